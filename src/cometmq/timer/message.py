"""Timer messages as records: the send-path rewrite, the re-put on delivery or roll, recall handles.

A producer asks for a delivery time with TIMER_DELIVER_MS (absolute ms), TIMER_DELAY_SEC or
TIMER_DELAY_MS (RocketMQ 5 property names; the delay forms win, as in RocketMQ). The broker stores
such a message under the timer topic ``rmq_sys_wheel_timer``, queue 0, with TIMER_OUT_MS (the
exact delivery time), REAL_TOPIC and REAL_QID, so it is durable before the ack. On delivery the
record is put back under its real topic and queue with every other property kept (UNIQ_KEY, so the
message id does not change, and TIMER_OUT_MS, so consumers see when it was due; the record's store
time is when it was delivered). TIMER_SRC_PHY names the timer record a delivered or rolled copy came
from, which lets crash recovery recognise what had already been put (no duplicates after kill -9).
"""

from __future__ import annotations

import binascii
import enum
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from sys import intern
from typing import TYPE_CHECKING

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import TRANSACTION_MASK
from cometmq.protocol.properties import (
    MAX_PROPERTIES_LENGTH,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    encode_properties,
)
from cometmq.protocol.record_layout import HOST_V6_FLAGS, LAYOUT_V4, LAYOUTS, MAGIC_CODE, layout_for
from cometmq.protocol.taghash import tags_code
from cometmq.store.message import TRANSACTION_PREPARED_TYPE, MessageInner

if TYPE_CHECKING:
    from cometmq.store.message_store import MessageStore

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
#: cometmq: the commit-log offset of the timer record a delivered or rolled copy was made from
TIMER_SRC_PHY = "TIMER_SRC_PHY"
RECALL_TAG = "_RECALL_TAG_"
_TIMER_REQUEST_KEYS = (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
#: the most a re-put adds to a parked message's encoded properties: a roll adds TIMER_ROLL_TIMES and TIMER_SRC_PHY,
#: each with its two separators and a value of at most 19 digits (a delivery adds less: it drops REAL_TOPIC and
#: REAL_QID). A timer message must leave this much room, or its roll or delivery would be refused by the store.
REPUT_GROWTH = len(TIMER_ROLL_TIMES) + len(TIMER_SRC_PHY) + 2 * (2 + 19)
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def delete_key(real_topic: str, uniq_key: str) -> str:
    """How a delete marker names the message it cancels (RocketMQ: ``topic + "+" + uniqKey``)."""
    return f"{real_topic}+{uniq_key}"


class Rewrite(enum.Enum):
    NOT_TIMER = "NOT_TIMER"
    #: parked under the timer topic
    SCHEDULED = "SCHEDULED"
    #: the delivery time has passed: stored as an ordinary message, delivered at once
    DUE_NOW = "DUE_NOW"
    ILLEGAL = "ILLEGAL"


@dataclass(frozen=True, slots=True)
class RewriteResult:
    outcome: Rewrite
    remark: str = ""
    deliver_ms: int = 0


def requested_delivery(props: Mapping[str, str], now_ms: int) -> int | None:
    """The delivery time a message asks for, None when it asks for none; ValueError when malformed."""
    if TIMER_DELAY_SEC in props:
        return now_ms + int(props[TIMER_DELAY_SEC]) * 1000
    if TIMER_DELAY_MS in props:
        return now_ms + int(props[TIMER_DELAY_MS])
    if TIMER_DELIVER_MS in props:
        return int(props[TIMER_DELIVER_MS])
    return None


def strip_timer_request(msg: MessageInner) -> None:
    """Drop timer requests from a message that has a delay level (the level wins, as in RocketMQ)."""
    if any(k in msg.properties for k in _TIMER_REQUEST_KEYS):
        props = msg.edit_properties()
        for k in _TIMER_REQUEST_KEYS:
            props.pop(k, None)


def rewrite_for_timer(msg: MessageInner, now_ms: int, max_delay_ms: int) -> RewriteResult:
    """Park a timer message under the timer topic, in place. Messages already converted (the timer
    topic, or TIMER_OUT_MS set) and prepared transactional halves are left alone."""
    props = msg.properties
    if not (TIMER_DELIVER_MS in props or TIMER_DELAY_SEC in props or TIMER_DELAY_MS in props):
        return RewriteResult(Rewrite.NOT_TIMER)
    if msg.topic == TIMER_TOPIC or TIMER_OUT_MS in props or msg.sys_flag & TRANSACTION_MASK == \
            TRANSACTION_PREPARED_TYPE:
        return RewriteResult(Rewrite.NOT_TIMER)
    try:
        deliver = requested_delivery(props, now_ms)
    except ValueError:
        return RewriteResult(Rewrite.ILLEGAL, "a timer property (TIMER_DELIVER_MS, TIMER_DELAY_SEC, "
                                              "TIMER_DELAY_MS) is not an integer")
    assert deliver is not None
    if deliver <= now_ms:
        if TIMER_DEL_UNIQKEY in props:
            return RewriteResult(Rewrite.ILLEGAL, "a delete marker for a time already past")
        return RewriteResult(Rewrite.DUE_NOW, deliver_ms=deliver)
    if deliver - now_ms > max_delay_ms:
        return RewriteResult(Rewrite.ILLEGAL, f"the delivery time is {(deliver - now_ms) // 1000} s ahead, more "
                                              f"than timerMaxDelaySec ({max_delay_ms // 1000} s)")
    parked = dict(props)
    parked[TIMER_OUT_MS] = str(deliver)
    parked[REAL_TOPIC] = msg.topic
    parked[REAL_QID] = str(msg.queue_id)
    try:
        raw: bytes | None = encode_properties(parked)
    except ProtocolError:
        raw = None  # (a property the store refuses anyway: its append says why)
    if raw is not None and len(raw) > MAX_PROPERTIES_LENGTH - REPUT_GROWTH:
        return RewriteResult(Rewrite.ILLEGAL, f"the properties of a timer message are {len(raw)} bytes once parked, "
                                              f"more than {MAX_PROPERTIES_LENGTH - REPUT_GROWTH} (its roll or "
                                              f"delivery adds up to {REPUT_GROWTH})")
    props = msg.edit_properties()
    props.update(parked)
    msg.properties_raw = raw  # (the same pairs in the same order: the append need not encode them again)
    msg.topic = TIMER_TOPIC
    msg.queue_id = 0
    return RewriteResult(Rewrite.SCHEDULED, deliver_ms=deliver)


# -- recall handles -------------------------------------------------------------------------------------
#: URL-safe base64 (base64.urlsafe_b64encode/decode, through binascii: a broker does not load base64 for it)
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """RocketMQ's v1 recall handle: ``"v1 topic brokerName timestamp uniqKey"``, URL-safe base64."""

    topic: str
    broker_name: str
    timestamp: str
    message_id: str

    def encode(self) -> str:
        raw = " ".join(("v1", self.topic, self.broker_name, self.timestamp, self.message_id))
        return binascii.b2a_base64(raw.encode("utf-8"), newline=False).translate(_TO_URLSAFE).decode("ascii")

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        if not handle:
            raise ValueError("recall handle is invalid")
        try:
            padded = handle.encode("ascii") + b"=" * (-len(handle) % 4)
            raw = binascii.a2b_base64(padded.translate(_FROM_URLSAFE)).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            raise ValueError("recall handle is invalid") from None
        items = raw.split(" ")
        if len(items) < 5 or items[0] != "v1":
            raise ValueError("recall handle is invalid")
        return cls(items[1], items[2], items[3], items[4])


def recall_handle_for(msg: MessageInner, broker_name: str) -> str | None:
    """The handle a send response carries for a message parked under the timer topic."""
    props = msg.properties
    if msg.topic != TIMER_TOPIC or TIMER_DEL_UNIQKEY in props:
        return None
    out, real, uniq = props.get(TIMER_OUT_MS), props.get(REAL_TOPIC), props.get(UNIQ_KEY)
    if out is None or real is None or uniq is None or real.startswith("%RETRY%"):
        return None
    # Our TIMER_OUT_MS is the exact time (RocketMQ floors it and adds 1 here); the marker made from
    # this handle lands in the same slot as the message.
    return RecallHandle(real, broker_name, out, uniq).encode()


def delete_marker(topic: str, uniq_key: str, deliver_ms: int, *, producer_group: str | None, born_ms: int,
                  born_host: bytes) -> MessageInner:
    """The message a recall stores: it names the cancelled message and is due when that one is.
    It still needs ``rewrite_for_timer`` to be parked under the timer topic."""
    props = {TAGS: RECALL_TAG, TIMER_DEL_UNIQKEY: delete_key(topic, uniq_key), UNIQ_KEY: uniq_key,
             TIMER_DELIVER_MS: str(deliver_ms)}
    if producer_group:
        props["PGROUP"] = producer_group
    return MessageInner(topic=topic, body=b"0", queue_id=0, properties=props, born_timestamp=born_ms,
                        born_host=born_host)


# -- re-put ---------------------------------------------------------------------------------------------
#: TOTALSIZE MAGIC FLAG QUEUEOFFSET SYSFLAG BORNTIMESTAMP BORNHOST RECONSUMETIMES BODYLEN: only what a re-put
#: needs, by layout (an IPv6 host moves the fields after it)
_FIELDS = tuple(layout.struct_of("total_size", "magic_code", "flag", "queue_offset", "sys_flag", "born_timestamp",
                                 "born_host", "reconsume_times", "body_length") for layout in LAYOUTS)
_FIELDS_V4 = _FIELDS[LAYOUT_V4.index]
_BODY_POS_V4 = LAYOUT_V4.body_pos
_TIMER_TOPIC_BYTES = TIMER_TOPIC.encode()
_SRC_PAIR = TIMER_SRC_PHY + "\x01"


@dataclass(slots=True)
class TimerRecord:
    """What the dequeue needs from a timer-topic record. ``properties`` and ``text`` (the encoded
    properties) belong to this record: the re-put functions consume them."""

    properties: dict[str, str]
    text: str
    body: bytes
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    reconsume_times: int
    queue_offset: int
    is_timer_topic: bool


def parse_timer_record(view: memoryview) -> TimerRecord | None:
    """Decode a stored record (None when it is not a well-formed one)."""
    try:
        total, magic, flag, qoff, sys_flag, born_ts, born_host, reconsume, body_len = _FIELDS_V4.unpack_from(view, 0)
        p = _BODY_POS_V4
        if sys_flag & HOST_V6_FLAGS:
            layout = layout_for(sys_flag)
            total, magic, flag, qoff, sys_flag, born_ts, born_host, reconsume, body_len = \
                _FIELDS[layout.index].unpack_from(view, 0)
            p = layout.body_pos
        if magic != MAGIC_CODE or total != len(view) or body_len < 0:
            return None
        body = bytes(view[p:p + body_len])
        p += body_len
        topic_len = view[p]
        is_timer = view[p + 1:p + 1 + topic_len] == _TIMER_TOPIC_BYTES
        p += 1 + topic_len
        (props_len,) = _I16.unpack_from(view, p)
        if props_len < 0 or p + 2 + props_len != total:
            return None
        text = bytes(view[p + 2:p + 2 + props_len]).decode("utf-8")
    except (ValueError, UnicodeError, struct.error, IndexError):
        return None
    props: dict[str, str] = {}
    for item in text.split("\x02"):
        name, sep, value = item.partition("\x01")
        if sep and name:
            props[intern(name)] = value  # names repeat in every record: share them
    return TimerRecord(props, text, body, flag, sys_flag, born_ts, born_host, reconsume, qoff, is_timer)


def _edit_properties(rec: TimerRecord, drop: list[tuple[str, str]], add: dict[str, str]) -> bytes:
    """The record's encoded properties without the ``drop`` pairs and with ``add`` (both already
    applied to ``rec.properties``), edited as text rather than re-encoded pair by pair."""
    text = "\x02" + rec.text
    if not text.endswith("\x02"):
        text += "\x02"
    for name, value in drop:
        text = text.replace(f"\x02{name}\x01{value}\x02", "\x02", 1)
    if any(f"\x02{name}\x01" in text for name, _ in drop):
        return encode_properties(rec.properties)  # a name given twice: encode the parsed properties
    return (text[1:] + "".join(f"{k}\x01{v}\x02" for k, v in add.items())).encode("utf-8")


def delivery_message(rec: TimerRecord, src_phy: int) -> MessageInner | None:
    """The record put back under its real topic and queue (None without a usable REAL_TOPIC)."""
    props = rec.properties
    topic = props.pop(REAL_TOPIC, None)
    qid = props.pop(REAL_QID, None)
    old_src = props.pop(TIMER_SRC_PHY, None)
    if not topic:
        return None
    try:
        queue_id = int(qid) if qid is not None else 0
    except ValueError:
        queue_id = 0
    drop = [(REAL_TOPIC, topic)]
    if qid is not None:
        drop.append((REAL_QID, qid))
    if old_src is not None:
        drop.append((TIMER_SRC_PHY, old_src))
    src = str(src_phy)
    props[TIMER_SRC_PHY] = src
    raw = _edit_properties(rec, drop, {TIMER_SRC_PHY: src})
    # The tag code is worked out here, when the message is read ahead, not when it is put.
    return MessageInner(topic=topic, body=rec.body, queue_id=queue_id, properties=props, properties_raw=raw,
                        flag=rec.flag, sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp,
                        born_host=rec.born_host, reconsume_times=rec.reconsume_times,
                        tags_code=tags_code(props.get(TAGS)))


def roll_message(rec: TimerRecord, src_phy: int) -> MessageInner:
    """The record put back under the timer topic, to be placed again nearer its time."""
    props = rec.properties
    try:
        props[TIMER_ROLL_TIMES] = str(int(props.get(TIMER_ROLL_TIMES, "0")) + 1)
    except ValueError:
        props[TIMER_ROLL_TIMES] = "1"
    props[TIMER_SRC_PHY] = str(src_phy)
    return MessageInner(topic=TIMER_TOPIC, body=rec.body, queue_id=0, properties=props,
                        properties_raw=encode_properties(props), flag=rec.flag, sys_flag=rec.sys_flag,
                        born_timestamp=rec.born_timestamp, born_host=rec.born_host,
                        reconsume_times=rec.reconsume_times)


def queued_records_floor(store: MessageStore, queue_offset: int = 0) -> int | None:
    """The commit-log offset of the timer topic's record at ``queue_offset`` (or its first kept one): below it, no
    record the timer has still to index. None when the queue holds none from there."""
    cq = store.queues.get((TIMER_TOPIC, 0))
    if cq is None:
        return None
    queue_offset = max(queue_offset, cq.min_offset)
    if queue_offset >= cq.max_offset:
        return None
    unit = cq.get_unit(queue_offset)
    return unit[0] if unit is not None else None
