"""The SDK's connections: :class:`RemotingConnection` plus a lean request for the producer's hot path.

:meth:`SdkConnection.start_request` writes a frame the caller encoded already and returns the future its reply
completes: no coroutine around the wait, no ``RemotingCommand`` to encode, and no timer per request. Deadlines go
in one queue per connection with one timer, armed for the earliest deadline still pending: a request pays an
append, and the timer fires about once per timeout, not once per request (``call_later`` + ``cancel`` cost a
timer handle and two timer-heap operations on every send). The timeout error is the one ``request`` raises, at
the same moment (the earliest pending deadline). Everything else (other frames, the peer's own requests,
closing) is the base class's. The whole JSON reply frames a chunk starts with (the answers of the sends in
flight) are each decoded by :func:`_lone_reply` (one C call when client/_sendfast.c is built) instead of the frame
decoder.

:class:`SdkRemotingClient` is the client instance's :class:`RemotingClient`, making these connections and
handing out an open one without a coroutine (:meth:`SdkRemotingClient.open_connection`).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.net.client import RemotingClient
from cometmq.net.connection import ConnectionClosedError, Dispatcher, RemotingConnection, RequestTimeoutError
from cometmq.protocol.remoting import RESPONSE_FLAG, RemotingCommand, SerializeType, take_frames

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a core dependency
    _orjson = None  # type: ignore[assignment]

__all__ = ["SdkConnection", "SdkRemotingClient"]

_WRITELINES_THRESHOLD = 64 * 1024  # as RemotingConnection: below this, one joined write
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_JSON = SerializeType.JSON
_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type")


def _command_setters() -> tuple[Any, ...] | None:
    """RemotingCommand's slot setters in field order (as the codec builds a command), or None if its fields
    are not the ones expected (then every reply goes through the base class's decoder)."""
    if tuple(f for f in getattr(RemotingCommand, "__dataclass_fields__", {})) != _FIELDS:
        return None  # pragma: no cover - guards a change of RemotingCommand
    return tuple(RemotingCommand.__dict__[name].__set__ for name in _FIELDS)


_SETTERS = _command_setters()


class SdkConnection(RemotingConnection):
    """A client connection with :meth:`start_request`."""

    def __init__(self, dispatcher: Dispatcher | None = None, **kwargs: Any) -> None:
        super().__init__(dispatcher, **kwargs)
        #: (deadline, opaque, future, request code, timeout) of start_request's requests, oldest first
        self._deadlines: deque[tuple[float, int, asyncio.Future[RemotingCommand], int, float]] = deque()
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self.add_close_callback(_stop_sweep)

    def start_request(self, head: bytes, body: bytes, opaque: int, code: int,
                      timeout: float) -> asyncio.Future[RemotingCommand]:
        """Write a two-way request already encoded (``head``: length, header word and header; ``body``) and
        return the future of its reply. As :meth:`request` without the coroutine: the same errors (a closed
        connection, an opaque already waiting) and the same timeout. A caller that stops waiting (cancelled)
        calls :meth:`forget`."""
        if self._closed:
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        pending = self._pending
        if opaque in pending:
            raise ValueError(f"opaque {opaque} is already waiting for a reply on this connection")
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        loop = self._loop
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        pending[opaque] = future
        deadline = loop.time() + timeout
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].done():  # answered (or failed) already: nothing left to time
            deadlines.popleft()
        if len(deadlines) > 64 and len(deadlines) > 2 * len(pending):
            # answered requests held behind an older one still waiting: drop them (amortised: the queue at
            # least halves each time)
            self._deadlines = deadlines = deque(entry for entry in deadlines if not entry[2].done())
        deadlines.append((deadline, opaque, future, code, timeout))
        if deadline < self._sweep_at:
            self._arm(deadline)
        if len(body) >= _WRITELINES_THRESHOLD:
            transport.writelines((head, body))
        else:
            transport.write(head + body if body else head)
        if self._write_paused and self._write_hard_limit:
            self._check_write_backlog(transport)
        return future

    def data_received(self, data: bytes) -> None:
        """Each whole frame at the chunk's start that is one JSON reply, with nothing buffered before it (the
        answers of sends in flight), is decoded and completes its request here; the rest of the chunk, from the
        first frame the check below does not pass plainly (or a partial frame), goes to the base class, which
        decodes it as it always does. The command built is the one the codec builds from these bytes: the same
        fields, the same types."""
        if _SETTERS is None or _orjson is None or self._closed or self._decoder.buffered:
            super().data_received(data)
            return
        taken = take_frames(data, self._take_reply)
        if taken < len(data):
            super().data_received(data[taken:] if taken else data)

    def _take_reply(self, frame: bytes) -> bool:
        """Complete the request ``frame`` answers, if it is a reply of the usual shape (else False: untouched)."""
        if self._closed:  # (a waiter's callback closed us: the rest goes to the base class, which drops it)
            return False
        reply = _lone_reply(frame, self._max_frame_size)
        if reply is None:
            return False
        self.last_read = self._loop.time()
        future = self._pending.pop(reply.opaque, None)
        if future is not None and not future.done():
            future.set_result(reply)
        else:
            self._complete(reply)  # no waiter: logged as the base class does
        return True

    def forget(self, opaque: int, future: asyncio.Future[RemotingCommand]) -> None:
        """Stop waiting for the reply of a :meth:`start_request` (its caller was cancelled)."""
        if self._pending.get(opaque) is future:
            del self._pending[opaque]

    def _arm(self, when: float) -> None:
        handle = self._sweep_handle
        if handle is not None:
            handle.cancel()
        self._sweep_at = when
        self._sweep_handle = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail the requests past their deadline; arm the timer for the earliest one left."""
        self._sweep_handle = None
        self._sweep_at = math.inf
        now = self._loop.time()
        pending = self._pending
        left: deque[tuple[float, int, asyncio.Future[RemotingCommand], int, float]] = deque()
        earliest = math.inf
        for entry in self._deadlines:
            deadline, opaque, future, code, timeout = entry
            if future.done():
                continue
            if deadline <= now:
                if pending.get(opaque) is future:
                    del pending[opaque]
                future.set_exception(RequestTimeoutError(
                    f"no reply to request code {code} (opaque {opaque}) from {self.remote_address} "
                    f"within {timeout:g}s"))
                continue
            left.append(entry)
            earliest = min(earliest, deadline)
        self._deadlines = left
        if left:
            self._arm(earliest)


def _stop_sweep(conn: RemotingConnection) -> None:
    """At close: the base class failed every pending future; nothing is left to time."""
    assert isinstance(conn, SdkConnection)
    if conn._sweep_handle is not None:
        conn._sweep_handle.cancel()
        conn._sweep_handle = None
    conn._sweep_at = math.inf
    conn._deadlines.clear()


class SdkRemotingClient(RemotingClient):
    """A :class:`RemotingClient` whose TCP connections are :class:`SdkConnection` s."""

    connection_class = SdkConnection

    def open_connection(self, addr: str) -> SdkConnection | None:
        """The open :class:`SdkConnection` to ``addr``; None when there is none (not connected yet, closed, an
        in-process one): the caller goes the usual way (``invoke``), which connects."""
        conn = self._connections.get(addr)
        if type(conn) is SdkConnection and not conn._closed and not self._closed:
            return conn
        return None


def _lone_reply_py(data: bytes, max_frame_size: int) -> RemotingCommand | None:
    """The reply ``data`` holds when it is one whole JSON-header response frame of the usual shape (integer
    fields in int32, a string language, a string or no remark, string ext fields); None otherwise. The reference
    of the C helper's ``lone_reply`` (:data:`_lone_reply` is that one when it is built)."""
    size = len(data)
    if type(data) is not bytes or size < 8 or data[4] != 0:  # not a JSON header (or not even a header word)
        return None
    length = int.from_bytes(data[:4], "big")
    header_end = 8 + int.from_bytes(data[5:8], "big")
    if size != length + 4 or header_end > size or length > max_frame_size:
        return None
    try:
        header = _orjson.loads(data[8:header_end])
    except ValueError:
        return None
    if type(header) is not dict:
        return None
    get = header.get
    code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
    language, remark, ext = get("language", "JAVA"), get("remark"), get("extFields")
    if not (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
            and _INT32_MIN <= code <= _INT32_MAX and _INT32_MIN <= opaque <= _INT32_MAX
            and _INT32_MIN <= flag <= _INT32_MAX and _INT32_MIN <= version <= _INT32_MAX
            and flag & RESPONSE_FLAG and type(language) is str and (remark is None or type(remark) is str)):
        return None
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        return None
    else:
        for value in ext.values():
            if type(value) is not str:
                return None
    assert _SETTERS is not None
    set_code, set_language, set_version, set_opaque, set_flag, set_remark, set_ext, set_body, set_stype = _SETTERS
    cmd = object.__new__(RemotingCommand)
    set_code(cmd, code)
    set_language(cmd, language)
    set_version(cmd, version)
    set_opaque(cmd, opaque)
    set_flag(cmd, flag)
    set_remark(cmd, remark)
    set_ext(cmd, ext)
    set_body(cmd, data[header_end:] if size > header_end else b"")
    set_stype(cmd, _JSON)
    return cmd


def _bound_c_helper() -> Any:
    """client/_sendfast.c bound to RemotingCommand's slots, or None (not built, COMETMQ_PURE_PYTHON, no orjson)."""
    if _SETTERS is None or _orjson is None:
        return None  # pragma: no cover
    helper = load_c_helper("cometmq.client._sendfast")
    if helper is not None:
        helper.bind(RemotingCommand, _FIELDS, _JSON, _orjson.loads)
    return helper


_C_HELPER: Any = _bound_c_helper()
#: the lone-reply decoder: one C call when the helper is built, else :func:`_lone_reply_py`
_lone_reply: Callable[[bytes, int], RemotingCommand | None] = \
    _C_HELPER.lone_reply if _C_HELPER is not None else _lone_reply_py
