"""Disk pressure (issue [15]) on a real small file system (an 8 MiB tmpfs; skipped where it cannot be mounted):
writes are refused with SERVICE_NOT_AVAILABLE "disk full" before anything is written, at RocketMQ's
diskSpaceWarningLevelRatio or when the next segment does not fit; the forced clean deletes segments before their
reserved time only with cleanFileForciblyEnable, logs it at WARNING and counts the messages."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cometmq.broker.appender import answer_code
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.store import message_store
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutStatus
from tests.store.conftest import msg

MIB = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "fs"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("cannot mount a tmpfs here")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)


@pytest.fixture(autouse=True)
def _no_disk_check_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(message_store, "DISK_CHECK_INTERVAL_S", 0.0)


def _fill(path: Path, nbytes: int) -> Path:
    ballast = path / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\x01" * nbytes)
    return ballast


def _used_pct(path: Path) -> float:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bavail) * 100 / st.f_blocks


def test_segment_larger_than_the_free_space_is_refused_with_service_not_available(
        small_fs: Path, make_store: Callable[..., MessageStore]) -> None:
    # The case: 1 GiB segments (RocketMQ's default) on a disk with less free space than that.
    store = make_store(small_fs / "store", commitlog_segment_size=1 << 30, max_message_size=4 * MIB)
    result = store.put_message(msg())
    assert result.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk full" in result.remark
    with pytest.raises(RemotingError) as err:
        answer_code(result)
    assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE  # was SYSTEM_ERROR (CREATE_MAPPED_FILE_FAILED)
    assert store.commitlog.max_offset == 0 and not list(store.config.commitlog_dir.iterdir())
    again = store.put_message(msg())  # still refused, quickly, with the same clear answer
    assert again.status is PutStatus.SERVICE_NOT_AVAILABLE and "does not fit" in again.remark


def test_writes_refused_above_the_warning_level_and_taken_again_below(
        small_fs: Path, make_store: Callable[..., MessageStore]) -> None:
    store = make_store(small_fs / "store", commitlog_segment_size=MIB)
    assert store.put_message(msg()).ok
    end = store.commitlog.max_offset
    ballast = _fill(small_fs, int(8 * MIB * 0.93) - MIB)
    assert _used_pct(small_fs) >= 90
    result = store.put_message(msg())
    assert result.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk full" in result.remark
    assert store.commitlog.max_offset == end  # nothing written
    ballast.unlink()
    assert store.put_message(msg()).ok


def _fill_segments(store: MessageStore, segments: int) -> int:
    n = 0
    while len(store.commitlog.files.files) <= segments:
        assert store.put_message(msg(body=b"m" * 1000)).ok
        n += 1
    deadline = time.monotonic() + 5
    while store.reput.reput_offset < store.commitlog.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


@pytest.mark.parametrize("forcibly", [True, False])
def test_forced_clean_is_configured_logged_and_counted(
        small_fs: Path, make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture,
        forcibly: bool) -> None:
    store = make_store(small_fs / "store", commitlog_segment_size=MIB, clean_file_forcibly_enable=forcibly,
                       disk_space_warning_level_ratio=99, clean_resource_interval_ms=3_600_000)
    _fill_segments(store, 3)
    first_segment = store.commitlog.files.files[0].file_from_offset
    before = store.min_offset("T", 0)
    _fill(small_fs, int(8 * MIB * 0.88) - 4 * MIB)
    assert _used_pct(small_fs) >= store.config.disk_force_clean_ratio
    with caplog.at_level(logging.INFO, logger="cometmq.store"):
        store.cleaner.clean()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if forcibly:
        assert store.commitlog.min_offset > first_segment
        removed = store.min_offset("T", 0) - before
        assert removed > 0 and store.cleaner.forced_deleted_messages == removed
        assert store.cleaner.forced_deleted_segments == 1
        assert any("before their reserved time" in r.getMessage() for r in warnings)
    else:  # unexpired (never consumed) messages stay; one WARNING says why
        assert store.commitlog.min_offset == first_segment and store.min_offset("T", 0) == before
        assert store.cleaner.forced_deleted_messages == 0
        assert any("cleanFileForciblyEnable=false" in r.getMessage() for r in warnings)


REPLICA_ON_A_FULL_DISK = textwrap.dedent(
    """
    import json, os, struct, sys
    from pathlib import Path
    from cometmq.store import index
    from cometmq.store.config import StoreConfig
    from cometmq.store.message import MessageInner
    from cometmq.store.message_store import MessageStore
    index.RESERVE_STEP = 4096  # (the default reserves 1 MiB of entries ahead: more than this test writes)
    master_dir, replica_dir, fs = map(Path, sys.argv[1:4])

    def config(path):
        return StoreConfig(store_path=path, commitlog_segment_size=1 << 20, consume_queue_units_per_file=100_000,
                           max_hash_slot_num=1024, max_index_num=100_000, max_message_size=64 * 1024)

    master = MessageStore(config(master_dir))
    master.start()
    for i in range(1500):
        props = {"KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}
        assert master.put_message(MessageInner(topic="T", body=b"x" * 100, properties=props)).ok
    end = master.commitlog.max_offset
    data = bytes(master.commitlog.read(0, end))
    master.shutdown()
    starts, off = [], 0
    while off < end:
        starts.append(off)
        off += struct.unpack_from(">i", data, off)[0]
    replica = MessageStore(config(replica_dir))
    replica.start()
    half = starts[1000]
    assert replica.append_raw(0, data[:half])  # as a replica appends its master's bytes (no disk check)
    replica.index_builder.drain()
    fd = os.open(fs / "ballast", os.O_WRONLY | os.O_CREAT)  # the disk fills up
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    os.close(fd)
    assert replica.append_raw(half, data[half:])  # commit-log segment and consume-queue room were reserved
    replica.index_builder.drain()  # the index needs new pages: a write into a hole here was SIGBUS
    print(json.dumps({"max": replica.max_offset("T", 0), "old": len(replica.query_by_key("T", "k500")),
                      "new": len(replica.query_by_key("T", "k1400"))}), flush=True)
    os.unlink(fs / "ballast")
    replica.shutdown()
    """
)


def test_a_replica_indexing_on_a_full_disk_is_not_killed(small_fs: Path, tmp_path: Path) -> None:
    # A replica appends what its master sends without the write path's disk check, and the key index is a sparse
    # mapped file: once the disk filled, the index builder's first write into an unbacked page killed the broker
    # with SIGBUS (and a recovery re-indexing on that disk would again, at every start).
    out = subprocess.run([sys.executable, "-c", REPLICA_ON_A_FULL_DISK, str(tmp_path / "master"),
                          str(small_fs / "replica"), str(small_fs)], capture_output=True, text=True, timeout=120)
    assert out.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["max"] == 1500  # every message is in its queue
    assert report["old"] == 1  # keys indexed before the disk filled are still found
    assert report["new"] == 0  # the ones after it could not be indexed: said so, once
    assert out.stderr.count("no disk space for entries") == 1


INDEX_FILES_ON_A_FULL_DISK = textwrap.dedent(
    """
    import json, os, struct, sys
    from pathlib import Path
    from cometmq.store.config import StoreConfig
    from cometmq.store.message import MessageInner
    from cometmq.store.message_store import MessageStore
    master_dir, replica_dir, fs = map(Path, sys.argv[1:4])

    def config(path):  # small index files: the replica must make new ones as it goes
        return StoreConfig(store_path=path, commitlog_segment_size=1 << 20, consume_queue_units_per_file=100_000,
                           max_hash_slot_num=64, max_index_num=200, max_message_size=64 * 1024)

    master = MessageStore(config(master_dir))
    master.start()
    for i in range(200):  # (the replica's consume queue stays in the page it has in memory: no disk needed)
        props = {"KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}
        assert master.put_message(MessageInner(topic="T", body=b"x" * 100, properties=props)).ok
    assert master.put_message(MessageInner(topic="T", body=b"y", properties={"KEYS": "after"})).ok
    end = master.commitlog.max_offset
    data = bytes(master.commitlog.read(0, end))
    master.shutdown()
    starts, off = [], 0
    while off < end:
        starts.append(off)
        off += struct.unpack_from(">i", data, off)[0]
    starts.append(end)
    replica = MessageStore(config(replica_dir))
    replica.start()
    assert replica.append_raw(0, data[: starts[100]])
    replica.index_builder.drain()
    fd = os.open(fs / "ballast", os.O_WRONLY | os.O_CREAT)  # the disk fills up
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        pass
    os.close(fd)
    for a, b in zip(starts[100:-2], starts[101:-1]):  # record by record, as replication may send them
        assert replica.append_raw(a, data[a:b])
        replica.index_builder.drain()
    index = replica.index
    report = {"max": replica.max_offset("T", 0), "indexed": sum(f.count for f in index.files),
              "unindexed": index.unindexed_keys, "old": len(replica.query_by_key("T", "k50")),
              "new": len(replica.query_by_key("T", "k190"))}
    os.unlink(fs / "ballast")  # space again: keys are indexed again
    assert replica.append_raw(starts[-2], data[starts[-2] :])
    replica.index_builder.drain()
    report["after"] = len(replica.query_by_key("T", "after"))
    print(json.dumps(report), flush=True)
    replica.shutdown()
    """
)


def test_keys_not_indexed_on_a_full_disk_are_logged_once_and_counted(small_fs: Path, tmp_path: Path) -> None:
    # Keys that find no disk space in the index (no room for a new index file, or for entries in the current one)
    # are not indexed, as RocketMQ's IndexService drops a key it cannot index (it never indexes it later). Each
    # dispatch while the disk stayed full logged an ERROR again (a new index file was tried for every batch), and
    # nothing counted the keys lost.
    out = subprocess.run([sys.executable, "-c", INDEX_FILES_ON_A_FULL_DISK, str(tmp_path / "master"),
                          str(small_fs / "replica"), str(small_fs)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["max"] == 200  # every message is in its queue
    assert report["old"] == 1 and report["new"] == 0
    assert report["unindexed"] > 0 and report["indexed"] + report["unindexed"] == 2 * 200
    assert out.stderr.count("keys are not indexed") == 1, out.stderr
    assert out.stderr.count("keys are indexed again") == 1 and report["after"] == 1


def test_a_dispatch_the_full_disk_stops_answers_stored_and_goes_on_once_there_is_room(
        small_fs: Path, make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills between the store's disk checks (above its ratio only once it is 100 % full): the record goes
    into the preallocated log segment, but a new queue's consume-queue file cannot grow. The put raised OSError
    after storing it: the producer was told SYSTEM_ERROR and sent the message again (a duplicate). Now the put is
    answered stored, the dispatch stops there (logged once) and goes on from the log once there is room: at the
    next append, or at the maintenance pass when no append comes."""
    monkeypatch.setattr(message_store, "DISK_CHECK_INTERVAL_S", 3600.0)  # checked at the first put only
    store = make_store(small_fs / "store", commitlog_segment_size=2 * MIB, consume_queue_units_per_file=1000)
    assert store.put_message(msg()).ok
    ballast = small_fs / "ballast"
    try:
        _stall_and_go_on(store, ballast, caplog)
    finally:
        ballast.unlink(missing_ok=True)


def _stall_and_go_on(store: MessageStore, ballast: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open(ballast, "ab", buffering=0) as f:  # every block left, in 64 KiB steps then smaller ones
        for step in (64 * 1024, 4096, 1):
            try:
                while True:
                    f.write(b"\x01" * step)
            except OSError:
                pass
    # A new queue's first page is a buffer in memory; once it is full (204 units) its file must be made: ENOSPC.
    with caplog.at_level(logging.ERROR, logger="cometmq.store.dispatch"):
        results = [store.put_message(msg(topic="New")) for _ in range(300)]
    assert all(r.ok for r in results), {r.status for r in results}
    assert store.reput.stalled is not None
    assert store.max_offset("New", 0) < 300  # all stored, not all dispatched yet
    stops = [r for r in caplog.records if r.name == "cometmq.store.dispatch"]
    assert len(stops) == 1 and stops[0].exc_info is not None  # once a spell, not once a put
    ballast.unlink()
    with store.lock:  # what the maintenance pass does when no append comes
        store.reput.retry()
    assert store.reput.stalled is None and store.reput.reput_offset == store.commitlog.max_offset
    got = store.get_messages("New", 0, 0, 500)
    assert list(got.queue_offsets) == list(range(300))
    assert store.put_message(msg(topic="New")).ok
    assert store.max_offset("New", 0) == 301
