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

# -- push consumer ------------------------------------------------------------------------------------------
from cometmq.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from cometmq.client.push_consumer import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumerStats,
    ConsumeStatus,
    MessageListener,
    OrderlyPushConsumer,
    PushConsumer,
)
from cometmq.client.rebalance import (
    AllocateAverage,
    AllocateAverageByCircle,
    AllocateByConfig,
    AllocateConsistentHash,
    AllocateStrategy,
)

__all__ += [
    "AllocateAverage",
    "AllocateAverageByCircle",
    "AllocateByConfig",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "ConsumerStats",
    "LocalFileOffsetStore",
    "MessageListener",
    "OffsetStore",
    "OrderlyPushConsumer",
    "PushConsumer",
    "RemoteBrokerOffsetStore",
]

# -- lite-pull consumer and admin client (the blocking twins are in cometmq.client.sync) ----------------------
from cometmq.client.admin import Admin, ConsumeStats, OffsetReset, OffsetWrapper, TopicOffset  # noqa: E402
from cometmq.client.lite_pull_consumer import LitePullConsumer  # noqa: E402

__all__ += [
    "Admin",
    "ConsumeStats",
    "LitePullConsumer",
    "OffsetReset",
    "OffsetWrapper",
    "TopicOffset",
]

# -- transactional messages -------------------------------------------------------------------------------------
from cometmq.client.transaction_producer import (  # noqa: E402
    EndOutcome,
    LocalTransactionState,
    TransactionClientInstance,
    TransactionProducer,
    TransactionSendResult,
)

__all__ += ["EndOutcome", "LocalTransactionState", "TransactionClientInstance", "TransactionProducer",
            "TransactionSendResult"]
