"""Pulled records as lazy :class:`MessageExt` objects (the lite-pull and simple consumers' decoding).

A message holds the body and the record's raw header and properties bytes; properties, ids and host strings
are worked out on first access. That keeps the per-message cost of a pull at one small ``struct`` unpack and
three slices.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import zlib
from collections.abc import Mapping
from typing import Any

from cometmq.client.admin import queue_label
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MAGIC_CODE, MIN_RECORD_SIZE, SysFlag
from cometmq.protocol.properties import RETRY_TOPIC, UNIQ_KEY, decode_properties

__all__ = ["decode_pulled"]

#: TOTALSIZE, MAGIC, SYSFLAG (at 36) and BODYLEN (at 84): all a pull needs to cut a record out of the body
_CUT = struct.Struct(">iI28xi44xi")
_BODY_AT = 88
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HOST = struct.Struct(">4si")
_RETRY_PREFIX = "%RETRY%"
_COMPRESSED = int(SysFlag.COMPRESSED)  # a plain int: IntFlag's & costs microseconds
_props_slot = MessageExt.__dict__["properties"]  # the base class's slot, used as the properties cache


def _host(rec: bytes, at: int) -> str:
    ip, port = _HOST.unpack_from(rec, at)
    return f"{socket.inet_ntoa(ip)}:{port}"


class _PulledMessage(MessageExt):
    """A MessageExt made from a pulled record without decoding it: ``body`` and ``queue`` are set, ``_r`` keeps
    the record's bytes, and the other fields are read from them when asked for (properties once, then cached).
    Pickling and copying give a plain :class:`MessageExt`.
    """

    __slots__ = ("_r",)
    _r: bytes

    def __new__(cls, *args: Any, **kwargs: Any) -> MessageExt:  # type: ignore[misc]
        # Only ``dataclasses.replace`` (and so a listener's copy with changes) calls the class: it gets a plain
        # MessageExt with every field given. decode_pulled makes its objects with object.__new__.
        return MessageExt(*args, **kwargs)

    @property
    def properties(self) -> Mapping[str, str]:
        try:
            return _props_slot.__get__(self, MessageExt)  # type: ignore[no-any-return]
        except AttributeError:
            rec = self._r
            at = _BODY_AT + _I32.unpack_from(rec, 84)[0]
            at += 1 + rec[at]
            (n,) = _I16.unpack_from(rec, at)
            props = decode_properties(rec[at + 2 : at + 2 + n])
            _props_slot.__set__(self, props)
            return props

    @property
    def topic(self) -> str:
        topic: str = self.queue.topic
        if topic.startswith(_RETRY_PREFIX):
            return self.properties.get(RETRY_TOPIC) or topic
        return topic

    @property
    def offset_msg_id(self) -> str:
        rec = self._r
        return f"{rec[64:72].hex().upper()}{_I64.unpack_from(rec, 28)[0] & 0xFFFFFFFFFFFFFFFF:016X}"

    @property
    def msg_id(self) -> str:
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def flag(self) -> int:
        return _I32.unpack_from(self._r, 16)[0]  # type: ignore[no-any-return]

    @property
    def queue_offset(self) -> int:
        return _I64.unpack_from(self._r, 20)[0]  # type: ignore[no-any-return]

    @property
    def commit_log_offset(self) -> int:
        return _I64.unpack_from(self._r, 28)[0]  # type: ignore[no-any-return]

    @property
    def sys_flag(self) -> int:
        return _I32.unpack_from(self._r, 36)[0]  # type: ignore[no-any-return]

    @property
    def born_timestamp(self) -> int:
        return _I64.unpack_from(self._r, 40)[0]  # type: ignore[no-any-return]

    @property
    def born_host(self) -> str:
        return _host(self._r, 48)

    @property
    def store_timestamp(self) -> int:
        return _I64.unpack_from(self._r, 56)[0]  # type: ignore[no-any-return]

    @property
    def store_host(self) -> str:
        return _host(self._r, 64)

    @property
    def reconsume_times(self) -> int:
        return _I32.unpack_from(self._r, 72)[0]  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (MessageExt, tuple(getattr(self, f.name) for f in dataclasses.fields(MessageExt)))

    def __repr__(self) -> str:
        return "MessageExt" + MessageExt.__repr__(self)[len(type(self).__qualname__):]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageExt):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(MessageExt))

    __hash__ = MessageExt.__hash__


_new = object.__new__
_set_r = _PulledMessage.__dict__["_r"].__set__
_set_body = MessageExt.__dict__["body"].__set__
_set_queue = MessageExt.__dict__["queue"].__set__


def decode_pulled(body: bytes, queue: MessageQueue) -> list[MessageExt]:
    """The records of a pull response body as lazy :class:`MessageExt` objects; ProtocolError when malformed.

    Per record: one small unpack, two slices (the record, the body) and a bare object with three slots set.
    """
    out: list[MessageExt] = []
    append = out.append
    cut = _CUT.unpack_from
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < MIN_RECORD_SIZE:
            raise ProtocolError(f"truncated record at {pos} of a pull of {queue_label(queue)}")
        total, magic, sys_flag, body_len = cut(body, pos)
        stop = pos + total
        if magic != MAGIC_CODE or total < MIN_RECORD_SIZE or stop > end or body_len < 0 \
                or body_len > total - MIN_RECORD_SIZE:
            raise ProtocolError(f"malformed record at {pos} of a pull of {queue_label(queue)}")
        m = _new(_PulledMessage)
        _set_r(m, body[pos:stop])
        _set_queue(m, queue)
        payload = body[pos + _BODY_AT : pos + _BODY_AT + body_len]
        if sys_flag & _COMPRESSED:
            try:
                payload = zlib.decompress(payload)
            except zlib.error:
                pass  # left as stored; sys_flag tells the caller
        _set_body(m, payload)
        append(m)
        pos = stop
    return out
