"""What replication will use: raw appends at an offset, a confirmed offset that holds dispatch back,
and truncation to an offset."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cometmq.protocol.message import decode_record
from cometmq.store.message import DispatchRequest
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus

from .conftest import msg

MakeStore = Callable[..., MessageStore]


def bodies(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[bytes]:
    r = store.get_messages(topic, queue_id, store.min_offset(topic, queue_id), 1000, max_bytes=1 << 24)
    return [decode_record(v)[0].body for v in r.buffers]


def copy_log(master: MessageStore, replica: MessageStore, chunk: int = 700) -> None:
    """Ship the master's log to the replica in arbitrary chunks, as an HA connection would."""
    offset = replica.commitlog.max_offset
    while offset < master.commitlog.max_offset:
        mf = master.commitlog.files.find(offset)
        assert mf is not None
        pos = offset - mf.file_from_offset
        n = min(chunk, mf.wrote_position - pos)
        assert replica.append_raw(offset, bytes(mf.view(pos, n)))
        offset += n


def test_raw_appends_rebuild_the_same_queues(make_store: MakeStore, tmp_path: Path) -> None:
    master = make_store(tmp_path / "m", commitlog_segment_size=4096)
    replica = make_store(tmp_path / "r", commitlog_segment_size=4096)
    for i in range(120):
        master.put_message(msg(body=f"r{i}".encode() * 9, queue_id=i % 3, keys=f"key{i}"))
    copy_log(master, replica)
    assert replica.commitlog.max_offset == master.commitlog.max_offset
    for q in range(3):
        assert bodies(replica, "T", q) == bodies(master, "T", q)
        assert replica.max_offset("T", q) == master.max_offset("T", q)
    assert len(replica.query_by_key("T", "key77")) == 1
    assert not replica.append_raw(12345, b"x")  # not at the end of the log: refused, nothing written
    # New local appends continue the queue offsets where the copied records left them.
    res = replica.put_message(msg(body=b"own", queue_id=0))
    assert res.records[0].queue_offset == master.max_offset("T", 0)


def test_confirm_offset_holds_dispatch_back(make_store: MakeStore) -> None:
    store = make_store()
    seen: list[DispatchRequest] = []
    store.add_arrival_listener(seen.append)
    store.set_confirm_offset(0)
    r1 = store.put_message(msg(body=b"a"))
    r2 = store.put_message(msg(body=b"b"))
    assert seen == [] and store.get_messages("T", 0, 0, 32).status is not GetStatus.FOUND
    store.set_confirm_offset(r1.end_offset)
    assert [s.phy_offset for s in seen] == [r1.records[0].phy_offset]
    assert bodies(store) == [b"a"]
    store.set_confirm_offset(None)
    assert [s.phy_offset for s in seen] == [r1.records[0].phy_offset, r2.records[0].phy_offset]
    assert bodies(store) == [b"a", b"b"]


def test_truncate_drops_records_queue_units_and_index_entries(make_store: MakeStore) -> None:
    store = make_store(commitlog_segment_size=4096)
    results = [store.put_message(msg(body=f"t{i}".encode() * 30, keys=f"k{i}")) for i in range(60)]
    cut = results[40].records[0].phy_offset
    store.truncate(cut)
    assert store.commitlog.max_offset == cut
    assert bodies(store) == [f"t{i}".encode() * 30 for i in range(40)]
    assert store.query_by_key("T", "k45") == []
    assert len(store.query_by_key("T", "k39")) == 1
    res = store.put_message(msg(body=b"after", keys="k45"))
    assert res.records[0].queue_offset == 40 and res.records[0].phy_offset >= cut
    assert [decode_record(v)[0].body for v in store.query_by_key("T", "k45")] == [b"after"]


def test_disk_watermark_forces_deletion_of_young_segments(make_store: MakeStore) -> None:
    store = make_store(commitlog_segment_size=4096, consume_queue_units_per_file=8)
    for i in range(200):
        store.put_message(msg(body=str(i).encode() * 40))
    before = len(store.commitlog.files.files)
    store.disk_usage_ratio = lambda: 0.99  # type: ignore[method-assign]  # a full disk, without filling one
    store.cleaner.clean()
    assert len(store.commitlog.files.files) == before - 1  # force mode frees one segment per pass
    assert store.min_offset("T", 0) > 0
    store.disk_usage_ratio = lambda: 0.10  # type: ignore[method-assign]
    store.config = store.config.replace(delete_when=str((time.localtime().tm_hour + 12) % 24))
    store.cleaner.clean()  # young segments, below the watermark, not the delete hour: all kept
    assert len(store.commitlog.files.files) == before - 1


def test_cutting_a_long_tail_of_one_queue_file_is_one_cut(make_store: MakeStore) -> None:
    """An old master's unreplicated tail can be many units of one consume-queue file. They were dropped one at a
    time, each zeroing and syncing the file's tail under the store's lock: 10,000 units took 4.7 s, 30,000 would
    take ~40 s (quadratic). The bound below catches that, not a few per cent."""
    store = make_store(commitlog_segment_size=64 << 20, consume_queue_units_per_file=300_000)
    results = [store.put_message(msg(body=b"x" * 20)) for _ in range(30_000)]
    cut = results[12_345].records[0].phy_offset
    started = time.monotonic()
    store.truncate(cut)
    assert time.monotonic() - started < 10
    assert store.max_offset("T", 0) == 12_345 and store.commitlog.max_offset == cut
    got = store.get_messages("T", 0, 12_340, 10)
    assert list(got.queue_offsets) == [12_340, 12_341, 12_342, 12_343, 12_344]
    after = store.put_message(msg(body=b"after"))
    assert after.records[0].queue_offset == 12_345
