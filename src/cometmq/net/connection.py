"""One remoting connection over asyncio, shared by servers and clients.

Bytes go through the sans-I/O ``FrameDecoder``; responses complete the future waiting on their opaque;
requests run in their own task each (a held long poll must not stall the requests behind it on the same
connection), and the handler's reply goes back whenever it is ready: peers match replies by opaque, not order.
Handlers marked ``eager_start`` (sends and pulls) run their first step at once, inside ``data_received``; only
if they suspend does a task take over, so a request answered without waiting costs no task and no loop turn.

Errors meet one boundary here (``_serve``): a ``RemotingError`` is answered with its code and remark; a
``RemoteProtocolError`` (a header field or body the peer got wrong) with ``codes.bad_request_code`` for the
request and the error text, the connection kept; anything else, a ``LocalProtocolError`` included, is logged with
its traceback and answered SYSTEM_ERROR. Bytes that break framing close the connection (``data_received``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import replace
from typing import Any, Protocol, TypeVar, cast

from cometmq.net.limits import limited_log, peer_ip
from cometmq.protocol.codes import RemotingError, ResponseCode, bad_request_code
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    FrameDecoder,
    RemotingCommand,
    encode_parts,
    make_response,
)

log = logging.getLogger(__name__)

Handler = Callable[["RemotingConnection", RemotingCommand], Awaitable[RemotingCommand | None]]
"""Serves one request: returns the reply, or None to reply later through ``send_response`` (or never)."""
Dispatcher = Mapping[int, Handler]
ConnectionCallback = Callable[["RemotingConnection"], None]
BufferObserver = Callable[["RemotingConnection", int], None]
"""Told how many more (or fewer) bytes a connection holds for an incomplete frame (a server's ConnectionGuard)."""
RequestObserver = Callable[[int, int, int, bool], None]
"""Told of each request answered: (request code, response code, nanoseconds from its arrival to its answer,
whether the handler returned before answering: a held long poll). Installed by the server's owner (metrics)."""
FastPath = Callable[["RemotingConnection", bytes], int]
"""Offered each chunk received while no partial frame is buffered, before it is decoded: returns how many bytes
from the chunk's start it took, whole frames (it answers the requests they hold, through ``send_frame``, now or
from a task of ``start_handler_task``); the rest goes, untouched, to the decoder and the dispatcher
(broker/send_fast.py: single SEND_MESSAGE_V2s)."""

DEFAULT_WRITE_HIGH_WATER = 4 * 1024 * 1024
DEFAULT_WRITE_LOW_WATER = 1024 * 1024
DEFAULT_MAX_INFLIGHT = 16384  # handlers running per connection before we stop reading (soft: a chunk in hand
# is still dispatched)
_WRITELINES_THRESHOLD = 64 * 1024  # below this, one joined write is cheaper than a vectored one
SENDFILE_THRESHOLD = 64 * 1024  # below this, a body is written from memory (sendfile saves a copy, costs a call)


class FileSource(Protocol):
    """A body that lies in a file (cometmq.store.mapped_file.FileRegion): ``size`` bytes a socket can be sent."""

    size: int

    def send_to(self, sock_fd: int) -> int:
        """Send as much as the non-blocking socket ``sock_fd`` takes now (from the start); the count sent."""
_EMPTY_DISPATCHER: Dispatcher = {}


H = TypeVar("H")


def eager_start(handler: H) -> H:
    """Mark a handler to be started at once in ``data_received`` instead of in a new task (what Python 3.12's
    eager tasks do, for 3.11 too). Until its first suspension it runs outside any task, so that first step
    must not need one (no ``asyncio.timeout``, ``wait_for`` or ``current_task``); after it, a task drives it
    as usual (cancellation included)."""
    handler.eager_start = True  # type: ignore[attr-defined]
    return handler


class _Started(Coroutine[Any, Any, None]):
    """A coroutine whose first step already ran outside any task, handed to a task to go on with: the task's
    first ``send`` gets back what that step yielded (the future it waits on); everything after, results and
    thrown exceptions (cancellation, even before the task's first step), goes to the coroutine itself."""

    __slots__ = ("_coro", "_first", "_started")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro, self._first, self._started = coro, first, False

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            first, self._first = self._first, None
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._started = True
        self._first = None
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the old three-argument form

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, None]:
        return self  # send/throw/close/__next__: the generator protocol

    def __iter__(self) -> _Started:
        return self

    def __next__(self) -> Any:
        return self.send(None)


class ConnectionClosedError(ConnectionError):
    """The connection closed (or was closed) before the operation could complete."""


class RemotingConnectError(ConnectionError):
    """A connection to the peer could not be opened."""


class RequestTimeoutError(TimeoutError):
    """No reply arrived within the timeout."""


def format_address(peer: Any) -> str:
    """``host:port`` for a socket address tuple (``[v6]:port`` for IPv6); ``str(peer)`` otherwise."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return "?" if peer is None else str(peer)


def _expire(future: asyncio.Future[RemotingCommand], code: int, opaque: int, peer: str, timeout: float) -> None:
    if not future.done():
        future.set_exception(RequestTimeoutError(
            f"no reply to request code {code} (opaque {opaque}) from {peer} within {timeout:g}s"))


class RemotingConnection(asyncio.Protocol):
    """An asyncio protocol that speaks remoting frames.

    ``attributes`` is free for the layer above (e.g. the broker keeps the client id of the channel there).
    """

    def __init__(
        self,
        dispatcher: Dispatcher | None = None,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        write_high_water: int = DEFAULT_WRITE_HIGH_WATER,
        write_low_water: int = DEFAULT_WRITE_LOW_WATER,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        observer: RequestObserver | None = None,
        write_hard_limit: int = 0,
        fast_path: FastPath | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        #: the request observer (metrics), which a ``FastPath`` tells of the requests it answers (read only)
        self.observer = self._observer = observer
        self._fast_path = fast_path
        #: opaque -> (request code, arrival ns, held): requests not answered yet, kept only with an observer
        self._timing: dict[int, tuple[int, int, bool]] = {}
        self._dispatcher = _EMPTY_DISPATCHER if dispatcher is None else dispatcher
        self._decoder = FrameDecoder(max_frame_size)
        #: the longest frame (length field) this connection accepts; a longer one closes it (read only)
        self.max_frame_size = self._max_frame_size = max_frame_size
        #: loop time of the last bytes received, and of the first byte of the frame not yet complete (None: none)
        self.last_read = self._loop.time()
        self.partial_since: float | None = None
        #: loop time since which the transport's write buffer has been above the high-water mark (None: it is not)
        self.write_paused_since: float | None = None
        self._buffer_observer: BufferObserver | None = None
        #: queued reply bytes beyond which a peer that does not read is disconnected (0: no limit)
        self._write_hard_limit = write_hard_limit
        self._write_high_water = write_high_water
        self._write_low_water = write_low_water
        self._max_inflight = max_inflight
        self._transport: asyncio.Transport | None = None
        #: sendfile writes to the socket itself: never under TLS (the bytes would bypass the encryption)
        self._tls = False
        self._closed = False
        self._made: asyncio.Future[None] = self._loop.create_future()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_paused = False
        self._reading_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._close_callbacks: list[ConnectionCallback] = []
        self.remote_address = "?"
        self.local_address = "?"
        self.attributes: dict[str, Any] = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<RemotingConnection {self.local_address} -> {self.remote_address} {state}>"

    # -- public API ----------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffered_bytes(self) -> int:
        """Bytes received for a frame not complete yet."""
        return self._decoder.buffered

    def set_buffer_observer(self, observer: BufferObserver | None) -> None:
        """Tell ``observer(conn, delta)`` each change of ``buffered_bytes`` (and its release at close)."""
        self._buffer_observer = observer

    @property
    def pending_requests(self) -> int:
        return len(self._pending)

    @property
    def active_handlers(self) -> int:
        return len(self._tasks)

    def add_close_callback(self, callback: ConnectionCallback) -> None:
        """Run ``callback(conn)`` once when the connection closes (at once if it already has)."""
        if self._closed:
            self._run_callback(callback)
        else:
            self._close_callbacks.append(callback)

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for the reply with the same opaque."""
        if cmd.flag & (RESPONSE_FLAG | ONEWAY_FLAG):
            raise ValueError("request() needs a two-way request; use send_oneway() or send_response()")
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        opaque = cmd.opaque
        if opaque in self._pending:
            raise ValueError(f"opaque {opaque} is already waiting for a reply on this connection")
        future: asyncio.Future[RemotingCommand] = self._loop.create_future()
        self._pending[opaque] = future
        # A timer that fails the future, not asyncio.timeout: no Timeout object, no current_task(), no
        # cancellation to undo, and one timer handle instead of a rescheduled one (cheaper on every request).
        expiry = self._loop.call_later(timeout, _expire, future, cmd.code, opaque, self.remote_address, timeout)
        try:
            self._write(cmd)
            return await future
        finally:
            expiry.cancel()
            self._pending.pop(opaque, None)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a request that gets no reply (the oneway flag is set if missing)."""
        if cmd.flag & RESPONSE_FLAG:
            raise ValueError("send_oneway() needs a request, not a response")
        if not cmd.flag & ONEWAY_FLAG:
            cmd = replace(cmd, flag=cmd.flag | ONEWAY_FLAG)
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        self._write(cmd)

    def send_response(self, cmd: RemotingCommand, *, file_region: FileSource | None = None) -> bool:
        """Send a reply; False (and nothing sent) if the peer has gone, which is normal for late replies.

        ``file_region``: where ``cmd``'s body lies in a file; when nothing is waiting to be written on this
        connection, the frame's head is written to the socket and the body sent from the file (sendfile), and
        whatever the socket does not take at once is written from ``cmd.body`` as usual."""
        if self._observer is not None:
            self._observed(cmd)
        if not self._can_write():
            log.debug("dropping reply code %d opaque %d: %s is closed", cmd.code, cmd.opaque, self.remote_address)
            return False
        if not cmd.flag & RESPONSE_FLAG:
            cmd = replace(cmd, flag=cmd.flag | RESPONSE_FLAG)
        self._write(cmd, file_region)
        return True

    def send_frame(self, frame: bytes, code: int, opaque: int) -> bool:
        """``send_response`` for a reply already encoded (``code`` and ``opaque`` are its own, for the log): False
        (nothing sent) if the peer has gone. The caller tells the observer, if any."""
        transport = self._transport
        if self._closed or transport is None or transport.is_closing():
            log.debug("dropping reply code %d opaque %d: %s is closed", code, opaque, self.remote_address)
            return False
        transport.write(frame)
        if self._write_paused and self._write_hard_limit:
            self._check_write_backlog(transport)
        return True

    def start_handler_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a request's handling on in a task of this connection (counted in flight, cancelled at close)."""
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._handler_done)
        if len(self._tasks) >= self._max_inflight:
            self._update_reading()

    def _observed(self, reply: RemotingCommand) -> None:
        self.reply_observed(reply.opaque, reply.code)

    def reply_observed(self, opaque: int, code: int) -> None:
        """Tell the observer of the answer (``code``) to the request ``opaque`` (a reply sent without
        ``send_response``, encoded already)."""
        timing = self._timing.pop(opaque, None)
        if timing is not None and self._observer is not None:
            request_code, start, held = timing
            self._observer(request_code, code, time.perf_counter_ns() - start, held)

    def _can_write(self) -> bool:
        transport = self._transport
        return not self._closed and transport is not None and not transport.is_closing()

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below the low-water mark."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        if not self._write_paused:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def close(self) -> None:
        """Close the connection: pending requests fail at once, queued writes are still flushed."""
        if self._transport is not None:
            self._transport.close()
        self._finalize(ConnectionClosedError(f"connection to {self.remote_address} was closed locally"))

    def abort(self) -> None:
        """Close without flushing queued writes."""
        if self._transport is not None:
            self._transport.abort()
        self._finalize(ConnectionClosedError(f"connection to {self.remote_address} was aborted"))

    async def wait_connected(self) -> None:
        """Wait for ``connection_made`` (uvloop may call it after ``create_connection`` has returned)."""
        await asyncio.shield(self._made)

    async def wait_closed(self) -> None:
        """Wait until the transport has really gone (its socket is released)."""
        await asyncio.shield(self._lost)

    async def cancel_handlers(self, timeout: float = 5.0) -> None:
        """Cancel the request handlers still running and wait (up to ``timeout``) for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    # -- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check here.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._tls = transport.get_extra_info("ssl_object") is not None
        transport.set_write_buffer_limits(high=self._write_high_water, low=self._write_low_water)
        self.remote_address = format_address(transport.get_extra_info("peername"))
        self.local_address = format_address(transport.get_extra_info("sockname"))
        if not self._made.done():
            self._made.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self.last_read = now = self._loop.time()
        decoder = self._decoder
        before = decoder.buffered
        if not before and self._fast_path is not None:
            taken = self._fast_path(self, data)
            if taken:
                if taken == len(data) or self._closed:
                    return
                data = data[taken:]
        try:
            commands = decoder.feed(data)
        except RemoteProtocolError as exc:
            # The stream has lost framing (or a header is unreadable, so no reply can be addressed to it): nothing
            # later on it can be trusted. Only this connection closes. One line per peer a minute, no traceback.
            self._buffered_changed(before, 0, now, False)
            limited_log.warning(log, ("malformed", peer_ip(self.remote_address)),
                                "closing connection from %s: malformed frame: %s", self.remote_address, exc)
            self.abort()
            return
        after = decoder.buffered
        if after != before or (after and commands):
            self._buffered_changed(before, after, now, bool(commands))
        for cmd in commands:
            if self._closed:  # a handler or callback closed us while we were dispatching this chunk
                break
            if cmd.flag & RESPONSE_FLAG:
                self._complete(cmd)
            else:
                self._dispatch(cmd)

    def _buffered_changed(self, before: int, after: int, now: float, completed: bool) -> None:
        # A frame completed and another begun in one chunk: the new one's clock starts now.
        if not after:
            self.partial_since = None
        elif not before or completed:
            self.partial_since = now
        observer = self._buffer_observer
        if observer is not None and after != before:
            observer(self, after - before)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc is not None else ""
        self._finalize(ConnectionClosedError(f"connection to {self.remote_address} was lost{reason}"))
        self._transport = None
        if not self._lost.done():
            self._lost.set_result(None)

    @property
    def write_buffer_size(self) -> int:
        """Reply bytes queued in the transport, not taken by the peer yet."""
        transport = self._transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def pause_writing(self) -> None:
        self._write_paused = True
        self.write_paused_since = self._loop.time()
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self.write_paused_since = None
        self._wake_drainers(None)
        self._update_reading()

    # -- internals -----------------------------------------------------------------------------------------
    def _write(self, cmd: RemotingCommand, file_region: FileSource | None = None) -> None:
        head, body = encode_parts(cmd)
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        if file_region is not None and not self._tls and len(body) >= SENDFILE_THRESHOLD \
                and len(body) == file_region.size and transport.get_write_buffer_size() == 0:
            # Nothing is queued in the transport (uvloop's or asyncio's), so bytes written to the socket now
            # go out in order: the head, then as much of the body as the socket takes straight from the file;
            # the transport writes what is left, after them.
            sock = transport.get_extra_info("socket")
            fd = sock.fileno() if sock is not None else -1
            if fd >= 0:
                try:
                    wrote = os.write(fd, head)
                except OSError:  # full (BlockingIOError) or failing: the transport's write finds out which
                    wrote = 0
                sent = file_region.send_to(fd) if wrote == len(head) else 0
                if wrote < len(head):
                    transport.write(head[wrote:])
                if sent < len(body):
                    transport.write(body[sent:])
                if self._write_paused and self._write_hard_limit:
                    self._check_write_backlog(transport)
                return
        if len(body) >= _WRITELINES_THRESHOLD:
            transport.writelines((head, body))
        else:
            transport.write(head + body if body else head)
        if self._write_paused and self._write_hard_limit:  # above the high-water mark only: one test per write
            self._check_write_backlog(transport)

    def _check_write_backlog(self, transport: asyncio.Transport) -> None:
        queued = transport.get_write_buffer_size()
        if queued > self._write_hard_limit:
            limited_log.warning(log, ("write-backlog", peer_ip(self.remote_address)),
                                "closing connection to %s: %d bytes of replies are queued and not read "
                                "(write hard limit %d)", self.remote_address, queued, self._write_hard_limit)
            self.abort()

    def _complete(self, cmd: RemotingCommand) -> None:
        future = self._pending.pop(cmd.opaque, None)
        if future is None or future.done():
            log.debug(
                "reply code %d opaque %d from %s has no waiter (timed out?)",
                cmd.code,
                cmd.opaque,
                self.remote_address,
            )
            return
        future.set_result(cmd)

    def _dispatch(self, cmd: RemotingCommand) -> None:
        if self._observer is not None and not cmd.flag & ONEWAY_FLAG:
            self._timing[cmd.opaque] = (cmd.code, time.perf_counter_ns(), False)
        handler = self._dispatcher.get(cmd.code)
        if handler is None:
            if cmd.flag & ONEWAY_FLAG:
                log.debug(
                    "ignoring oneway request code %d from %s: no handler", cmd.code, self.remote_address
                )
            else:
                self.send_response(
                    make_response(
                        cmd,
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        f"request code {cmd.code} is not supported",
                    )
                )
            return
        coro = self._serve(handler, cmd)
        if getattr(handler, "eager_start", False):
            try:
                yielded = coro.send(None)
            except StopIteration:
                return  # answered already
            self.start_handler_task(_Started(coro, yielded))
        else:
            self.start_handler_task(coro)

    async def _serve(self, handler: Handler, cmd: RemotingCommand) -> None:
        try:
            reply = await handler(self, cmd)
        except RemotingError as exc:
            reply = make_response(cmd, exc.code, exc.remark)
        except RemoteProtocolError as exc:
            # The peer's header or body is malformed, but the frame was whole: answer (the code chosen by request
            # code, in one table) and keep the connection. One line, no traceback: it is not our bug.
            log.warning("bad request code %d from %s: %s", cmd.code, self.remote_address, exc)
            reply = make_response(cmd, bad_request_code(cmd.code), str(exc))
        except Exception as exc:  # LocalProtocolError included: we built something invalid, a bug to see
            log.exception("handler for request code %d from %s failed", cmd.code, self.remote_address)
            reply = make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if reply is None or cmd.flag & ONEWAY_FLAG:
            if reply is None and self._observer is not None:
                timing = self._timing.get(cmd.opaque)
                if timing is not None:  # not answered yet: a held pull, answered later by whoever wakes it
                    self._timing[cmd.opaque] = (timing[0], timing[1], True)
            return
        if reply.opaque != cmd.opaque or not reply.flag & RESPONSE_FLAG:
            reply = replace(reply, opaque=cmd.opaque, flag=reply.flag | RESPONSE_FLAG)
        try:
            self.send_response(reply)
        except ConnectionClosedError:
            pass  # closed while we wrote: the peer is gone, nobody to tell
        except Exception as exc:  # the handler built a reply that cannot be encoded (a LocalProtocolError)
            log.exception("cannot send reply to request code %d from %s", cmd.code, self.remote_address)
            self.send_response(make_response(cmd, ResponseCode.SYSTEM_ERROR, f"bad reply: {exc}"))

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._reading_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        # Reading stops while the peer is not taking our writes or while too many of its requests are in
        # progress; a peer that floods us then just sees TCP back-pressure.
        transport = self._transport
        if transport is None or self._closed:
            return
        want_paused = self._write_paused or len(self._tasks) >= self._max_inflight
        if want_paused == self._reading_paused:
            return
        self._reading_paused = want_paused
        if want_paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _wake_drainers(self, exc: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def _finalize(self, exc: ConnectionClosedError) -> None:
        if self._closed:
            return
        self._closed = True
        held = self._decoder.buffered
        if held:  # give back what an incomplete frame held, now: the protocol object may outlive the socket
            self._decoder = FrameDecoder(self._max_frame_size)
            self.partial_since = None
            if self._buffer_observer is not None:
                self._buffer_observer(self, -held)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)
        self._wake_drainers(exc)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            self._run_callback(callback)

    def _run_callback(self, callback: ConnectionCallback) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("close callback for %s failed", self.remote_address)
