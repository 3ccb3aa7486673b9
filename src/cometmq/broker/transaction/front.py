"""What the broker wires of transactions, with the engine built on first use (issue [16]: an idle broker imports
only what it uses).

``Transactions`` is the send hook, the END_TRANSACTION handlers and the master's load, start and stop, as
``BrokerController`` sees them. The engine (``service.TransactionalMessageService`` and what it imports: the half
and op codecs, the table, the batch protocol; 0.3 MiB of an idle broker) is built at the first transactional
send, the first END_TRANSACTION, the first look at its internals, or at load when the store already holds halves
(a restart with transactions to rebuild). This module owns the system topics' names and the test that tells a
transaction's half from any other send, so neither needs the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cometmq.broker.first_use import BuiltOnFirstUse
from cometmq.broker.send_hooks import SendContext, SendKind
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.headers import parse_bool
from cometmq.protocol.message import transaction_value
from cometmq.protocol.properties import TRAN_MSG
from cometmq.protocol.remoting import RemotingCommand
from cometmq.store.config import ConfigError
from cometmq.store.message import TRANSACTION_PREPARED_TYPE, MessageInner
from cometmq.store.status import PutResult

if TYPE_CHECKING:
    from cometmq.broker.appender import Appender
    from cometmq.broker.clients import ProducerManager
    from cometmq.broker.config import BrokerConfig
    from cometmq.broker.topics import TopicConfigManager
    from cometmq.broker.transaction.service import TransactionalMessageService
    from cometmq.store.message_store import MessageStore

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


def wants_transaction(m: MessageInner) -> bool:
    """A transaction's half: the PREPARED sys flag, or TRAN_MSG=true."""
    if transaction_value(m.sys_flag) == TRANSACTION_PREPARED_TYPE:
        return True
    try:
        return parse_bool(m.properties.get(TRAN_MSG, ""))
    except ValueError:
        return False


def check_transaction_config(cfg: BrokerConfig) -> None:
    """transactionTimeOut, transactionCheckMax and transactionCheckInterval, checked when the broker is built."""
    timeout, check_max, interval = cfg.transaction_timeout_ms, cfg.transaction_check_max, \
        cfg.transaction_check_interval_ms
    if timeout < 0 or check_max < 0 or interval <= 0:
        raise ConfigError("transactionTimeOut and transactionCheckMax must be >= 0 and transactionCheckInterval "
                          f"> 0 (got {timeout}, {check_max}, {interval})")


class Transactions(BuiltOnFirstUse["TransactionalMessageService"]):
    """The broker's transactions; see the module docstring. Attributes it does not have are the engine's (built
    then): ``table``, ``metrics``, ``end_transaction``... A metrics scrape reads :meth:`counts`, which builds
    nothing (it runs on another thread)."""

    #: as a send hook: a producer's send may be a transaction's half
    kinds = frozenset({SendKind.SEND})

    def __init__(self, cfg: BrokerConfig, store: MessageStore, appender: Appender, topics: TopicConfigManager,
                 producers: ProducerManager, clock: Callable[[], int]) -> None:
        check_transaction_config(cfg)
        super().__init__()
        self._args = (cfg, store, appender, topics, producers, clock)
        self.store = store
        self.topics = topics

    @property
    def engine(self) -> TransactionalMessageService:
        return self._get()

    # -- the engine on first use (broker/first_use.py) ------------------------------------------------------------
    def _make(self) -> TransactionalMessageService:
        from cometmq.broker.transaction.service import TransactionalMessageService

        return TransactionalMessageService(*self._args)

    def _holds_state(self) -> bool:
        return self.store.max_offset(HALF_TOPIC, 0) > 0

    def _start_part(self, part: TransactionalMessageService) -> None:
        part.start_checking()

    def counts(self) -> tuple[int, int, int]:
        """(pending halves, committed, rolled back), zeros while the engine is not built."""
        engine = self._part
        if engine is None:
            return 0, 0, 0
        return len(engine.table), engine.metrics.committed, engine.metrics.rolled_back

    def handlers(self) -> dict[int, Handler]:
        async def end_transaction(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
            return await self.engine.end_transaction(conn, cmd)

        async def end_transactions(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
            return await self.engine.end_transactions(conn, cmd)

        return {RequestCode.END_TRANSACTION: end_transaction, RequestCode.END_TRANSACTION_BATCH: end_transactions}

    # -- the master's services ----------------------------------------------------------------------------------
    def load(self) -> None:
        """The system topics; the engine too when it is built or the store holds halves to rebuild from."""
        self.topics.create_system_topic(HALF_TOPIC, 1, perm=0)
        self.topics.create_system_topic(OP_TOPIC, 1, perm=0)
        super().load()

    # -- the send path (a send hook, broker/send_hooks.py) -------------------------------------------------------
    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> bool:
        if self._part is None and not ctx.half_batch and not any(wants_transaction(m) for m in msgs):
            return False
        return self.engine.before_put(msgs, ctx)

    def after_put(self, msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        if self._part is not None:
            self._part.after_put(msgs, result, ctx)


__all__ = ["CHECK_MAX_TOPIC", "HALF_TOPIC", "OP_TOPIC", "Transactions", "check_transaction_config", "wants_transaction"]
