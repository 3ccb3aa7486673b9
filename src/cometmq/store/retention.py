"""Background upkeep: flushing consume queues with the checkpoint, and deleting expired files."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cometmq.common.service import ServiceThread

if TYPE_CHECKING:
    from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)

#: segments deleted in one pass, so one pass never stalls the disk for long
MAX_DELETE_PER_PASS = 10


class MaintenanceService(ServiceThread):
    """RocketMQ's FlushConsumeQueueService: every flushIntervalConsumeQueue, flush the consume queues with at least
    flushConsumeQueueLeastPages dirty pages (or a full file), and every flushConsumeQueueThoroughInterval all dirty
    ones; then, every flushIntervalIndex, the index; and the checkpoint, whose dispatched offset stays below every
    unit not flushed yet (the queues left dirty hold it back) and below the index's last flush. 5,000 queues each
    written a little cost a few fdatasyncs a second, not 5,000."""

    def __init__(self, store: MessageStore, monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__("FlushConsumeQueueService", store.config.flush_interval_consume_queue_ms / 1000)
        self.store = store
        self._monotonic = monotonic
        self._saved: tuple[int, int] | None = None
        self._last_thorough = self._last_index = monotonic()
        #: a pass left the index unflushed: its checkpoint claims less than the queues have made durable
        self._index_behind = False
        #: an idle pass dropped the key index's mapping (see ``IndexService.release_idle``); again after a write
        self._released = False
        #: passes that flushed something, and the thorough ones among them
        self.passes = 0
        self.thorough_passes = 0
        #: callers of ``checkpoint_now`` waiting for a thorough pass (one that began after they asked)
        self._forced: list[threading.Event] = []
        self._forced_lock = threading.Lock()

    def checkpoint_now(self, timeout_s: float) -> bool:
        """Run a thorough pass (every dirty queue flushed, the checkpoint written) in this service's thread, as the
        next one, and wait for it; False when it did not end within ``timeout_s`` (or the service is not running).
        A topic deleted must not come back from the log at a restart after a crash: recovery re-dispatches what the
        checkpoint has not passed, and the checkpoint is held back by units of the queues just deleted."""
        done = threading.Event()
        with self._forced_lock:
            self._forced.append(done)
        self.wakeup()
        return done.wait(timeout_s)

    def run_once(self) -> None:
        with self._forced_lock:
            forced, self._forced = self._forced, []
        try:
            self._pass(forced=bool(forced))
        finally:
            for done in forced:
                done.set()

    def _pass(self, *, forced: bool) -> None:
        store = self.store
        cfg = store.config
        if forced and store.index_builder is not None:
            store.index_builder.drain()  # (the checkpoint claims no more than is indexed)
        if store.reput.stalled is not None:  # a full disk stopped the dispatch: go on if it can now
            with store.lock:
                store.reput.retry()
        now = self._monotonic()
        thorough = forced or now - self._last_thorough >= cfg.flush_consume_queue_thorough_interval_ms / 1000
        index = thorough or now - self._last_index >= cfg.flush_interval_index_ms / 1000
        state = (store.reput.reput_offset, store.flushed_offset)
        if not forced and state == self._saved and not (thorough and store.dirty_queues) \
                and not store.cq_mappings.pending and not (index and self._index_behind):
            # Nothing new; queues left dirty below the threshold wait for the thorough pass. The first such pass
            # after writes drops the index's pages from the mapping (slots written at random stay mapped while
            # keys keep coming).
            if not self._released and store.index is not None and (
                    store.index_builder is None or store.index_builder.caught_up()):
                store.index.release_idle()
                self._released = True
            return
        self._released = False
        store.flush_and_checkpoint(0 if thorough else cfg.flush_consume_queue_least_pages, index=index)
        self._saved = state
        self._index_behind = not index
        if index:
            self._last_index = now
        self.passes += 1
        if thorough:
            self._last_thorough = now
            self.thorough_passes += 1

    def on_shutdown(self) -> None:
        """The store's shutdown writes the final, clean checkpoint."""


class CleanService(ServiceThread):
    """Delete commit-log segments past their reserved time at the delete hour or when the disk fills,
    then consume-queue and index files that point only before the log's new start."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__("CleanCommitLogService", store.config.clean_resource_interval_ms / 1000)
        self.store = store
        self.manual_requests = 0
        #: segments, and the messages in them, deleted by the forced clean before their reserved time (consumed
        #: or not): exported as cometmq_storage_forced_deleted_messages
        self.forced_deleted_segments = 0
        self.forced_deleted_messages = 0
        self._warned_forcible_off = False
        #: name -> the lowest commit-log offset that user still needs, or None (the timer: the records of its pending
        #: messages). Called from this thread: each must answer from state it keeps up to date, without blocking.
        self.pins: dict[str, Callable[[], int | None]] = {}
        #: the segment a pin last held back past its reserved time (logged once a segment)
        self._held: int | None = None

    def pin(self, name: str, floor: Callable[[], int | None]) -> None:
        """Keep the segments holding offsets from ``floor()`` on past their reserved time (a forced clean still
        deletes them, and says so)."""
        self.pins[name] = floor

    def _floor(self) -> tuple[str, int] | None:
        low: tuple[str, int] | None = None
        for name, floor in list(self.pins.items()):
            try:
                at = floor()
            except Exception:  # a user's bug must not stop retention: it holds the log back at its start instead
                log.exception("retention: the %s pin failed; keeping every segment", name)
                at = 0
            if at is not None and (low is None or at < low[1]):
                low = (name, at)
        return low

    def request_delete(self) -> None:
        """Delete expired files now, whatever the hour (the admin 'deleteExpiredCommitLog')."""
        self.manual_requests += 1
        self.wakeup()

    def run_once(self) -> None:
        self.clean()

    def on_shutdown(self) -> None:
        """Nothing to finish."""

    def clean(self) -> int:
        store = self.store
        cfg = store.config
        now_ms = store.clock()
        hour = time.localtime(now_ms / 1000).tm_hour  # (not datetime: a broker does not load it for this)
        ratio = store.disk_usage_ratio() * 100
        force = ratio >= cfg.disk_force_clean_ratio
        if force and not cfg.clean_file_forcibly_enable and not self._warned_forcible_off:
            self._warned_forcible_off = True
            log.warning("disk %.1f%% used (diskSpaceCleanForciblyRatio %d) but cleanFileForciblyEnable=false: no "
                        "segment is deleted before its reserved time; writes are refused from %d%%", ratio,
                        cfg.disk_force_clean_ratio, cfg.disk_space_warning_level_ratio)
        elif not force:
            self._warned_forcible_off = False
        due = hour in cfg.delete_hours or ratio >= cfg.disk_max_used_space_ratio or self.manual_requests > 0
        deleted = 0
        if due:
            if self.manual_requests:
                self.manual_requests -= 1
            deleted = self.delete_expired(now_ms, force=force)
        store.check_disk()  # the write path sees the space freed (or used up) now, not at its next look
        self.release_cold_pages()
        return deleted

    def delete_expired(self, now_ms: int, *, force: bool = False) -> int:
        """Delete segments (never the last) not written for ``fileReservedTime`` hours; with ``force`` (and
        cleanFileForciblyEnable) the oldest goes regardless of age, one a pass, logged at WARNING and counted.
        Consume queues and index follow the log's new start."""
        store = self.store
        cfg = store.config
        force = force and cfg.clean_file_forcibly_enable
        reserved_s = cfg.file_reserved_time_h * 3600
        files = store.commitlog.files
        deleted = early = 0
        pinned = self._floor()
        with store.lock:
            while len(files.files) > 1 and deleted < MAX_DELETE_PER_PASS:
                first = files.files[0]
                expired = first.last_modified() + reserved_s <= now_ms / 1000
                if not force and not expired:
                    break
                if first.end_offset > store.reput.reput_offset:
                    break  # never delete what the dispatcher has not seen
                if pinned is not None and first.end_offset > pinned[1]:
                    if not force:
                        if self._held != first.file_from_offset:
                            self._held = first.file_from_offset
                            log.warning("retention: commit-log segment %d is kept past its reserved time "
                                        "(fileReservedTime %gh): the %s still needs the records from offset %d",
                                        first.file_from_offset, cfg.file_reserved_time_h, pinned[0], pinned[1])
                        break
                    log.error("disk over diskSpaceCleanForciblyRatio %d%%: deleting commit-log segment %d, which "
                              "holds records the %s still needs (from offset %d): those are lost",
                              cfg.disk_force_clean_ratio, first.file_from_offset, pinned[0], pinned[1])
                files.delete_first(1)
                deleted += 1
                if not expired:
                    early += 1
                if force:
                    break
            if deleted:
                min_phy = files.min_offset
                removed = 0
                for cq in store.queues.values():
                    before = cq.min_offset
                    cq.delete_before_phy(min_phy)
                    removed += cq.min_offset - before
                if store.index is not None:
                    store.index.delete_files_before(min_phy)
                if early:
                    self.forced_deleted_segments += early
                    self.forced_deleted_messages += removed
                    log.warning("disk over diskSpaceCleanForciblyRatio %d%%: deleted %d commit-log segment(s) before "
                                "their reserved time (fileReservedTime %gh), %d messages removed from their queues "
                                "whether consumed or not (cleanFileForciblyEnable=true); the log now starts at %d",
                                cfg.disk_force_clean_ratio, early, cfg.file_reserved_time_h, removed, min_phy)
                else:
                    log.info("retention: deleted %d expired commit-log segments (%d messages); the log now starts "
                             "at %d", deleted, removed, min_phy)
        return deleted

    def release_cold_pages(self) -> None:
        """Unmap full segments other than the newest: readers fault pages back from the page cache."""
        files = self.store.commitlog.files.files
        for mf in files[:-2]:
            mf.release_pages(0, mf.size)
