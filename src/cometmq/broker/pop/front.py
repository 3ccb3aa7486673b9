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


class Pop:
    """The broker's POP consumption; see the module docstring. Attributes it does not have are the service's (built
    then): ``snapshot``, ``append``, ``revive``... A metrics scrape reads ``states``, ``metrics`` and ``waiting()``,
    which build nothing (it runs on another thread)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, appender: Appender, *,
                 offsets: ConsumerOffsetManager, groups: SubscriptionGroupManager, topics: TopicConfigManager,
                 clock: Callable[[], int], stats: BrokerStats | None = None) -> None:
        self._args = (config, store, appender)
        self._kwargs: dict[str, Any] = {"offsets": offsets, "groups": groups, "topics": topics, "clock": clock,
                                        "stats": stats}
        self.store = store
        self.snapshot_path = config.store.config_dir / POP_STATE_FILE
        self._service: PopService | None = None
        self._processor: PopProcessor | None = None
        #: the master's services run: a service built now loads, and starts its revive and snapshot ticks
        self._loaded = False
        self._started = False
        self._idle_metrics = PopMetrics()

    @property
    def built(self) -> bool:
        return self._service is not None

    @property
    def service(self) -> PopService:
        """The service, built (on the event loop's thread) at the first call."""
        return self._service if self._service is not None else self._build()[0]

    @property
    def processor(self) -> PopProcessor:
        """The requests' processor, built with the service."""
        return self._processor if self._processor is not None else self._build()[1]

    def _build(self) -> tuple[PopService, PopProcessor]:
        from cometmq.broker.pop.processor import PopProcessor
        from cometmq.broker.pop.service import PopService

        config, store, _ = self._args
        service = self._service = PopService(*self._args, **self._kwargs)
        processor = self._processor = PopProcessor(config, store, self._kwargs["groups"], self._kwargs["topics"],
                                                   service)
        if self._loaded:
            service.load()
        if self._started:
            service.start_ticks()
        return service, processor

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.service, name)

    # -- read by a metrics scrape (another thread): nothing is built ----------------------------------------------
    @property
    def states(self) -> dict[Any, Any]:
        service = self._service
        return service.states if service is not None else {}

    @property
    def metrics(self) -> PopMetrics:
        service = self._service
        return service.metrics if service is not None else self._idle_metrics

    def waiting(self) -> int:
        service = self._service
        return service.waiting() if service is not None else 0

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
        service = self._service
        if service is not None:
            service.on_arrivals(reqs)

    # -- the master's services ----------------------------------------------------------------------------------
    def load(self) -> None:
        """The service's state, when it is built or the broker holds POP state to load."""
        self._loaded = True
        if self._service is not None:
            self._service.load()
        elif self.snapshot_path.exists() or self.store.max_offset(POP_LOG_TOPIC, 0) > 0:
            self._build()  # (and loaded)

    async def start(self) -> None:
        self._started = True
        if self._service is not None:
            self._service.start_ticks()

    async def stop(self) -> None:
        self._loaded = self._started = False
        if self._service is not None:
            await self._service.stop()


__all__ = ["POP_LOG_TOPIC", "POP_STATE_FILE", "Pop", "PopMetrics"]
