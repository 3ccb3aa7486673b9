"""A crash right after a replica cut its log leaves nothing stale (RocketMQ #10666), in process.

A crash is simulated by copying the running store's folder (what a killed process leaves: its writes are in
the page cache, nothing was shut down, the ``abort`` marker is there, the checkpoint on disk still names the old
end) and recovering a new store from the copy. The cut crosses segments, and the checkpoint has recorded the old
end as flushed before the cut, so recovery cannot trust it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cometmq.protocol.message import decode_record
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock, wait_until
from tests.store.conftest import msg, small_config

SEGMENT = 4096


@pytest.fixture
def stores() -> Iterator[list[MessageStore]]:
    started: list[MessageStore] = []
    yield started
    for s in started:
        s.shutdown()


def open_store(stores: list[MessageStore], path: Path) -> MessageStore:
    # Every flush pass flushes what there is: with 4 KiB segments a partly written last one holds no whole dirty
    # page, and the default (4 pages) could leave the old end unflushed until the 10 s thorough flush
    s = MessageStore(small_config(path, commitlog_segment_size=SEGMENT, flush_commitlog_least_pages=0),
                     clock=FakeClock(None))
    s.start()
    stores.append(s)
    return s


def put(store: MessageStore, prefix: str, n: int) -> list[int]:
    """n messages of ~150 bytes to queue T/0; their physical offsets."""
    out = []
    for i in range(n):
        res = store.put_message(msg(body=f"{prefix}-{i}-".ljust(120, "x").encode(), uniq=f"{prefix}{i}"))
        assert res.ok
        out.append(res.records[0].phy_offset)
    return out


def crash_image(store: MessageStore, to: Path) -> Path:
    # a checkpoint's temp file may be renamed away between the listing and its copy: the image is taken without it
    # (as a crash just before it was written would leave things)
    shutil.copytree(store.config.store_path, to, ignore=shutil.ignore_patterns("*.tmp"))
    assert (to / "abort").exists() or any(to.iterdir())
    return to


def bodies(store: MessageStore) -> list[str]:
    r = store.get_messages("T", 0, store.min_offset("T", 0), 10_000, max_bytes=1 << 24)
    return [decode_record(v)[0].body.decode().split("-x")[0].rstrip("x") for v in r.buffers]


def log_bytes(store: MessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    while start < end:  # a read stays within one segment
        n = min(end, (start // SEGMENT + 1) * SEGMENT) - start
        view = store.commitlog.read(start, n)
        assert view is not None, f"cannot read {n} bytes at {start}"
        out += view
        start += n
    return bytes(out)


@pytest.mark.parametrize("then", ["nothing", "new bytes"])
def test_crash_after_a_cut_recovers_the_cut_log(stores: list[MessageStore], tmp_path: Path, then: str) -> None:
    replica = open_store(stores, tmp_path / "replica")
    offsets = put(replica, "old", 120)  # ~18 KiB: five segments
    old_end = replica.commitlog.max_offset
    wait_until(lambda: replica.flush_service.flushed_offset >= old_end, 5, "the old end flushed", step=0.01)
    time.sleep(0.2)  # the checkpoint (written every 50 ms) records the old end
    cut = offsets[40]  # in the second segment: the segments after it go
    assert cut // SEGMENT < old_end // SEGMENT - 1

    # the new master: 40 records of the same sizes (so the same offsets), then its own
    master = open_store(stores, tmp_path / "master")
    put(master, "old", 40)
    assert master.commitlog.max_offset == cut
    put(master, "new", 30)
    kept = log_bytes(replica, 0, cut)  # (its records' store times differ from the master's copies)
    replica.truncate(cut)
    assert replica.commitlog.max_offset == cut
    end = cut
    if then == "new bytes":
        end = master.commitlog.max_offset
        while replica.commitlog.max_offset < end:  # as the HA link appends: raw, a segment at a time
            at = replica.commitlog.max_offset
            mf = master.commitlog.files.find(at)
            assert mf is not None
            n = mf.wrote_position - (at - mf.file_from_offset)
            assert replica.append_raw(at, bytes(mf.view(at - mf.file_from_offset, n)))

    recovered = open_store(stores, crash_image(replica, tmp_path / "image"))
    assert recovered.commitlog.max_offset == end
    assert log_bytes(recovered, 0, end) == kept + log_bytes(master, cut, end)
    got = bodies(recovered)
    assert got[:40] == [f"old-{i}" for i in range(40)]
    assert got[40:] == ([f"new-{i}" for i in range(30)] if then == "new bytes" else [])
    assert recovered.max_offset("T", 0) == len(got)
    # nothing of the old tail is left in the files either
    seg_dir = tmp_path / "image" / "commitlog"
    raw = b"".join(p.read_bytes() for p in sorted(seg_dir.iterdir()) if p.name.isdigit())
    assert b"old-40-" not in raw and b"old-119-" not in raw
    # new writes continue the queue after the recovered end
    res = recovered.put_message(msg(body=b"after the crash"))
    assert res.ok and res.records[0].queue_offset == len(got) and res.records[0].phy_offset == end
