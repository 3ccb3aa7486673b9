"""Pulled records as lazy :class:`MessageExt` objects (the lite-pull and simple consumers' decoding).

A message holds the body and the record's raw header and properties bytes; properties, ids and host strings
are worked out on first access. That keeps the per-message cost of a pull at one small ``struct`` unpack and
three slices.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Mapping
from typing import Any

from cometmq.client.admin import queue_label
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.protocol.errors import ProtocolError, RemoteProtocolError
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY, SysFlag, host_string, inflate_body, unpack_host
from cometmq.protocol.names import RETRY_TOPIC_PREFIX as _RETRY_PREFIX
from cometmq.protocol.properties import RETRY_TOPIC, UNIQ_KEY, decode_properties
from cometmq.protocol.record_layout import (
    BORN_TIMESTAMP_POS,
    FLAG_POS,
    HOST_V6_FLAGS,
    LAYOUT_V4,
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    SYS_FLAG_POS,
    layout_for,
    record_layout,
)

__all__ = ["decode_pulled", "decode_pulled_within"]

log = logging.getLogger(__name__)

#: TOTALSIZE, MAGIC, SYSFLAG and BODYLEN (of a record with IPv4 hosts): all a pull needs to cut a record out
_CUT = LAYOUT_V4.struct_of("total_size", "magic_code", "sys_flag", "body_length")
_BODY_AT = LAYOUT_V4.body_pos
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_COMPRESSED = int(SysFlag.COMPRESSED)  # a plain int: IntFlag's & costs microseconds
_V6 = HOST_V6_FLAGS
_props_slot = MessageExt.__dict__["properties"]  # the base class's slot, used as the properties cache


def _host(rec: bytes, at: int, size: int) -> str:
    return host_string(unpack_host(rec[at : at + size]))


class _PulledMessage(MessageExt):
    """A MessageExt made from a pulled record without decoding it: ``body`` and ``queue`` are set, ``_r`` keeps
    the record's bytes (its COMPRESSED bit cleared when the body was inflated), and the other fields are read from
    them when asked for (properties once, then cached). Pickling and copying give a plain :class:`MessageExt`.
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
            layout = record_layout(rec)
            at = layout.body_pos + _I32.unpack_from(rec, layout.body_length_pos)[0]
            at += 1 + rec[at]  # (decode_pulled checked the body's length: the topic's length byte is there)
            n = _I16.unpack_from(rec, at)[0] if at + 2 <= len(rec) else -1
            if n < 0 or at + 2 + n > len(rec):
                raise RemoteProtocolError(f"the topic and properties of the record at offset {self.queue_offset} "
                                          f"of {queue_label(self.queue)} run past its end") from None
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
        layout = record_layout(rec)
        host = rec[layout.store_host_pos : layout.store_host_pos + layout.store_host_size]
        return f"{host.hex().upper()}{_I64.unpack_from(rec, PHYSICAL_OFFSET_POS)[0] & 0xFFFFFFFFFFFFFFFF:016X}"

    @property
    def msg_id(self) -> str:
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def flag(self) -> int:
        return _I32.unpack_from(self._r, FLAG_POS)[0]  # type: ignore[no-any-return]

    @property
    def queue_offset(self) -> int:
        return _I64.unpack_from(self._r, QUEUE_OFFSET_POS)[0]  # type: ignore[no-any-return]

    @property
    def commit_log_offset(self) -> int:
        return _I64.unpack_from(self._r, PHYSICAL_OFFSET_POS)[0]  # type: ignore[no-any-return]

    @property
    def sys_flag(self) -> int:
        return _I32.unpack_from(self._r, SYS_FLAG_POS)[0]  # type: ignore[no-any-return]

    @property
    def born_timestamp(self) -> int:
        return _I64.unpack_from(self._r, BORN_TIMESTAMP_POS)[0]  # type: ignore[no-any-return]

    @property
    def born_host(self) -> str:
        layout = record_layout(self._r)
        return _host(self._r, layout.born_host_pos, layout.born_host_size)

    @property
    def store_timestamp(self) -> int:
        return _I64.unpack_from(self._r, record_layout(self._r).store_timestamp_pos)[0]  # type: ignore[no-any-return]

    @property
    def store_host(self) -> str:
        layout = record_layout(self._r)
        return _host(self._r, layout.store_host_pos, layout.store_host_size)

    @property
    def reconsume_times(self) -> int:
        return _I32.unpack_from(self._r, record_layout(self._r).reconsume_times_pos)[0]  # type: ignore[no-any-return]

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


def _body_with_v6_hosts(body: bytes, pos: int, total: int, sys_flag: int) -> tuple[int, int]:
    """(where the body starts, its length) in a record with an IPv6 host; a negative length when the record is
    too short for its hosts (the caller refuses it)."""
    layout = layout_for(sys_flag)
    if total < layout.min_record_size or pos + total > len(body):
        return layout.body_pos, -1
    return layout.body_pos, _I32.unpack_from(body, pos + layout.body_length_pos)[0]


def _inflated(record: bytes, payload: bytes, queue: MessageQueue, limit: int, room: int | None
              ) -> tuple[bytes, bytes] | None:
    """(record, body) of a COMPRESSED record: the body inflated and the record's COMPRESSED bit cleared (as RocketMQ's
    MessageDecoder clears it), when the body inflates to at most ``limit`` bytes; else both as they are. With a
    ``room`` below ``limit``: None when the body does not inflate within it (the answer is cut there)."""
    inflated = inflate_body(payload, limit if room is None or room >= limit else room)
    if inflated is None:
        if room is not None and room < limit:
            return None  # over the room, or not inflating at all: the next pull starts here, with the whole limit
        log.warning("the compressed body of the message at offset %d of %s does not inflate to at most %d bytes "
                    "(max_inflated_body_size): delivered as stored, sys_flag COMPRESSED", _I64.unpack_from(
                        record, QUEUE_OFFSET_POS)[0], queue_label(queue), limit)
        return record, payload
    at = SYS_FLAG_POS + 3  # the low byte of the big-endian SYSFLAG
    return record[:at] + bytes((record[at] & ~_COMPRESSED,)) + record[at + 1 :], inflated


def decode_pulled(body: bytes, queue: MessageQueue, max_inflated: int = DEFAULT_MAX_INFLATED_BODY
                  ) -> list[MessageExt]:
    """The records of a pull response body as lazy :class:`MessageExt` objects; ProtocolError when malformed.

    Per record: one small unpack, two slices (the record, the body) and a bare object with three slots set. A
    COMPRESSED body is inflated when it inflates to at most ``max_inflated`` bytes (its COMPRESSED bit then
    cleared); else it stays as stored, the bit set.
    """
    return decode_pulled_within(body, queue, max_inflated, None)[0]


def decode_pulled_within(body: bytes, queue: MessageQueue, max_inflated: int, budget: int | None, *,
                         partial: bool = False) -> tuple[list[MessageExt], bool, int]:
    """:func:`decode_pulled`, the bodies of the messages returned summing to at most ``budget`` bytes (None: no
    bound) where COMPRESSED ones make them grow: (the messages, whether the answer was cut, their bodies' bytes).

    A few KiB of zlib inflate to megabytes, and the broker's limits on an answer count the stored bytes: one answer
    of 32 bodies stored at 16 KiB each could inflate to 512 MiB. The answer is cut before the first COMPRESSED
    record whose body does not inflate within what is left of ``budget``; the first record is always decoded (with
    the whole ``max_inflated``), so every pull makes progress. The caller pulls the rest again from the offset
    after the last message returned: nothing is dropped or skipped.

    ``partial``: a malformed record after the first is not an error either: the answer is cut before it (WARNING), and
    the next pull starts at it. The broker checks the first record of each run it serves (total size, magic code) and
    steps over one that does not match its consume-queue unit, logging it; a damaged record inside a run reaches the
    consumer, which would otherwise fail this answer, pull the same offset again, and never get past it.
    """
    out: list[MessageExt] = []
    append = out.append
    cut = _CUT.unpack_from
    v6 = _V6
    held = 0
    if budget is not None:
        budget = int(budget)  # (a fractional MiB threshold: zlib takes whole byte counts)
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < MIN_RECORD_SIZE:
            raise ProtocolError(f"truncated record at {pos} of a pull of {queue_label(queue)}")
        total, magic, sys_flag, body_len = cut(body, pos)
        stop = pos + total
        if sys_flag & v6:  # an IPv6 host moves the body length and the body
            body_at, body_len = _body_with_v6_hosts(body, pos, total, sys_flag)
        else:
            body_at = _BODY_AT
        if magic != MAGIC_CODE or total < MIN_RECORD_SIZE or stop > end or body_len < 0 \
                or body_len > total - (body_at + 3):
            if partial and out:
                log.warning("malformed record at %d of a pull of %s, after queue offset %d: the answer is cut before "
                            "it (the next pull starts there)", pos, queue_label(queue), out[-1].queue_offset)
                return out, True, held
            raise ProtocolError(f"malformed record at {pos} of a pull of {queue_label(queue)}")
        payload = body[pos + body_at : pos + body_at + body_len]
        if sys_flag & _COMPRESSED:
            got = _inflated(body[pos:stop], payload, queue, max_inflated,
                            None if budget is None or not out else max(budget - held, 0))
            if got is None:
                return out, True, held
            record, payload = got
        else:
            record = body[pos:stop]
        m = _new(_PulledMessage)
        _set_r(m, record)
        _set_queue(m, queue)
        _set_body(m, payload)
        append(m)
        held += len(payload)
        pos = stop
    return out, False, held
