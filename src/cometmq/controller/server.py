"""The controller as a network server: RocketMQ's controller codes on a remoting port (``cometmq controller``).

``ControllerProcessors`` (processors.py) does the work; this owns the ``RemotingServer`` it is served on and wires
the server's close callback to it (a broker whose connection closes is dead at once), its TLS (``config.tls``) and
its ACL (``config.acl_enable``: the handlers behind ``acl.remoting.guard`` with CONTROLLER_POLICY, the file reloaded
when it changes). The nameserver embeds the same processors on its own port instead (``enableControllerInNamesrv``,
cli.py), under the nameserver's TLS and ACL.
"""

from __future__ import annotations

from types import TracebackType

from ..acl.control import AccessControl
from ..acl.policy import CONTROLLER_POLICY
from ..acl.remoting import guard
from ..net.server import RemotingServer
from ..net.tls import ServerTls
from .log import ReplicatedLog
from .processors import Clock, ControllerConfig, ControllerProcessors, wall_ms

__all__ = ["ControllerConfig", "ControllerServer"]


class ControllerServer:
    """One controller node serving on ``config.host:config.port`` (0 picks a free port; read ``port``)."""

    def __init__(self, config: ControllerConfig, log: ReplicatedLog, clock: Clock = wall_ms) -> None:
        self.config = config
        self.processors = ControllerProcessors(config, log, clock, address=lambda: self.addr)
        self.acl = AccessControl(config.acl_file) if config.acl_enable else None
        tls = config.tls
        self._server = RemotingServer(config.host, config.port,
                                      guard(self.processors.handlers(), self.acl, CONTROLLER_POLICY),
                                      tls=ServerTls(tls) if tls is not None and tls.enabled else None)
        self._server.add_close_callback(self.processors.connection_closed)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def addr(self) -> str:
        """The address this node is known by (``advertised_addr``, else the bound host and port)."""
        return self.config.advertised_addr or f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        if self.acl is not None:
            self.acl.load()  # a bad ACL file stops the start, naming its line and key
        await self.processors.start()  # the state is replayed before the first request is taken
        try:
            await self._server.start()
        except BaseException:
            await self.processors.stop()
            raise
        if self.acl is not None:
            self.acl.start()

    async def stop(self) -> None:
        await self._server.stop()
        if self.acl is not None:
            await self.acl.stop()
        await self.processors.stop()

    async def __aenter__(self) -> ControllerServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
