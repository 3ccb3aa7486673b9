"""Consume queues: per (topic, queueId), dense 20-byte units pointing into the commit log.

Unit = commit-log offset (int64), record size (int32), tag hash code (int64). The queue offset of a
message is the index of its unit, so offsets are 0-based and dense. The files grow as they fill and are mapped only
while in use (store/cq_file.py). A queue that was never written has no file and no folder.

Durability: a queue is *dirty* from its first unit not yet flushed, whose commit-log offset it remembers
(``dirty_phy``); the store's flush policy (``MessageStore.flush_consume_queues``) flushes queues in batches and
records in the checkpoint how far every queue is durable: the lowest ``dirty_phy`` of the queues left dirty.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

from cometmq.store.batch_codec import C_BATCH
from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.cq_file import ConsumeQueueFile, ConsumeQueueFiles, MappingLRU, first_unit, units_end
from cometmq.store.message import DispatchRequest

log = logging.getLogger(__name__)

CQ_UNIT = struct.Struct(">qiq")

#: a queue offset gap is filled with (empty, sparse) files up to this many; a larger one is refused
MAX_GAP_FILES = 64

#: the queues' shared bound on open mappings when a queue is made without one (tests, tools)
_DEFAULT_LRU = MappingLRU(8192)


class ConsumeQueue:
    __slots__ = ("_min_offset", "_next", "_on_dirty", "_tail", "dirty_phy", "file_size", "files", "queue_id",
                 "topic", "units_per_file")

    def __init__(self, topic: str, queue_id: int, directory: Path, units_per_file: int,
                 *, lru: MappingLRU | None = None, on_dirty: Callable[[ConsumeQueue], None] | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.file_size = units_per_file * CQ_UNIT_SIZE
        self.files = ConsumeQueueFiles(directory, self.file_size, lru if lru is not None else _DEFAULT_LRU)
        self._min_offset = 0
        #: the hot path's shortcut: the file that takes the next unit, and that unit's queue offset
        self._tail: ConsumeQueueFile | None = None
        self._next = -1
        #: the commit-log offset of the first unit not flushed yet, -1 when everything is flushed
        self.dirty_phy = -1
        #: told when the queue turns dirty (the store keeps the set of dirty queues)
        self._on_dirty = on_dirty

    # -- startup ---------------------------------------------------------------------------
    def load(self, directory: str | None = None) -> None:
        self.files.load(directory)

    def recover(self) -> None:
        """Set the write position just past the last non-empty unit (units are written densely)."""
        self._tail = None
        while self.files.files:
            last = self.files.files[-1]
            n = last.count_units(self.units_per_file)
            if n == 0 and len(self.files.files) > 1:
                # An empty trailing file: drop it and look at the previous one.
                self.files.files.pop()
                self.files._starts.pop()
                last.destroy()
                continue
            last.wrote_position = last.flushed_position = n * CQ_UNIT_SIZE
            break
        first = self.files.first
        self._min_offset = first.file_from_offset // CQ_UNIT_SIZE if first else 0
        self._skip_leading_holes()

    def end_recovery(self) -> None:
        """Drop recovery's images of the files (reads map them from now on)."""
        self.files.drop_images()

    def _skip_leading_holes(self) -> None:
        first = self.files.first
        if first is None:
            return
        base = first.file_from_offset // CQ_UNIT_SIZE
        n = first.wrote_position // CQ_UNIT_SIZE
        i = first_unit(first.buf(), 0, n)
        if i < n:
            self._min_offset = base + i

    def first_bad_unit(self, matches: Callable[[int, int, int, int], bool], min_phy: int) -> int | None:
        """The queue offset of the first unit of the last file (those pointing at or past ``min_phy``) that does
        not match its record (``matches(phy, size, queue_id, queue_offset)``, the commit log's
        ``record_matches``), or None when they all do. A unit of size 0 before the last one counts as bad: a
        zeroed unit, or a gap the re-dispatch may fill."""
        last = self.files.last
        if last is None:
            return None
        base = last.file_from_offset // CQ_UNIT_SIZE
        n = last.wrote_position // CQ_UNIT_SIZE
        start = max(self.min_offset - base, 0)
        if start >= n:
            return None
        units = last.view(0, n * CQ_UNIT_SIZE)
        try:
            # Units are in log order: skip those before min_phy (their records were not checked by recovery).
            lo, hi = start, n
            while lo < hi:
                mid = (lo + hi) // 2
                if CQ_UNIT.unpack_from(units, mid * CQ_UNIT_SIZE)[0] < min_phy:
                    lo = mid + 1
                else:
                    hi = mid
            qid = self.queue_id
            for i in range(lo, n):
                phy, size, _ = CQ_UNIT.unpack_from(units, i * CQ_UNIT_SIZE)
                if size <= 0 or phy < 0 or not matches(phy, size, qid, base + i):
                    return base + i
        finally:
            units.release()
        return None

    def truncate_to(self, queue_offset: int) -> None:
        """Drop the units from ``queue_offset`` on (a damaged unit: recovery re-dispatches them from the log)."""
        self._tail = None
        self.files.set_write_end(max(queue_offset, self.min_offset) * CQ_UNIT_SIZE)

    # -- offsets ---------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        """The queue offset the next message gets (one past the last unit)."""
        return self.files.max_offset // CQ_UNIT_SIZE

    @property
    def min_offset(self) -> int:
        return min(self._min_offset, self.max_offset)

    def bounds(self) -> tuple[int, int]:
        """(``min_offset``, ``max_offset``) in one call, for the woken pull's fast answer (broker/pull_fast.py)."""
        files = self.files.files
        if not files:
            return min(self._min_offset, 0), 0
        last = files[-1]
        mx = (last.file_from_offset + last.wrote_position) // CQ_UNIT_SIZE
        return min(self._min_offset, mx), mx

    def last_unit(self) -> tuple[int, int, int] | None:
        mx = self.max_offset
        if mx <= self.min_offset:
            return None
        return self.get_unit(mx - 1)

    # -- write -----------------------------------------------------------------------------
    def put(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        """Write the unit for ``queue_offset``. Returns False when it is already there (re-dispatch)."""
        tail = self._tail
        if queue_offset == self._next and tail is not None:
            pos = tail.wrote_position
            mm = tail._mm
            # A file unmapped by the LRU, or one that must grow first, takes the slow path.
            if mm is not None and pos + CQ_UNIT_SIZE <= tail._len:
                CQ_UNIT.pack_into(mm, pos, phy_offset, size, tags_code)
                tail.wrote_position = pos + CQ_UNIT_SIZE
                self._next = queue_offset + 1
                if self.dirty_phy < 0:
                    self._mark_dirty(phy_offset)
                return True
        return self._put_slow(queue_offset, phy_offset, size, tags_code)

    def put_following(self, requests: list[DispatchRequest], i: int) -> int:
        """With the C helper (store/batch_codec.py): write the units of ``requests[i:]`` that follow on in this
        queue, as ``put`` would one by one on its fast path, in one call; returns the index of the first request
        not handled (``i`` when none was: the caller goes on with ``put``)."""
        tail = self._tail
        if tail is None or C_BATCH is None:
            return i
        mm = tail._mm
        if mm is None:
            return i
        pos = tail.wrote_position
        j, written, first_phy = C_BATCH.put_units(mm, pos, tail._len, requests, i, self.topic, self.queue_id,
                                                  self._next)
        if written:
            tail.wrote_position = pos + written * CQ_UNIT_SIZE
            self._next += written
            if self.dirty_phy < 0:
                self._mark_dirty(first_phy)
        return int(j)

    def _mark_dirty(self, phy_offset: int) -> None:
        self.dirty_phy = phy_offset
        if self._on_dirty is not None:
            self._on_dirty(self)

    def _put_slow(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        self._tail = None
        expected = self.max_offset
        if queue_offset < expected:
            return False
        pos_bytes = queue_offset * CQ_UNIT_SIZE
        last = self.files.last
        if last is None:
            # A new queue (or one whose files were lost) may start past 0.
            mf = self.files.last_for_append(pos_bytes)
            self._min_offset = queue_offset
        elif queue_offset > expected:
            if (pos_bytes - last.end_offset) // self.file_size >= MAX_GAP_FILES:
                # A queue offset this far ahead is a damaged header (the body CRC does not cover it), not a gap to
                # fill with thousands of empty files: the unit is not written (RocketMQ appends at the queue's end
                # with "logic queue order maybe wrong"; a unit at the wrong offset would be served as another).
                log.error("consume queue %s-%d: the record at %d names queue offset %d, more than %d files past the "
                          "end %d: not dispatched to the queue", self.topic, self.queue_id, phy_offset, queue_offset,
                          MAX_GAP_FILES, expected)
                return False
            log.warning("consume queue %s-%d: gap from %d to %d", self.topic, self.queue_id,
                        expected, queue_offset)
            mf = last
            while mf.end_offset <= pos_bytes:
                mf.wrote_position = mf.size
                mf = self.files.last_for_append()
            mf.wrote_position = pos_bytes - mf.file_from_offset
        else:
            mf = self.files.last_for_append()
        pos = mf.wrote_position
        mm = mf.ensure(pos + CQ_UNIT_SIZE)  # grows the file (blocks reserved first) or maps it again
        CQ_UNIT.pack_into(mm, pos, phy_offset, size, tags_code)
        mf.wrote_position = pos + CQ_UNIT_SIZE
        self._tail = mf
        self._next = queue_offset + 1
        if self.dirty_phy < 0:
            self._mark_dirty(phy_offset)
        return True

    def truncate_from_phy(self, phy_end: int) -> int:
        """Drop units that point at or past ``phy_end`` (the commit log ended earlier). Returns units removed."""
        self._tail = None
        # The cut found by reading back from the end, then made once: cutting unit by unit zeroed the file's tail
        # and synced it for each unit, seconds for ten thousand units under the store's lock (quadratic).
        end, first = self.max_offset, self.min_offset
        while end > first:
            unit = self.get_unit(end - 1)
            if unit is None or unit[0] + unit[1] <= phy_end:
                break
            end -= 1
        removed = self.max_offset - end
        if removed:
            self.files.set_write_end(end * CQ_UNIT_SIZE)
            log.warning("consume queue %s-%d: dropped %d units past the log end %d", self.topic,
                        self.queue_id, removed, phy_end)
        return removed

    # -- read ------------------------------------------------------------------------------
    def get_unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        if queue_offset < self.min_offset or queue_offset >= self.max_offset:
            return None
        pos = queue_offset * CQ_UNIT_SIZE
        mf = self.files.find(pos)
        if mf is None:
            return None
        phy, size, tags = CQ_UNIT.unpack_from(mf.buf(), pos - mf.file_from_offset)
        return (phy, size, tags)

    def units(self, queue_offset: int, max_units: int) -> memoryview | None:
        """Up to ``max_units`` consecutive units from ``queue_offset``, within one file (zero-copy)."""
        end = self.max_offset
        if queue_offset < self.min_offset or queue_offset >= end:
            return None
        pos = queue_offset * CQ_UNIT_SIZE
        mf = self.files.find(pos)
        if mf is None:
            return None
        local = pos - mf.file_from_offset
        count = min(max_units, (mf.wrote_position - local) // CQ_UNIT_SIZE)
        if count <= 0:
            return None
        return mf.view(local, count * CQ_UNIT_SIZE)

    def offset_by_time(self, timestamp: int, store_time_of: Callable[[int, int], int | None]) -> int:
        """The first queue offset whose message was stored at or after ``timestamp`` (binary search).

        ``store_time_of(phy, size)`` reads a record's store time from the commit log (None when gone).
        """
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            ts = store_time_of(unit[0], unit[1]) if unit else None
            if ts is None or ts < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- maintenance -----------------------------------------------------------------------
    def delete_before_phy(self, min_phy: int) -> int:
        """Delete whole files whose every unit points before ``min_phy``; advance the min offset."""
        self._tail = None
        deleted = 0
        while len(self.files.files) > 1:
            first = self.files.files[0]
            if first.wrote_position < CQ_UNIT_SIZE:
                break
            # Its last unit that holds a record: a queue offset gap may end the file with empty units.
            buf = first.buf()
            last = units_end(buf, 0, first.wrote_position // CQ_UNIT_SIZE) - 1
            phy = CQ_UNIT.unpack_from(buf, last * CQ_UNIT_SIZE)[0] if last >= 0 else 0
            if phy >= min_phy:
                break
            self.files.delete_first(1)
            deleted += 1
        self._correct_min_offset(min_phy)
        return deleted

    def _correct_min_offset(self, min_phy: int) -> None:
        """Move the min offset to the first unit of the first file whose record is still in the log (at or past
        ``min_phy``). Units holding records are in log order; empty ones (a queue offset gap) say nothing and are
        stepped over: the search is for the first unit from which the next one holding a record is still there."""
        first = self.files.first
        if first is None:
            return
        base = first.file_from_offset // CQ_UNIT_SIZE
        n = first.wrote_position // CQ_UNIT_SIZE
        lo, hi = max(self._min_offset - base, 0), n
        buf = first.buf()
        while lo < hi:
            mid = (lo + hi) // 2
            j = first_unit(buf, mid, n)
            if j < n and CQ_UNIT.unpack_from(buf, j * CQ_UNIT_SIZE)[0] < min_phy:
                lo = j + 1
            else:
                hi = mid
        self._min_offset = max(self._min_offset, base + first_unit(buf, lo, n))

    def flush(self, least_pages: int = 0) -> None:
        """Flush the queue when ``flush_due(least_pages)``; the store's policy flushes through ``take_flush``."""
        for f in self.files.files:
            if f.pending:
                f.prepare()
                f.install()
        if self.flush_due(least_pages):
            for f, target in self.take_flush():
                f.flush_to(target)

    def flush_due(self, least_pages: int) -> bool:
        """RocketMQ's rule (flushConsumeQueueLeastPages): flush when a file is full or at least ``least_pages`` pages
        are dirty; with 0, whenever anything is."""
        files = self.files.files
        if any(f.pending for f in files):
            # Not on disk yet (the flush pass makes it first; it failed to, or it came after): the queue stays
            # dirty. Checked before any file can make the flush due: ``take_flush`` counts the whole queue clean.
            return False
        pages = 0
        for f in files:
            if f.flushed_position < f.wrote_position:
                if least_pages <= 0 or f.is_full:
                    return True
                pages += f.dirty_pages()
        return pages >= least_pages > 0

    def has_pending(self) -> bool:
        return any(f.pending for f in self.files.files)

    def has_unflushed(self) -> bool:
        return any(f.flushed_position < f.wrote_position for f in self.files.files)

    def take_flush(self) -> list[tuple[ConsumeQueueFile, int]]:
        """The files with unflushed units and how far they are written, and the queue counted clean from now (the
        caller holds the store lock, so nothing is written meanwhile; it then flushes them to those positions and
        marks the queue dirty again if that fails)."""
        self.dirty_phy = -1
        return [(f, f.wrote_position) for f in self.files.files if f.flushed_position < f.wrote_position]

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
