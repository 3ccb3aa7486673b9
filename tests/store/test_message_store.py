"""The message store end to end: put, dispatch, read, offsets, lookups — over flush modes and sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.protocol.message import decode_record, iter_records
from cometmq.protocol.taghash import tags_code
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus, PutStatus
from tests.kit import FakeClock

from .conftest import ASYNC, SYNC, msg

MakeStore = Callable[..., MessageStore]

COMBOS = [
    pytest.param({"flush_disk_type": ASYNC}, id="async-64k"),
    pytest.param({"flush_disk_type": SYNC}, id="sync-64k"),
    pytest.param({"flush_disk_type": ASYNC, "commitlog_segment_size": 4096,
                  "consume_queue_units_per_file": 3}, id="async-tiny-segments"),
]


@pytest.mark.parametrize("opts", COMBOS)
def test_put_then_get_in_order(make_store: MakeStore, opts: dict[str, object]) -> None:
    store = make_store(**opts)
    sent = []
    for i in range(200):
        body = f"message-{i}".encode() * (1 + i % 7)
        res = store.put_message(msg(body=body, queue_id=i % 3, tags=f"tag{i % 2}"))
        assert res.status is PutStatus.PUT_OK
        assert res.records[0].queue_offset == i // 3
        sent.append((i % 3, body))
    for qid in range(3):
        expected = [b for q, b in sent if q == qid]
        got: list[bytes] = []
        offset = 0
        while True:
            r = store.get_messages("T", qid, offset, 32)
            if r.status is not GetStatus.FOUND:
                assert r.status is GetStatus.OFFSET_OVERFLOW_ONE
                break
            for view, qoff in zip(r.buffers, r.queue_offsets, strict=True):
                rec, size = decode_record(view, check_crc=True)
                assert size == len(view)
                assert rec.queue_offset == qoff
                assert rec.queue_id == qid
                got.append(rec.body)
            offset = r.next_begin_offset
        assert got == expected
        assert store.max_offset("T", qid) == len(expected)
        assert store.min_offset("T", qid) == 0


def test_records_never_straddle_segments(make_store: MakeStore) -> None:
    store = make_store(commitlog_segment_size=4096)
    for i in range(100):
        assert store.put_message(msg(body=bytes([i]) * (150 + i))).ok
    files = store.commitlog.files.files
    assert len(files) > 3
    for rec_off, view in store.commitlog.scan(0):
        mf = store.commitlog.files.find(rec_off)
        assert mf is not None and rec_off + len(view) <= mf.end_offset
    assert store.get_messages("T", 0, 0, 32).status is GetStatus.FOUND
    seen = 0
    off = 0
    while (r := store.get_messages("T", 0, off, 32)).status is GetStatus.FOUND:
        seen += r.message_count
        off = r.next_begin_offset
    assert seen == 100


def test_batch_is_contiguous_and_offsets_are_dense(make_store: MakeStore) -> None:
    store = make_store()
    store.put_message(msg(queue_id=1))
    res = store.put_messages([msg(body=f"b{i}".encode(), queue_id=1) for i in range(10)])
    assert res.ok
    assert [r.queue_offset for r in res.records] == list(range(1, 11))
    offsets = [r.phy_offset for r in res.records]
    sizes = [r.size for r in res.records]
    assert all(offsets[i] + sizes[i] == offsets[i + 1] for i in range(9))
    r = store.get_messages("T", 1, 1, 32)
    assert [rec.body for rec in (decode_record(v)[0] for v in r.buffers)] == [f"b{i}".encode() for i in range(10)]


def test_bad_messages_are_refused_and_change_nothing(make_store: MakeStore) -> None:
    store = make_store()
    assert store.put_message(msg()).ok
    before = store.commitlog.max_offset
    too_big = store.put_message(msg(body=b"x" * (16 * 1024 + 1)))
    assert too_big.status is PutStatus.MESSAGE_ILLEGAL and "exceeds" in too_big.remark
    long_topic = store.put_message(msg(topic="t" * 128))
    assert long_topic.status is PutStatus.MESSAGE_ILLEGAL
    huge_props = store.put_message(msg(big="v" * 40000))
    assert huge_props.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    bad_sep = store.put_message(msg(**{"k": "a\x01b"}))
    assert bad_sep.status is PutStatus.MESSAGE_ILLEGAL
    # A batch with one bad message stores none of it.
    mixed = store.put_messages([msg(body=b"ok"), msg(body=b"x" * (16 * 1024 + 1))])
    assert mixed.status is PutStatus.MESSAGE_ILLEGAL
    assert store.commitlog.max_offset == before
    assert store.max_offset("T", 0) == 1


def test_tag_filter_and_offset_statuses(make_store: MakeStore) -> None:
    store = make_store()
    for i in range(10):
        store.put_message(msg(body=str(i).encode(), tags="A" if i % 2 else "B"))
    want = tags_code("A")
    r = store.get_messages("T", 0, 0, 32, tag_filter=lambda code: code == want)
    assert r.status is GetStatus.FOUND
    assert [decode_record(v)[0].body for v in r.buffers] == [b"1", b"3", b"5", b"7", b"9"]
    assert r.next_begin_offset == 10
    none = store.get_messages("T", 0, 0, 32, tag_filter=lambda code: False)
    assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_begin_offset == 10
    assert store.get_messages("T", 0, 10, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
    bad = store.get_messages("T", 0, 99, 32)
    assert bad.status is GetStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 0
    assert store.get_messages("nope", 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert (store.get_messages("T", 0, 0, 32).min_offset, store.get_messages("T", 0, 0, 32).max_offset) == (0, 10)


def test_transfer_limits(make_store: MakeStore) -> None:
    store = make_store(max_transfer_bytes=1000, max_transfer_count=5)
    for _ in range(20):
        store.put_message(msg(body=b"y" * 300))
    r = store.get_messages("T", 0, 0, 32)
    assert r.message_count == 2  # ~400 bytes each: a third would pass 1000
    assert store.get_messages("T", 0, 0, 32, max_bytes=1 << 20).message_count == 20
    store2_count = store.get_messages("T", 0, 0, 3).message_count
    assert store2_count == 2


def test_arrival_listener_sees_each_message_within_the_put(make_store: MakeStore) -> None:
    store = make_store()
    seen: list[DispatchRequest] = []
    store.add_arrival_listener(seen.append)
    store.put_message(msg(tags="TagA", keys="k1 k2", queue_id=2))
    assert len(seen) == 1
    req = seen[0]
    assert (req.topic, req.queue_id, req.queue_offset, req.tags_code) == ("T", 2, 0, tags_code("TagA"))
    assert req.properties["KEYS"] == "k1 k2"
    store.put_messages([msg(queue_id=2), msg(queue_id=2)])
    assert [r.queue_offset for r in seen] == [0, 1, 2]


def test_batch_listener_hears_each_put_once_and_a_failing_one_harms_nothing(make_store: MakeStore) -> None:
    store = make_store()
    batches: list[list[tuple[int, int]]] = []
    store.add_arrival_batch_listener(lambda reqs: batches.append([(r.queue_id, r.queue_offset) for r in reqs]))

    def broken(reqs: list[DispatchRequest]) -> None:
        raise RuntimeError("listener bug")

    store.add_arrival_batch_listener(broken)
    store.put_message(msg(queue_id=1))
    assert store.put_messages([msg(queue_id=1), msg(queue_id=3), msg(queue_id=1)]).ok
    assert batches == [[(1, 0)], [(1, 1), (3, 0), (1, 2)]]
    assert store.max_offset("T", 1) == 3


def test_offset_by_time_uses_store_timestamps(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store()
    t0 = clock.now
    for _ in range(10):
        store.put_message(msg())
        clock.advance(1000)
    assert store.offset_by_time("T", 0, t0 - 5) == 0
    assert store.offset_by_time("T", 0, t0 + 3000) == 3
    assert store.offset_by_time("T", 0, t0 + 3500) == 4
    assert store.offset_by_time("T", 0, t0 + 10**9) == 10
    assert store.earliest_store_time("T", 0) == t0
    assert store.store_time("T", 0, 5) == t0 + 5000


def test_query_by_key_and_unique_key(make_store: MakeStore) -> None:
    store = make_store()
    for i in range(50):
        store.put_message(msg(body=str(i).encode(), keys=f"order-{i % 5} common", uniq=f"U{i:030d}"))
    store.put_message(msg(topic="Other", keys="order-1"))
    hits = store.query_by_key("T", "order-1", max_num=100)
    assert sorted(int(decode_record(v)[0].body) for v in hits) == [i for i in range(50) if i % 5 == 1]
    one = store.query_by_key("T", f"U{7:030d}")
    assert [decode_record(v)[0].body for v in one] == [b"7"]
    assert store.query_by_key("T", "absent") == []
    assert len(store.query_by_key("T", "common", max_num=10)) == 10


def test_sync_flush_waiters_see_durable_offsets(make_store: MakeStore) -> None:
    import threading

    store = make_store(flush_disk_type=SYNC)
    flushed: list[int] = []
    store.add_flush_listener(flushed.append)
    results: list[bool] = []

    def writer() -> None:
        for _ in range(20):
            res = store.put_message(msg())
            ok = store.wait_flushed(res.end_offset, 10)
            results.append(ok and store.flushed_offset >= res.end_offset)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 160 and all(results)
    assert flushed == sorted(flushed)
    assert flushed[-1] == store.commitlog.max_offset


def test_read_record_by_physical_offset(make_store: MakeStore) -> None:
    store = make_store()
    res = store.put_messages([msg(body=b"first"), msg(body=b"second")])
    view = store.read_record(res.records[1].phy_offset)
    assert view is not None and decode_record(view)[0].body == b"second"
    assert store.read_record(res.records[1].phy_offset + 1) is None
    assert store.read_record(10**12) is None
    assert list(r.body for r in iter_records(b"".join(bytes(v) for v in
                                                       store.get_messages("T", 0, 0, 32).buffers))) == [
        b"first", b"second"]


def test_delete_topic(make_store: MakeStore) -> None:
    store = make_store()
    store.put_message(msg(topic="Gone"))
    store.put_message(msg(topic="Kept"))
    store.delete_topic("Gone")
    assert store.get_messages("Gone", 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get_messages("Kept", 0, 0, 32).status is GetStatus.FOUND
    assert store.topics() == {"Kept"}


def read_bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    r = store.get_messages("T", queue_id, 0, 100)
    return [decode_record(v)[0].body for v in r.buffers]


def test_records_encoded_ahead_are_byte_identical(make_store: MakeStore, clock: FakeClock, tmp_path: Path) -> None:
    """CommitLog.prepare + append writes the same bytes as an append that encodes (the timer's read-ahead path),
    also with prepared and plain messages mixed in one batch, and with a store host set after the prepare."""
    plain = make_store(tmp_path / "plain")
    ahead = make_store(tmp_path / "ahead")

    def batch() -> list[MessageInner]:
        return [msg(queue_id=i % 3, tags=f"t{i}", keys=f"k{i}", body=bytes([i]) * (50 + i)) for i in range(12)]

    msgs = batch()
    for i, m in enumerate(msgs):
        if i % 4:
            assert ahead.commitlog.prepare(m) and m.encoded is not None
    for store in (plain, ahead):
        store.commitlog.store_host = b"\x0a\x00\x00\x07\x00\x00\x2a\xf8"  # as a broker sets it once its port is known
    assert plain.put_messages(batch()).ok
    assert ahead.put_messages(msgs).ok
    assert plain.put_messages(batch()[:5]).ok
    assert ahead.put_messages(msgs[:5]).ok  # encoded records are templates: appending one again re-patches it
    end = plain.commitlog.max_offset
    assert ahead.commitlog.max_offset == end
    assert bytes(plain.commitlog.read(0, end)) == bytes(ahead.commitlog.read(0, end))  # type: ignore[arg-type]
    assert [read_bodies(ahead, q) for q in range(3)] == [read_bodies(plain, q) for q in range(3)]


def test_prepare_refuses_what_an_append_would_refuse(make_store: MakeStore) -> None:
    store = make_store(max_message_size=1000)
    big = msg(body=b"x" * 1001)
    assert not store.commitlog.prepare(big) and big.encoded is None
    assert store.put_messages([big]).status is PutStatus.MESSAGE_ILLEGAL
    half = msg()
    half.sys_flag = 0x4
    assert not store.commitlog.prepare(half)
