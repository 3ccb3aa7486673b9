"""A durable append writes what it changed, not the large page-cache folio around it.

On Linux 6.x, pages faulted in order through an ext4 file's mapping are read ahead into large folios (up to
2 MiB); an append of a few hundred bytes then dirties the whole folio, and every SYNC_FLUSH fdatasync wrote
2 MiB (0.6 ms instead of 0.15 ms per durable send). The segment queue advises its unwritten part MADV_RANDOM.
"""

from __future__ import annotations

from pathlib import Path

from cometmq.store.mapped_file import MappedFileQueue

MiB = 1 << 20


def write_bytes() -> int:
    """Bytes this process has caused to be written to storage (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def test_a_small_durable_append_after_a_bulk_writes_a_few_pages(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path / "log", 256 * MiB)
    try:
        mf = files.last_for_append()
        chunk = b"b" * (150 * 128)
        for i in range(64 * MiB // len(chunk)):  # 64 MiB through the mapping, in order, as batched sends do
            mf.append(chunk)
            if i % 8 == 0:
                files.flush()
        files.flush()
        per_append = []
        for _ in range(20):
            before = write_bytes()
            mf.append(b"x" * 200)
            files.flush()
            per_append.append(write_bytes() - before)
        per_append.sort()
        # one or two 4 KiB pages (the record may straddle two), not a 2 MiB folio
        assert per_append[len(per_append) // 2] <= 64 * 1024, per_append
        assert bytes(mf.view(mf.wrote_position - 200, 200)) == b"x" * 200
    finally:
        files.close()


def test_released_and_reopened_segments_read_back(tmp_path: Path) -> None:
    files = MappedFileQueue(tmp_path / "log", 16 * MiB)
    mf = files.last_for_append()
    data = bytes(range(256)) * (8 * MiB // 256)
    mf.append(data)
    files.flush()
    mf.release_pages(0, 4 * MiB)  # unmapped behind the writer, read-ahead given back
    assert bytes(mf.view(0, len(data))) == data
    files.close()
    again = MappedFileQueue(tmp_path / "log", 16 * MiB)
    again.load()
    again.set_write_end(len(data))
    last = again.last
    assert last is not None and last.wrote_position == len(data)
    assert bytes(last.view(0, len(data))) == data
    again.close()


def test_written_pages_unmapped_before_a_flush_still_reach_the_file(tmp_path: Path) -> None:
    """``release_written`` drops this process's mapping of written, unflushed pages once enough of them are mapped
    (their dirty state stays with the page cache, which the flush then writes); they read back through the mapping
    and from the file."""
    from tests.store.test_warm import resident_kib

    files = MappedFileQueue(tmp_path / "log", 32 * MiB)
    try:
        mf = files.last_for_append()
        data = bytes(range(256)) * (12 * MiB // 256)
        mf.append(data)
        before = resident_kib(mf.path)
        files.release_written(1 * MiB, 4 * MiB)
        assert mf.released_position == 11 * MiB
        assert resident_kib(mf.path) <= before - 10 * 1024
        files.release_written(1 * MiB, 4 * MiB)  # less than 4 MiB more written: nothing to do
        assert mf.released_position == 11 * MiB
        assert mf.dirty_pages() >= 12 * MiB // 4096 - 1 and files.flush() == len(data)
        with open(mf.path, "rb") as f:
            assert f.read(len(data)) == data
        assert bytes(mf.view(0, len(data))) == data
    finally:
        files.close()
