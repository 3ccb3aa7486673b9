"""The message store facade the broker uses: put, get, offsets, lookups, lifecycle."""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cometmq.common.atomic_file import fsync_dir
from cometmq.common.native import load_c_helper
from cometmq.protocol.message import pack_host
from cometmq.protocol.record_layout import LAYOUT_V4, MAGIC_CODE
from cometmq.store.bad_units import BadUnits
from cometmq.store.checkpoint import Checkpoint
from cometmq.store.commitlog import CommitLog
from cometmq.store.config import CQ_UNIT_SIZE, FlushDiskType, StoreConfig
from cometmq.store.consume_queue import CQ_UNIT, ConsumeQueue
from cometmq.store.cq_file import MappingLRU, mapping_bound
from cometmq.store.dispatch import Dispatcher, ReputService
from cometmq.store.flush import AsyncFlushService, GroupCommitService, _FlushBase
from cometmq.store.index import IndexService
from cometmq.store.index_builder import IndexBuilder
from cometmq.store.mapped_file import FileRegion
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.recovery import recover
from cometmq.store.retention import CleanService, MaintenanceService
from cometmq.store.status import GetResult, GetStatus, PutResult, PutStatus
from cometmq.store.warm import WarmService

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _unit_sizes(n: int) -> struct.Struct:
    """Reads the sizes of ``n`` consume-queue units (8-byte offset, 4-byte size, 8-byte tag code each)."""
    return struct.Struct(">" + "8xi8x" * n)


#: runs of back-to-back records one coalesced read gives at most (beyond: the record-by-record loop is cheaper)
_MAX_RUNS = 16

#: a record's TOTALSIZE and MAGIC, what a read checks against the consume-queue unit before serving it
_SIZE_MAGIC = LAYOUT_V4.struct_of("total_size", "magic_code").unpack_from

#: cometmq.store._indexc when built, else None: its ``runs`` finds what _runs finds without a Python int per unit
_C_HELPER: Any = load_c_helper("cometmq.store._indexc")
#: its ``heads``: _runs's check of every record of the runs, in C (a build before it lacks it: Python checks then)
_C_HEADS: Any = getattr(_C_HELPER, "heads", None)

TagFilter = Callable[[int], bool]
RecordFilter = Callable[[memoryview], bool]


#: what a topic name may be (RocketMQ's TopicValidator), checked before a consume queue's folder is made from it
_SAFE_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]{1,127}\Z")


def usage_of(st: os.statvfs_result) -> tuple[float, int]:
    """(used fraction, bytes free to us) of a file system, as ``df`` counts them: used / (used + available to
    unprivileged users). Blocks reserved for root (or held back by the host) count as neither: on a disk with a
    large reserve, (total - available) / total would call a half-empty disk full."""
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    free = st.f_bavail * st.f_frsize
    return (0.0 if used + free <= 0 else used / (used + free)), free


#: seconds a disk-usage reading stays valid for the write path (statvfs is a system call; puts come thousands of
#: times a second). The clean service reads it every cleanResourceInterval too.
DISK_CHECK_INTERVAL_S = 0.5


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
    def __init__(self, config: StoreConfig, *, store_host: tuple[str, int] = ("127.0.0.1", 10911),
                 clock: Callable[[], int] = _wall_clock_ms) -> None:
        self.config = config
        self.clock = clock
        self.store_host = store_host
        self.commitlog = CommitLog(config, pack_host(*store_host), clock)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        #: the consume-queue files mapped at once (store/cq_file.py)
        self.cq_mappings = MappingLRU(mapping_bound(config.max_open_consume_queue_files))
        #: queues with units not flushed yet (each knows the commit-log offset of its first); under ``lock``
        self.dirty_queues: set[ConsumeQueue] = set()
        #: the dispatched offset of the last checkpoint saved; cuts of the log (``truncate``) since a flush pass
        #: began, as (generation, offset), which that pass's checkpoint must not claim past; ``_cp_lock`` orders saves
        self._saved_dispatched = 0
        #: the dispatched offset the index was flushed to by the last pass that flushed it (-1: none yet)
        self._index_durable = -1
        self._cut_gen = 0
        self._cuts: list[tuple[int, int]] = []
        self._cp_lock = threading.Lock()
        self.index: IndexService | None = (
            IndexService(config.index_dir, config.max_hash_slot_num, config.max_index_num)
            if config.message_index_enable else None
        )
        self.reput = ReputService(self.commitlog)
        self.reput.dispatchers.append(self._dispatch_to_consume_queue)
        self.index_builder: IndexBuilder | None = None
        if self.index is not None:
            self.index_builder = IndexBuilder(self.index)
            self.reput.dispatchers.append(self.index_builder.submit)
        self.flush_service: _FlushBase = (
            GroupCommitService(self.commitlog.files, config.group_commit_inline_max_us)
            if config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            else AsyncFlushService(self.commitlog.files, config.flush_interval_commitlog_ms,
                                   config.flush_commitlog_least_pages,
                                   config.flush_commitlog_thorough_interval_ms)
        )
        self.maintenance = MaintenanceService(self)
        self.warmer: WarmService | None = (
            WarmService(self.commitlog.files, config.warm_ahead_bytes) if config.warm_ahead_bytes > 0 else None)
        self.cleaner = CleanService(self)
        #: appends and their dispatch happen under this lock, so dispatch follows log order
        self.lock = threading.Lock()
        #: None: every written byte is confirmed; replication sets a lower value
        self._confirm_offset: int | None = None
        self.running = False
        self.recovered_abnormally = False
        #: why writes are refused now ("disk full: ..."), or None; and when the disk was last looked at
        self._disk_full: str | None = None
        self._disk_checked_at = -DISK_CHECK_INTERVAL_S
        #: the last append needed a new commit-log segment that did not fit: refused until one fits
        self._segment_blocked = False
        #: units found not to match their record: stepped over by reads, logged and counted (store/bad_units.py)
        self.bad_units = BadUnits(self.commitlog)
        #: topics of records not dispatched because their name is not a legal topic (logged once each)
        self._bad_topics: set[str] = set()

    # -- paths -------------------------------------------------------------------------------
    @property
    def abort_file(self) -> Path:
        return Path(self.config.store_path) / "abort"

    @property
    def checkpoint_file(self) -> Path:
        return Path(self.config.store_path) / "checkpoint"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Load files, recover after a crash if needed, and start the background services."""
        Path(self.config.store_path).mkdir(parents=True, exist_ok=True)
        self.recovered_abnormally = recover(self)
        self.abort_file.touch()
        self.flush_service.flushed_offset = self.commitlog.max_offset
        self.flush_service.start()
        if self.index_builder is not None:
            self.index_builder.start()
        self.maintenance.start()
        self.cleaner.start()
        if self.warmer is not None:
            self.warmer.start()
        self.running = True

    def shutdown(self) -> None:
        """Stop services, flush everything and leave a clean checkpoint; removes the abort marker."""
        if not self.running:
            return
        self.running = False
        self.cleaner.stop()
        self.maintenance.stop()
        if self.warmer is not None:
            self.warmer.stop()
        self.flush_service.stop()
        if self.index_builder is not None:
            self.index_builder.stop()
        self.flush_consume_queues(0)  # every pending file made, every dirty queue flushed (folders synced once)
        with self.lock:
            self.commitlog.flush()
            for cq in list(self.dirty_queues):  # whatever came in meanwhile
                cq.flush()
            self.dirty_queues.clear()
            if self.index is not None:
                self.index.flush()
            end = self.commitlog.max_offset
            Checkpoint(end, self.reput.reput_offset, self.clock(), clean_end_offset=end).save(
                self.checkpoint_file)
            self.abort_file.unlink(missing_ok=True)
            for cq in self.queues.values():
                cq.close()
            if self.index is not None:
                self.index.close()
            self.commitlog.close()

    def checkpoint_floor(self, dispatched: int, flushed: int) -> None:
        """Save a checkpoint that claims no more than ``dispatched`` (and the log flushed to no more than ``flushed``):
        after recovery re-dispatched, and when the log is cut, what a checkpoint saved before may claim is no longer
        on disk (a cut log's offsets are written again; new units wait in memory or in the page cache)."""
        with self._cp_lock:
            dispatched = min([dispatched, self._saved_dispatched] if self._saved_dispatched else [dispatched])
            dispatched = min([dispatched, *(cq.dirty_phy for cq in self.dirty_queues if cq.dirty_phy >= 0)])
            Checkpoint(flushed, dispatched, self.clock()).save(self.checkpoint_file)
            self._saved_dispatched = dispatched
            self._index_durable = min(self._index_durable, dispatched)

    def flush_consume_queues(self, least_pages: int = 0) -> int:
        """Flush the dirty consume queues that RocketMQ's policy says are due (``least_pages`` dirty pages or a full
        file; 0: every dirty one), one fdatasync per file, outside the store lock. Returns the commit-log offset
        below which every unit is durable: the dispatch point when this began, or the first unflushed unit of a
        queue left dirty (below the threshold, or whose flush failed), whichever is lower."""
        durable, _ = self._flush_consume_queues(least_pages)
        return durable

    def _flush_consume_queues(self, least_pages: int) -> tuple[int, int]:
        """``flush_consume_queues``, and the log-cut generation it began at."""
        self.make_pending_files()
        with self.lock:
            durable = self.reput.reput_offset
            gen = self._cut_gen
            jobs = []
            for cq in self.dirty_queues:
                if cq.flush_due(least_pages) or not (cq.has_unflushed() or cq.has_pending()):
                    jobs.append((cq, cq.dirty_phy, cq.take_flush()))
            for cq, _, _ in jobs:
                self.dirty_queues.discard(cq)
        failed = []
        error: OSError | None = None
        # Every file of this pass exists now: a folder synced once covers the new entries of all of them.
        synced_dirs: set[Path] = set()
        for cq, phy, files in jobs:
            try:
                for f, target in files:
                    f.flush_to(target, synced_dirs)
                cq.files.release_flushed(4096)
            except OSError as exc:
                failed.append((cq, phy))
                error = exc
        with self.lock:
            for cq, phy in failed:  # still dirty from its first unit
                if cq.dirty_phy < 0 or phy < cq.dirty_phy:
                    cq.dirty_phy = phy
                if (cq.topic, cq.queue_id) in self.queues:
                    self.dirty_queues.add(cq)
            durable = min([durable, *(cq.dirty_phy for cq in self.dirty_queues if cq.dirty_phy >= 0)])
        if error is not None:
            log.error("consume-queue flush failed for %d queue(s): %s", len(failed), error)
        return durable, gen

    def make_pending_files(self) -> int:
        """Make the consume-queue files still in memory (store/cq_file.py): folders and file without the store lock,
        then, under it, a batch at a time, copy each buffer in and map it. A file that cannot be made now (a full
        disk) stays pending for the next pass, its queue dirty. Returns how many were made."""
        pending = self.cq_mappings.take_pending()
        ready = []
        error: OSError | None = None
        for f in pending:
            try:
                f.prepare()
                ready.append(f)
            except OSError as exc:
                error = exc
                self.cq_mappings.add_pending(f)
        if error is not None:
            log.error("cannot make %d consume-queue file(s) now (they stay in memory, their queues dirty; retried "
                      "at the next flush): %s", len(pending) - len(ready), error)
        made = 0
        for i in range(0, len(ready), 256):
            with self.lock:
                for f in ready[i : i + 256]:
                    try:
                        f.install()
                        made += 1
                    except OSError as exc:
                        log.error("cannot make consume-queue file %s now: %s", f.path, exc)
                        self.cq_mappings.add_pending(f)
        return made

    def flush_and_checkpoint(self, least_pages: int = 0, *, index: bool = True) -> None:
        """Flush consume queues (those due by ``least_pages``, see ``flush_consume_queues``) and, with ``index``,
        the index, then record how far they are durable (not past the index's last flush)."""
        durable, gen = self._flush_consume_queues(least_pages)
        if self.index_builder is not None:
            durable = self.index_builder.durable_point(durable)
        if self.index is not None:
            if index or self._index_durable < 0:
                self.index.flush()
                self._index_durable = durable
            durable = min(durable, self._index_durable)
        flushed = self.flush_service.flushed_offset
        with self._cp_lock:
            for g, offset in self._cuts:  # the log was cut while this pass ran: claim nothing past the cut
                if g > gen:
                    durable, flushed = min(durable, offset), min(flushed, offset)
                    self._index_durable = min(self._index_durable, offset)
            self._cuts = [c for c in self._cuts if c[0] > gen]
            Checkpoint(flushed, durable, self.clock()).save(self.checkpoint_file)
            self._saved_dispatched = durable

    # -- write -----------------------------------------------------------------------------------
    def put_message(self, msg: MessageInner) -> PutResult:
        return self.put_messages([msg])

    def put_messages(self, msgs: list[MessageInner], request_flush: bool = True) -> PutResult:
        """Append messages as one contiguous batch and dispatch them. Under SYNC_FLUSH the result is
        stored but not yet durable: wait with ``wait_flushed`` or a flush listener for ``end_offset``.
        ``request_flush=False``: the caller will call ``commit`` itself (after gathering more)."""
        if not self.running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark="the store is not running")
        refusal = self._disk_full if time.monotonic() - self._disk_checked_at < DISK_CHECK_INTERVAL_S \
            else self.check_disk()
        if refusal is not None:  # before anything is written (RocketMQ: the store is not writeable, disk full)
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=refusal)
        with self.lock:
            result = self.commitlog.append(msgs)
            ok = result.status is PutStatus.PUT_OK
            if result.status is PutStatus.SERVICE_NOT_AVAILABLE:  # a new segment did not fit: refuse at once
                self._segment_blocked = True
                self._set_disk_full(result.remark)
            if ok:
                confirmed = result.end_offset if self._confirm_offset is None else self._confirm_offset
                self.reput.submit(result.records, confirmed)
        if ok and request_flush:
            self.flush_service.request(result.end_offset)
        return result

    def commit(self, offset: int) -> bool:
        """SYNC_FLUSH: make the log durable up to ``offset``, in this thread while fdatasync is fast
        (see ``GroupCommitService.commit``); True when it is durable on return, False when the flush
        thread was asked to do it (wait for ``offset`` then). Always True under ASYNC_FLUSH."""
        service = self.flush_service
        if not isinstance(service, GroupCommitService):
            return True
        if self.config.group_commit_inline_max_us <= 0:
            service.request(offset)
            return service.flushed_offset >= offset
        return service.commit(offset)

    @property
    def sync_flush(self) -> bool:
        return self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH

    def wait_flushed(self, offset: int, timeout_s: float | None = None) -> bool:
        """Block (in a thread) until the commit log is flushed to ``offset``."""
        if timeout_s is None:
            timeout_s = self.config.sync_flush_timeout_ms / 1000
        return self.flush_service.wait_flushed(offset, timeout_s)

    def add_flush_listener(self, listener: Callable[[int], None]) -> None:
        """``listener(flushed_offset)`` is called from the flush thread after each flush."""
        self.flush_service.add_listener(listener)

    @property
    def flushed_offset(self) -> int:
        return self.flush_service.flushed_offset

    def add_arrival_listener(self, listener: Dispatcher) -> None:
        """Called with each dispatched record, in log order, in the appending thread."""
        self.reput.listeners.append(listener)

    def add_arrival_batch_listener(self, listener: Callable[[list[DispatchRequest]], None]) -> None:
        """Like ``add_arrival_listener``, called once per dispatched batch with its records in log order."""
        self.reput.batch_listeners.append(listener)

    # -- dispatch ----------------------------------------------------------------------------
    def _dispatch_to_consume_queue(self, requests: list[DispatchRequest]) -> None:
        queues = self.queues
        # Per-record cost matters here (a timer burst re-puts 200,000 at once): the transaction test is
        # inlined (not consumable: prepared 0x4 and rolled-back 0xC halves, bit 0x4 set), and runs of
        # one queue reuse its lookup; with the C helper the rest of a run is one call (``put_following``).
        last_topic, last_qid, cq = "", -1, None
        i, n = 0, len(requests)
        while i < n:
            req = requests[i]
            i += 1
            if req.sys_flag & 0x4:
                continue
            if cq is None or req.queue_id != last_qid or req.topic != last_topic:
                last_topic, last_qid = req.topic, req.queue_id
                cq = queues.get((last_topic, last_qid))
                if cq is None:
                    if not _SAFE_TOPIC.match(last_topic):
                        self._skip_bad_topic(req.topic, req.phy_offset)
                        last_topic = ""
                        continue
                    cq = self.consume_queue(last_topic, last_qid)
            cq.put(req.queue_offset, req.phy_offset, req.size, req.tags_code)
            if i < n:  # put_following returns i at once without the C helper
                i = cq.put_following(requests, i)

    def _skip_bad_topic(self, topic: str, phy_offset: int) -> None:
        """A record whose topic is no legal name (a damaged header the body CRC does not cover, or bytes copied
        from a broker that let one in) gets no consume queue: its name would become a folder (``..``, ``/``, NUL)."""
        if topic not in self._bad_topics:
            self._bad_topics.add(topic)
            log.warning("record at %d names topic %r, which is no legal topic name: not dispatched", phy_offset,
                        topic[:200])

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self.new_consume_queue(topic, queue_id, self.config.consume_queue_dir / topic / str(queue_id))
            self.queues[key] = cq
        return cq

    def new_consume_queue(self, topic: str, queue_id: int, directory: Path) -> ConsumeQueue:
        """A consume queue object (no file until its first unit is written)."""
        return ConsumeQueue(topic, queue_id, directory, self.config.consume_queue_units_per_file,
                            lru=self.cq_mappings, on_dirty=self.dirty_queues.add)

    # -- replication hooks ---------------------------------------------------------------------
    def set_confirm_offset(self, offset: int | None) -> None:
        """Hold dispatch back to ``offset`` (None: confirm everything written) and dispatch up to it."""
        with self.lock:
            self._confirm_offset = offset
            self.reput.confirm(self.commitlog.max_offset if offset is None else offset)

    def append_raw(self, offset: int, data: bytes | memoryview) -> bool:
        with self.lock:
            if not self.commitlog.append_raw(offset, data):
                return False
            end = self.commitlog.max_offset
            self.reput.confirm(end if self._confirm_offset is None else self._confirm_offset)
        self.flush_service.request(end)
        return True

    def truncate(self, offset: int, *, keep_log: bool = False) -> None:
        """Cut the log back to ``offset`` and drop consume-queue units and index files past it (keep_log: those only).

        Durable on return (RocketMQ #10666 resurrected a truncated tail after a crash): the zeroed tail is
        fdatasync'd (``MappedFiles.set_write_end``), removed segments' directory entries are synced, and the flushed
        offset drops to ``offset``, so a recovery after a crash finds the log ending here."""
        with self.lock:
            if not keep_log:
                self.commitlog.truncate(offset)
                fsync_dir(self.config.commitlog_dir)
            service = self.flush_service
            service.flushed_offset = min(service.flushed_offset, offset)
            for cq in self.queues.values():
                cq.truncate_from_phy(offset)
            if self.index is not None:
                if self.index_builder is not None:
                    self.index_builder.drain()
                self.index.truncate_after(offset)
                if self.index_builder is not None:
                    self.index_builder.reset_to(offset)
            self.reput.pending.clear()
            self.reput.reput_offset = min(self.reput.reput_offset, offset)
            self.rebuild_queue_table()
            # A checkpoint saved before says the old log was dispatched (and flushed) past the cut: offsets from the
            # cut on are written again, and their units are not on disk yet.
            self._cut_gen += 1
            with self._cp_lock:
                self._cuts.append((self._cut_gen, offset))
            self.checkpoint_floor(offset, min(service.flushed_offset, offset))

    def rebuild_queue_table(self) -> None:
        self.commitlog.queue_table = {key: cq.max_offset for key, cq in self.queues.items()}

    # -- read --------------------------------------------------------------------------------------
    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int,
                     tag_filter: TagFilter | None = None, record_filter: RecordFilter | None = None,
                     max_bytes: int | None = None, *, coalesce: bool = False) -> GetResult:
        """Up to ``max_count`` records of a queue from ``offset`` (at most the byte cap, at least one), as
        zero-copy views. ``coalesce``: the caller only wants the bytes (a pull answer joins them), so records
        that lie back to back in the commit log may come as one view; ``queue_offsets`` still lists every
        record, ``buffers`` then has fewer entries (``message_count`` is not the record count)."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off, max_off = cq.min_offset, cq.max_offset
        if max_off == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset < min_off:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            # As RocketMQ: an offset past the end of a queue that still starts at 0 restarts from 0.
            nxt = min_off if min_off == 0 else max_off
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)

        if max_bytes is None:
            max_count = min(max_count, self.config.max_transfer_count)
            byte_limit = self.config.max_transfer_bytes
        else:
            byte_limit = max_bytes
        max_count = max(1, max_count)
        if coalesce and tag_filter is None and record_filter is None:
            runs = self._runs(cq, offset, min(max_count, max_off - offset), byte_limit)
            if runs is not None:
                views, count, start = runs
                region = None
                if len(views) == 1:
                    mf = self.commitlog.files.find(start)
                    if mf is not None:
                        region = FileRegion(mf, start - mf.file_from_offset, len(views[0]))
                return GetResult(GetStatus.FOUND, offset + count, min_off, max_off, views,
                                 range(offset, offset + count), sum(map(len, views)), region)
        # Bound the work of one read when a filter rejects most units (RocketMQ's 16000-byte scan).
        scan_limit = max(max_count, 800)
        log_min = self.commitlog.min_offset
        buffers: list[memoryview] = []
        qoffsets: list[int] = []
        result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_off, max_off, buffers, qoffsets)
        total = 0
        scanned = 0
        removed = 0
        qoff = offset
        read = self.commitlog.read
        # Records of one read mostly sit in one segment: slice it directly while they do.
        seg_view: memoryview | None = None
        seg_start = seg_end = 0
        done = False
        while not done and scanned < scan_limit and qoff < max_off:
            units = cq.units(qoff, scan_limit - scanned)
            if units is None:
                break
            for phy, size, tags in CQ_UNIT.iter_unpack(units):
                if size <= 0:
                    qoff += 1
                    scanned += 1
                    continue
                if phy < log_min:
                    removed += 1
                elif tag_filter is None or tag_filter(tags):
                    if seg_start <= phy and phy + size <= seg_end:
                        view = seg_view[phy - seg_start : phy - seg_start + size]  # type: ignore[index]
                    else:
                        view = read(phy, size)
                        mf = self.commitlog.files.find(phy) if view is not None else None
                        if mf is not None:
                            seg_start = mf.file_from_offset
                            seg_end = seg_start + mf.wrote_position
                            seg_view = mf.view(0, mf.wrote_position)
                    if (view is None and phy >= self.commitlog.min_offset) or (
                            view is not None and _SIZE_MAGIC(view, 0) != (size, MAGIC_CODE)):
                        # The unit and the record disagree (a damaged unit or log): those bytes are never served;
                        # the record by its own size when it is the unit's, else the unit is stepped over (logged,
                        # counted), as RocketMQ's read goes past a unit it cannot read (store/bad_units.py).
                        view = self.bad_units.salvage(cq.topic, cq.queue_id, qoff, phy, size)
                        if view is None:
                            self.bad_units.skipped(cq.topic, cq.queue_id, qoff, phy, size)
                        else:
                            size = len(view)
                    if view is None:
                        removed += 1
                    elif record_filter is None or record_filter(view):
                        if buffers and total + size > byte_limit:
                            done = True
                            break
                        buffers.append(view)
                        qoffsets.append(qoff)
                        total += size
                qoff += 1
                scanned += 1
                if len(buffers) >= max_count:
                    done = True
                    break
            units.release()
        result.next_begin_offset = qoff
        result.buffer_total_size = total
        if buffers:
            result.status = GetStatus.FOUND
        elif removed and removed == scanned:  # (units stepped over count as removed: the answer goes past them)
            result.status = GetStatus.MESSAGE_WAS_REMOVING
        elif scanned == 0:
            result.status = GetStatus.OFFSET_FOUND_NULL
        return result

    def _runs(self, cq: ConsumeQueue, offset: int, count: int,
              byte_limit: int) -> tuple[list[memoryview], int, int] | None:
        """``_coalesced_runs``, checked: every record of each run must have the magic code and the size of its unit
        (None otherwise: the record-by-record loop then checks each and steps over a bad one). A damaged unit breaks
        the run it is in, but a record damaged inside a run (its header) does not: the first and last were not
        enough (a consumer got an answer it could not decode, and pulled it again for ever)."""
        found = self._coalesced_runs(cq, offset, count, byte_limit)
        if found is None:
            return None
        views, k, _ = found
        units = cq.units(offset, k)
        if units is None or len(units) < k * CQ_UNIT_SIZE:
            return None
        with units:
            if _C_HEADS is not None:
                return found if _C_HEADS(units, k, views) else None
            sizes = _unit_sizes(k).unpack_from(units)
        cum = list(itertools.accumulate(sizes, initial=0))
        j = 0
        for view in views:
            n = len(view)
            base = cum[j]
            e = bisect.bisect_left(cum, base + n, j + 1) - 1  # the run's last unit
            if e >= k or cum[e + 1] - base != n:
                return None
            for i in range(j, e + 1):
                if _SIZE_MAGIC(view, cum[i] - base) != (sizes[i], MAGIC_CODE):
                    return None
            j = e + 1
        return found if j == k else None

    def _coalesced_runs(self, cq: ConsumeQueue, offset: int, count: int,
                        byte_limit: int) -> tuple[list[memoryview], int, int] | None:
        """The records get_messages (unfiltered) would return from ``offset``, as one view per run of records
        that lie back to back in the commit log (a queue's records written in a batch do), found without
        Python work per record: (views, record count, the first record's commit-log offset). None when this
        cannot tell cheaply (the caller then takes the record-by-record loop): units in two consume-queue
        files, a unit of size 0 (a hole), a record below the log's first offset or not inside one segment, many
        short runs.

        How: the sizes are read in one struct call. When the last record ends where the first starts plus the
        sum of the sizes, the records are back to back (a queue's records have increasing commit-log offsets
        and do not overlap, so any gap would add to that span), and the byte cap's cut is a binary search over
        the units. Otherwise the running sums (``accumulate``, in C) give where each record would start if
        there were no gap (``expected``) and the cap's cut (bisect); ``start - expected`` (the gaps so far) never
        goes down along the queue, so a run is where it stays the same, and each run's end is a binary search."""
        units = cq.units(offset, count)
        if units is None:
            return None
        with units:
            if _C_HELPER is not None:
                found = _C_HELPER.runs(units, self.commitlog.min_offset, byte_limit, count, _MAX_RUNS)
                if found is None:
                    return None
                k, spans = found
                read = self.commitlog.read
                views: list[memoryview] = []
                for start, length in spans:
                    view = read(start, length)
                    if view is None:
                        return None
                    views.append(view)
                return views, k, spans[0][0]
            n = len(units) // CQ_UNIT_SIZE
            sizes = _unit_sizes(n).unpack_from(units)
            if min(sizes) <= 0:
                return None
            unpack = CQ_UNIT.unpack_from
            phy0 = unpack(units, 0)[0]
            if phy0 < self.commitlog.min_offset:
                return None
            total = sum(sizes)
            if unpack(units, (n - 1) * CQ_UNIT_SIZE)[0] + sizes[-1] - phy0 == total:  # one run
                if total <= byte_limit:
                    if n < count:  # more would fit: the rest is in the next consume-queue file
                        return None
                    k = n
                else:  # the longest prefix within the cap (at least one record)
                    lo, hi = 1, n - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        phy, size, _ = unpack(units, (mid - 1) * CQ_UNIT_SIZE)
                        if phy + size - phy0 <= byte_limit:
                            lo = mid
                        else:
                            hi = mid - 1
                    k = lo
                phy, size, _ = unpack(units, (k - 1) * CQ_UNIT_SIZE)
                view = self.commitlog.read(phy0, phy + size - phy0)
                return None if view is None else ([view], k, phy0)
            expected = list(itertools.accumulate(sizes, initial=phy0))
            k = max(1, bisect.bisect_right(expected, phy0 + byte_limit) - 1)  # records within the cap
            if k == n < count:  # more would fit: the rest is in the next consume-queue file
                return None
            views = []
            read = self.commitlog.read
            i = 0
            while i < k:
                start = unpack(units, i * CQ_UNIT_SIZE)[0]
                gap = start - expected[i]
                lo, hi = i + 1, k  # the run is [i, lo): phy == expected + gap up to lo - 1
                if unpack(units, (k - 1) * CQ_UNIT_SIZE)[0] - expected[k - 1] == gap:
                    lo = k
                else:
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if unpack(units, mid * CQ_UNIT_SIZE)[0] - expected[mid] == gap:
                            lo = mid + 1
                        else:
                            hi = mid
                if len(views) == _MAX_RUNS:
                    return None
                view = read(start, expected[lo] - expected[i])
                if view is None:
                    return None
                views.append(view)
                i = lo
        return views, k, phy0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp, self.commitlog.store_time_at)

    def store_time(self, topic: str, queue_id: int, offset: int) -> int | None:
        cq = self.queues.get((topic, queue_id))
        unit = cq.get_unit(offset) if cq else None
        return self.commitlog.store_time_at(unit[0], unit[1]) if unit else None

    def earliest_store_time(self, topic: str, queue_id: int) -> int | None:
        return self.store_time(topic, queue_id, self.min_offset(topic, queue_id))

    def read_record(self, phy_offset: int) -> memoryview | None:
        """The record at a commit-log offset (as a message id or a retry request names it)."""
        if phy_offset < self.commitlog.min_offset:
            return None
        return self.commitlog.record_at(phy_offset)

    def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[memoryview]:
        """Records of ``topic`` whose KEYS or UNIQ_KEY include ``key``, newest first, verified."""
        if self.index is None:
            return []
        from cometmq.store.commitlog import dispatch_request_from_record

        if self.index_builder is not None:
            # Read your writes: wait (briefly) until everything dispatched so far is indexed.
            self.index_builder.wait_applied(self.reput.reput_offset, 2.0)
        end = end_ms if end_ms is not None else self.clock() + 1
        found: list[memoryview] = []
        for phy in self.index.query(f"{topic}#{key}", max_num * 2, begin_ms, end):
            view = self.read_record(phy)
            if view is None:
                continue
            req = dispatch_request_from_record(phy, view)
            if req is None or req.topic != topic:
                continue
            if req.uniq_key == key or key in req.keys.split(" "):
                found.append(view)
                if len(found) >= max_num:
                    break
        return found

    # -- admin ---------------------------------------------------------------------------------------
    def delete_topic(self, topic: str) -> None:
        with self.lock:
            for key in [k for k in self.queues if k[0] == topic]:
                cq = self.queues.pop(key)
                self.dirty_queues.discard(cq)
                cq.destroy()
                self.commitlog.queue_table.pop(key, None)
            with contextlib.suppress(OSError):
                (self.config.consume_queue_dir / topic).rmdir()

    def topics(self) -> set[str]:
        return {t for t, _ in self.queues}

    def check_disk(self) -> str | None:
        """Read the disk's usage now: above diskSpaceWarningLevelRatio writes are refused (the reason is returned)
        until it is back below diskSpaceCleanForciblyRatio (RocketMQ's hysteresis)."""
        self._disk_checked_at = time.monotonic()
        try:
            st = os.statvfs(self.config.store_path)
        except OSError as exc:
            log.warning("cannot read the disk usage of %s: %s", self.config.store_path, exc)
            return self._disk_full
        ratio, free = usage_of(st)
        ratio *= 100
        cfg = self.config
        segment = cfg.commitlog_segment_size
        if ratio >= cfg.disk_space_warning_level_ratio:
            self._set_disk_full(f"disk full: {ratio:.1f}% of the store's file system is used "
                                f"(diskSpaceWarningLevelRatio {cfg.disk_space_warning_level_ratio})")
        elif self._segment_blocked and free < segment:
            self._set_disk_full(f"disk full: a new commit-log segment of {segment} bytes does not fit in the {free} "
                                "bytes free (mappedFileSizeCommitLog)")
        elif self._disk_full is not None and (self._segment_blocked or ratio < min(
                cfg.disk_force_clean_ratio, cfg.disk_space_warning_level_ratio)):
            log.warning("disk space OK again (%.1f%% used, %d bytes free): writes are taken again", ratio, free)
            self._disk_full = None
            self._segment_blocked = False
        return self._disk_full

    def _set_disk_full(self, reason: str) -> None:
        self._disk_checked_at = time.monotonic()
        if self._disk_full is None:
            log.error("writes are refused (SERVICE_NOT_AVAILABLE) until space is freed: %s", reason)
        self._disk_full = reason

    @property
    def disk_full(self) -> str | None:
        """Why writes are refused now (as last checked), or None."""
        return self._disk_full

    def disk_usage_ratio(self) -> float:
        return usage_of(os.statvfs(self.config.store_path))[0]
