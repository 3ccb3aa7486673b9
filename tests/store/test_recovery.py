"""Restart and crash recovery: clean stops, kill -9, torn and corrupted tails, queues out of step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.protocol.message import decode_record
from cometmq.store.checkpoint import Checkpoint
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus
from tests.kit import FakeClock

from .conftest import ASYNC, SYNC, msg, small_config

MakeStore = Callable[..., MessageStore]


def read_all(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[bytes]:
    out: list[bytes] = []
    offset = store.min_offset(topic, queue_id)
    while True:
        r = store.get_messages(topic, queue_id, offset, 32)
        if r.status is not GetStatus.FOUND:
            return out
        out.extend(decode_record(v, check_crc=True)[0].body for v in r.buffers)
        offset = r.next_begin_offset


def crash(store: MessageStore) -> None:
    """Stop the services without the clean-shutdown steps, as a killed process would leave things."""
    store.cleaner.stop()
    store.maintenance.stop()
    if store.warmer is not None:
        store.warmer.stop()
    store.flush_service.stop()
    store.running = False
    for cq in store.queues.values():
        cq.close()
    if store.index is not None:
        store.index.close()
    store.commitlog.close()


def reopen(path: Path, clock: FakeClock, **changes: object) -> MessageStore:
    store = MessageStore(small_config(path, **changes), clock=clock)
    store.start()
    return store


@pytest.mark.parametrize("segment", [4096, 64 * 1024])
def test_clean_restart_loses_nothing(tmp_path: Path, clock: FakeClock, segment: int) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock, commitlog_segment_size=segment)
    bodies = [f"m{i}".encode() * 20 for i in range(300)]
    for i, b in enumerate(bodies):
        store.put_message(msg(body=b, queue_id=i % 2, keys=f"k{i}"))
    end = store.commitlog.max_offset
    store.shutdown()
    assert not (path / "abort").exists()
    store = reopen(path, clock, commitlog_segment_size=segment)
    try:
        assert not store.recovered_abnormally
        assert store.commitlog.max_offset == end
        assert read_all(store, "T", 0) == bodies[0::2]
        assert read_all(store, "T", 1) == bodies[1::2]
        assert len(store.query_by_key("T", "k17")) == 1
        res = store.put_message(msg(body=b"after", queue_id=0))
        assert res.records[0].queue_offset == 150
        assert res.records[0].phy_offset >= end
        assert read_all(store, "T", 0)[-1] == b"after"
    finally:
        store.shutdown()


def test_crash_without_clean_stop_recovers_everything(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock, commitlog_segment_size=4096)
    bodies = [f"c{i}".encode() * 10 for i in range(200)]
    for b in bodies:
        store.put_message(msg(body=b))
    crash(store)
    store = reopen(path, clock, commitlog_segment_size=4096)
    try:
        assert store.recovered_abnormally
        assert read_all(store) == bodies
        assert store.put_message(msg(body=b"next")).records[0].queue_offset == 200
    finally:
        store.shutdown()


def test_missing_checkpoint_rebuilds_without_duplicates(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock)
    bodies = [f"x{i}".encode() for i in range(100)]
    for b in bodies:
        store.put_message(msg(body=b, keys="dup"))
    store.shutdown()
    (path / "checkpoint").unlink()
    store = reopen(path, clock)
    try:
        assert store.recovered_abnormally
        assert read_all(store) == bodies
        assert store.max_offset("T", 0) == 100
        assert len(store.query_by_key("T", "dup", max_num=1000)) == 100
    finally:
        store.shutdown()


def test_truncated_last_segment(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock)
    bodies = [bytes([65 + i % 26]) * 200 for i in range(100)]
    res = [store.put_message(msg(body=b)) for b in bodies]
    crash(store)
    seg = sorted((path / "commitlog").iterdir())[-1]
    cut = res[60].records[0].phy_offset + 50 - int(seg.name)  # in the middle of record 60
    with open(seg, "r+b") as f:
        f.truncate(cut)
    store = reopen(path, clock)
    try:
        assert read_all(store) == bodies[:60]
        assert store.commitlog.max_offset == res[60].records[0].phy_offset
        nxt = store.put_message(msg(body=b"new"))
        assert nxt.records[0].queue_offset == 60
        assert read_all(store) == [*bodies[:60], b"new"]
    finally:
        store.shutdown()


def test_flipped_bytes_in_the_middle_cut_the_log_there(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock)
    bodies = [f"body-{i}".encode() * 8 for i in range(100)]
    res = [store.put_message(msg(body=b, queue_id=i % 2)) for i, b in enumerate(bodies)]
    crash(store)
    seg = sorted((path / "commitlog").iterdir())[-1]
    victim = res[50].records[0]
    with open(seg, "r+b") as f:
        f.seek(victim.phy_offset - int(seg.name) + 100)  # inside the body: the CRC no longer matches
        f.write(b"\xff\xfe\xfd")
    store = reopen(path, clock)
    try:
        assert read_all(store, "T", 0) == bodies[0:50:2]
        assert read_all(store, "T", 1) == bodies[1:50:2]
        assert store.commitlog.max_offset == victim.phy_offset
        # New writes go where the bad record was; nothing stale is resurrected on the next restart.
        store.put_message(msg(body=b"fresh", queue_id=0))
        crash(store)
        store = reopen(path, clock)
        assert read_all(store, "T", 0) == [*bodies[0:50:2], b"fresh"]
        assert read_all(store, "T", 1) == bodies[1:50:2]
    finally:
        store.shutdown()


def test_consume_queue_longer_than_log(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock)
    bodies = [f"q{i}".encode() * 30 for i in range(40)]
    res = [store.put_message(msg(body=b)) for b in bodies]
    store.flush_and_checkpoint()
    crash(store)
    # The log loses its last 10 records (as after a power cut); the consume queue still points at them.
    seg = sorted((path / "commitlog").iterdir())[-1]
    cut = res[30].records[0].phy_offset - int(seg.name)
    with open(seg, "r+b") as f:
        f.seek(cut)
        f.write(bytes(64 * 1024 - cut))
    store = reopen(path, clock)
    try:
        assert store.max_offset("T", 0) == 30
        assert read_all(store) == bodies[:30]
        assert store.put_message(msg(body=b"n")).records[0].queue_offset == 30
    finally:
        store.shutdown()


def test_consume_queue_behind_log_is_rebuilt(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock, consume_queue_units_per_file=1000)
    bodies = [f"b{i}".encode() for i in range(50)]
    for b in bodies:
        store.put_message(msg(body=b))
    store.shutdown()
    # Lose the last 20 units of the consume queue and mark the stop as a crash.
    cq_file = path / "consumequeue" / "T" / "0" / f"{0:020d}"
    with open(cq_file, "r+b") as f:
        f.seek(30 * 20)
        f.write(bytes(20 * 20))
    cp = Checkpoint.load(path / "checkpoint")
    assert cp is not None
    Checkpoint(cp.commitlog_flushed, 0, cp.timestamp_ms).save(path / "checkpoint")
    (path / "abort").touch()
    store = reopen(path, clock, consume_queue_units_per_file=1000)
    try:
        assert store.max_offset("T", 0) == 50
        assert read_all(store) == bodies
    finally:
        store.shutdown()



def test_a_queue_starting_inside_its_first_file_keeps_its_units_across_a_restart(tmp_path: Path,
                                                                                  clock: FakeClock) -> None:
    # A replica joining a master whose log no longer starts at 0 copies the log from there (the broker's
    # append_replicated): each queue's first unit then lies deep inside its first consume-queue file, after empty
    # units. A restart counted the units by a binary search that landed in those and found the queue empty.
    master = reopen(tmp_path / "m", clock, commitlog_segment_size=4096, consume_queue_units_per_file=1000)
    bodies = [f"m{i}".encode() * 10 for i in range(200)]
    for b in bodies:
        assert master.put_message(msg(body=b)).ok
    start = master.commitlog.files.files[-1].file_from_offset
    tail = bytes(master.commitlog.read(start, master.commitlog.max_offset - start) or b"")
    master.shutdown()
    replica = reopen(tmp_path / "r", clock, commitlog_segment_size=4096, consume_queue_units_per_file=1000)
    with replica.lock:
        replica.commitlog.files.last_for_append(start)
        replica.reput.reput_offset = start
    assert replica.append_raw(start, tail)
    first = replica.min_offset("T", 0)
    assert first > 100 and replica.max_offset("T", 0) == 200
    replica.shutdown()
    replica = reopen(tmp_path / "r", clock, commitlog_segment_size=4096, consume_queue_units_per_file=1000)
    try:
        assert (replica.min_offset("T", 0), replica.max_offset("T", 0)) == (first, 200)
        assert read_all(replica) == bodies[first:]
        # written on after a promotion: the queue offsets go on from the end, not over the old units
        assert replica.put_message(msg(body=b"new")).records[0].queue_offset == 200
    finally:
        replica.shutdown()

WRITER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from cometmq.store.config import StoreConfig, FlushDiskType
    from cometmq.store.message import MessageInner
    from cometmq.store.message_store import MessageStore
    cfg = StoreConfig(store_path=Path(sys.argv[1]), commitlog_segment_size=256 * 1024,
                      consume_queue_units_per_file=500, max_hash_slot_num=1024, max_index_num=4096,
                      flush_disk_type=FlushDiskType.SYNC_FLUSH, max_message_size=64 * 1024)
    store = MessageStore(cfg)
    store.start()
    i = 0
    while True:
        body = f"acked-{i}".encode() * 20
        res = store.put_message(MessageInner(topic="K", body=body, queue_id=i % 4,
                                             properties={"KEYS": f"key{i}"}))
        if res.ok and store.wait_flushed(res.end_offset, 5):
            print(json.dumps([i, i % 4, res.records[0].queue_offset]), flush=True)
        i += 1
    """
)


def test_kill_9_under_sync_flush_keeps_every_acknowledged_record(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    acked: list[list[int]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            acked.append(json.loads(line))
            if len(acked) >= 1500:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    assert len(acked) >= 1500
    store = MessageStore(small_config(path, commitlog_segment_size=256 * 1024, consume_queue_units_per_file=500,
                                      max_message_size=64 * 1024, flush_disk_type=SYNC))
    store.start()
    try:
        assert store.recovered_abnormally
        for q in range(4):
            got = read_all(store, "K", q)
            want = [f"acked-{i}".encode() * 20 for i, qq, _ in acked if qq == q]
            assert got[: len(want)] == want
            # Records written after the last ack we read may be there too, but only in order.
            assert all(g.startswith(b"acked-") for g in got)
        assert len(store.query_by_key("K", f"key{acked[-1][0]}")) == 1
    finally:
        store.shutdown()


def test_retention_deletes_expired_segments_and_moves_min_offsets(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock, commitlog_segment_size=4096, consume_queue_units_per_file=8,
                   file_reserved_time_h=1)
    for i in range(300):
        store.put_message(msg(body=str(i).encode() * 40, keys=f"r{i}"))
    segments_before = len(store.commitlog.files.files)
    assert segments_before > 5
    assert store.cleaner.delete_expired(clock.now) == 0  # nothing is an hour old yet
    clock.advance(2 * 3600 * 1000)
    deleted = store.cleaner.delete_expired(clock.now)
    try:
        assert deleted == min(10, segments_before - 1)
        log_min = store.commitlog.min_offset
        assert log_min > 0
        cq_min = store.min_offset("T", 0)
        assert cq_min > 0
        first = store.get_messages("T", 0, cq_min, 1)
        assert first.status is GetStatus.FOUND and first.queue_offsets == [cq_min]
        assert store.read_record(0) is None
        old = store.get_messages("T", 0, 0, 32)
        assert old.status is GetStatus.OFFSET_TOO_SMALL and old.next_begin_offset == cq_min
        assert store.query_by_key("T", "r0") == []
    finally:
        store.shutdown()
    store = reopen(path, clock, commitlog_segment_size=4096, consume_queue_units_per_file=8)
    try:
        assert store.min_offset("T", 0) >= cq_min
        assert store.max_offset("T", 0) == 300
    finally:
        store.shutdown()



def test_readers_of_the_oldest_segment_survive_its_deletion(tmp_path: Path, clock: FakeClock) -> None:
    # Retention deletes under the store lock; reads take none. A read that had found the oldest commit-log segment (or
    # consume-queue file) when the cleaner deleted it failed on the released view, the closed mapping or the missing
    # file (ValueError, FileNotFoundError): a pull answered with an error, a delay level's task ended for good.
    store = reopen(tmp_path / "s", clock, commitlog_segment_size=4096, consume_queue_units_per_file=8,
                   file_reserved_time_h=1)
    for i in range(6000):
        store.put_message(msg(body=b"%d" % i * 20))
    errors: list[BaseException] = []
    done = threading.Event()

    def read_the_oldest() -> None:
        while not done.is_set():
            try:
                offset = store.min_offset("T", 0)
                store.get_messages("T", 0, offset, 4)
                store.get_messages("T", 0, offset, 4, coalesce=True)
                store.read_record(store.commitlog.min_offset)
            except Exception as exc:
                errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the reader lands between a lookup and its read
    reader = threading.Thread(target=read_the_oldest)
    reader.start()
    try:
        clock.advance(2 * 3600 * 1000)
        while len(store.commitlog.files.files) > 2:
            store.cleaner.delete_expired(clock.now)
            time.sleep(0.001)
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
        store.shutdown()
    assert errors == []


DISK_FULL = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from cometmq.store.config import StoreConfig
    from cometmq.store.message import MessageInner
    from cometmq.store.message_store import MessageStore
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    cfg = StoreConfig(store_path=Path(sys.argv[1]), commitlog_segment_size=64 * 1024,
                      consume_queue_units_per_file=64, max_hash_slot_num=64, max_index_num=256,
                      max_message_size=16 * 1024)
    store = MessageStore(cfg)
    store.start()
    store.put_message(MessageInner(topic="D", body=b"d" * 1000, properties={}))  # creates the first segment
    # Files may not grow past 32 KiB from now on: the next 64 KiB commit-log segment cannot be made.
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, hard))
    statuses = []
    for i in range(400):
        res = store.put_message(MessageInner(topic="D", body=b"d" * 1000, properties={}))
        statuses.append(res.status.value)
    print(json.dumps({"ok": 1 + statuses.count("PUT_OK"), "statuses": sorted(set(statuses))}), flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    store.shutdown()
    """
)


def test_disk_full_fails_appends_with_a_status_and_keeps_the_store_consistent(tmp_path: Path,
                                                                                clock: FakeClock) -> None:
    path = tmp_path / "s"
    out = subprocess.run([sys.executable, "-c", DISK_FULL, str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert 0 < report["ok"] < 400
    assert "CREATE_MAPPED_FILE_FAILED" in report["statuses"]
    store = reopen(path, clock)
    try:
        assert not store.recovered_abnormally
        assert read_all(store, "D") == [b"d" * 1000] * report["ok"]
    finally:
        store.shutdown()


def test_async_flush_writes_in_the_background(make_store: MakeStore) -> None:
    store = make_store(flush_disk_type=ASYNC, flush_interval_commitlog_ms=10, flush_commitlog_least_pages=0)
    res = store.put_message(msg())
    assert store.wait_flushed(res.end_offset, 10)


@pytest.mark.parametrize("preallocate", [True, False])
def test_zeroing_a_tail_skips_holes_but_clears_every_byte_past_the_end(tmp_path: Path, preallocate: bool) -> None:
    """zero_from reads only the ranges the file system reports as data; islands of stale bytes far past the end
    (in a preallocated segment, and in a sparse one) are still cleared, and bytes before the end are kept."""
    from cometmq.store.mapped_file import MappedFile

    size = 64 << 20
    mf = MappedFile(tmp_path / f"{0:020d}", size, preallocate=preallocate)
    try:
        mf.mm[0:4096] = b"k" * 4096
        for at in (5000, 9 << 20, 40 << 20, size - 3):
            mf.mm[at:at + 3] = b"xyz"
        mf.flush()
        ranges = mf._data_ranges(4096)
        assert all(4096 <= a < b <= size for a, b in ranges)
        # the islands lie in reported ranges; most of the file does not (when the file system reports holes)
        for at in (5000, 9 << 20, 40 << 20, size - 3):
            assert any(a <= at < b for a, b in ranges), (at, ranges)
        mf.zero_from(4096)
        assert bytes(mf.mm[0:4096]) == b"k" * 4096
        assert mf.mm.find(b"xyz") == -1 and mf.mm.find(b"k", 4096) == -1
    finally:
        mf.close()


def test_a_checkpoint_with_a_digit_flipped_to_an_exponent_is_ignored(tmp_path: Path, clock: FakeClock) -> None:
    """One damaged byte can turn an offset into a JSON number too large for a float ("7e0348" reads as infinity):
    the checkpoint is unreadable, as a missing one is (a full check of the log), not a crash at start."""
    path = tmp_path / "s"
    store = reopen(path, clock)
    bodies = [f"e{i}".encode() for i in range(20)]
    for b in bodies:
        store.put_message(msg(body=b))
    crash(store)
    raw = json.loads((path / "checkpoint").read_bytes())
    text = json.dumps(raw, sort_keys=True).replace(f'"dispatched_offset": {raw["dispatched_offset"]}',
                                                   '"dispatched_offset": 7e0348')
    assert "7e0348" in text
    (path / "checkpoint").write_text(text)
    assert Checkpoint.load(path / "checkpoint") is None
    store = reopen(path, clock)
    try:
        assert store.recovered_abnormally
        assert read_all(store) == bodies
    finally:
        store.shutdown()
