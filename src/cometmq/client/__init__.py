"""The cometmq Python SDK for RocketMQ's remoting protocol (asyncio core)."""

from cometmq.client.errors import (
    BrokerError,
    ClientConnectionError,
    ClientStateError,
    ClientTimeoutError,
    InvalidArgumentError,
    MQClientError,
    NoRouteError,
)
from cometmq.client.instance import ClientInstance
from cometmq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from cometmq.client.producer import Producer, select_by_hash, select_round_robin

__all__ = [
    "BrokerError",
    "ClientConnectionError",
    "ClientInstance",
    "ClientStateError",
    "ClientTimeoutError",
    "InvalidArgumentError",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NoRouteError",
    "Producer",
    "SendResult",
    "SendStatus",
    "select_by_hash",
    "select_round_robin",
]
