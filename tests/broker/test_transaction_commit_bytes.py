"""How a commit builds the delivered message from the stored half (broker/transaction/messages.py: ``read_half``
and ``committed``, which read the half's bytes without decoding it) against the reference: the half decoded,
``committed_reference`` (what the broker did before), encoded. For any stored record: the same reading of what an
END checks (topic, offsets, producer group, origin), and the same committed record byte for byte (properties and
their order, flags, hosts, tag code), or the same error; the C helper (store/_batchc.c) and the pure-Python reading
alike. Then appended through real stores (the C and the Python append), and end to end through a broker: every
committed record in the log is what the reference builds from its half."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cometmq.broker.transaction import HALF_TOPIC
from cometmq.broker.transaction import messages as tm
from cometmq.protocol import record_layout
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MessageRecord, decode_record, encode_parts, pack_host
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.properties import KEYS, PGROUP, REAL_QID, REAL_TOPIC, TAGS, TRAN_MSG, UNIQ_KEY, encode_properties
from cometmq.protocol.remoting import make_request
from cometmq.protocol.transaction_batch import HALF_BATCH_FIELD, EndEntry, decode_end_outcomes, encode_end_entries
from cometmq.store import batch_codec
from cometmq.store import commitlog as commitlog_module
from cometmq.store import consume_queue as consume_queue_module
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock
from tests.store.conftest import small_config

from .conftest import StartBroker
from .test_transaction import GROUP, Producer, make_producer, producer_factory

__all__ = ["producer_factory"]  # the fixture, used by name

C = tm.C_TX
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
STORE_HOST = pack_host("10.1.2.3", 10911)
#: an IPv6 born host that the reference (decode, then pack_host) turns into an IPv4 one
V4_MAPPED = bytes(10) + b"\xff\xff" + bytes([192, 168, 7, 9]) + (4242).to_bytes(4, "big")
HOSTS = [pack_host("127.0.0.1", 5000), pack_host("10.9.8.7", -1), pack_host("::1", 7), pack_host("fe80::2:1", 70000),
         V4_MAPPED, bytes(16) + bytes(4)]

# -- the half records -------------------------------------------------------------------------------------------
TEXT = st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",))
NAMES = st.one_of(st.sampled_from([REAL_TOPIC, REAL_QID, TRAN_MSG, tm.TRAN_PREPARED_QUEUE_OFFSET,
                                   tm.TRANSACTION_CHECK_TIMES, tm.CHECK_IMMUNITY_TIME_IN_SECONDS, tm.TRAN_CHECK_FROM_MS,
                                   PGROUP, TAGS, KEYS, UNIQ_KEY, "color", "ü-名"]),
                  st.text(TEXT, min_size=1, max_size=12))
#: numbers as Python's int() reads them, and not
NUMBERS = st.sampled_from(["0", "1", "7", "15", "123456789", "1234567890", "2147483648", "99999999999", "+1", " 2",
                           "3 ", "01", "-3", "", "x", "١٢", "1_0", "0x10"])
VALUES = st.one_of(st.text(TEXT, max_size=24), NUMBERS)
#: ways a stored properties blob may be other than plain (what the broker writes): the reference decodes those
ODD_PROPERTIES: list[Callable[[bytes], bytes]] = [
    lambda raw: raw[:-1] if raw else raw,  # the last pair without its 0x02
    lambda raw: raw + b"lonely\x02",  # a pair without 0x01
    lambda raw: b"\x01nameless\x02" + raw,
    lambda raw: raw + b"TAGS\x01a\x01b\x02",  # 0x01 in a value
    lambda raw: b"\x02" + raw,  # an empty pair
    lambda raw: raw + b"bad\x01\xff\xfe\x02",  # not UTF-8
    lambda raw: raw + raw,  # every name twice
]


@st.composite
def half_records(draw: st.DrawFn) -> bytes:
    """A stored record as the broker may find it where an END points: mostly a half with properties of every kind
    (the broker's own bookkeeping, a check-back copy's count and origin, unicode, empty values, repeated names),
    some with properties no broker writes, some of another topic, some damaged."""
    pairs = draw(st.lists(st.tuples(NAMES, VALUES), max_size=10))
    if draw(st.integers(0, 20)) == 0:
        pairs += [(f"p{i}", "v") for i in range(70)]  # more pairs than the C helper reads
    if draw(st.booleans()):
        pairs += [(REAL_TOPIC, draw(st.text(TEXT, max_size=30))), (REAL_QID, draw(NUMBERS))]
        pairs = draw(st.permutations(pairs))
    if draw(st.integers(0, 3)):  # mostly each name once, as the broker stores a half
        pairs = list({k: v for k, v in reversed(pairs)}.items())[::-1]
    raw = "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode()
    if draw(st.integers(0, 5)) == 0:
        raw = draw(st.sampled_from(ODD_PROPERTIES))(raw)
    assume(len(raw) <= 32767)
    topic = draw(st.sampled_from([HALF_TOPIC] * 16 + ["TxOther", "RMQ_SYS_TRANS_HALF_TOPIX", "é"]))
    data = encode_parts(topic=topic.encode(), body=draw(st.binary(max_size=40)), properties=raw,
                        queue_id=draw(INT32), flag=draw(INT32), queue_offset=draw(INT64), physical_offset=draw(INT64),
                        sys_flag=draw(INT32), born_timestamp=draw(INT64), born_host=draw(st.sampled_from(HOSTS)),
                        store_timestamp=draw(INT64), store_host=draw(st.sampled_from(HOSTS[:4])),
                        reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64))
    damage = draw(st.integers(0, 11))
    if damage == 0:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif damage == 1:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif damage == 2:
        data += b"\x00"  # bytes after the record
    return data


# -- what is compared -------------------------------------------------------------------------------------------
def appended_bytes(m: MessageInner) -> bytes:
    """``m``'s record as an append writes it (fixed queue offset, position, store time and host)."""
    props = m.properties_raw if m.properties_raw is not None else encode_properties(m.properties)
    return encode_parts(topic=m.topic.encode(), body=m.body, properties=props, queue_id=m.queue_id, flag=m.flag,
                        queue_offset=3, physical_offset=5, sys_flag=m.sys_flag, born_timestamp=m.born_timestamp,
                        born_host=m.born_host, store_timestamp=7, store_host=STORE_HOST,
                        reconsume_times=m.reconsume_times, prepared_transaction_offset=m.prepared_transaction_offset)


def described(m: MessageInner) -> tuple[Any, ...]:
    """Every field of a message to append, its properties as the items they read as, its record's bytes (or why it
    has none), and its tag code (last: computing it sets ``tags_code``)."""
    fields = (m.topic, m.body, m.queue_id, list(m.properties.items()), m.properties_raw, m.flag, m.sys_flag,
              m.born_timestamp, m.born_host, m.reconsume_times, m.prepared_transaction_offset, m.tags_code, m.encoded)
    try:
        record: Any = appended_bytes(m)
    except ProtocolError as exc:
        record = ("cannot be encoded", type(exc), str(exc))
    return (*fields, record, m.tag_hash())


def outcome(build: Callable[[], MessageInner]) -> tuple[Any, ...]:
    try:
        return ("ok", *described(build()))
    except Exception as exc:  # the reference's own error (a property it cannot encode again)
        return ("raised", type(exc), str(exc))


def reference_reading(data: bytes) -> tuple[Any, ...] | None:
    """What END_TRANSACTION read of the record before (decode_record, then the decoded properties)."""
    try:
        rec = decode_record(data)[0]
    except ProtocolError:
        return None
    return (rec.topic, rec.physical_offset, rec.queue_offset, rec.properties.get(PGROUP, ""),
            tm.origin_of(rec.properties, rec.queue_offset))


def test_the_transaction_helpers_layout_copies_match_record_layout() -> None:
    if C is None:
        pytest.skip("C helper not built")
    layouts = record_layout.LAYOUTS
    assert C.layout() == {
        "MAGIC_CODE": record_layout.MAGIC_CODE, "BORN_HOST_POS": record_layout.BORN_HOST_POS,
        "IPV4_HOST_SIZE": record_layout.IPV4_HOST_SIZE, "IPV6_HOST_SIZE": record_layout.IPV6_HOST_SIZE,
        "BORNHOST_V6_FLAG": record_layout.BORNHOST_V6_FLAG, "STOREHOST_V6_FLAG": record_layout.STOREHOST_V6_FLAG,
        "BODY_POS_V4_V4": layouts[0].body_pos, "BODY_POS_V6_V4": layouts[1].body_pos,
        "BODY_POS_V4_V6": layouts[2].body_pos, "BODY_POS_V6_V6": layouts[3].body_pos,
    }


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(half_records(), st.integers(0, 2**63 - 1))
def test_committed_record_is_the_references(data: bytes, offset: int) -> None:
    half = tm.read_half(data)
    expected = reference_reading(data)
    if expected is None:
        assert half is None
        event("undecodable: no half")
        return
    assert half is not None
    assert (half.topic, half.physical_offset, half.queue_offset, half.group, half.origin) == expected
    event("read from its bytes" if half.record is None else "decoded (the reference)")
    rec = decode_record(data)[0]
    reference = outcome(lambda: tm.committed_reference(rec, offset))
    assert outcome(lambda: tm.committed(half, offset)) == reference
    assert outcome(lambda: tm.committed(rec, offset)) == reference
    # The pure-Python reading and the C helper's, each on its own: the same where they read the record at all.
    plain_py = tm._committed_plain_py(data, offset)
    fields_py = tm._half_fields_py(data)
    assert (plain_py is None) == (fields_py is None)
    if fields_py is not None:
        assert rec.topic == HALF_TOPIC and (C is not None or half.record is None)
        queue_offset, phy, group, _ = fields_py
        assert (phy, queue_offset, group) == expected[1:4]
        assert outcome(lambda: plain_py) == reference  # type: ignore[arg-type,return-value]
    if C is not None:
        fields_c = C.half_fields(tm._HALF_TOPIC_PART, tm._PGROUP_B, tm._PREPARED_B, data)
        assert fields_c is None or fields_c == fields_py
        assert (half.record is None) == (fields_c is not None)  # what read_half reads a record with
        plain_c = C.committed_half(tm._HALF_TOPIC_PART, tm._BOOKKEEPING_B, tm._REAL_TOPIC_B, tm._REAL_QID_B, data,
                                   offset)
        assert (plain_c is None) == (fields_c is None) or (plain_c is None and fields_c is not None)
        if plain_c is not None:
            assert outcome(lambda: plain_c) == reference
            event("C helper")
        elif fields_py is not None:
            event("C helper hands it to Python" if fields_c is not None else "C helper leaves it to the reference")


@st.composite
def range_records(draw: st.DrawFn) -> list[bytes]:
    """A range of the half queue as a batched END reads it: mostly copies of one record at consecutive queue
    offsets (one half batch), now and then with another record among them."""
    base = draw(half_records())
    records = []
    for k in range(draw(st.integers(1, 3))):
        data = bytearray(base)
        if len(data) >= 36 and k:  # the next queue offset, and the position where the one before ends
            offset = (int.from_bytes(base[20:28], "big", signed=True) + k + 2**63) % 2**64 - 2**63  # int64 wraps
            data[20:28] = offset.to_bytes(8, "big", signed=True)
            phy = (int.from_bytes(base[28:36], "big", signed=True) + k * len(base) + 2**63) % 2**64 - 2**63
            data[28:36] = phy.to_bytes(8, "big", signed=True)
        records.append(bytes(data))
    if len(records) > 1 and not draw(st.integers(0, 4)):
        records[draw(st.integers(0, len(records) - 1))] = draw(half_records())
    return records


@st.composite
def varied_ranges(draw: st.DrawFn) -> list[bytes]:
    """A range of plain halves of one group at consecutive queue offsets, back to back, whose values change from
    one to the next or stay (real topic, present or not, born host and time, body, size): the C helper shares an
    equal value between consecutive messages and must never share one that differs."""
    first, phy = draw(st.integers(0, 2**40)), draw(st.integers(0, 2**40))
    records = []
    for k in range(draw(st.integers(2, 5))):
        pairs = [(UNIQ_KEY, f"u{k}"), (PGROUP, GROUP), (TRAN_MSG, "true")]
        topic = draw(st.sampled_from([None, "", "TxA", "TxA", "TxB", "Tö", "Tx" + "a" * 100]))
        if topic is not None:
            pairs.insert(draw(st.integers(0, len(pairs))), (REAL_TOPIC, topic))
        pairs.append((REAL_QID, draw(st.sampled_from(["0", "1", "1", "12"]))))
        raw = "".join(f"{name}\x01{value}\x02" for name, value in pairs).encode()
        data = encode_parts(topic=HALF_TOPIC.encode(), body=draw(st.sampled_from([b"", b"b", b"b", b"body" * 9])),
                            properties=raw, queue_id=0, flag=draw(st.sampled_from([0, 0, 7])), queue_offset=first + k,
                            physical_offset=phy, sys_flag=0, born_timestamp=draw(st.sampled_from([5, 5, 2**40, -1])),
                            born_host=draw(st.sampled_from(HOSTS)), store_timestamp=9,
                            store_host=draw(st.sampled_from(HOSTS[:4])), reconsume_times=0,
                            prepared_transaction_offset=0)
        records.append(data)
        phy += len(data)
    return records


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(range_records(), varied_ranges()), st.booleans(), st.integers(0, 4), st.booleans())
def test_a_ranges_records_read_at_once_are_what_each_reads_as(records: list[bytes], commit: bool, other_group: int,
                                                              check_first: bool) -> None:
    """The C helper's commit_records (a range's halves read at once, broker/transaction/service.py) takes the
    records only when each is a half its single reading takes (read_half from the bytes) of the group at its queue
    offset, and then gives for each the origin and commit-log offset it reads and the message committed() builds."""
    readings = [reference_reading(d) for d in records]
    first = readings[0][2] if readings[0] is not None else 0
    group = readings[0][3] if readings[0] is not None and other_group else "another-group"
    first_phy = readings[0][1] if readings[0] is not None and check_first else -1
    got = tm.commit_records([memoryview(d) for d in records], len(records), first, first_phy, group, commit)
    # The same records back to back in a region of the log (the first len(records) - 1 of them when the region
    # ends inside the last one, or whatever is not a whole record)
    region = b"".join(records)
    from_region = tm.commit_records(memoryview(region + b"\x00\x00\x01"), len(records), first, first_phy, group,
                                    commit)
    if C is None:
        assert got is None and from_region is None
        return
    if got is None:
        event("declined")
        return
    event("taken")
    origins, phys, msgs, costs, sizes = got
    assert sizes == [len(d) for d in records]
    for k, data in enumerate(records):
        half = tm.read_half(data)
        assert half is not None and half.record is None  # plain
        offset = (first + k + 2**63) % 2**64 - 2**63  # (int64 wraps, as range_records' offsets do)
        assert (half.queue_offset, half.group, half.origin, half.physical_offset) == (offset, group, origins[k],
                                                                                     phys[k])
        if commit:
            assert msgs is not None
            m = msgs[k]
            assert outcome(lambda: m) == outcome(lambda: tm.committed(half, phys[k]))  # noqa: B023
            assert costs[k] == 64 + len(m.body) + len(m.topic) + tm.RECORD_OVERHEAD + len(m.properties_raw or b"")
        else:
            assert msgs is None and costs[k] == 64
    assert first_phy < 0 or phys[0] == first_phy
    # In a region each record must also be where its predecessor ends (its position field): a list is checked at
    # its first only.
    positions = [first_phy + sum(map(len, records[:k])) for k in range(len(records))]
    if first_phy >= 0 and phys != positions:
        assert from_region is None
        return
    again = tm.commit_records([memoryview(d) for d in records], len(records), first, first_phy, group, commit)
    assert from_region is not None and described_read(from_region) == described_read(again)  # (both unread)


def described_read(read: Any) -> tuple[Any, ...]:
    origins, phys, msgs, costs, sizes = read
    return origins, phys, None if msgs is None else [described(m) for m in msgs], costs, sizes


def test_known_half() -> None:
    """A half as the SDK's batch stores it, and a check-back copy of it: only the bookkeeping pairs go."""
    props = {UNIQ_KEY: "U", TAGS: "t", KEYS: "k1 k2", "writeId": "w", TRAN_MSG: "true", PGROUP: "g",
             REAL_TOPIC: "Orders", REAL_QID: "3"}
    data = encode_parts(topic=HALF_TOPIC.encode(), body=b"b", properties=encode_properties(props), queue_offset=11,
                        physical_offset=4000, sys_flag=0x1, born_host=HOSTS[1], store_host=STORE_HOST)
    half = tm.read_half(data)
    assert half is not None and half.record is None
    assert (half.topic, half.physical_offset, half.queue_offset, half.group, half.origin) == (
        HALF_TOPIC, 4000, 11, "g", 11)
    m = tm.committed(half, 4000)
    assert (m.topic, m.queue_id, m.sys_flag, m.prepared_transaction_offset, m.born_host) == (
        "Orders", 3, 0x9, 4000, HOSTS[1])
    assert m.properties_raw == encode_properties({UNIQ_KEY: "U", TAGS: "t", KEYS: "k1 k2", "writeId": "w",
                                                  PGROUP: "g"})
    copy = tm.copy_for_check(decode_record(data)[0], 11, 2)
    copy_data = encode_parts(topic=HALF_TOPIC.encode(), body=b"b", properties=encode_properties(copy.properties),
                             queue_offset=12, physical_offset=4400, born_host=HOSTS[1], store_host=STORE_HOST)
    copy_half = tm.read_half(copy_data)
    assert copy_half is not None and copy_half.record is None and copy_half.origin == 11
    assert tm.committed(copy_half, 4400).properties_raw == encode_properties(
        {UNIQ_KEY: "U", TAGS: "t", KEYS: "k1 k2", "writeId": "w", PGROUP: "g", tm.TRANSACTION_CHECK_TIMES: "2"})



def test_a_renewed_halfs_commit_drops_the_time_its_check_counts_from() -> None:
    """A half renewed before its check (broker/transaction/progress.py) carries TRAN_CHECK_FROM_MS: a commit naming
    it delivers the message without it, from its bytes (the C helper when built, and Python) as the reference."""
    props = {UNIQ_KEY: "U", TAGS: "t", tm.CHECK_IMMUNITY_TIME_IN_SECONDS: "86400", "color": "blue", TRAN_MSG: "true",
             PGROUP: "g", REAL_TOPIC: "Orders", REAL_QID: "3"}
    data = encode_parts(topic=HALF_TOPIC.encode(), body=b"b", properties=encode_properties(props), queue_offset=11,
                        physical_offset=4000, store_timestamp=1234, born_host=HOSTS[1], store_host=STORE_HOST)
    renewed = tm.renewed(decode_record(data)[0], 11)
    assert renewed.properties[tm.TRAN_CHECK_FROM_MS] == "1234"
    copy_data = encode_parts(topic=HALF_TOPIC.encode(), body=b"b", properties=encode_properties(renewed.properties),
                             queue_offset=900, physical_offset=90_000, born_host=HOSTS[1], store_host=STORE_HOST)
    want = encode_properties({UNIQ_KEY: "U", TAGS: "t", tm.CHECK_IMMUNITY_TIME_IN_SECONDS: "86400", "color": "blue",
                              PGROUP: "g"})
    copy_half = tm.read_half(copy_data)
    assert copy_half is not None and copy_half.record is None and copy_half.origin == 11
    assert tm.committed(copy_half, 90_000).properties_raw == want
    assert tm._committed_plain_py(copy_data, 90_000).properties_raw == want  # type: ignore[union-attr]
    assert tm.committed_reference(decode_record(copy_data)[0], 90_000).properties_raw == want
    if C is not None:
        read = tm.commit_records([memoryview(copy_data)], 1, 900, 90_000, "g", True)
        assert read is not None and read[2] is not None and read[2][0].properties_raw == want


# -- appended by real stores ------------------------------------------------------------------------------------
@contextmanager
def pure_python_append() -> Iterator[None]:
    with mock.patch.object(commitlog_module, "C_BATCH", None), \
            mock.patch.object(consume_queue_module, "C_BATCH", None):
        yield


def _append(path: Path, msgs: list[MessageInner], store_v6: bool) -> tuple[Any, ...]:
    store = MessageStore(small_config(path), store_host=("::1", 10911) if store_v6 else ("127.0.0.1", 10911),
                         clock=FakeClock(1_700_000_000_000))
    store.start()
    try:
        result = store.put_messages(msgs)
        log = b"".join(bytes(mf.mm[:mf.wrote_position]) for mf in store.commitlog.files.files)
        records = [(r.topic, r.queue_id, r.phy_offset, r.size, r.tags_code, r.store_timestamp, r.queue_offset,
                    r.sys_flag, list(r.properties.items())) for r in result.records]
        return result.status, result.remark, log, records, dict(store.commitlog.queue_table)
    finally:
        store.shutdown()


plain_halves = st.builds(
    lambda pairs, topic, qid, body, born, flag, sys_flag: encode_parts(
        topic=HALF_TOPIC.encode(), body=body,
        properties="".join(f"{k}\x01{v}\x02" for k, v in {**dict(pairs), REAL_TOPIC: topic, REAL_QID: qid}.items())
        .encode(), queue_offset=9, physical_offset=1234, sys_flag=sys_flag, flag=flag, born_host=born,
        store_host=STORE_HOST),
    st.lists(st.tuples(NAMES, VALUES), max_size=8), st.sampled_from(["T", "Tü", "T" * 120]),
    st.sampled_from(["0", "1", "7", "01", "+2", "x"]), st.binary(max_size=30), st.sampled_from(HOSTS), INT32,
    st.sampled_from([0, 0x1, 0x4, 0x8, 0xC, 0x31, -1]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plain_halves, min_size=1, max_size=4), st.booleans())
def test_appended_like_the_reference(halves: list[bytes], store_v6: bool) -> None:
    """The messages built from the halves' bytes and an op record, appended by the store (its C helper when
    built): the log, the dispatch requests and the queue table of the reference's messages appended in Python."""
    def new() -> list[MessageInner]:
        msgs = []
        for data in halves:
            half = tm.read_half(data)
            assert half is not None
            msgs.append(tm.committed(half, 1234))
        return [*msgs, tm.op_record([9], 5)]

    def reference() -> list[MessageInner]:
        msgs = [tm.committed_reference(decode_record(data)[0], 1234) for data in halves]
        op = tm.op_record([9], 5)
        # the op record as the broker made it before: its properties as a dict, encoded and hashed by the append
        return [*msgs, MessageInner(topic=op.topic, body=op.body, properties=dict(op.properties),
                                    born_timestamp=op.born_timestamp)]

    with tempfile.TemporaryDirectory() as tmp:
        got = _append(Path(tmp) / "new", new(), store_v6)
        with pure_python_append():
            expected = _append(Path(tmp) / "reference", reference(), store_v6)
    assert got == expected


def test_a_commit_batch_takes_the_stores_c_path(tmp_path: Path) -> None:
    """Committed messages built from halves and the op record go to the store's C helper whole."""
    if C is None:
        pytest.skip("C helper not built")
    props = {UNIQ_KEY: "U", TAGS: "t", TRAN_MSG: "true", PGROUP: "g", REAL_TOPIC: "T", REAL_QID: "1"}
    data = encode_parts(topic=HALF_TOPIC.encode(), body=b"b", properties=encode_properties(props),
                        born_host=HOSTS[0], store_host=STORE_HOST)
    half = tm.read_half(data)
    assert half is not None
    assert batch_codec.C_BATCH.measure([tm.committed(half, 0), tm.op_record([0], 1)], 1024, 0) is not None


# -- end to end: the records a broker delivers ------------------------------------------------------------------
def expected_commit(b: Any, delivered: MessageRecord) -> bytes:
    """The committed record the reference builds from the half ``delivered`` names, as stored where it is."""
    view = b.store.read_record(delivered.prepared_transaction_offset)
    half_rec = decode_record(view)[0]
    m = tm.committed_reference(half_rec, delivered.prepared_transaction_offset)
    return encode_parts(topic=m.topic.encode(), body=m.body, properties=m.properties_raw or b"", queue_id=m.queue_id,
                        flag=m.flag, queue_offset=delivered.queue_offset, physical_offset=delivered.physical_offset,
                        sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
                        store_timestamp=delivered.store_timestamp, store_host=b.store.commitlog.store_host,
                        reconsume_times=m.reconsume_times,
                        prepared_transaction_offset=m.prepared_transaction_offset)


async def test_delivered_records_are_the_references(start_broker: StartBroker,
                                                    producer_factory: list[Producer]) -> None:
    """Halves with unicode, empty and odd properties, committed by END_TRANSACTION (the half and a check-back copy)
    and by END_TRANSACTION_BATCH: each record in the real topic is byte for byte what the reference makes."""
    b = await start_broker(transaction_timeout_ms=200, transaction_check_interval_ms=60_000)
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    # one half left to a check-back: its END names the re-appended copy (TRANSACTION_CHECK_TIMES and
    # TRAN_PREPARED_QUEUE_OFFSET, which the commit drops)
    checked = await p.half("TxBytes", b"checked", queue_id=1, uniq="U-check", extra="ü")
    _, check = await p.next_check()
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
        "commitLogOffset": check.ext_fields["commitLogOffset"], "commitOrRollback": 8,
        "fromTransactionCheck": "true"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert checked.ext_fields["queueId"] == "1"
    single = await p.half("TxBytes", b"", queue_id=1, uniq="U-single", empty="", 名前="値 ✓")
    r = await p.end(single, 8)
    assert r.code == ResponseCode.SUCCESS, r.remark
    # a half batch, decided in one request (one rolled back)
    items = [(f"b{i}".encode() * i, {UNIQ_KEY: f"U-b{i}", TRAN_MSG: "true", PGROUP: GROUP, TAGS: f"t{i}",
                                     KEYS: f"k{i} ü{i}", "n": str(i), "": "" if i else "x"}, i)
             for i in range(6)]
    items = [(body, {k: v for k, v in props.items() if k}, flag) for body, props, flag in items]
    ext = {"producerGroup": GROUP, "topic": "TxBytes", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "queueId": 1, "sysFlag": 4, "bornTimestamp": "1", "flag": 0, "properties": "", "reconsumeTimes": "0",
           "batch": "true", HALF_BATCH_FIELD: "true"}
    r = await p.client.invoke(b.addr, make_request(RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch(items)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    first = int(r.ext_fields["queueOffset"])
    entries = [EndEntry(decode_offset_msg_id(m).offset, first + i, 12 if i == 2 else 8, m)
               for i, m in enumerate(r.ext_fields["msgId"].split(","))]
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": GROUP},
                                                   encode_end_entries(entries)))
    assert r.code == ResponseCode.SUCCESS and all(o.ok for o in decode_end_outcomes(r.body))

    got = b.store.get_messages("TxBytes", 1, 0, 32)
    delivered = [(bytes(v), decode_record(v)[0]) for v in got.buffers]
    assert [rec.body for _, rec in delivered] == [b"checked", b""] + [f"b{i}".encode() * i for i in (0, 1, 3, 4, 5)]
    for raw, rec in delivered:
        assert raw == expected_commit(b, rec), rec
    assert b.transactions.metrics.committed == 7 and b.transactions.metrics.rolled_back == 1
