"""A remoting server: accepts connections and serves requests through a dispatcher (code -> handler)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from cometmq.net.addr import bound_socket
from cometmq.net.connection import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_WRITE_HIGH_WATER,
    DEFAULT_WRITE_LOW_WATER,
    ConnectionCallback,
    Dispatcher,
    FastPath,
    RemotingConnection,
    RequestObserver,
)
from cometmq.net.limits import ConnectionGuard, ConnectionLimits
from cometmq.net.tls import ServerTls, TlsListener, start_tls_listener
from cometmq.protocol.remoting import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger(__name__)


class RemotingServer:
    """Listen on ``host:port`` (port 0 picks a free one; read ``port`` after ``start()``).

    ``dispatcher`` maps request codes to handlers and is read on every request, so a mutable dict may gain
    handlers after start. Unknown codes get REQUEST_CODE_NOT_SUPPORTED, a ``RemotingError`` its own code and
    remark, a ``RemoteProtocolError`` (a malformed header field or body) the code ``bad_request_code`` gives for
    the request and its text as remark, any other exception SYSTEM_ERROR; the connection stays open in all four
    cases. Bytes that break framing close that one connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        dispatcher: Dispatcher,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
        write_low_water: int = DEFAULT_WRITE_LOW_WATER,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        backlog: int = 1024,
        observer: RequestObserver | None = None,
        tls: ServerTls | None = None,
        limits: ConnectionLimits | None = None,
        fast_path: FastPath | None = None,
    ) -> None:
        self.host = host
        #: offered each chunk before it is decoded (connection.FastPath); None: every request is dispatched
        self._fast_path = fast_path
        #: timeouts, connection caps and buffered-bytes budgets (net/limits.py); the defaults unless given
        self.guard = ConnectionGuard(limits or ConnectionLimits())
        self._observer = observer
        #: TLS (net/tls.py): None or mode disabled serves plaintext; permissive and enforcing peek each connection
        self.tls = tls if tls is not None and tls.config.enabled else None
        self._requested_port = port
        self._port: int | None = None
        self._dispatcher = dispatcher
        self._max_frame_size = max_frame_size
        self._write_high_water = write_high_water
        self._write_low_water = write_low_water
        self._max_inflight = max_inflight
        self._backlog = backlog
        self._server: asyncio.Server | TlsListener | None = None
        self._connections: set[RemotingConnection] = set()
        self._connect_callbacks: list[ConnectionCallback] = []
        self._close_callbacks: list[ConnectionCallback] = []

    @property
    def port(self) -> int:
        """The port actually bound (differs from the requested one when that was 0)."""
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def connections(self) -> frozenset[RemotingConnection]:
        return frozenset(self._connections)

    def add_connect_callback(self, callback: ConnectionCallback) -> None:
        """Call ``callback(conn)`` for every accepted connection."""
        self._connect_callbacks.append(callback)

    def add_close_callback(self, callback: ConnectionCallback) -> None:
        """Call ``callback(conn)`` when any accepted connection closes (so the broker can drop its client)."""
        self._close_callbacks.append(callback)

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("server already started")
        loop = asyncio.get_running_loop()
        if self.tls is not None:
            self._server = await start_tls_listener(self._new_connection, self.host, self._requested_port, self.tls,
                                                    backlog=self._backlog, admit=self.guard.may_open)
        elif (sock := bound_socket(self.host, self._requested_port)) is not None:  # an IP address: no lookup
            try:
                self._server = await loop.create_server(self._new_connection, sock=sock, backlog=self._backlog)
            except BaseException:
                sock.close()
                raise
        else:
            self._server = await loop.create_server(
                self._new_connection, self.host, self._requested_port, backlog=self._backlog, reuse_address=True
            )
        sockets = self._server.sockets
        self._port = sockets[0].getsockname()[1] if sockets else self._requested_port
        self.guard.start(self._connections)
        log.info("remoting server listening on %s:%d%s", self.host, self._port,
                 f" (TLS {self.tls.mode.value})" if self.tls is not None else "")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop listening, close every connection, cancel the handlers still running."""
        server, self._server = self._server, None
        if server is None:
            return
        await self.guard.stop()
        server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.close()
        await asyncio.gather(*(conn.cancel_handlers(timeout) for conn in connections))
        if connections:
            waiters = {asyncio.ensure_future(conn.wait_closed()): conn for conn in connections}
            _, stuck = await asyncio.wait(waiters, timeout=timeout)
            for waiter in stuck:  # a peer that never read its replies: drop what is left unsent
                waiters[waiter].abort()
            if stuck:
                await asyncio.wait(stuck, timeout=timeout)
        await server.wait_closed()
        log.info("remoting server on %s:%s stopped", self.host, self._port)

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _new_connection(self) -> RemotingConnection:
        return _ServerConnection(
            self,
            self._dispatcher,
            max_frame_size=self._max_frame_size,
            write_high_water=self._write_high_water,
            write_low_water=self._write_low_water,
            max_inflight=self._max_inflight,
            observer=self._observer,
            write_hard_limit=self.guard.limits.write_hard_limit,
            fast_path=self._fast_path,
        )

    def _accepted(self, conn: RemotingConnection) -> None:
        if not self.guard.admit(conn):  # over a connection cap: closed already, logged (rate-limited)
            return
        self._connections.add(conn)
        conn.add_close_callback(self._closed)
        for callback in self._close_callbacks:
            conn.add_close_callback(callback)
        for callback in self._connect_callbacks:
            try:
                callback(conn)
            except Exception:
                log.exception("connect callback for %s failed", conn.remote_address)

    def _closed(self, conn: RemotingConnection) -> None:
        self._connections.discard(conn)


class _ServerConnection(RemotingConnection):
    """Registers itself with its server once the socket is there (the address is known only then)."""

    def __init__(self, server: RemotingServer, dispatcher: Dispatcher, **kwargs: Any) -> None:
        super().__init__(dispatcher, **kwargs)
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._accepted(self)
