"""Consume queues at scale (issue 18): no file for a queue never written, files that grow as they fill, new files
made by the flush pass, RocketMQ's consume-queue flush policy, a bound on open mappings, and recovery of many queues
after SIGKILL."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cometmq.protocol.message import decode_record
from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.consume_queue import CQ_UNIT
from cometmq.store.cq_file import PAGE_SIZE, MappingLRU
from cometmq.store.message_store import MessageStore
from cometmq.store.retention import MaintenanceService
from cometmq.store.status import GetStatus
from tests.store.conftest import msg, small_config

ROOT = Path(__file__).resolve().parents[2]


def cq_dir(store: MessageStore, topic: str, qid: int) -> Path:
    return store.config.consume_queue_dir / topic / str(qid)


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def bodies(store: MessageStore, topic: str, qid: int, start: int = 0) -> list[bytes]:
    r = store.get_messages(topic, qid, start, 1000)
    return [bytes(decode_record(b)[0].body) for b in r.buffers] if r.status is GetStatus.FOUND else []


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_queue_never_written_has_no_file_or_folder(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    store.put_messages([msg(queue_id=0), msg(queue_id=0)])
    store.flush_and_checkpoint()
    assert cq_dir(store, "T", 0).is_dir()
    assert not cq_dir(store, "T", 1).exists()
    assert not (store.config.consume_queue_dir / "Other").exists()
    assert ("T", 1) not in store.queues
    r = store.get_messages("T", 1, 0, 32)
    assert r.status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    path = Path(store.config.store_path)
    store.shutdown()
    again = MessageStore(small_config(path))
    again.start()
    try:
        assert not cq_dir(again, "T", 1).exists()
        assert again.max_offset("T", 0) == 2 and again.max_offset("T", 1) == 0
    finally:
        again.shutdown()


def test_a_new_file_stays_in_memory_until_the_flush_pass_makes_it(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(flush_interval_consume_queue_ms=3_600_000)
    store.put_messages([msg(body=b"a"), msg(body=b"b")])
    d = cq_dir(store, "T", 0)
    assert not d.exists()  # pending: nothing on disk yet, readable all the same
    assert bodies(store, "T", 0) == [b"a", b"b"]
    assert store.make_pending_files() == 1
    f = store.queues[("T", 0)].files.files[0]
    assert not f.pending and f.mapped
    data = (d / "00000000000000000000").read_bytes()
    assert CQ_UNIT.unpack_from(data, 0)[1] > 0 and CQ_UNIT.unpack_from(data, CQ_UNIT_SIZE)[1] > 0
    store.put_messages([msg(body=b"c")])  # written into the mapping from now on
    assert bodies(store, "T", 0) == [b"a", b"b", b"c"]


def test_a_queue_of_three_messages_takes_at_most_a_page_of_disk(tmp_path: Path) -> None:
    # RocketMQ's default geometry: 300,000 units (6 MB) a file
    store = MessageStore(small_config(tmp_path / "s", consume_queue_units_per_file=300_000))
    store.start()
    try:
        store.put_messages([msg(body=b"%d" % i) for i in range(3)])
        store.flush_and_checkpoint()
        d = cq_dir(store, "T", 0)
        f = d / "00000000000000000000"
        assert f.stat().st_size == PAGE_SIZE
        assert disk_bytes(d) <= 1 << 20
        assert f.stat().st_blocks * 512 <= 64 * 1024
    finally:
        store.shutdown()
    assert disk_bytes(tmp_path / "s" / "consumequeue") <= 1 << 20


def test_a_file_grows_in_chunks_and_recovery_finds_its_last_unit(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = MessageStore(small_config(path, consume_queue_units_per_file=300_000))
    store.start()
    n = 1000  # past the first page (204 units) and the second chunk
    for i in range(0, n, 100):
        store.put_messages([msg(body=b"%d" % j) for j in range(i, i + 100)])
    f = store.queues[("T", 0)].files.files[0]
    assert f.length >= n * CQ_UNIT_SIZE and f.length % PAGE_SIZE == 0 and f.length < 300_000 * CQ_UNIT_SIZE
    store.shutdown()
    on_disk = (cq_dir(store, "T", 0) / "00000000000000000000").stat().st_size
    assert on_disk == f.length
    for abnormal in (False, True):
        if abnormal:
            (path / "abort").touch()
        again = MessageStore(small_config(path, consume_queue_units_per_file=300_000))
        again.start()
        try:
            assert again.max_offset("T", 0) == n
            assert again.get_messages("T", 0, n - 1, 1).status is GetStatus.FOUND
            again.put_messages([msg(body=b"more")])
            assert again.max_offset("T", 0) == n + 1
            assert bodies(again, "T", 0, n) == [b"more"]
        finally:
            again.shutdown()
        n += 1


def test_a_full_size_file_of_an_older_version_loads(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = MessageStore(small_config(path, consume_queue_units_per_file=300_000))
    store.start()
    store.put_messages([msg(body=b"%d" % i) for i in range(5)])
    store.shutdown()
    f = cq_dir(store, "T", 0) / "00000000000000000000"
    os.truncate(f, 300_000 * CQ_UNIT_SIZE)  # preallocated at full size, as before
    again = MessageStore(small_config(path, consume_queue_units_per_file=300_000))
    again.start()
    try:
        assert again.max_offset("T", 0) == 5
        again.put_messages([msg(body=b"x")])
        assert bodies(again, "T", 0) == [b"0", b"1", b"2", b"3", b"4", b"x"]
    finally:
        again.shutdown()


def test_growth_on_a_full_disk_fails_before_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(small_config(tmp_path / "s", consume_queue_units_per_file=300_000))
    store.start()
    try:
        store.put_messages([msg(body=b"%d" % i) for i in range(10)])
        store.make_pending_files()
        f = store.queues[("T", 0)].files.files[0]
        length = f.length

        def full(fd: int, offset: int, size: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        with pytest.raises(OSError):
            f.ensure(length + CQ_UNIT_SIZE)
        assert f.length == length and os.stat(f.path).st_size == length  # nothing mapped past the reserved blocks
        monkeypatch.undo()
        assert len(f.ensure(length + CQ_UNIT_SIZE)) > length
    finally:
        store.shutdown()


def _stores_with_dirty(tmp_path: Path) -> tuple[MessageStore, MaintenanceService, FakeMonotonic]:
    store = MessageStore(small_config(tmp_path / "s", consume_queue_units_per_file=300_000,
                                      flush_interval_consume_queue_ms=3_600_000, message_index_enable=False))
    store.start()
    clock = FakeMonotonic()
    return store, MaintenanceService(store, monotonic=clock), clock


def test_flush_policy_least_pages_then_thorough_interval(tmp_path: Path) -> None:
    store, service, clock = _stores_with_dirty(tmp_path)
    try:
        assert store.config.flush_consume_queue_least_pages == 2
        assert store.config.flush_consume_queue_thorough_interval_ms == 60_000
        small = store.put_messages([msg(topic="Small", body=b"s")]).records[0].phy_offset
        units = 2 * PAGE_SIZE // CQ_UNIT_SIZE + 10  # more than two pages of units
        for i in range(0, units, 200):
            store.put_messages([msg(topic="Big", body=b"b") for _ in range(min(200, units - i))])
        big = store.queues[("Big", 0)].files.files[0]
        little = store.queues[("Small", 0)].files.files[0]
        service.run_once()
        # Big had >= 2 dirty pages: flushed. Small had one unit: left dirty, and it holds the checkpoint back.
        assert big.flushed_position == big.wrote_position
        assert little.flushed_position == 0 < little.wrote_position
        assert store.queues[("Small", 0)] in store.dirty_queues
        cp = json.loads(store.checkpoint_file.read_bytes())
        assert cp["dispatched_offset"] == small
        # Nothing new and the thorough interval not reached: nothing happens.
        clock.t += 30
        service.run_once()
        assert little.flushed_position == 0
        # 60 s after the last thorough flush: everything is flushed and the checkpoint reaches the dispatch point.
        clock.t += 30
        service.run_once()
        assert little.flushed_position == little.wrote_position
        assert not store.dirty_queues
        cp = json.loads(store.checkpoint_file.read_bytes())
        assert cp["dispatched_offset"] == store.reput.reput_offset
        assert service.thorough_passes == 1
    finally:
        store.shutdown()


def test_flush_policy_keys_are_read(tmp_path: Path) -> None:
    from cometmq.store.config import STORE_KEYS, StoreConfig, convert_keys

    changes = convert_keys({"flushConsumeQueueLeastPages": "0", "flushConsumeQueueThoroughInterval": "1000",
                            "maxOpenConsumeQueueFiles": "16"}, STORE_KEYS)
    cfg = StoreConfig(store_path=tmp_path).replace(**changes)
    assert (cfg.flush_consume_queue_least_pages, cfg.flush_consume_queue_thorough_interval_ms,
            cfg.max_open_consume_queue_files) == (0, 1000, 16)


def test_a_failed_flush_keeps_the_queue_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = _stores_with_dirty(tmp_path)
    try:
        phy = store.put_messages([msg(body=b"a")]).records[0].phy_offset
        store.make_pending_files()
        real = os.fdatasync

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(os, "fdatasync", failing)
        store.flush_and_checkpoint(0)
        cq = store.queues[("T", 0)]
        assert cq in store.dirty_queues and cq.dirty_phy == phy
        assert json.loads(store.checkpoint_file.read_bytes())["dispatched_offset"] == phy
        monkeypatch.setattr(os, "fdatasync", real)
        store.flush_and_checkpoint(0)
        assert not store.dirty_queues
    finally:
        store.shutdown()


def _mapped_cq_files(store: MessageStore) -> int:
    root = str(store.config.consume_queue_dir)
    with open("/proc/self/maps") as fh:
        return sum(1 for line in fh if root in line)


def test_open_mappings_are_bounded_by_an_lru(tmp_path: Path) -> None:
    import gc

    store = MessageStore(small_config(tmp_path / "s", max_open_consume_queue_files=8))
    store.start()
    try:
        for i in range(50):
            store.put_messages([msg(topic=f"T{i}", body=b"%d-%d" % (i, j)) for j in range(3)])
        store.make_pending_files()
        lru = store.cq_mappings
        assert len(lru) <= 8 and lru.evicted >= 42
        for _ in range(2):
            for i in range(50):
                assert bodies(store, f"T{i}", 0) == [b"%d-%d" % (i, j) for j in range(3)]
                assert len(lru) <= 8
        # writes to a queue whose file was unmapped map it again and land in the file
        for i in range(50):
            store.put_messages([msg(topic=f"T{i}", body=b"%d-3" % i)])
            assert len(lru) <= 8
        gc.collect()
        assert _mapped_cq_files(store) <= 8
        assert all(bodies(store, f"T{i}", 0)[-1] == b"%d-3" % i for i in range(50))
    finally:
        store.shutdown()
    again = MessageStore(small_config(tmp_path / "s", max_open_consume_queue_files=8))
    again.start()
    try:
        assert len(again.cq_mappings) == 0  # start-up maps nothing
        assert all(again.max_offset(f"T{i}", 0) == 4 for i in range(50))
    finally:
        again.shutdown()


def test_lru_unmaps_the_least_recently_used() -> None:
    lru = MappingLRU(2)

    class F:
        _mm: object = None
        _len = 0
        _image = None

    a, b, c = F(), F(), F()
    lru.install(a, "A", 1)  # type: ignore[arg-type]
    lru.install(b, "B", 1)  # type: ignore[arg-type]
    lru.use(a)  # type: ignore[arg-type]
    lru.install(c, "C", 1)  # type: ignore[arg-type]
    assert (a._mm, b._mm, c._mm) == ("A", None, "C")
    assert lru.evicted == 1 and len(lru) == 2


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tests.store.conftest import msg, small_config
    from cometmq.store.message_store import MessageStore
    path, queues, rounds, flush_after, least = (Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                                int(sys.argv[4]), int(sys.argv[5]))
    store = MessageStore(small_config(path, flush_interval_consume_queue_ms=3_600_000, max_open_consume_queue_files=16,
                                      consume_queue_units_per_file=300_000))
    store.start()
    for r in range(rounds):
        store.put_messages([msg(topic=f"Q{q % 97}", queue_id=q // 97, body=b"%d-%d" % (q, r)) for q in range(queues)])
        if r == flush_after:
            store.flush_and_checkpoint(least)  # files made; flushed (least 0) or most left dirty (least 2)
    # queues new since the last flush pass: their files are still buffers in memory, lost with the process
    store.put_messages([msg(topic="New", queue_id=i, body=b"new-%d" % i) for i in range(50)])
    print("written", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize(("flush_after", "least"), [(-1, 2), (1, 2), (1, 0)])
def test_many_queues_recover_after_sigkill(tmp_path: Path, flush_after: int, least: int) -> None:
    path = tmp_path / "s"
    queues, rounds = 400, 4
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(queues), str(rounds), str(flush_after),
                             str(least)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "written"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    t0 = time.monotonic()
    store = MessageStore(small_config(path, consume_queue_units_per_file=300_000, max_open_consume_queue_files=16))
    store.start()
    try:
        assert store.recovered_abnormally
        for q in range(queues):
            topic, qid = f"Q{q % 97}", q // 97
            assert store.max_offset(topic, qid) == rounds, (topic, qid)
            assert bodies(store, topic, qid) == [b"%d-%d" % (q, r) for r in range(rounds)]
        assert [bodies(store, "New", i) for i in range(50)] == [[b"new-%d" % i] for i in range(50)]
        assert len(store.cq_mappings) <= 16
        # and it goes on from there
        store.put_messages([msg(topic="Q0", queue_id=0, body=b"after")])
        assert store.max_offset("Q0", 0) == rounds + 1
    finally:
        store.shutdown()
    assert time.monotonic() - t0 < 60
    again = MessageStore(small_config(path, consume_queue_units_per_file=300_000))
    again.start()
    try:
        assert not again.recovered_abnormally
        assert again.max_offset("Q0", 0) == rounds + 1
        assert sum(again.max_offset(f"Q{q % 97}", q // 97) for q in range(queues)) == queues * rounds + 1
    finally:
        again.shutdown()


def test_a_truncated_pending_queue_stays_dirty_until_flushed(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(flush_interval_consume_queue_ms=3_600_000, message_index_enable=False)
    recs = store.put_messages([msg(body=b"a"), msg(body=b"b"), msg(body=b"c")]).records
    store.truncate(recs[2].phy_offset)  # a replica cut back: the pending file keeps two units, none on disk
    cq = store.queues[("T", 0)]
    f = cq.files.files[0]
    assert f.pending and cq.max_offset == 2 and f.flushed_position == 0
    store.flush_and_checkpoint(0)
    assert not f.pending and f.flushed_position == f.wrote_position == 2 * CQ_UNIT_SIZE
    assert bodies(store, "T", 0) == [b"a", b"b"]
    assert json.loads(store.checkpoint_file.read_bytes())["dispatched_offset"] == recs[2].phy_offset


def test_a_queue_offset_far_past_the_end_is_not_filled_with_files(tmp_path: Path) -> None:
    from cometmq.store.consume_queue import MAX_GAP_FILES, ConsumeQueue

    cq = ConsumeQueue("T", 0, tmp_path / "T" / "0", 64)
    assert cq.put(0, 100, 10, 0)
    assert cq.put(3, 200, 10, 0)  # a small gap is filled (units of size 0 in between)
    assert cq.max_offset == 4 and cq.get_unit(1) == (0, 0, 0)
    far = 64 * (MAX_GAP_FILES + 2)
    assert not cq.put(far, 300, 10, 0)  # a damaged header's offset: refused, no thousands of files
    assert cq.max_offset == 4 and len(cq.files.files) == 1
    assert cq.put(4, 400, 10, 0)
    cq.destroy()


def test_bounds_is_min_and_max_offset_in_one_call(tmp_path: Path) -> None:
    """``bounds()`` (the woken pull's fast answer reads both in one call) is ``(min_offset, max_offset)``: empty, as
    units are put across files, once the oldest file is deleted (its min moves), and once truncated back."""
    from cometmq.store.consume_queue import ConsumeQueue

    cq = ConsumeQueue("T", 0, tmp_path / "T" / "0", 4)
    seen = [cq.bounds() == (cq.min_offset, cq.max_offset) == (0, 0)]
    for i in range(10):
        assert cq.put(i, 100 * (i + 1), 10, 0)
        seen.append(cq.bounds() == (cq.min_offset, cq.max_offset) == (0, i + 1))
    assert all(seen)
    assert cq.delete_before_phy(500) >= 1  # units below commit-log offset 500 are gone with their file
    assert cq.bounds() == (cq.min_offset, cq.max_offset) and cq.min_offset > 0 and cq.max_offset == 10
    cq.truncate_to(6)
    assert cq.bounds() == (cq.min_offset, cq.max_offset) == (cq.min_offset, 6)
    cq.destroy()


_FULL_THEN_PENDING = textwrap.dedent("""
    import json, resource, signal, sys, time
    from pathlib import Path
    from tests.store.conftest import msg, small_config
    from cometmq.store.message_store import MessageStore
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = MessageStore(small_config(Path(sys.argv[1]), consume_queue_units_per_file=8, message_index_enable=False,
                                      flush_interval_consume_queue_ms=3_600_000))
    store.start()
    for i in range(8):
        store.put_message(msg(body=b"m%d" % i))
    store.make_pending_files()  # the queue's first file (full) is on disk and mapped, not flushed
    # From here no file may grow past 150 bytes (a full disk): the next file (160 bytes) cannot be made.
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (150, hard))
    res = store.put_message(msg(body=b"m8"))  # its unit goes to a new file, a buffer in memory
    store.flush_and_checkpoint(0)
    print(json.dumps([res.status.value, res.records[0].queue_offset]), flush=True)
    time.sleep(600)
""")


def test_a_full_file_flushed_does_not_make_a_queue_with_a_file_in_memory_clean(tmp_path: Path) -> None:
    """A queue whose full file is flushed while its next file is still a buffer in memory (its file could not be
    made, or was not made yet) stays dirty from that buffer's first unit: the checkpoint must not claim it, or a
    SIGKILL loses the unit for good (recovery re-dispatches only from the checkpoint)."""
    path = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-c", _FULL_THEN_PENDING, str(path)], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == ["PUT_OK", 8]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    store = MessageStore(small_config(path, consume_queue_units_per_file=8, message_index_enable=False))
    store.start()
    try:
        assert store.recovered_abnormally
        assert store.max_offset("T", 0) == 9
        assert bodies(store, "T", 0) == [b"m%d" % i for i in range(9)]
    finally:
        store.shutdown()
