"""Warming the commit log's pages ahead of the writer: pages become resident, contents stay as they were; an idle
writer's window is dropped from the mapping until it moves again."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.common.native import load_c_helper
from cometmq.store import mapped_file, warm
from cometmq.store.mapped_file import MappedFile, MappedFileQueue
from cometmq.store.message_store import MessageStore
from cometmq.store.warm import WarmService
from tests.store.conftest import msg

MiB = 1 << 20


def resident_kib(path: Path) -> int:
    """This process's resident KiB of the mapping of ``path`` (from /proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            for detail in lines[i + 1:i + 30]:
                if detail.startswith("Rss:"):
                    return int(detail.split()[1])
    raise AssertionError(f"{path} is not mapped")


def test_warm_makes_pages_resident_without_changing_them(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / f"{0:020d}", 16 * MiB)
    try:
        mf.append(b"record" * 1000)
        before = resident_kib(mf.path)
        if not mf.warm(8 * MiB):
            pytest.skip("this kernel cannot prefault mapped pages (MADV_POPULATE_WRITE)")
        assert mf.warmed_position >= 8 * MiB
        assert resident_kib(mf.path) >= before + 7 * 1024
        assert bytes(mf.view(0, 6000)) == b"record" * 1000
        assert bytes(mf.view(6000, 8 * MiB - 6000)) == bytes(8 * MiB - 6000)
        mf.warm(64 * MiB)  # clipped to the file's size
        assert mf.warmed_position == 16 * MiB
    finally:
        mf.close()
    assert mf.warm(32 * MiB)  # after close: nothing to do, no crash


@pytest.mark.parametrize("impl", ["c", "ctypes"])
def test_the_c_helper_and_the_ctypes_fallback_warm_alike(impl: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """cometmq.common._osc's populate_write (no ctypes in a server) and the ctypes fallback (no compiler)."""
    osc = load_c_helper("cometmq.common._osc")
    if impl == "c":
        if osc is None:
            pytest.skip("the C helpers are not built")
        populate = osc.populate_write
    else:
        populate = mapped_file._ctypes_populate_write()
        assert populate is not None
    monkeypatch.setattr(mapped_file, "_populate", lambda: populate)
    mf = MappedFile(tmp_path / f"{0:020d}", 8 * MiB)
    try:
        mf.append(b"kept" * 1000)
        before = resident_kib(mf.path)
        if not mf.warm(4 * MiB, step=1 * MiB):
            pytest.skip("this kernel cannot prefault mapped pages (MADV_POPULATE_WRITE)")
        assert mf.warmed_position == 4 * MiB
        assert resident_kib(mf.path) >= before + 3 * 1024
        assert bytes(mf.view(0, 4000)) == b"kept" * 1000
        assert bytes(mf.view(4000, 4 * MiB - 4000)) == bytes(4 * MiB - 4000)
        if impl == "c":  # a range outside the mapping, or not page-aligned, is refused before any call
            for start, length in ((0, 8 * MiB + 1), (-4096, 4096), (100, 4096), (8 * MiB, 1)):
                with pytest.raises(ValueError, match="populate_write"):
                    populate(mf.mm, start, length)
            assert populate(mf.mm, 8 * MiB, 0) == 0
    finally:
        mf.close()


def test_store_keeps_the_window_ahead_of_the_writer(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(commitlog_segment_size=64 * MiB, warm_ahead_bytes=4 * MiB)
    assert store.warmer is not None
    for _ in range(50):
        assert store.put_messages([msg(body=b"b" * 1000) for _ in range(64)]).ok
    mf = store.commitlog.files.last
    assert mf is not None
    deadline = time.monotonic() + 10
    while mf.warmed_position < mf.wrote_position + 4 * MiB - 4096 and time.monotonic() < deadline:
        if store.warmer.disabled:
            pytest.skip("this kernel cannot prefault mapped pages (MADV_POPULATE_WRITE)")
        time.sleep(0.01)
    assert mf.warmed_position >= mf.wrote_position + 4 * MiB - 4096
    assert mf.warmed_position <= mf.wrote_position + 4 * MiB + MiB  # a window, not the whole segment
    got = store.get_messages("T", 0, 0, 32)
    assert got.message_count == 32


def test_warming_can_be_turned_off(make_store: Callable[..., MessageStore]) -> None:
    assert make_store(warm_ahead_bytes=0).warmer is None


def test_unwarm_drops_the_window_past_the_writer_and_keeps_the_bytes(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / f"{0:020d}", 16 * MiB)
    try:
        mf.append(b"record" * 1000)
        if not mf.warm(8 * MiB):
            pytest.skip("this kernel cannot prefault mapped pages (MADV_POPULATE_WRITE)")
        assert resident_kib(mf.path) >= 7 * 1024
        assert mf.unwarm() == 8 * MiB - 8192  # from the page after the one holding the write position
        assert mf.warmed_position == 8192 and resident_kib(mf.path) <= 1024
        assert bytes(mf.view(0, 6000)) == b"record" * 1000  # the written page stays, and its bytes
        assert mf.unwarm() == 0
        mf.append(b"more" * 10)
        assert mf.warm(4 * MiB) and mf.warmed_position >= 4 * MiB and resident_kib(mf.path) >= 3 * 1024
    finally:
        mf.close()
    assert mf.unwarm() == 0  # after close: nothing to do, no crash


def test_an_idle_writer_gets_its_window_dropped_until_it_moves(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path / "log", 64 * MiB)
    service = WarmService(files, 4 * MiB)
    try:
        mf = files.last_for_append()
        mf.append(b"x" * 10_000)
        service.run_once()
        if service.disabled:
            pytest.skip("this kernel cannot prefault mapped pages (MADV_POPULATE_WRITE)")
        assert mf.warmed_position >= 4 * MiB and resident_kib(mf.path) >= 3 * 1024
        service.run_once()  # the writer has not moved, but not for long: kept
        assert mf.warmed_position >= 4 * MiB
        service._moved_at = time.monotonic() - warm.IDLE_RELEASE_S
        service.run_once()
        assert mf.warmed_position == 12_288 and resident_kib(mf.path) <= 1024
        service.run_once()  # still idle: not warmed again
        assert mf.warmed_position == 12_288 and resident_kib(mf.path) <= 1024
        mf.append(b"y" * 100)
        service.run_once()
        assert mf.warmed_position >= 4 * MiB and resident_kib(mf.path) >= 3 * 1024
        assert bytes(mf.view(0, 10_100)) == b"x" * 10_000 + b"y" * 100
    finally:
        files.close()
