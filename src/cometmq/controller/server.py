"""The controller as a network server: RocketMQ's controller codes on a remoting port (``cometmq controller``).

``ControllerProcessors`` (processors.py) does the work; this owns the ``RemotingServer`` it is served on and wires
the server's close callback to it (a broker whose connection closes is dead at once). The nameserver embeds the
same processors on its own port instead (``enableControllerInNamesrv``, cli.py).
"""

from __future__ import annotations

from types import TracebackType

from ..net.server import RemotingServer
from .log import ReplicatedLog
from .processors import Clock, ControllerConfig, ControllerProcessors, wall_ms

__all__ = ["ControllerConfig", "ControllerServer"]


class ControllerServer:
    """One controller node serving on ``config.host:config.port`` (0 picks a free port; read ``port``)."""

    def __init__(self, config: ControllerConfig, log: ReplicatedLog, clock: Clock = wall_ms) -> None:
        self.config = config
        self.processors = ControllerProcessors(config, log, clock, address=lambda: self.addr)
        self._server = RemotingServer(config.host, config.port, self.processors.handlers())
        self._server.add_close_callback(self.processors.connection_closed)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def addr(self) -> str:
        """The address this node is known by (``advertised_addr``, else the bound host and port)."""
        return self.config.advertised_addr or f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        await self.processors.start()  # the state is replayed before the first request is taken
        try:
            await self._server.start()
        except BaseException:
            await self.processors.stop()
            raise

    async def stop(self) -> None:
        await self._server.stop()
        await self.processors.stop()

    async def __aenter__(self) -> ControllerServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
