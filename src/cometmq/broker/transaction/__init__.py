"""Transactional messages on the broker: half and op topics, END_TRANSACTION, check-back (see service.py)."""

from cometmq.broker.transaction.messages import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC
from cometmq.broker.transaction.service import TransactionalMessageService, TransactionMetrics

__all__ = ["CHECK_MAX_TOPIC", "HALF_TOPIC", "OP_TOPIC", "TransactionMetrics", "TransactionalMessageService"]
