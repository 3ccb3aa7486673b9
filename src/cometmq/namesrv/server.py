"""The nameserver process: a remoting server over the route table, plus the scan that expires silent brokers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from cometmq.common.periodic import Periodic
from cometmq.namesrv.kv_config import KVConfigManager
from cometmq.namesrv.processors import NamesrvProcessors
from cometmq.namesrv.route_info import DEFAULT_BROKER_EXPIRY_S, ExpiredBroker, RouteInfoManager
from cometmq.net.connection import Dispatcher, Handler, RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.net.tls import ServerTls
from cometmq.net.tls_settings import TlsConfig

if TYPE_CHECKING:
    from cometmq.acl.control import AccessControl

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    host: str = "127.0.0.1"
    port: int = 9876
    #: how often silent brokers are looked for (RocketMQ's scanNotActiveBroker period)
    scan_interval_s: float = 5.0
    #: a broker that has not registered for this long is dropped (brokers register every 30 s)
    broker_expiry_s: float = DEFAULT_BROKER_EXPIRY_S
    #: access control (aclEnable / aclFile; docs/security.md): reads of routes stay open, every change (brokers
    #: registering, topics deleted, KV and config) needs an admin account
    acl_enable: bool = False
    acl_file: str = "plain_acl.yml"
    #: TLS of the nameserver's port (net/tls.py), None: plaintext
    tls: TlsConfig | None = None
    #: RocketMQ's orderMessageEnable: route answers carry a topic's ORDER_TOPIC_CONFIG KV value (written by
    #: ``updateTopic -o true``) as orderTopicConf. On here; RocketMQ's default is false.
    order_message_enable: bool = True
    #: RocketMQ's kvConfigPath: where KV configs (ORDER_TOPIC_CONFIG, ...) are kept; None: in memory only
    kv_config_path: Path | None = None


class EmbeddedService(Protocol):
    """A service served on the nameserver's port beside the route table: the controller when RocketMQ's
    ``enableControllerInNamesrv`` is on (built by the caller: the nameserver does not import the controller)."""

    def handlers(self) -> dict[int, Handler]: ...

    def connection_closed(self, conn: RemotingConnection) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class NamesrvController:
    """Owns the route table, the remoting server and the expiry scan; ``start()`` / ``stop()`` them together."""

    def __init__(self, config: NamesrvConfig | None = None, *, clock: Callable[[], float] = time.monotonic,
                 embedded: Sequence[EmbeddedService] = ()) -> None:
        self.config = config or NamesrvConfig()
        self.route_info = RouteInfoManager(clock, self.config.broker_expiry_s)
        self.processors = NamesrvProcessors(self.route_info, KVConfigManager(self.config.kv_config_path),
                                            order_message_enable=self.config.order_message_enable)
        self.embedded = tuple(embedded)
        dispatcher = self.processors.dispatcher()
        for service in self.embedded:
            clash = dispatcher.keys() & service.handlers().keys()
            if clash:
                raise ValueError(f"request codes {sorted(clash)} are served twice")
            dispatcher.update(service.handlers())
        tls = self.config.tls
        self.acl: AccessControl | None = None
        table: Dispatcher = dispatcher
        if self.config.acl_enable:  # the ACL modules are imported only when access control is on
            from cometmq.acl.control import AccessControl
            from cometmq.acl.policy import NAMESRV_POLICY
            from cometmq.acl.remoting import guard

            self.acl = AccessControl(self.config.acl_file)
            table = guard(dispatcher, self.acl, NAMESRV_POLICY)
        self._server = RemotingServer(self.config.host, self.config.port, table,
                                      tls=ServerTls(tls) if tls is not None and tls.enabled else None)
        self._server.add_close_callback(self._connection_closed)
        for service in self.embedded:
            self._server.add_close_callback(service.connection_closed)
        self._scan = Periodic("namesrv-scan", self.config.scan_interval_s, self.scan_once, logger=log)

    @property
    def port(self) -> int:
        """The bound port (the real one when the config asked for 0)."""
        return self._server.port

    @property
    def addr(self) -> str:
        """``host:port`` to give brokers and clients."""
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        if self._scan.running:
            raise RuntimeError("nameserver already started")
        if self.acl is not None:
            self.acl.load()  # a bad ACL file stops the start, naming its line and key
        for i, service in enumerate(self.embedded):  # ready (a controller's state replayed) before any request
            try:
                await service.start()
            except BaseException:
                for started in reversed(self.embedded[:i]):
                    await started.stop()
                raise
        try:
            await self._server.start()
        except BaseException:
            for service in reversed(self.embedded):
                await service.stop()
            raise
        if self.acl is not None:
            self.acl.start()  # reloads the file when it changes (once nothing can fail the start any more)
        self._scan.start()  # a failing pass is logged with its traceback; the scan goes on
        log.info("nameserver serving on %s", self.addr)

    async def stop(self) -> None:
        await self._scan.stop()
        await self._server.stop()
        if self.acl is not None:
            await self.acl.stop()
        for service in reversed(self.embedded):
            await service.stop()

    async def __aenter__(self) -> NamesrvController:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def scan_once(self, now: float | None = None) -> list[ExpiredBroker]:
        """Expire silent brokers and close their connections (unless another live broker still uses one)."""
        expired = self.route_info.scan_inactive(now)
        for broker in expired:
            conn = broker.conn
            if isinstance(conn, RemotingConnection) and not conn.closed and not self.route_info.conn_in_use(conn):
                conn.close()  # as RocketMQ does: a broker that stopped talking gets a fresh connection
        return expired

    def _connection_closed(self, conn: RemotingConnection) -> None:
        self.route_info.on_connection_closed(conn)
