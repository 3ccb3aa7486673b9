"""The batch write path's C helper (store/_batchc.c, wired in store/batch_codec.py) against its Python reference,
byte for byte: the decode of plain batch bodies (valid, odd and mutated: the same messages, or the same refusal), the
commit-log records an append writes (CRC, queue offsets, host bits, dispatch requests, the queue table, refusals),
and the consume-queue units of the dispatch; and its copies of the record layout against record_layout.py."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cometmq.broker import send as send_module
from cometmq.protocol import record_layout
from cometmq.protocol.batch import ITEM_OVERHEAD, encode_batch_raw
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH, decode_record, pack_host
from cometmq.protocol.properties import RawProperties, encode_properties
from cometmq.store import batch_codec
from cometmq.store import commitlog as commitlog_module
from cometmq.store import consume_queue as consume_queue_module
from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from tests.kit import FakeClock

from .conftest import small_config

C = batch_codec.C_BATCH
pytestmark = pytest.mark.skipif(C is None, reason="C helper not built")

# -- layout ------------------------------------------------------------------------------------------------------


def test_layout_copies_match_record_layout() -> None:
    got = C.layout()
    layouts = record_layout.LAYOUTS
    assert got == {
        "MAGIC_CODE": record_layout.MAGIC_CODE,
        "BORN_HOST_POS": record_layout.BORN_HOST_POS,
        "IPV4_HOST_SIZE": record_layout.IPV4_HOST_SIZE,
        "IPV6_HOST_SIZE": record_layout.IPV6_HOST_SIZE,
        "BORNHOST_V6_FLAG": record_layout.BORNHOST_V6_FLAG,
        "STOREHOST_V6_FLAG": record_layout.STOREHOST_V6_FLAG,
        "HALVES_BIT": commitlog_module._HALVES_BIT,
        "MAX_TOPIC_LENGTH": MAX_TOPIC_LENGTH,
        "MAX_PROPERTIES_LENGTH": MAX_PROPERTIES_LENGTH,
        "ITEM_OVERHEAD": ITEM_OVERHEAD,
        "CQ_UNIT_SIZE": CQ_UNIT_SIZE,
        "BODY_POS_V4_V4": layouts[0].body_pos,
        "BODY_POS_V6_V4": layouts[1].body_pos,
        "BODY_POS_V4_V6": layouts[2].body_pos,
        "BODY_POS_V6_V6": layouts[3].body_pos,
    }
    # the fields the C code writes one after another, at the positions the owner gives them
    for layout in layouts:
        assert [layout.position(n) for n in ("total_size", "magic_code", "body_crc", "queue_id", "flag",
                                             "queue_offset", "physical_offset", "sys_flag", "born_timestamp",
                                             "born_host")] == [0, 4, 8, 12, 16, 20, 28, 36, 40, 48]
        assert layout.store_timestamp_pos == 48 + layout.born_host_size
        assert layout.store_host_pos == layout.store_timestamp_pos + 8
        assert layout.reconsume_times_pos == layout.store_host_pos + layout.store_host_size
        assert layout.prepared_transaction_offset_pos == layout.reconsume_times_pos + 4
        assert layout.body_length_pos == layout.prepared_transaction_offset_pos + 8


def test_bind_refuses_other_classes_and_keeps_its_binding() -> None:
    class Slotted:
        __slots__ = ("topic",)

    for wrong in (dict, Slotted, RawProperties):
        with pytest.raises(TypeError):
            C.bind(MessageInner, batch_codec.MESSAGE_FIELDS, RawProperties, batch_codec.RAW_FIELDS, wrong,
                   batch_codec.REQUEST_FIELDS)
    # nothing of a refused bind was kept: the real classes still decode
    assert C.decode_plain(encode_batch_raw([(b"b", b"", 0)]), "T", 0, 0, 0, BORN, 0, ()) == [
        MessageInner("T", b"b", 0, RawProperties(b""), b"", 0, 0, 0, BORN, 0)]


# -- decode ------------------------------------------------------------------------------------------------------
NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "TAGSX", "a", "ünï", "WAIT", "DELAY", "TIMER_OUT_MS", "TRAN_MSG", "XDELAY"]
VALUES = ["", "v", "TagA", "k1 k2", "héllo", "日本", "😀x", "TIMER_x"]
#: the send path's (a hit makes the batch not plain)
MARKERS = send_module._SPECIAL_MARKERS
_good_props = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=4).map(encode_properties)
_odd_props = st.sampled_from([b"noseparator", b"TAGS\x01a\x01b", b"\x01x\x02", b"TAGS\x01\xff\x02",
                              b"KEYS\x01\xed\xa0\x80\x02", b"\xc3", b"ok\x01\xe6\x97\xa5\x02"])
properties = st.one_of(_good_props, _good_props, _odd_props)
_bodies = st.one_of(st.binary(max_size=200), st.sampled_from([b"DELAY\x01", b"TRAN_MSG\x01TIMER_"]))
item = st.tuples(_bodies, properties, st.integers(-(2**31), 2**31 - 1))


@st.composite
def batch_bodies(draw: st.DrawFn) -> bytes:
    """A valid batch body, or one mutated: bytes flipped, cut, added, a length field overwritten, or noise."""
    body = bytearray(encode_batch_raw(draw(st.lists(item, max_size=8))))
    how = draw(st.sampled_from(["valid", "valid", "flip", "cut", "add", "field", "noise"]))
    if how == "flip" and body:
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(body) - 1))
            body[at] = draw(st.integers(0, 255))
    elif how == "cut" and body:
        del body[draw(st.integers(0, len(body) - 1)):]
    elif how == "add":
        body += draw(st.binary(min_size=1, max_size=30))
    elif how == "field" and len(body) >= 4:
        at = draw(st.integers(0, len(body) - 4))
        body[at:at + 4] = draw(st.integers(-(2**31), 2**31 - 1)).to_bytes(4, "big", signed=True)
    elif how == "noise":
        body = bytearray(draw(st.binary(max_size=120)))
    return bytes(body)


BORN = pack_host("10.1.2.3", 5555)


def _reference(body: bytes, markers: tuple[bytes, ...]) -> list[MessageInner] | str | None:
    try:
        return batch_codec.plain_batch_messages_py(body, "T", 3, 0, 1_700_000_000_000, BORN, 2, markers)
    except ProtocolError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=400, deadline=None)
@given(batch_bodies(), st.sampled_from([MARKERS, (), (b"UNIQ",)]))
def test_decode_matches_reference(body: bytes, markers: tuple[bytes, ...]) -> None:
    want = _reference(body, markers)
    got = C.decode_plain(body, "T", 3, 0, 1_700_000_000_000, BORN, 2, markers)
    count = C.count_plain(body, markers)
    entry = batch_codec._plain_batch_messages_c
    if isinstance(want, str):
        assert got is None and count is None
        # through the send path's entry (and the count's): the reference's own error, word for word
        for call in (lambda: entry(body, "T", 3, 0, 1_700_000_000_000, BORN, 2, markers),
                     lambda: batch_codec._plain_batch_count_c(body, markers)):
            with pytest.raises(ProtocolError) as info:
                call()
            assert f"{type(info.value).__name__}: {info.value}" == want
        return
    if want is None:  # a marker in some item's properties: not plain
        assert got is False and count is False
        assert entry(body, "T", 3, 0, 1_700_000_000_000, BORN, 2, markers) is None
        assert batch_codec._plain_batch_count_c(body, markers) is None
        return
    assert count == len(want) == batch_codec.plain_batch_count_py(body, markers)
    # (before the comparison below, which decodes the properties)
    assert all(type(g.properties) is RawProperties and g.properties._dict is None for g in got)
    assert got == want
    for g, w in zip(got, want, strict=True):
        assert g.properties.raw == w.properties_raw == g.properties_raw
        assert [type(getattr(g, f)) for f in batch_codec.MESSAGE_FIELDS] == \
            [type(getattr(w, f)) for f in batch_codec.MESSAGE_FIELDS]
    # nothing shared between two messages that the store may change
    assert len({id(m) for m in got}) == len(got)


def test_decode_refusals_are_the_references() -> None:
    good = encode_batch_raw([(b"b", b"UNIQ_KEY\x01k\x02", 0)])
    for body in (good[:-1], good + b"\x00", good[:21], b"\x00" * 22, good.replace(b"UNIQ", b"\xffNIQ")):
        assert C.decode_plain(body, "T", 0, 0, 0, BORN, 0, MARKERS) is None
        assert isinstance(_reference(body, MARKERS), str)
    assert C.decode_plain(b"", "T", 0, 0, 0, BORN, 0, MARKERS) == []
    # a marker in a body is no property: still plain
    assert C.decode_plain(encode_batch_raw([(b"DELAY\x01TIMER_", b"", 0)]), "T", 0, 0, 0, BORN, 0, MARKERS) != []


# -- append and dispatch -------------------------------------------------------------------------------------------
TOPICS = ["T", "Topic-A", "主题", "%RETRY%g", "x" * MAX_TOPIC_LENGTH]
HOSTS = [pack_host("10.0.0.7", 4001), pack_host("2001:db8::7", 4002)]

#: how a message's properties are held: encoded (RawProperties, the send path's), a dict with its encoding, a dict
#: alone, or a tag code set beside them (the timer's)
message_spec = st.fixed_dictionaries({
    "topic": st.sampled_from(TOPICS),
    "queue_id": st.integers(0, 2),
    "props": _good_props,
    "held": st.sampled_from(["raw", "raw", "raw", "dict+raw", "dict", "tags_code"]),
    "body": st.binary(max_size=300),
    "born": st.sampled_from(HOSTS),
    "sys_flag": st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC, 0x10, 0x20, 0x31, 0x1]),
    "flag": st.integers(-(2**31), 2**31 - 1),
    "reconsume": st.integers(0, 16),
    "prepare": st.integers(0, 9),
})
#: rarely: what the append refuses (the whole batch then fails in both, with the same remark)
odd_spec = st.sampled_from([{"topic": ""}, {"topic": "y" * (MAX_TOPIC_LENGTH + 1)}, {"body": b"z" * 2000},
                            {"born": b"\x01\x02\x03\x04\x05"}, {"props": b"p" * (MAX_PROPERTIES_LENGTH + 1)}])
#: what the send path hands the store: encoded properties (or a tag code), nothing encoded ahead, nothing refused
clean_spec = st.builds(lambda spec, held: {**spec, "held": held, "prepare": 1}, message_spec,
                       st.sampled_from(["raw", "raw", "tags_code"]))
mixed_batch = st.lists(st.one_of(message_spec, message_spec, message_spec, message_spec, message_spec,
                                 st.builds(lambda spec, odd: {**spec, **odd}, message_spec, odd_spec)),
                       min_size=1, max_size=10)
#: a message of ``batch_items`` (a packed half's commit): its body the batch of ``items`` (sometimes mutated, as
#: batch_bodies mutates one), ``batch_items`` their count or (rarely) another number
items_spec = st.fixed_dictionaries({
    "items": st.lists(st.tuples(st.binary(max_size=120), properties, st.integers(-(2**31), 2**31 - 1)), min_size=1,
                      max_size=8),
    "off_by": st.sampled_from([0, 0, 0, 0, 0, 0, 1, -1]),
    "mutate": st.sampled_from([None] * 8 + [b"", b"\x00"]),
})
items_batch = st.lists(st.one_of(st.builds(lambda spec, items: {**spec, **items, "prepare": 1}, message_spec,
                                           items_spec),
                                 clean_spec), min_size=1, max_size=4)
#: mostly batches the helper takes whole, some it hands back to Python (which must then do all of it)
batch_spec = st.one_of(st.lists(clean_spec, min_size=1, max_size=10), st.lists(clean_spec, min_size=1, max_size=10),
                       mixed_batch, items_batch)
log_spec = st.fixed_dictionaries({
    "batches": st.lists(batch_spec, min_size=1, max_size=12),
    "store_v6": st.booleans(),
})


def _message(spec: dict[str, Any]) -> MessageInner:
    raw: bytes = spec["props"]
    held = spec["held"]
    props: Any = RawProperties(raw) if held in ("raw", "tags_code") else dict(RawProperties(raw))
    m = MessageInner(topic=spec["topic"], body=spec["body"], queue_id=spec["queue_id"], properties=props,
                     properties_raw=None if held == "dict" else raw, flag=spec["flag"], sys_flag=spec["sys_flag"],
                     born_timestamp=1_700_000_000_000, born_host=spec["born"], reconsume_times=spec["reconsume"],
                     prepared_transaction_offset=spec["flag"] & 0xFFFF)
    if held == "tags_code":
        m.tags_code = spec["flag"]
    if "items" in spec:
        body = encode_batch_raw(spec["items"])
        m.body = body if spec["mutate"] is None else body[:-1] + spec["mutate"]
        m.batch_items = len(spec["items"]) + spec["off_by"]
    return m


@contextmanager
def pure_python() -> Iterator[None]:
    with mock.patch.object(commitlog_module, "C_BATCH", None), \
            mock.patch.object(consume_queue_module, "C_BATCH", None):
        yield


def _run(path: Path, spec: dict[str, Any], native: bool) -> dict[str, Any]:
    store_host = ("::1", 10911) if spec["store_v6"] else ("127.0.0.1", 10911)
    clock = FakeClock(1_700_000_000_000)
    store = MessageStore(small_config(path, commitlog_segment_size=4096, max_message_size=1024,
                                      consume_queue_units_per_file=8),
                         store_host=store_host, clock=clock)
    store.start()
    try:
        results: list[tuple[Any, ...]] = []
        for batch in spec["batches"]:
            msgs = [_message(s) for s in batch]
            for m, s in zip(msgs, batch, strict=True):
                if s["prepare"] == 0:  # the timer's read-ahead: a record encoded before the append
                    store.commitlog.prepare(m)
            if native:
                native_append = C.measure(msgs, 1024, store.commitlog._store_flags) is not None
                event("native append" if native_append else "append handed back to Python")
                if any(m.batch_items for m in msgs):
                    event(f"batch items: {'native append' if native_append else 'handed back to Python'}")
            result: PutResult = store.put_messages(msgs)
            clock.advance(1)
            results.append((result.status, result.remark, result.end_offset, result.records,
                            [m.sys_flag for m in msgs]))
        log = b"".join(bytes(mf.mm[:mf.wrote_position]) for mf in store.commitlog.files.files)
        queues = {key: (cq.min_offset, cq.max_offset, [cq.get_unit(i) for i in range(cq.min_offset, cq.max_offset)],
                        cq.dirty_phy)
                  for key, cq in store.queues.items()}
        cq_files = {key: [bytes(f.buf()[:f.wrote_position]) for f in cq.files.files]
                    for key, cq in store.queues.items()}
        return {"results": results, "log": log, "table": dict(store.commitlog.queue_table), "queues": queues,
                "cq_files": cq_files}
    finally:
        store.shutdown()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(log_spec)
def test_append_and_dispatch_match_reference(spec: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        native = _run(Path(tmp) / "c", spec, True)
        with pure_python():
            reference = _run(Path(tmp) / "py", spec, False)
    assert native["results"] == reference["results"]
    assert native["log"] == reference["log"]
    assert native["table"] == reference["table"]
    assert native["queues"] == reference["queues"]
    assert native["cq_files"] == reference["cq_files"]


def test_measure_hands_back_what_it_does_not_take(tmp_path: Path) -> None:
    """Each of these makes the whole append Python's: nothing of it is half done in C."""
    base = {"topic": "T", "queue_id": 0, "props": b"TAGS\x01a\x02", "held": "raw", "body": b"b", "born": HOSTS[0],
            "sys_flag": 0, "flag": 0, "reconsume": 0, "prepare": 1}
    # the fixed part, the body, the topic's length and name, the properties' length and bytes
    assert C.measure([_message(base)], 1024, 0) == record_layout.LAYOUT_V4.body_pos + 1 + 1 + 1 + 2 + 7
    odd: list[dict[str, Any]] = [{"held": "dict"}, {"topic": ""}, {"body": b"z" * 2000}, {"born": b"\x01"},
                                 {"props": b"TAGS\x01\xff\x02"}]
    for change in odd:
        assert C.measure([_message(base), _message({**base, **change})], 1024, 0) is None, change
    big = _message(base)
    big.flag = 2**31
    assert C.measure([big], 1024, 0) is None
    assert C.measure([], 1024, 0) is None


def test_pack_writes_no_byte_past_what_measure_gave() -> None:
    """A message changed between ``measure`` and ``pack`` (a bug of the caller's): an error, and nothing written
    past the room measured (the next append's, or a segment's blank end)."""
    items = [(b"a" * 10, b"", 0), (b"b" * 10, b"", 0)]
    m = MessageInner("T", encode_batch_raw(items), 0, {}, b"", 0, 0, 0, BORN, 0, batch_items=2)
    total = C.measure([m], 1024, 0)
    assert total is not None
    m.body = encode_batch_raw([(b"c" * 300, b"", 0), (b"d" * 300, b"", 0)])  # still 2 items, larger
    buf = bytearray(4096)
    with pytest.raises(ValueError, match="changed since measure"):
        C.pack([m], buf, 100, 100, 1, b"\x7f\x00\x00\x01\x00\x00\x00\x00", {}, total)
    assert not any(buf[100 + total:])
    # smaller: the records end before the room does, also an error
    m.body = encode_batch_raw([(b"e", b"", 0), (b"f", b"", 0)])
    with pytest.raises(ValueError, match="changed since measure"):
        C.pack([m], bytearray(4096), 0, 0, 1, b"\x7f\x00\x00\x01\x00\x00\x00\x00", {}, total)
    # a pack that fails leaves the queue table as it was, the runs it had ended included
    first, second = (MessageInner("T", b"x", q, RawProperties(b""), b"", 0, 0, 0, BORN, 0) for q in (0, 1))
    m.body = encode_batch_raw(items)
    m.queue_id = 1
    total = C.measure([first, second, m], 1024, 0)
    m.body = encode_batch_raw([(b"g" * 300, b"", 0), (b"h", b"", 0)])
    table = {("T", 0): 5}
    with pytest.raises(ValueError, match="changed since measure"):
        C.pack([first, second, m], bytearray(4096), 0, 0, 1, b"\x7f\x00\x00\x01\x00\x00\x00\x00", table, total)
    assert table == {("T", 0): 5}
    m.body = encode_batch_raw(items)
    assert len(C.pack([first, second, m], bytearray(4096), 0, 0, 1, b"\x7f\x00\x00\x01\x00\x00\x00\x00", table,
                      total)) == 4
    assert table == {("T", 0): 6, ("T", 1): 3}


def test_a_plain_batch_takes_the_native_path(tmp_path: Path) -> None:
    """What the send path hands the store (decode_plain's messages) is appended by the helper, not Python."""
    store = MessageStore(small_config(tmp_path), clock=FakeClock(1_700_000_000_000))
    store.start()
    try:
        body = encode_batch_raw([(b"x" * 100, b"UNIQ_KEY\x01k%d\x02TAGS\x01t\x02" % i, 0) for i in range(16)])
        msgs = batch_codec.plain_batch_messages(body, "T", 1, 0, 1_700_000_000_000, BORN, 0, MARKERS)
        assert msgs is not None
        with mock.patch.object(store.commitlog, "_append_native", wraps=store.commitlog._append_native) as spy:
            result = store.put_messages(msgs)
        assert spy.call_count == 1 and result.ok
        assert [r.queue_offset for r in result.records] == list(range(16))
        assert store.consume_queue("T", 1).max_offset == 16
        # A packed half's commit (one message of batch_items) too: a record and a request per item.
        packed = MessageInner("T", body, 1, {}, b"", 0, 0x8, 1_700_000_000_000, BORN, 0, 77, batch_items=16)
        with mock.patch.object(store.commitlog, "_append_native", wraps=store.commitlog._append_native) as spy:
            result = store.put_messages([packed])
        assert spy.call_count == 1 and result.ok
        assert [r.queue_offset for r in result.records] == list(range(16, 32))
        assert [r.properties["UNIQ_KEY"] for r in result.records] == [f"k{i}" for i in range(16)]
        assert store.consume_queue("T", 1).max_offset == 32
        assert [rec.body for rec, _ in (decode_record(store.read_record(r.phy_offset))  # type: ignore[arg-type]
                                        for r in result.records)] == [b"x" * 100] * 16
    finally:
        store.shutdown()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["0A000007000FA1", "20010DB8000000000000000000000007000FA2", "", "é"]),
       st.lists(st.integers(-3, 2**63 - 1), max_size=40))
def test_offset_ids_match_reference(prefix: str, offsets: list[int]) -> None:
    """The answer's msgId of a batch, C against the reference's %-format (a negative offset: the reference's)."""
    records = [DispatchRequest("T", 0, phy, 100, 0, 0, i, 0, {}) for i, phy in enumerate(offsets)]
    want = batch_codec.offset_msg_ids_py(prefix, records)
    got = C.offset_ids(prefix, records)
    if prefix.isascii() and all(phy >= 0 for phy in offsets):
        assert got == want
    else:
        assert got is None
    assert batch_codec._offset_msg_ids_c(prefix, records) == want
