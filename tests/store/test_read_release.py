"""Reading an old part of the log does not leave it in the broker's RSS.

A consumer far behind reads the log through the broker's mapping, which faults every page it reads back into this
process (the page cache holds them anyway): reading a 1 M-message backlog took the broker from ~60 to ~330 MiB and
it stayed there. The flush service unmaps what readers mapped behind the writer's window once a second
(``MappedFileQueue.release_reads``); the bytes read back the same afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

from cometmq.store import flush
from cometmq.store.flush import AsyncFlushService
from cometmq.store.mapped_file import MappedFileQueue

MiB = 1 << 20
PAGE = 4096


def mapped_rss(path: Path) -> int:
    """Bytes of ``path``'s mappings resident in this process (/proc/self/smaps)."""
    total, mine = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
            mine = len(head) >= 6 and head[5] == str(path)
        elif mine and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


def touch(view: memoryview) -> int:
    """Read one byte of each page (as a reader of records does)."""
    return sum(view[i] for i in range(0, len(view), PAGE))


def test_pages_readers_map_behind_the_writer_are_unmapped_again(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path / "log", 64 * MiB)
    try:
        mf = files.last_for_append()
        data = bytes(range(256)) * (48 * MiB // 256)
        mf.append(data)
        files.flush()
        files.release_flushed(0)  # the writer's window: nothing of it kept
        path = mf.path
        assert mapped_rss(path) < 2 * MiB
        assert touch(mf.view(0, len(data))) == sum(data[i] for i in range(0, len(data), PAGE))
        assert mapped_rss(path) > 40 * MiB  # the read mapped them back
        files.release_reads()
        assert mapped_rss(path) < 2 * MiB
        assert bytes(mf.view(0, len(data))) == data  # read back, from the page cache
    finally:
        files.close()


def test_the_flush_service_releases_reads_once_an_interval(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path / "log", 64 * MiB)
    try:
        mf = files.last_for_append()
        mf.append(b"r" * (32 * MiB))
        files.flush()
        files.release_flushed(0)
        service = AsyncFlushService(files, interval_ms=500, least_pages=4, thorough_interval_ms=10_000)
        touch(mf.view(0, 32 * MiB))
        service.run_once()  # within the interval of its start: nothing released yet
        assert mapped_rss(mf.path) > 24 * MiB
        service._reads_released_at = time.monotonic() - flush.READ_RELEASE_INTERVAL_S
        service.run_once()
        assert mapped_rss(mf.path) < 2 * MiB
    finally:
        files.close()
