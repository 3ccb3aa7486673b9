"""Warming the commit log's pages ahead of the writer: pages become resident, contents stay as they were."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.store.mapped_file import MappedFile
from cometmq.store.message_store import MessageStore
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
