"""Dispatch requests read straight from a segment's bytes: what a replica (or a recovery) dispatches for records
that came in as raw bytes.

``walk_records`` goes through a run of records in one buffer (no segment lookup or view per record), checks
each as ``commitlog.record_is_valid`` does (lengths adding up, no CRC) and reads only what the dispatcher needs.
The properties stay encoded: a ``RawProperties`` over their bytes (what the master's send path hands the
dispatcher too). The consume queue reads none of them, the index builder only UNIQ_KEY and KEYS (its C helper
searches the bytes), the tag code only TAGS; arrival listeners that look further (a SQL92 filter, the timer's
TIMER_OUT_MS) decode them on first use. They are checked to be UTF-8 here, so that decoding them later cannot
fail: a record whose topic or properties are not UTF-8 is *undecodable*, and the dispatch stops at it, as it
did when every record's properties were decoded on the spot.

The optional C helper (``_indexc.walk_records``) does the same walk; this Python function is the reference and
the fallback, and tests/store/test_record_walk.py holds the two (and ``CommitLog.scan`` followed by
``dispatch_request_from_record``) to the same requests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.properties import RawProperties, check_utf8
from cometmq.protocol.record_layout import (
    BLANK_MAGIC_CODE,
    HOST_FLAGS_BYTE,
    HOST_FLAGS_SHIFT,
    LAYOUT_V4,
    LAYOUTS,
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    QUEUE_ID_POS,
)
from cometmq.protocol.taghash import tags_code
from cometmq.store.message import DispatchRequest

#: Why a walk stopped; it returns the position it stopped at with it.
LIMIT = 0  #: it has ``limit`` requests: more may follow from the position
BLANK = 1  #: a blank segment tail starts at the position: the records go on in the next segment
SHORT = 2  #: fewer than 8 bytes are left before the end
INVALID = 3  #: the record at the position is incomplete before the end, or its lengths do not add up
UNDECODABLE = 4  #: the record at the position is whole, but its topic or properties are not UTF-8

_SIZE_MAGIC = LAYOUT_V4.struct_of("total_size", "magic_code").unpack_from
_I16 = struct.Struct(">h").unpack_from
#: per layout: its fields the dispatcher needs, unpacked at QUEUE_ID_POS; its smallest record; where the body starts
_LAYOUTS = tuple((layout.struct_of("queue_id", "queue_offset", "sys_flag", "store_timestamp", "body_length")
                  .unpack_from, layout.min_record_size, layout.body_pos) for layout in LAYOUTS)

Walk = Callable[[Any, int, int, int, int], tuple[list[DispatchRequest], int, int]]


def walk_records_py(buf: Any, pos: int, end: int, base: int, limit: int) -> tuple[list[DispatchRequest], int, int]:
    """Requests for the records from ``pos`` of ``buf`` (a segment's mapping, or any buffer that slices to bytes),
    at most ``limit`` of them, none reaching past ``end``; ``base`` is the log offset of ``buf[0]``.

    Returns the requests, where the walk stopped and why (``LIMIT``, ``BLANK``, ...)."""
    out: list[DispatchRequest] = []
    add = out.append
    count = 0
    last_topic_b = b""
    topic = ""
    while count < limit:
        if pos + 8 > end:
            return out, pos, SHORT
        size, magic = _SIZE_MAGIC(buf, pos)
        if magic != MAGIC_CODE:
            return out, pos, BLANK if magic == BLANK_MAGIC_CODE else INVALID
        rec_end = pos + size
        if size < MIN_RECORD_SIZE or rec_end > end:
            return out, pos, INVALID
        unpack, min_size, body_pos = _LAYOUTS[(buf[pos + HOST_FLAGS_BYTE] >> HOST_FLAGS_SHIFT) & 3]
        if size < min_size:
            return out, pos, INVALID
        queue_id, queue_offset, sys_flag, store_ts, body_len = unpack(buf, pos + QUEUE_ID_POS)
        p = pos + body_pos + body_len
        if body_len < 0 or p + 3 > rec_end:
            return out, pos, INVALID
        props_at = p + 1 + buf[p]
        if props_at + 2 > rec_end:
            return out, pos, INVALID
        (props_len,) = _I16(buf, props_at)
        props_at += 2
        if props_len < 0 or props_at + props_len != rec_end:
            return out, pos, INVALID
        topic_b = buf[p + 1 : props_at - 2]
        if topic_b != last_topic_b:  # a batch is one topic: decode its name once
            try:
                topic = topic_b.decode("utf-8")
            except UnicodeDecodeError:
                return out, pos, UNDECODABLE
            last_topic_b = topic_b
        raw = buf[props_at:rec_end]
        if not raw.isascii():
            try:
                check_utf8(raw)
            except ProtocolError:
                return out, pos, UNDECODABLE
        props = RawProperties(raw)
        add(DispatchRequest(topic, queue_id, base + pos, size, tags_code(props.get("TAGS")), store_ts, queue_offset,
                            sys_flag, props))
        count += 1
        pos = rec_end
    return out, pos, LIMIT


_C_HELPER: Any = load_c_helper("cometmq.store._indexc")
#: the C walk, or None (not built, an older build without it, or COMETMQ_PURE_PYTHON set)
C_WALK: Callable[..., tuple[list[DispatchRequest], int, int]] | None = getattr(_C_HELPER, "walk_records", None)


def _walk_c(buf: Any, pos: int, end: int, base: int, limit: int) -> tuple[list[DispatchRequest], int, int]:
    assert C_WALK is not None
    return C_WALK(buf, pos, end, base, limit, DispatchRequest, RawProperties)


#: the walk the commit log uses: C when built, else the reference
walk_records: Walk = _walk_c if C_WALK is not None else walk_records_py
