"""The message store facade the broker uses: put, get, offsets, lookups, lifecycle."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cometmq.protocol.message import pack_host
from cometmq.store.checkpoint import Checkpoint
from cometmq.store.commitlog import CommitLog
from cometmq.store.config import FlushDiskType, StoreConfig
from cometmq.store.consume_queue import CQ_UNIT, ConsumeQueue
from cometmq.store.dispatch import Dispatcher, ReputService
from cometmq.store.flush import AsyncFlushService, GroupCommitService, _FlushBase
from cometmq.store.index import IndexService
from cometmq.store.index_builder import IndexBuilder
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.recovery import recover
from cometmq.store.retention import CleanService, MaintenanceService
from cometmq.store.status import GetResult, GetStatus, PutResult, PutStatus
from cometmq.store.warm import WarmService

log = logging.getLogger(__name__)

TagFilter = Callable[[int], bool]
RecordFilter = Callable[[memoryview], bool]


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
        with self.lock:
            self.commitlog.flush()
            self._flush_logic()
            end = self.commitlog.max_offset
            Checkpoint(end, self.reput.reput_offset, self.clock(), clean_end_offset=end).save(
                self.checkpoint_file)
            try:
                self.abort_file.unlink()
            except FileNotFoundError:
                pass
            for cq in self.queues.values():
                cq.close()
            if self.index is not None:
                self.index.close()
            self.commitlog.close()

    def _flush_logic(self) -> None:
        for cq in list(self.queues.values()):
            cq.flush()
            cq.files.release_flushed(4096)
        if self.index is not None:
            self.index.flush()

    def flush_and_checkpoint(self) -> None:
        """Flush consume queues and index, then record how far they are durable."""
        dispatched = self.reput.reput_offset
        if self.index_builder is not None:
            dispatched = self.index_builder.durable_point(dispatched)
        self._flush_logic()
        Checkpoint(self.flush_service.flushed_offset, dispatched, self.clock()).save(self.checkpoint_file)

    # -- write -----------------------------------------------------------------------------------
    def put_message(self, msg: MessageInner) -> PutResult:
        return self.put_messages([msg])

    def put_messages(self, msgs: list[MessageInner], request_flush: bool = True) -> PutResult:
        """Append messages as one contiguous batch and dispatch them. Under SYNC_FLUSH the result is
        stored but not yet durable: wait with ``wait_flushed`` or a flush listener for ``end_offset``.
        ``request_flush=False``: the caller will call ``commit`` itself (after gathering more)."""
        if not self.running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark="the store is not running")
        with self.lock:
            result = self.commitlog.append(msgs)
            ok = result.status is PutStatus.PUT_OK
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
        # one queue reuse its lookup.
        last_topic, last_qid, cq = "", -1, None
        for req in requests:
            if req.sys_flag & 0x4:
                continue
            if cq is None or req.queue_id != last_qid or req.topic != last_topic:
                last_topic, last_qid = req.topic, req.queue_id
                cq = queues.get((last_topic, last_qid))
                if cq is None:
                    cq = self.consume_queue(last_topic, last_qid)
            cq.put(req.queue_offset, req.phy_offset, req.size, req.tags_code)

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(topic, queue_id, self.config.consume_queue_dir / topic / str(queue_id),
                              self.config.consume_queue_units_per_file, preallocate=self.config.preallocate)
            self.queues[key] = cq
        return cq

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

    def truncate(self, offset: int) -> None:
        """Cut the log back to ``offset`` and drop consume-queue units and index files past it."""
        with self.lock:
            self.commitlog.truncate(offset)
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

    def rebuild_queue_table(self) -> None:
        self.commitlog.queue_table = {key: cq.max_offset for key, cq in self.queues.items()}

    # -- read --------------------------------------------------------------------------------------
    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int,
                     tag_filter: TagFilter | None = None, record_filter: RecordFilter | None = None,
                     max_bytes: int | None = None) -> GetResult:
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
        # Bound the work of one read when a filter rejects most units (RocketMQ's 16000-byte scan).
        scan_limit = max(max_count, 800)
        log_min = self.commitlog.min_offset
        result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_off, max_off)
        buffers, qoffsets = result.buffers, result.queue_offsets
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
        elif removed and removed == scanned:
            result.status = GetStatus.MESSAGE_WAS_REMOVING
        elif scanned == 0:
            result.status = GetStatus.OFFSET_FOUND_NULL
        return result

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
                self.queues.pop(key).destroy()
                self.commitlog.queue_table.pop(key, None)
            try:
                (self.config.consume_queue_dir / topic).rmdir()
            except OSError:
                pass

    def topics(self) -> set[str]:
        return {t for t, _ in self.queues}

    def disk_usage_ratio(self) -> float:
        st = os.statvfs(self.config.store_path)
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        return 0.0 if total == 0 else (total - free) / total
