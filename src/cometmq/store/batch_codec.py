"""The write path of a batch, per batch instead of per message: a plain SEND_BATCH_MESSAGE body into messages, the
messages into commit-log records (CRC, queue offsets, host bits) and dispatch requests, the requests into
consume-queue units, and the records' offset msgIds for the answer.

The optional C helper ``cometmq.store._batchc`` does each of these loops in one call; in Python they cost the
broker about 3.5 µs a message of a 128-message batch, most of its CPU on batched sends. The Python code is the
reference and the fallback when the helper is not built (or COMETMQ_PURE_PYTHON is set): the decode here
(:func:`plain_batch_messages_py`), the append in ``CommitLog.append``'s loop, the units in ``ConsumeQueue.put``.
tests/store/test_batch_codec.py compares both byte for byte, malformed bodies included. The record layout stays
owned by ``cometmq.protocol.record_layout``: the helper's copies of its constants are checked against it there.

The C code takes what it is sure of and hands everything else back: a body it would reject is decoded again by the
reference (which raises its error), a message needing anything unusual (a refusal, a record encoded ahead,
properties in a dict) makes ``measure`` answer None and the whole append runs in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.protocol.batch import decode_batch_raw
from cometmq.protocol.properties import RawProperties, check_utf8
from cometmq.store.message import DispatchRequest, MessageInner

#: the fields the C helper sets and reads, by name and in this order (it finds their slots by these names)
MESSAGE_FIELDS = ("topic", "body", "queue_id", "properties", "properties_raw", "flag", "sys_flag", "born_timestamp",
                  "born_host", "reconsume_times", "prepared_transaction_offset", "tags_code", "encoded", "batch_items")
RAW_FIELDS = ("_dict", "raw")
REQUEST_FIELDS = ("topic", "queue_id", "phy_offset", "size", "tags_code", "store_timestamp", "queue_offset",
                  "sys_flag", "properties")


def load_bound(module: str, *, requests: bool = True) -> Any:
    """The C helper ``module`` bound to MessageInner and RawProperties (and DispatchRequest with ``requests``), or
    None: not built, turned off, or the classes no longer have the fields it was written for (it makes objects
    without their ``__init__``, so a new field would be left unset: then Python does the work)."""
    helper = load_c_helper(module)
    if helper is None:
        return None
    if (tuple(f.name for f in fields(MessageInner)) != MESSAGE_FIELDS
            or tuple(f.name for f in fields(DispatchRequest)) != REQUEST_FIELDS
            or tuple(RawProperties.__slots__) != RAW_FIELDS):
        return None
    if requests:
        helper.bind(MessageInner, MESSAGE_FIELDS, RawProperties, RAW_FIELDS, DispatchRequest, REQUEST_FIELDS)
    else:
        helper.bind(MessageInner, MESSAGE_FIELDS, RawProperties, RAW_FIELDS)
    return helper


#: cometmq.store._batchc, bound to the classes above, or None
C_BATCH: Any = load_bound("cometmq.store._batchc")

PlainBatch = Callable[[bytes, str, int, int, int, bytes, int, tuple[bytes, ...]], list[MessageInner] | None]


def plain_batch_messages_py(body: bytes, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                            born_host: bytes, reconsume_times: int, markers: tuple[bytes, ...] = ()
                            ) -> list[MessageInner] | None:
    """A plain batch's messages (nothing will rewrite them), their properties kept encoded (RawProperties), checked
    as UTF-8 but not decoded. None when an item's properties hold one of ``markers`` (the names whose messages need
    the send's per-message checks): the batch is not plain. Any malformation raises ProtocolError, first."""
    items = decode_batch_raw(body)
    for _, raw, _ in items:
        check_utf8(raw)
    if markers and any(marker in raw for _, raw, _ in items for marker in markers):
        return None
    # Positional arguments (MESSAGE_FIELDS is checked against MessageInner's fields at import): half the cost.
    return [MessageInner(topic, item_body, queue_id, RawProperties(raw), raw, flag, sys_flag, born_timestamp,
                         born_host, reconsume_times) for item_body, raw, flag in items]


def _plain_batch_messages_c(body: bytes, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                            born_host: bytes, reconsume_times: int, markers: tuple[bytes, ...] = ()
                            ) -> list[MessageInner] | None:
    msgs: list[MessageInner] | bool | None = C_BATCH.decode_plain(body, topic, queue_id, sys_flag, born_timestamp,
                                                                  born_host, reconsume_times, markers)
    if msgs is None:  # malformed: the reference says how
        return plain_batch_messages_py(body, topic, queue_id, sys_flag, born_timestamp, born_host, reconsume_times,
                                       markers)
    if isinstance(msgs, bool):  # False: a marker, the batch is not plain
        return None
    return msgs


#: what the send path uses: C when built, else the reference
plain_batch_messages: PlainBatch = _plain_batch_messages_c if C_BATCH is not None else plain_batch_messages_py


def plain_batch_count_py(body: bytes, markers: tuple[bytes, ...] = ()) -> int | None:
    """How many messages :func:`plain_batch_messages` makes of ``body``, checked as it checks them, without making
    them (what a later append of the body as ``MessageInner.batch_items`` records needs): None when an item's
    properties hold one of ``markers``; ProtocolError when malformed."""
    msgs = plain_batch_messages_py(body, "", 0, 0, 0, b"", 0, markers)
    return None if msgs is None else len(msgs)


def _plain_batch_count_c(body: bytes, markers: tuple[bytes, ...] = ()) -> int | None:
    got: int | bool | None = C_BATCH.count_plain(body, markers)
    if got is None:  # malformed: the reference says how
        return plain_batch_count_py(body, markers)
    if isinstance(got, bool):  # False: a marker
        return None
    return got


#: C when built, else the reference
plain_batch_count: Callable[..., int | None] = _plain_batch_count_c if C_BATCH is not None else plain_batch_count_py


def offset_msg_ids_py(prefix: str, records: list[DispatchRequest]) -> str:
    """A send answer's msgId: each record's offset msgId (``prefix``, the store host's part of protocol/msgid's
    ``offset_msg_id``, + 16 hex digits of its commit-log offset, never negative), joined by commas. One %-format over
    all offsets: a third of the cost of an f-string per message."""
    offsets = tuple([r.phy_offset for r in records])
    return ((prefix + "%016X,") * len(offsets) % offsets)[:-1]


def _offset_msg_ids_c(prefix: str, records: list[DispatchRequest]) -> str:
    ids: str | None = C_BATCH.offset_ids(prefix, records)
    return ids if ids is not None else offset_msg_ids_py(prefix, records)


#: what a send answer uses: C when built, else the reference
offset_msg_ids: Callable[[str, list[DispatchRequest]], str] = (
    _offset_msg_ids_c if C_BATCH is not None else offset_msg_ids_py)
