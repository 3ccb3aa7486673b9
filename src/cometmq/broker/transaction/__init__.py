"""Transactional messages on the broker: half and op topics, END_TRANSACTION, check-back (see service.py).

The broker wires ``Transactions`` (front.py), which builds the engine (service.py) on first use.
"""

from cometmq.broker.transaction.front import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, Transactions

__all__ = ["CHECK_MAX_TOPIC", "HALF_TOPIC", "OP_TOPIC", "Transactions"]
