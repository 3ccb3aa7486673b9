"""Message ids (remoting-protocol.md §4): the offset msgId and the UNIQ_KEY.

* The **offset msgId** names a stored record: uppercase hex of the store host's address (4 bytes, or 16 for
  an IPv6 store host), its port (int32) and the record's commit-log offset (int64): 32 characters, or 56 with
  an IPv6 store host (Java's MessageDecoder.createMessageId). The send reply carries it and a client can
  rebuild it from a pulled record's STOREHOST and PHYSICALOFFSET, so it must be exact.
* The **UNIQ_KEY** is a client-assigned id the server treats as opaque. When the broker has to mint one
  (a message that arrived without it), :class:`UniqKeyGenerator` makes it in the clients' shape, so that
  tools that read the address and the time out of a key (as Java's ``MessageClientIDSetter`` does) work.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import pack_host, unpack_host
from cometmq.protocol.record_layout import IPV4_HOST_SIZE, IPV6_HOST_SIZE

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
_U64_MASK = (1 << 64) - 1
_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")  # explicit classes: no "0x", "+", "_", spaces or non-ASCII digits
_HEX = re.compile(r"[0-9A-Fa-f]*")
_OFFSET = struct.Struct(">q")
#: hex digits of an offset msgId with an IPv4 store host, and of a UNIQ_KEY
MSG_ID_LENGTH = 2 * (IPV4_HOST_SIZE + 8)
#: hex digits of an offset msgId with an IPv6 store host
MSG_ID_V6_LENGTH = 2 * (IPV6_HOST_SIZE + 8)


class OffsetMsgId(NamedTuple):
    host: str
    port: int
    offset: int


StoreHost = bytes | bytearray | memoryview | tuple[str, int]


def offset_msg_id(store_host: StoreHost, commit_log_offset: int) -> str:
    """The offset msgId of the record at ``commit_log_offset`` on ``store_host``: 32 characters, 56 for an IPv6 host.

    ``store_host`` is either the packed STOREHOST bytes of a record (8, or 20 for IPv6) or an ``(ip, port)`` pair.
    """
    if isinstance(store_host, tuple):
        host = pack_host(*store_host)
    else:
        host = bytes(store_host)
        if len(host) != IPV4_HOST_SIZE and len(host) != IPV6_HOST_SIZE:
            raise ProtocolError(f"a store host is {IPV4_HOST_SIZE} bytes (IPv4 + port) or {IPV6_HOST_SIZE}"
                                f" (IPv6 + port), got {len(host)}")
    if not INT64_MIN <= commit_log_offset <= INT64_MAX:
        raise ProtocolError(f"commit-log offset {commit_log_offset} is not an int64")
    # Java writes the offset with putLong, so a negative one would appear in two's complement.
    return f"{host.hex().upper()}{commit_log_offset & _U64_MASK:016X}"


def decode_offset_msg_id(msg_id: str | bytes | bytearray | memoryview) -> OffsetMsgId:
    """(ip, port, commit-log offset) from an offset msgId (32 hex digits, or 56 with an IPv6 store host); hex
    digits of either case are accepted."""
    if not isinstance(msg_id, str):
        try:
            msg_id = bytes(msg_id).decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError("msgId is not ASCII") from None
    if len(msg_id) not in (MSG_ID_LENGTH, MSG_ID_V6_LENGTH) or _HEX.fullmatch(msg_id) is None:
        raise ProtocolError(f"msgId {msg_id[:64]!r} is not {MSG_ID_LENGTH} or {MSG_ID_V6_LENGTH} hex digits")
    raw = bytes.fromhex(msg_id)
    host, port = unpack_host(raw[:-8])
    return OffsetMsgId(host, port, _OFFSET.unpack_from(raw, len(raw) - 8)[0])


# -- UNIQ_KEY --------------------------------------------------------------------------------------------
#
# 16 bytes, the layout both official clients share where it matters to readers:
#   IPv4 (4) | pid & 0xFFFF (2) | salt (4) | ms since the start of the local month (4) | counter (2)
# The last 6 bytes are kept as one 48-bit value that only ever grows within a prefix: a new millisecond
# jumps it to (ms << 16), otherwise it is incremented. So two keys of one prefix can never be equal, even
# when more than 65536 are made in one millisecond (the counter carries into the time field) or the clock
# steps back. A month (31 days + a DST hour) is < 2**32 ms, so the time fits its 4 bytes. When the month
# changes the time field restarts at 0, so the salt moves on by one instead: prefixes of successive
# months differ, and keys stay unique for the life of the process.

_VALUE_LIMIT = 1 << 48


def _month_bounds(ms: int) -> tuple[int, int]:
    """Start of the local month containing ``ms`` and start of the next one, both in epoch ms."""
    t = time.localtime(ms // 1000)
    year, month = t.tm_year, t.tm_mon
    nxt = (year + 1, 1) if month == 12 else (year, month + 1)
    start = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
    end = time.mktime((nxt[0], nxt[1], 1, 0, 0, 0, 0, 0, -1))
    return int(start) * 1000, int(end) * 1000


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class UniqKeyGenerator:
    """Thread-safe maker of 32-uppercase-hex UNIQ_KEYs, unique within the process (and after a fork).

    ``ip`` should be the broker's advertised IPv4 address; ``clock_ms`` exists for tests.
    """

    def __init__(
        self, ip: str | bytes = "127.0.0.1", *, clock_ms: Callable[[], int] = _wall_clock_ms
    ) -> None:
        if isinstance(ip, str):
            host = pack_host(ip, 0)
            if len(host) != IPV4_HOST_SIZE:  # the key's layout has room for an IPv4 address only
                raise ProtocolError(f"{ip!r} is not an IPv4 address")
            self._ip = host[:4]
        elif len(ip) == 4:
            self._ip = bytes(ip)
        else:
            raise ProtocolError(f"an IPv4 address is 4 bytes, got {len(ip)}")
        self._clock = clock_ms
        self._lock = threading.Lock()
        self._seed()
        # A forked child copies this object; without a new pid and salt it would repeat the parent's keys.
        # A weak reference keeps the fork hook from pinning the generator in memory.
        ref = weakref.ref(self)

        def _after_fork_in_child() -> None:
            gen = ref()
            if gen is not None:
                gen._lock = threading.Lock()  # another thread may have held it at fork time
                gen._seed()

        os.register_at_fork(after_in_child=_after_fork_in_child)

    def _seed(self) -> None:
        self._pid = os.getpid() & 0xFFFF
        self._salt = int.from_bytes(os.urandom(4), "big")
        self._month_start = 0
        self._month_end = 0  # empty window: the first key computes the real one
        self._last = -1
        self._prefix = ""

    def _roll(self, now: int) -> None:
        """Enter a new prefix: the month changed, the clock left it, or the 48-bit value ran out."""
        if self._prefix:  # not the first: the salt must differ from every earlier prefix's
            self._salt = (self._salt + 1) & 0xFFFFFFFF
        self._month_start, self._month_end = _month_bounds(now)
        self._last = -1
        prefix = self._ip + self._pid.to_bytes(2, "big") + self._salt.to_bytes(4, "big")
        self._prefix = prefix.hex().upper()

    def _reserve(self, n: int) -> tuple[str, int]:
        """Reserve ``n`` consecutive values (callers hold the lock): (prefix, first value)."""
        now = self._clock()
        if not self._month_start <= now < self._month_end:
            self._roll(now)
        value = (now - self._month_start) << 16
        if value <= self._last:
            value = self._last + 1
        if value + n > _VALUE_LIMIT:  # unreachable in practice: 65536 keys per ms for weeks
            self._roll(now)
            value = (now - self._month_start) << 16
        self._last = value + n - 1
        return self._prefix, value

    def new_key(self) -> str:
        with self._lock:
            prefix, value = self._reserve(1)
        return f"{prefix}{value:012X}"

    __call__ = new_key

    def new_keys(self, n: int) -> list[str]:
        """``n`` keys at once (a batch): as ``n`` calls of :meth:`new_key` in one millisecond, under one
        lock and one clock read. Values run consecutively from where :meth:`new_key` would start."""
        if n <= 0:
            return []
        prefix, value = self.reserve(n)
        return [f"{prefix}{v:012X}" for v in range(value, value + n)]

    def reserve(self, n: int) -> tuple[str, int]:
        """:meth:`new_keys` unformatted: (prefix, first value); key ``i`` is the prefix + ``first + i`` in 12
        upper-case hex digits (a batch encoder writes them straight into the body: batch.encode_keyed_batch)."""
        with self._lock:
            return self._reserve(n)


def _check_key(key: str) -> str:
    if not isinstance(key, str) or len(key) != MSG_ID_LENGTH or _HEX32.fullmatch(key) is None:
        raise ProtocolError(f"UNIQ_KEY {str(key)[:64]!r} is not {MSG_ID_LENGTH} hex digits")
    return key


def uniq_key_timestamp(key: str, now_ms: int | None = None) -> int:
    """Approximate creation time (epoch ms) of a UNIQ_KEY made by us or an official client.

    The key only holds ms since the start of a local month; we take the month of ``now_ms`` (default:
    now), or the previous one when that would put the key in the future.
    """
    offset = int(_check_key(key)[20:28], 16)
    now = _wall_clock_ms() if now_ms is None else now_ms
    start, _ = _month_bounds(now)
    if start + offset > now:
        start, _ = _month_bounds(start - 1)
    return start + offset


def uniq_key_ip(key: str) -> str:
    """The IPv4 address in the first 4 bytes of a UNIQ_KEY."""
    return socket.inet_ntoa(bytes.fromhex(_check_key(key)[:8]))
