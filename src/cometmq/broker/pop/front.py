"""What the broker wires of POP consumption, with the service built on first use (issue [16]: an idle broker imports
only what it uses).

``Pop`` is the POP requests' handlers, the arrival listener and the master's load, start and stop, as
``BrokerController`` sees them. The service (``service.PopService``, its processor, the pop log and state codecs
and ``protocol.pop``: 0.4 MiB of an idle broker) is built at the first POP-family request (POP, ACK, BATCH_ACK,
CHANGE_INVISIBLE_TIME, PEEK, NOTIFICATION; the gRPC endpoint sends these too), the first look at its internals,
or at load when the broker holds POP state (a snapshot, or pop-log records: a restart with deliveries to track).
This module owns the pop log's topic name, the snapshot's file name and the counters' shape, so that none of them
needs the service.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cometmq.broker.first_use import BuiltOnFirstUse
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import RemotingCommand
from cometmq.store.message import DispatchRequest

if TYPE_CHECKING:
    from cometmq.broker.appender import Appender
    from cometmq.broker.config import BrokerConfig
    from cometmq.broker.groups import SubscriptionGroupManager
    from cometmq.broker.offsets import ConsumerOffsetManager
    from cometmq.broker.pop.processor import PopProcessor
    from cometmq.broker.pop.service import PopService
    from cometmq.broker.stats import BrokerStats
    from cometmq.broker.topics import TopicConfigManager
    from cometmq.store.message_store import MessageStore

POP_LOG_TOPIC = "rmq_sys_POP_LOG"
#: the service's snapshot, in the broker's config folder
POP_STATE_FILE = "popState.json"

#: the POP family's request codes and the processor's method answering each
_REQUESTS = {
    RequestCode.POP_MESSAGE: "pop",
    RequestCode.ACK_MESSAGE: "ack",
    RequestCode.BATCH_ACK_MESSAGE: "batch_ack",
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: "change_invisible_time",
    RequestCode.PEEK_MESSAGE: "peek",
    RequestCode.NOTIFICATION: "notification",
}


@dataclass
class PopMetrics:
    popped: int = 0
    redelivered: int = 0
    acked: int = 0
    stale_refused: int = 0
    changed: int = 0
    dlq: int = 0
    woken_by_arrival: int = 0
    woken_by_revive: int = 0
    woken_by_ack: int = 0


class Pop(BuiltOnFirstUse["PopService"]):
    """The broker's POP consumption; see the module docstring. Attributes it does not have are the service's (built
    then): ``snapshot``, ``append``, ``revive``... A metrics scrape reads ``states``, ``metrics`` and ``waiting()``,
    which build nothing (it runs on another thread)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, appender: Appender, *,
                 offsets: ConsumerOffsetManager, groups: SubscriptionGroupManager, topics: TopicConfigManager,
                 clock: Callable[[], int], stats: BrokerStats | None = None) -> None:
        super().__init__()
        self._config, self._appender, self._offsets = config, appender, offsets
        self._groups, self._topics, self._clock, self._stats = groups, topics, clock, stats
        self.store = store
        self.snapshot_path = config.store.config_dir / POP_STATE_FILE
        self._processor: PopProcessor | None = None
        self._idle_metrics = PopMetrics()

    @property
    def service(self) -> PopService:
        return self._get()

    @property
    def processor(self) -> PopProcessor:
        """The requests' processor, built with the service."""
        self._get()
        assert self._processor is not None
        return self._processor

    # -- the service on first use (broker/first_use.py) -----------------------------------------------------------
    def _make(self) -> PopService:
        from cometmq.broker.pop.processor import PopProcessor
        from cometmq.broker.pop.service import PopService

        service = PopService(self._config, self.store, self._appender, offsets=self._offsets, groups=self._groups,
                             topics=self._topics, clock=self._clock, stats=self._stats)
        self._processor = PopProcessor(self._config, self.store, self._groups, self._topics, service)
        return service

    def _holds_state(self) -> bool:
        return self.snapshot_path.exists() or self.store.max_offset(POP_LOG_TOPIC, 0) > 0

    def _start_part(self, part: PopService) -> None:
        part.start_ticks()

    # -- read by a metrics scrape (another thread): nothing is built ----------------------------------------------
    @property
    def states(self) -> dict[Any, Any]:
        service = self._part
        return service.states if service is not None else {}

    @property
    def metrics(self) -> PopMetrics:
        service = self._part
        return service.metrics if service is not None else self._idle_metrics

    def waiting(self) -> int:
        service = self._part
        return service.waiting() if service is not None else 0

    def forget(self, *, group: str = "", topic: str = "") -> int:
        """Drop the POP state of a deleted topic or of a deleted group whose offsets are cleaned
        (``PopService.forget``); a service not built holds no state, and is not built for this."""
        service = self._part
        return service.forget(group=group, topic=topic) if service is not None else 0

    # -- requests and arrivals --------------------------------------------------------------------------------
    def handlers(self) -> dict[int, Handler]:
        def route(method: str) -> Handler:
            async def handle(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
                answer: RemotingCommand = await getattr(self.processor, method)(conn, cmd)
                return answer

            handle.__name__ = method
            return handle

        return {code: route(method) for code, method in _REQUESTS.items()}

    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        """The store's batch arrival listener: POP requests wait only on a built service."""
        service = self._part
        if service is not None:
            service.on_arrivals(reqs)


__all__ = ["POP_LOG_TOPIC", "POP_STATE_FILE", "Pop", "PopMetrics"]
