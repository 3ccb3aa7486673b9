"""A remoting client: one cached connection per ``host:port``, requests with timeouts, oneway sends.

Requests the server sends back over these connections (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE,
...) are served by the client's own dispatcher, exactly as a server serves its requests.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Callable, Mapping
from types import TracebackType

from cometmq.net.connection import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_WRITE_HIGH_WATER,
    DEFAULT_WRITE_LOW_WATER,
    ConnectionClosedError,
    Dispatcher,
    RemotingConnectError,
    RemotingConnection,
    RequestTimeoutError,
)
from cometmq.protocol.remoting import DEFAULT_MAX_FRAME_SIZE, RemotingCommand

log = logging.getLogger(__name__)


def split_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``: an address to connect to, its port 1-65535."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"address {addr!r} is not host:port (a port 1-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


LocalConnector = Callable[[Dispatcher | None], RemotingConnection]
"""Opens an in-process connection (``cometmq.net.local``); its argument serves what the other end sends back."""


class RemotingClient:
    """``local`` maps addresses served in this process to a connector used instead of TCP (same requests, same
    replies, no socket): the embedded gRPC endpoint reaches its own broker that way."""

    def __init__(
        self,
        dispatcher: Dispatcher | None = None,
        *,
        connect_timeout: float = 3.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
        write_low_water: int = DEFAULT_WRITE_LOW_WATER,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        local: Mapping[str, LocalConnector] | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        #: TCP connections use TLS with this context (net/tls.py ``client_context``); in-process ones never do
        self.ssl = ssl
        self._local: dict[str, LocalConnector] = dict(local or {})
        self.connect_timeout = connect_timeout
        self._max_frame_size = max_frame_size
        self._write_high_water = write_high_water
        self._write_low_water = write_low_water
        self._max_inflight = max_inflight
        self._connections: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Task[RemotingConnection]] = {}
        self._closed = False

    @property
    def connections(self) -> dict[str, RemotingConnection]:
        """A snapshot of the open connections by address."""
        return {addr: conn for addr, conn in self._connections.items() if not conn.closed}

    def _open(self, addr: str) -> RemotingConnection | None:
        """The connection to ``addr`` if there is one and it is open."""
        conn = self._connections.get(addr)
        return conn if conn is not None and not conn.closed else None

    async def get_connection(self, addr: str, timeout: float | None = None) -> RemotingConnection:
        """The open connection to ``addr``, connecting if needed; concurrent callers share one attempt."""
        if self._closed:
            raise ConnectionClosedError("client is closed")
        conn = self._open(addr)
        if conn is not None:
            return conn
        task = self._connecting.get(addr)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(addr))
            self._connecting[addr] = task
            task.add_done_callback(lambda t: self._connect_done(addr, t))
        limit = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        try:
            async with asyncio.timeout(limit):
                # shield: one caller giving up must not cancel the attempt the others wait on
                return await asyncio.shield(task)
        except TimeoutError:
            raise RemotingConnectError(f"connecting to {addr} timed out after {limit:g}s") from None

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """Send ``cmd`` to ``addr`` and return the reply; ``timeout`` covers connecting too."""
        conn = None if self._closed else self._open(addr)
        if conn is not None:  # connected already: the whole timeout is left for the request
            return await conn.request(cmd, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self.get_connection(addr, timeout)
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise RequestTimeoutError(f"no time left to send request code {cmd.code} to {addr}")
        return await conn.request(cmd, remaining)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        """Send ``cmd`` without waiting for a reply (but for the connection and a drained write buffer)."""
        conn = await self.get_connection(addr, timeout)
        conn.send_oneway(cmd)
        await conn.drain()

    def close_connection(self, addr: str) -> None:
        conn = self._connections.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Close every connection and wait (up to ``timeout``) for the sockets to be released."""
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        connections = list(self._connections.values())
        self._connections.clear()
        for conn in connections:
            conn.close()
        await asyncio.gather(*(conn.cancel_handlers(timeout) for conn in connections))
        if connections:
            waiters = {asyncio.ensure_future(conn.wait_closed()): conn for conn in connections}
            _, stuck = await asyncio.wait(waiters, timeout=timeout)
            for waiter in stuck:
                waiters[waiter].abort()
            if stuck:
                await asyncio.wait(stuck, timeout=timeout)

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _connect(self, addr: str) -> RemotingConnection:
        connector = self._local.get(addr)
        if connector is not None:
            conn = connector(self._dispatcher)
        else:
            host, port = split_address(addr)
            loop = asyncio.get_running_loop()
            try:
                if self.ssl is None:
                    _, conn = await loop.create_connection(self._new_connection, host, port)
                else:
                    _, conn = await loop.create_connection(self._new_connection, host, port, ssl=self.ssl,
                                                           server_hostname=host)
            except OSError as exc:  # ssl.SSLError included: a failed handshake
                raise RemotingConnectError(f"cannot connect to {addr}: {exc}") from exc
        await conn.wait_connected()
        if self._closed:  # close() ran while we were connecting
            conn.close()
            raise ConnectionClosedError("client is closed")
        self._connections[addr] = conn
        conn.add_close_callback(lambda c: self._forget(addr, c))
        log.debug("connected to %s", addr)
        return conn

    #: what the client's connections are (the SDK's subclass makes its own kind)
    connection_class: type[RemotingConnection] = RemotingConnection

    def _new_connection(self) -> RemotingConnection:
        return self.connection_class(
            self._dispatcher,
            max_frame_size=self._max_frame_size,
            write_high_water=self._write_high_water,
            write_low_water=self._write_low_water,
            max_inflight=self._max_inflight,
        )

    def _connect_done(self, addr: str, task: asyncio.Task[RemotingConnection]) -> None:
        if self._connecting.get(addr) is task:
            del self._connecting[addr]
        if not task.cancelled() and task.exception() is not None:
            log.debug("connecting to %s failed: %s", addr, task.exception())  # marks it retrieved

    def _forget(self, addr: str, conn: RemotingConnection) -> None:
        if self._connections.get(addr) is conn:
            del self._connections[addr]
