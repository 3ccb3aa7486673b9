"""Background upkeep: flushing consume queues with the checkpoint, and deleting expired files."""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING

from cometmq.common.service import ServiceThread

if TYPE_CHECKING:
    from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)

#: segments deleted in one pass, so one pass never stalls the disk for long
MAX_DELETE_PER_PASS = 10


class MaintenanceService(ServiceThread):
    """Flush consume queues and index, then save the checkpoint, when anything was dispatched."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__("FlushConsumeQueueService", store.config.flush_interval_consume_queue_ms / 1000)
        self.store = store
        self._saved: tuple[int, int] | None = None

    def run_once(self) -> None:
        state = (self.store.reput.reput_offset, self.store.flushed_offset)
        if state != self._saved:
            self.store.flush_and_checkpoint()
            self._saved = state

    def on_shutdown(self) -> None:
        """The store's shutdown writes the final, clean checkpoint."""


class CleanService(ServiceThread):
    """Delete commit-log segments past their reserved time at the delete hour or when the disk fills,
    then consume-queue and index files that point only before the log's new start."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__("CleanCommitLogService", store.config.clean_resource_interval_ms / 1000)
        self.store = store
        self.manual_requests = 0

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
        hour = datetime.datetime.fromtimestamp(now_ms / 1000).hour
        ratio = store.disk_usage_ratio() * 100
        force = ratio >= cfg.disk_force_clean_ratio
        due = hour in cfg.delete_hours or ratio >= cfg.disk_max_used_space_ratio or self.manual_requests > 0
        deleted = 0
        if due:
            if self.manual_requests:
                self.manual_requests -= 1
            deleted = self.delete_expired(now_ms, force=force)
        self.release_cold_pages()
        return deleted

    def delete_expired(self, now_ms: int, *, force: bool = False) -> int:
        """Delete segments (never the last) not written for ``fileReservedTime`` hours; with ``force``
        the oldest go regardless of age. Consume queues and index follow the log's new start."""
        store = self.store
        reserved_s = store.config.file_reserved_time_h * 3600
        files = store.commitlog.files
        deleted = 0
        with store.lock:
            while len(files.files) > 1 and deleted < MAX_DELETE_PER_PASS:
                first = files.files[0]
                if not force and first.last_modified() + reserved_s > now_ms / 1000:
                    break
                if first.end_offset > store.reput.reput_offset:
                    break  # never delete what the dispatcher has not seen
                files.delete_first(1)
                deleted += 1
                if force:
                    break
            if deleted:
                min_phy = files.min_offset
                for cq in store.queues.values():
                    cq.delete_before_phy(min_phy)
                if store.index is not None:
                    store.index.delete_files_before(min_phy)
                log.info("retention: deleted %d commit-log segments; the log now starts at %d", deleted, min_phy)
        return deleted

    def release_cold_pages(self) -> None:
        """Unmap full segments other than the newest: readers fault pages back from the page cache."""
        files = self.store.commitlog.files.files
        for mf in files[:-2]:
            mf.release_pages(0, mf.size)
