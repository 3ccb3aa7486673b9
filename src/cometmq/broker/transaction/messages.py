"""The records of the transaction design, built from and read back as plain values (no I/O).

RocketMQ's design, kept here:

- A *half* message is the producer's message stored under ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with its real
  topic and queue in ``REAL_TOPIC`` / ``REAL_QID`` and the transaction bits of its sys flag cleared, so the
  dispatcher gives it a consume-queue unit in the half topic (never in the real topic).
- An *op* record under ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (tag ``d``) says "done": its body is the half queue
  offsets it resolves, comma-separated.
- Each check-back re-appends the half (a *copy*) with ``TRANSACTION_CHECK_TIMES`` + 1, so the count survives a
  restart. Copies name their first half in ``TRAN_PREPARED_QUEUE_OFFSET`` (RocketMQ uses that property on its
  renewed halves for the same purpose); a transaction is identified by that *origin* offset, whichever copy a
  producer's END_TRANSACTION names. That is what keeps a commit from being delivered twice.
- The committed message goes back to the real topic and queue with the COMMIT sys flag; it keeps the
  producer's properties (UNIQ_KEY, KEYS, TAGS, user properties) minus the broker's bookkeeping ones.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import re
import struct
from collections.abc import Callable, Mapping
from operator import methodcaller
from typing import Any

from cometmq.broker.transaction.front import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC
from cometmq.protocol.batch import ITEM_OVERHEAD
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import TRANSACTION_MASK, MessageRecord, decode_record, encode_record, pack_host
from cometmq.protocol.properties import (
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    RawProperties,
    encode_properties,
)
from cometmq.protocol.record_layout import HOST_FLAGS_BYTE, HOST_FLAGS_SHIFT, LAYOUTS, MAGIC_CODE, MIN_RECORD_SIZE
from cometmq.protocol.taghash import tags_code
from cometmq.protocol.transaction_batch import PACKED_PROPERTY
from cometmq.store.batch_codec import load_bound, plain_batch_count
from cometmq.store.message import TRANSACTION_COMMIT_TYPE, MessageInner

REMOVE_TAG = "d"
#: Property keys (RocketMQ MessageConst).
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
#: cometmq's own: on a renewed half (:func:`renewed`), the store time (ms) its next check counts from
TRAN_CHECK_FROM_MS = "TRAN_CHECK_FROM_MS"
#: Properties that only the broker's bookkeeping needs; the committed message goes out without them.
_BOOKKEEPING = (REAL_TOPIC, REAL_QID, TRAN_MSG, TRAN_PREPARED_QUEUE_OFFSET, TRAN_CHECK_FROM_MS)
#: properties a producer's half must not bring: the broker sets them (or drops them)
_SET_BY_BROKER = (REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES, TRAN_PREPARED_QUEUE_OFFSET, TRAN_CHECK_FROM_MS)
#: the C helper (broker/transaction/_txc.c) bound to MessageInner and RawProperties, or None (Python does it all)
C_TX: Any = load_bound("cometmq.broker.transaction._txc", requests=False)


def to_half(msg: MessageInner, producer_group: str) -> tuple[str, str | None]:
    """Turn a producer's transactional message into its half, in place; its PGROUP and
    CHECK_IMMUNITY_TIME_IN_SECONDS (None when absent), which the transaction table keeps."""
    props_in = msg.properties
    raw = msg.properties_raw
    if type(props_in) is RawProperties and raw is not None:
        # A half batch's items as the SDK sends them (properties still encoded): the two pairs appended to the
        # encoded properties rather than all of them decoded and encoded again (a few µs a half); the same
        # properties as the dict path below makes. Names and values hold no 0x01 or 0x02, so with a 0x02 in front
        # and at the end "0x02 name 0x01" is found exactly where a pair of that name starts.
        lead = b"\x02" + raw if raw.endswith(b"\x02") else b"\x02" + raw + b"\x02"
        tran = lead.rfind(_TRAN_MSG_AT)  # the last pair of a name wins, as decode_properties reads them
        group_at = lead.rfind(_PGROUP_AT)
        if (tran >= 0 and lead.startswith(b"true\x02", tran + len(_TRAN_MSG_AT)) and group_at >= 0
                and lead[group_at + len(_PGROUP_AT)] != 2 and lead.count(b"\x02TRAN") == 1
                and b"\x02REAL_" not in lead):  # no pair of _SET_BY_BROKER (nor another named TRAN…/REAL_…)
            group = _value_at(lead, group_at + len(_PGROUP_AT))
            immunity_at = lead.rfind(_IMMUNITY_AT)
            immunity = None if immunity_at < 0 else _value_at(lead, immunity_at + len(_IMMUNITY_AT))
            raw = lead[1:] + f"{REAL_TOPIC}\x01{msg.topic}\x02{REAL_QID}\x01{msg.queue_id}\x02".encode()
            # Still encoded (RawProperties): the store's C append computes the tag code from TAGS, as Python's would.
            msg.properties, msg.properties_raw, msg.encoded = RawProperties(raw), raw, None
            msg.topic, msg.queue_id, msg.tags_code = HALF_TOPIC, 0, None
            msg.sys_flag &= ~TRANSACTION_MASK
            return group, immunity
    props = msg.edit_properties()
    props[REAL_TOPIC] = msg.topic
    props[REAL_QID] = str(msg.queue_id)
    props[TRAN_MSG] = "true"
    if not props.get(PGROUP):
        props[PGROUP] = producer_group
    for name in _SET_BY_BROKER[2:]:  # (REAL_TOPIC and REAL_QID: set above)
        props.pop(name, None)
    msg.properties_raw = None
    msg.topic = HALF_TOPIC
    msg.queue_id = 0
    msg.sys_flag &= ~TRANSACTION_MASK
    msg.tags_code = None
    return props[PGROUP], props.get(CHECK_IMMUNITY_TIME_IN_SECONDS)


def to_halves(msgs: list[MessageInner]) -> list[tuple[str, str | None]] | None:
    """:func:`to_half` of each of a half batch's messages in one C call (broker/transaction/_txc.c), with what it
    returns; None, nothing changed, when the helper is not built or a message is not one it takes (then
    :func:`to_half` makes each). tests/broker/test_transaction_state.py compares the two."""
    if C_TX is None:
        return None
    kept: list[tuple[str, str | None]] | None = C_TX.to_halves(
        msgs, HALF_TOPIC, 0, TRAN_MSG.encode(), PGROUP.encode(), CHECK_IMMUNITY_TIME_IN_SECONDS.encode(),
        (b"TRAN", b"REAL_"), REAL_TOPIC.encode(), REAL_QID.encode(), TRANSACTION_MASK)
    return kept


#: bytes of a stored record besides its body, topic and properties (v1 layout, IPv6 hosts), with some room: what a
#: batched END counts per commit to keep its appends under maxMessageSize
RECORD_OVERHEAD = 128
_TRAN_MSG_AT = b"\x02" + TRAN_MSG.encode() + b"\x01"
_PGROUP_AT = b"\x02" + PGROUP.encode() + b"\x01"
_IMMUNITY_AT = b"\x02" + CHECK_IMMUNITY_TIME_IN_SECONDS.encode() + b"\x01"
assert all(k.startswith(("TRAN", "REAL_")) for k in _SET_BY_BROKER)  # what to_half's byte test looks for


def _value_at(lead: bytes, start: int) -> str:
    return lead[start:lead.index(b"\x02", start)].decode("utf-8")


def origin_of(properties: Mapping[str, str], queue_offset: int) -> int:
    """The half queue offset that identifies the transaction a half record belongs to."""
    return _origin(properties.get(TRAN_PREPARED_QUEUE_OFFSET), queue_offset)


def check_times_of(properties: Mapping[str, str]) -> int:
    try:
        return max(0, int(properties.get(TRANSACTION_CHECK_TIMES, "0")))
    except ValueError:
        return 0


def immunity_ms(properties: Mapping[str, str], timeout_ms: int) -> int:
    """How long after its store time a half is left alone: the producer's CHECK_IMMUNITY_TIME_IN_SECONDS when
    longer than ``transactionTimeOut``, else the timeout (RocketMQ's ``getImmunityTime``)."""
    return immunity_of(properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS), timeout_ms)


def due_ms(properties: Mapping[str, str], store_timestamp: int, timeout_ms: int, interval_ms: int) -> int:
    """When the transaction of a half record (its latest) is checked next: its first check :func:`immunity_ms` after
    the half was stored, a later one ``interval_ms`` after the last check's copy was; a renewed record counts from
    the store time it carries (TRAN_CHECK_FROM_MS: its original's) instead of its own."""
    carried = properties.get(TRAN_CHECK_FROM_MS)
    start = int(carried) if carried is not None and carried.isdigit() else store_timestamp
    return start + (immunity_ms(properties, timeout_ms) if check_times_of(properties) == 0 else interval_ms)


def immunity_of(value: str | None, timeout_ms: int) -> int:
    """:func:`immunity_ms` of the property's value (None: absent)."""
    try:
        wanted = int(value or "0") * 1000
    except ValueError:
        wanted = 0
    return max(wanted, timeout_ms)


def _inner(rec: MessageRecord, topic: str, queue_id: int, props: dict[str, str], sys_flag: int) -> MessageInner:
    return MessageInner(topic=topic, body=rec.body, queue_id=queue_id, properties=props, flag=rec.flag,
                        sys_flag=sys_flag, born_timestamp=rec.born_timestamp, born_host=pack_host(*rec.born_host),
                        reconsume_times=rec.reconsume_times)


def copy_for_check(rec: MessageRecord, origin: int, check_times: int) -> MessageInner:
    """The re-appended half of a check-back: same message, one more check counted, pointing at its origin (its next
    check counts from its own store time)."""
    props = dict(rec.properties)
    props[TRANSACTION_CHECK_TIMES] = str(check_times)
    props[TRAN_PREPARED_QUEUE_OFFSET] = str(origin)
    props.pop(TRAN_CHECK_FROM_MS, None)
    return _inner(rec, HALF_TOPIC, 0, props, rec.sys_flag)


def renewed(rec: MessageRecord, origin: int) -> MessageInner:
    """A pending half's latest record appended again before its check is due (RocketMQ re-appends a half still
    immune from checks), so that the restart progress moves past it: the same message and check count, pointing
    at its origin, and carrying the store time its next check counts from (TRAN_CHECK_FROM_MS: the renewed
    record's own, or the one it carries), so :func:`due_ms` of the copy is that of the record it renews."""
    props = dict(rec.properties)
    props[TRAN_PREPARED_QUEUE_OFFSET] = str(origin)
    props.setdefault(TRAN_CHECK_FROM_MS, str(rec.store_timestamp))
    return _inner(rec, HALF_TOPIC, 0, props, rec.sys_flag)


def real_destination(rec: MessageRecord) -> tuple[str, int]:
    topic = rec.properties.get(REAL_TOPIC, "")
    try:
        queue_id = int(rec.properties.get(REAL_QID, "0"))
    except ValueError:
        queue_id = 0
    return topic, queue_id


class StoredHalf:
    """A stored record as an END_TRANSACTION reads the half it names (:func:`read_half`): what its checks need
    (topic, commit-log and queue offsets, producer group), the transaction it belongs to (``origin``), and what
    :func:`committed` builds the delivered message from.

    Read one of two ways, to the same values: a half as the broker writes it (its properties *plain*: each pair
    ``name 0x01 value 0x02``, no name empty or twice, no 0x01 in a value) without decoding it (``record`` None,
    ``data`` its bytes); any other record decoded in full (``record``), the reference."""

    __slots__ = ("data", "group", "origin", "physical_offset", "queue_offset", "record", "topic")

    def __init__(self, topic: str, physical_offset: int, queue_offset: int, group: str, origin: int,
                 record: MessageRecord | None, data: bytes = b"") -> None:
        self.topic = topic
        self.physical_offset = physical_offset
        self.queue_offset = queue_offset
        #: PGROUP, "" when it has none
        self.group = group
        self.origin = origin
        self.record = record
        self.data = data

    @classmethod
    def from_record(cls, rec: MessageRecord) -> StoredHalf:
        return cls(rec.topic, rec.physical_offset, rec.queue_offset, rec.properties.get(PGROUP, ""),
                   origin_of(rec.properties, rec.queue_offset), rec)


def read_half(view: bytes | bytearray | memoryview) -> StoredHalf | None:
    """The whole stored record ``view`` (as ``MessageStore.read_record`` gives it) read as the half an END names;
    None when it cannot be decoded. Any record is read (the caller checks that it is a half)."""
    data = bytes(view)
    fields = _half_fields(data)
    if fields is None:
        try:
            rec = decode_record(data)[0]
        except ProtocolError:
            return None
        return StoredHalf.from_record(rec)
    queue_offset, phy, group, prepared = fields
    return StoredHalf(HALF_TOPIC, phy, queue_offset, group, _origin(prepared, queue_offset), None, data)


def committed(half: StoredHalf | MessageRecord, half_commit_log_offset: int) -> MessageInner:
    """The message a commit delivers: back in its real topic and queue, with the COMMIT sys flag and its tag code;
    its properties are the half's without the bookkeeping ones, in their order, encoded here (a batched END sizes
    its appends by them). Of a half read from its bytes, built from them: the message :func:`committed_reference`
    makes of the decoded record (tests/broker/test_transaction_commit_bytes.py compares them)."""
    if isinstance(half, MessageRecord):
        return committed_reference(half, half_commit_log_offset)
    if half.record is not None:
        return committed_reference(half.record, half_commit_log_offset)
    msg = _committed_plain(half.data, half_commit_log_offset)
    if msg is None:  # (the C helper leaves an unusual REAL_QID to Python's int())
        msg = _committed_plain_py(half.data, half_commit_log_offset)
    if msg is None:
        raise ValueError("committed: the half's record changed since read_half")
    return msg


#: a packed half's property as it starts in encoded properties (at their start, or after a 0x02)
_PACKED_AT = PACKED_PROPERTY.encode() + b"\x01"
#: what an item of a packed half may not hold (a byte search of its properties, as the send path's): a delay or
#: timer property, as the commit appends the items as they are (no send hook sees them)
_PACKED_REFUSED = (b"DELAY\x01", b"TIMER_")
_COMPRESSED = 0x1


#: the search behind :func:`holds_packed`, of any buffer (a region of the log: no copy) and a span of it
_PACKED_FIND = re.compile(re.escape(_PACKED_AT)).search


def holds_packed(raw: bytes | bytearray | memoryview) -> bool:
    """Whether encoded properties, or records holding them, may hold :data:`PACKED_PROPERTY` (a byte search: a
    name ending in it, or a body holding its bytes, hits too)."""
    return _PACKED_FIND(raw) is not None


def packed_count(msg: MessageInner) -> int | None:
    """How many messages a packed half (protocol/transaction_batch.py) says it holds; None when ``msg`` is not
    one. ValueError for a value that is not a count."""
    value = msg.properties.get(PACKED_PROPERTY)
    if value is None:
        return None
    if not value.isdigit() or not 0 < int(value) <= 1 << 31:
        raise ValueError(f"{PACKED_PROPERTY}={value[:40]!r} is not a count of messages")
    return int(value)


def check_packed(msg: MessageInner, count: int) -> None:
    """Whether the packed half ``msg`` (its body a batch of ``count`` messages) can be unpacked as its commit
    appends it (``MessageInner.batch_items``): ValueError naming what is wrong: compressed, not a batch, an item with
    a delay or timer property, another number of items."""
    if msg.sys_flag & _COMPRESSED:
        raise ValueError("a packed half's body may not be compressed")
    try:
        got = plain_batch_count(msg.body, _PACKED_REFUSED)
    except ProtocolError as exc:
        raise ValueError(f"a packed half's body is not a batch: {exc}") from None
    if got is None:
        raise ValueError("a packed half's message may not hold a delay or timer property")
    if got != count:
        raise ValueError(f"a packed half's body holds {got} messages, not {PACKED_PROPERTY}={count}")


def commit_messages(half: StoredHalf, half_commit_log_offset: int) -> tuple[MessageInner, int]:
    """What a commit of ``half`` delivers: :func:`committed`'s message, of a packed half appended as the messages
    its body holds (``batch_items``: each with the half's offset as its prepared transaction offset, as a committed
    message has); and its size estimate for a batched END's appends (the message's body, topic, properties and
    :data:`RECORD_OVERHEAD`; of a packed half, from its body's length: an item there is its body and properties and
    ``ITEM_OVERHEAD`` bytes). ValueError when a packed half cannot be unpacked (its send checked it: only a record
    changed since would fail)."""
    msg = committed(half, half_commit_log_offset)
    count = packed_count(msg)
    if count is None:
        return msg, len(msg.body) + len(msg.topic) + RECORD_OVERHEAD + len(msg.properties_raw or b"")
    check_packed(msg, count)
    msg.batch_items = count
    return msg, unpacked_size(msg, count)


def unpacked_size(msg: MessageInner, count: int) -> int:
    """What the ``count`` messages of the packed half ``msg`` take in the log at most (each item of its body is its
    body and properties and ``ITEM_OVERHEAD`` bytes; each record those, the topic and :data:`RECORD_OVERHEAD`)."""
    return len(msg.body) + count * (len(msg.topic.encode()) + RECORD_OVERHEAD - ITEM_OVERHEAD)


_Read = tuple[list[int], list[int], list[MessageInner] | None, list[int], list[int]]


def commit_records(records: list[memoryview] | memoryview, limit: int, first: int, first_phy: int, group: str,
                   commit: bool) -> _Read | None:
    """Stored records of the half queue from queue offset ``first`` on (a list of records, or a region of the log
    holding up to ``limit`` of them back to back: as many as lie wholly in it), each checked as a batched END checks
    the half it names (a half of ``group`` at that offset, the first at commit-log offset ``first_phy`` unless that
    is negative): their origins, commit-log offsets, with ``commit`` the messages :func:`committed` makes of them,
    each one's size estimate for the END's appends, and its record's size. None when one is not a plain half that
    passes (the caller then reads them one by one, which names the problem), none was read, or the C helper is not
    built."""
    if C_TX is None:
        return None
    got: _Read | None = C_TX.commit_records(
        records, limit, first, first_phy, group.encode(), _HALF_TOPIC_PART, _PGROUP_B, _PREPARED_B, _BOOKKEEPING_B,
        _REAL_TOPIC_B, _REAL_QID_B, commit, RECORD_OVERHEAD)
    # A packed half among them commits as a message of batch_items (commit_messages), which the C helper does not
    # make: the caller reads them one by one. Only the records read are searched, where they lie (no copy).
    if got is not None and (any(_PACKED_FIND(v) for v in records[:len(got[0])]) if isinstance(records, list)
                            else _PACKED_FIND(records, 0, sum(got[4]))):
        return None
    return got


def _origin(prepared: str | None, queue_offset: int) -> int:
    if prepared:
        try:
            return int(prepared)
        except ValueError:
            pass
    return queue_offset


# -- plain halves: read from their bytes (the C helper broker/transaction/_txc.c does the same) --------------------
_HALF_TOPIC_PART = bytes((len(HALF_TOPIC),)) + HALF_TOPIC.encode()
#: what a plain half's reading needs of its record, from its start, by layout: TOTALSIZE MAGICCODE FLAG QUEUEOFFSET
#: PHYSICALOFFSET SYSFLAG BORNTIMESTAMP BORNHOST RECONSUMETIMES BODYLEN
_HALF_HEAD = tuple(layout.struct_of("total_size", "magic_code", "flag", "queue_offset", "physical_offset",
                                    "sys_flag", "born_timestamp", "born_host", "reconsume_times", "body_length")
                   for layout in LAYOUTS)
_BODY_POS = tuple(layout.body_pos for layout in LAYOUTS)
_MIN_SIZE = tuple(layout.min_record_size for layout in LAYOUTS)
_I16 = struct.Struct(">h")
_split_pair = methodcaller("split", b"\x01", 1)
_PGROUP_B = PGROUP.encode()
_PREPARED_B = TRAN_PREPARED_QUEUE_OFFSET.encode()
_REAL_TOPIC_B = REAL_TOPIC.encode()
_REAL_QID_B = REAL_QID.encode()
_TAGS_B = TAGS.encode()
_BOOKKEEPING_B = tuple(k.encode() for k in _BOOKKEEPING)
#: the start of an IPv4-mapped IPv6 address, which pack_host (the reference's) packs as the IPv4 address
_V4_MAPPED = bytes(10) + b"\xff\xff"
_PlainHalf = tuple[tuple[int, int, int, int, int, int, bytes, int, int], bytes, dict[bytes, bytes]]


def _plain_half_py(data: bytes) -> _PlainHalf | None:
    """A whole record of the half topic with plain properties in UTF-8 (lengths checked as ``decode_record`` checks
    them): its fixed fields (QUEUEOFFSET PHYSICALOFFSET FLAG SYSFLAG BORNTIMESTAMP RECONSUMETIMES BORNHOST, where its
    body starts and its length), its properties' bytes and pairs; None for anything else."""
    n = len(data)
    if n < MIN_RECORD_SIZE:
        return None
    index = (data[HOST_FLAGS_BYTE] >> HOST_FLAGS_SHIFT) & 3
    if n < _MIN_SIZE[index]:
        return None
    total, magic, flag, queue_offset, phy, sys_flag, born_ts, born, reconsume, body_len = \
        _HALF_HEAD[index].unpack_from(data)
    body_at = _BODY_POS[index]
    p = body_at + body_len
    topic_end = p + len(_HALF_TOPIC_PART)
    if (total != n or magic != MAGIC_CODE or body_len < 0 or topic_end + 2 > n
            or data[p:topic_end] != _HALF_TOPIC_PART):
        return None
    (props_len,) = _I16.unpack_from(data, topic_end)
    raw = data[topic_end + 2:]
    if props_len != len(raw):  # (a negative length too)
        return None
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    pairs = raw.split(b"\x02")
    if pairs.pop():  # the last pair does not end with 0x02
        return None
    try:
        props = dict(map(_split_pair, pairs))  # ValueError: a pair without 0x01
    except ValueError:
        return None
    if len(props) != len(pairs) or raw.count(1) != len(pairs) or b"" in props:
        return None
    return (queue_offset, phy, flag, sys_flag, born_ts, reconsume, born, body_at, body_len), raw, props


def _half_fields_py(data: bytes) -> tuple[int, int, str, str | None] | None:
    """A plain half's queue offset, commit-log offset, PGROUP ("" when absent) and TRAN_PREPARED_QUEUE_OFFSET
    (None when absent); None for any other record."""
    plain = _plain_half_py(data)
    if plain is None:
        return None
    fields, _, props = plain
    prepared = props.get(_PREPARED_B)
    return fields[0], fields[1], props.get(_PGROUP_B, b"").decode(), None if prepared is None else prepared.decode()


def _committed_plain_py(data: bytes, half_commit_log_offset: int) -> MessageInner | None:
    """:func:`committed_reference` of a plain half, from its bytes: its pairs of bookkeeping properties cut out
    (each pair starts after a 0x02, the first after the one put in front, so "0x02 name 0x01 value 0x02" is that
    pair), the rest of the message taken as stored (an IPv4-mapped born host packed as IPv4, as pack_host does)."""
    plain = _plain_half_py(data)
    if plain is None:
        return None
    (_, _, flag, sys_flag, born_ts, reconsume, born, body_at, body_len), raw, props = plain
    present = [k for k in _BOOKKEEPING_B if k in props]
    if present:
        edited = b"\x02" + raw
        for k in present:
            edited = edited.replace(b"\x02" + k + b"\x01" + props[k] + b"\x02", b"\x02", 1)
        raw = edited[1:]
    try:
        queue_id = int(props.get(_REAL_QID_B, b"0").decode())
    except ValueError:
        queue_id = 0
    if len(born) == 20 and born[:12] == _V4_MAPPED:
        born = born[12:]
    # Positional: MessageInner's fields in order (store/batch_codec.py checks that order).
    return MessageInner(props.get(_REAL_TOPIC_B, b"").decode(), data[body_at:body_at + body_len], queue_id,
                        RawProperties(raw), raw, flag, (sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE,
                        born_ts, born, reconsume, half_commit_log_offset,
                        tags_code(props.get(_TAGS_B, b"").decode()))


#: what END_TRANSACTION uses: the C helper when built (bound to the names above), else the Python above
_half_fields: Callable[[bytes], tuple[int, int, str, str | None] | None] = _half_fields_py
_committed_plain: Callable[[bytes, int], MessageInner | None] = _committed_plain_py
if C_TX is not None:
    _half_fields = functools.partial(C_TX.half_fields, _HALF_TOPIC_PART, _PGROUP_B, _PREPARED_B)
    _committed_plain = functools.partial(C_TX.committed_half, _HALF_TOPIC_PART, _BOOKKEEPING_B, _REAL_TOPIC_B,
                                         _REAL_QID_B)


def committed_reference(rec: MessageRecord, half_commit_log_offset: int) -> MessageInner:
    """:func:`committed` of a decoded half record (any record: what it does for halves it cannot read from their
    bytes, and what tests compare it with)."""
    topic, queue_id = real_destination(rec)
    props = {k: v for k, v in rec.properties.items() if k not in _BOOKKEEPING}
    msg = _inner(rec, topic, queue_id, props, (rec.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE)
    msg.properties_raw = encode_properties(props)
    msg.prepared_transaction_offset = half_commit_log_offset
    msg.tags_code = tags_code(props.get(TAGS))  # (what the append computes: set here, as the C helper sets it)
    return msg


def discarded(rec: MessageRecord) -> MessageInner:
    """A half checked ``transactionCheckMax`` times, kept for inspection under TRANS_CHECK_MAX_TIME_TOPIC."""
    props = dict(rec.properties)
    props.pop(TRAN_CHECK_FROM_MS, None)
    return _inner(rec, CHECK_MAX_TOPIC, 0, props, rec.sys_flag & ~TRANSACTION_MASK)


_OP_PROPERTIES_RAW = encode_properties({TAGS: REMOVE_TAG})
_OP_TAGS_CODE = tags_code(REMOVE_TAG)


def op_body(offsets: list[int]) -> bytes:
    """An op record's body: the offsets ascending, each once, comma-separated. Offsets already strictly increasing
    (a range of halves that are their own origins: the usual batched commit) are taken as they are, and all are
    formatted by one bytes ``%`` (no str per offset): the bytes :func:`op_body_reference` makes
    (tests/broker/test_transaction_state.py compares them)."""
    ordered = offsets if all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))) else sorted(set(offsets))
    return (b"%d," * len(ordered) % tuple(ordered))[:-1]


def op_body_reference(offsets: list[int]) -> bytes:
    """:func:`op_body` as plainly written."""
    return ",".join(map(str, sorted(set(offsets)))).encode()


def op_record(offsets: list[int], born_ms: int) -> MessageInner:
    body = op_body(offsets)
    # Its properties and tag code given encoded: the append of a commit batch then takes the store's C path.
    return MessageInner(topic=OP_TOPIC, body=body, queue_id=0, properties={TAGS: REMOVE_TAG},
                        properties_raw=_OP_PROPERTIES_RAW, born_timestamp=born_ms, tags_code=_OP_TAGS_CODE)


def parse_op_body(body: bytes) -> list[int]:
    """The half queue offsets an op record resolves; malformed parts are skipped."""
    out: list[int] = []
    for part in body.decode("ascii", "replace").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def check_request_body(rec: MessageRecord) -> bytes:
    """The message a CHECK_TRANSACTION_STATE carries: the half record as stored, shown with its real topic and
    queue (as RocketMQ's broker sends it), so the producer's checker sees the message it sent."""
    topic, queue_id = real_destination(rec)
    return encode_record(dataclasses.replace(rec, topic=topic, queue_id=queue_id))
