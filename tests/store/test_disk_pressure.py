"""Disk pressure (issue [15]) on a real small file system (an 8 MiB tmpfs; skipped where it cannot be mounted):
writes are refused with SERVICE_NOT_AVAILABLE "disk full" before anything is written, at RocketMQ's
diskSpaceWarningLevelRatio or when the next segment does not fit; the forced clean deletes segments before their
reserved time only with cleanFileForciblyEnable, logs it at WARNING and counts the messages."""

from __future__ import annotations

import logging
import os
import subprocess
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
