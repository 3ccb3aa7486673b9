"""A producer's SEND_MESSAGE_V2 frame head, written from a template instead of encoded from a command.

The request the producer sends for one message differs from the last one it sent to the same topic in five
places only: the opaque, the queue id, the born timestamp, the message's flag and its properties. A
:class:`SendFrameTemplate` is the JSON header the codec (``protocol.remoting.encode_parts``) writes for a probe
request of the producer's group and topic, cut at those five values and kept as a bytes ``%`` format, so a send
costs one format and one pack instead of a header dict copy, a ``RemotingCommand`` and its encoding. The probe
goes through the codec itself, so the fragments are its bytes; the properties are written as the codec writes a
string (the json module's ASCII escaping). A header the template cannot reproduce exactly (a group or topic that is
not ASCII, a header or frame over the codec's limits) is not made here: the caller encodes that request the usual
way. tests/client/test_send_frame.py compares both encodings byte for byte.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

from cometmq.protocol import msgid
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.msgid import UniqKeyGenerator
from cometmq.protocol.remoting import MAX_HEADER_LENGTH, RemotingCommand, encode_parts

__all__ = ["PLAIN_HEAD", "PLAIN_TAIL", "ProducerKeys", "SendFrameTemplate", "properties_json"]

_PREFIX = struct.Struct(">II")
_INT32_MAX = 2**31 - 1

#: the probe's values, each written once in the probe header, in this order (checked): opaque, queue id, born
#: timestamp, flag (numbers), and the properties (a string: its quoted JSON is replaced as a whole)
_PROBES = ((b"o", 1357913579), (b"q", 1468024680), (b"b", 1579135791), (b"f", 1680246802))
_PROBE_PROPERTIES = "\x00properties-probe"

#: a plain message's properties (UNIQ_KEY and WAIT only) as the codec writes them in the header: these around the
#: key (hex: nothing to escape)
PLAIN_HEAD = b'"UNIQ_KEY\\u0001'
PLAIN_TAIL = b'\\u0002WAIT\\u0001true\\u0002"'


def properties_json(text: str) -> bytes:
    """``text`` as the codec writes it in a header (``protocol.remoting``: the json module's ASCII escaping, which
    its C writer matches byte for byte)."""
    return encode_basestring_ascii(text).encode("ascii")


class SendFrameTemplate:
    """The SEND_MESSAGE_V2 frame head of one producer group and topic; see the module docstring.

    ``fields(topic, queue_id, sys_flag, born_timestamp, flag, properties)`` gives the request's ext fields, as
    the producer builds them; the template is cut from ``encode_parts`` of a request with those fields."""

    __slots__ = ("_format",)

    def __init__(self, fmt: bytes) -> None:
        self._format = fmt

    @classmethod
    def build(cls, topic: str, fields: Callable[[str, int, int, int, int, str], dict[str, str]]
              ) -> SendFrameTemplate | None:
        """The template for ``topic``, or None when the codec's header for it cannot be templated."""
        if not topic.isascii():
            return None
        o, q, b, f = (value for _, value in _PROBES)
        ext = fields(topic, q, 0, b, f, _PROBE_PROPERTIES)
        if any(not (type(v) is str and v.isascii()) for v in ext.values()):
            return None  # e.g. a group that is not ASCII: the codec may take the json module's path
        head, _ = encode_parts(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=o, ext_fields=ext))
        header = head[_PREFIX.size:]
        if not header.isascii():
            return None  # pragma: no cover - checked above
        probes = [(name, b"d", str(value).encode()) for name, value in _PROBES]
        probes.append((b"p", b"b", properties_json(_PROBE_PROPERTIES)))
        header = header.replace(b"%", b"%%")
        if any(header.count(text) != 1 for _, _, text in probes) \
                or sorted(probes, key=lambda p: header.index(p[2])) != probes:
            return None  # the group or topic holds a probe's text, or the codec wrote them in another order
        for _, conv, text in probes:
            header = header.replace(text, b"%" + conv)
        return cls(header)

    def frame_head(self, opaque: int, queue_id: int, born_timestamp: int, flag: int, properties: bytes,
                   body_length: int) -> bytes | None:
        """Length, header word and header of the request, as ``encode_parts`` writes them; None when the codec
        would refuse it (too large: the usual path raises its error)."""
        header = self._format % (opaque, queue_id, born_timestamp, flag, properties)
        header_length = len(header)
        length = 4 + header_length + body_length
        if header_length > MAX_HEADER_LENGTH or length > _INT32_MAX:
            return None
        return _PREFIX.pack(length, header_length) + header


_KEY_STATE = ("_lock", "_clock", "_month_start", "_month_end", "_last", "_prefix")


class ProducerKeys(UniqKeyGenerator):
    """The producer's :class:`UniqKeyGenerator`: :meth:`new_key` in one call in the usual case (the month known,
    the 48-bit value not run out), the same keys in the same order; anything else is the base class's."""

    def __init__(self, ip: str | bytes = "127.0.0.1", **kwargs: Any) -> None:
        super().__init__(ip, **kwargs)
        self._inline = all(hasattr(self, name) for name in _KEY_STATE)
        self._wall = getattr(self, "_clock", None) is getattr(msgid, "_wall_clock_ms", None)

    def new_key(self) -> str:
        if self._inline:
            with self._lock:
                now = time.time_ns() // 1_000_000 if self._wall else self._clock()
                start = self._month_start
                if start <= now < self._month_end:
                    value = (now - start) << 16
                    if value <= self._last:
                        value = self._last + 1
                    if value < _VALUE_LIMIT:
                        self._last = value
                        return f"{self._prefix}{value:012X}"
        return super().new_key()  # a new month, the first key, or the value ran out: the base class rolls


_VALUE_LIMIT = 1 << 48
