"""Flushing the commit log: a timed flush (ASYNC_FLUSH) or group commit (SYNC_FLUSH).

Group commit: appends ask for a flush and wake the service; one msync then covers every append
made before it started, and listeners hear the new flushed offset once per round, not once per
append. Callers in threads can block in ``wait_flushed``; an asyncio broker registers a listener
and resolves its own futures on its loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cometmq.common.service import ServiceThread
from cometmq.store.mapped_file import MappedFileQueue

log = logging.getLogger(__name__)

FlushListener = Callable[[int], None]

#: RSS is kept bounded by dropping this process's mapping of flushed bytes this far behind the tail.
RELEASE_LAG_BYTES = 16 * 1024 * 1024


class _FlushBase(ServiceThread):
    def __init__(self, name: str, files: MappedFileQueue, interval_s: float) -> None:
        super().__init__(name, interval_s)
        self.files = files
        self._listeners: list[FlushListener] = []
        self._cond = threading.Condition()
        self.flushed_offset = files.flushed_offset
        self.flush_count = 0
        self.io_error: OSError | None = None

    def add_listener(self, listener: FlushListener) -> None:
        self._listeners.append(listener)

    def _flush_now(self) -> int:
        try:
            flushed = self.files.flush()
            self.io_error = None
        except OSError as exc:  # keep serving; waiters time out and report FLUSH_DISK_TIMEOUT
            if self.io_error is None:
                log.error("commit-log flush failed: %s", exc)
            self.io_error = exc
            return self.flushed_offset
        self.flush_count += 1
        with self._cond:
            self.flushed_offset = flushed
            self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener(flushed)
            except Exception:
                log.exception("flush listener failed")
        # Unmap flushed pages well behind the tail so the writer's RSS does not grow with the log.
        self.files.release_flushed(RELEASE_LAG_BYTES)
        return flushed

    def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Block until the log is flushed up to ``offset`` (for callers in threads)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.flushed_offset < offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def request(self, offset: int) -> None:
        """Note that an append up to ``offset`` wants to be flushed."""

    def on_shutdown(self) -> None:
        self._flush_now()


class AsyncFlushService(_FlushBase):
    """ASYNC_FLUSH: flush every interval when enough pages are dirty, or fully every thorough interval."""

    def __init__(self, files: MappedFileQueue, interval_ms: int, least_pages: int,
                 thorough_interval_ms: int) -> None:
        super().__init__("FlushRealTimeService", files, interval_ms / 1000)
        self.least_pages = least_pages
        self.thorough_interval_s = thorough_interval_ms / 1000
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        thorough = now - self._last_thorough >= self.thorough_interval_s
        if thorough or self.files.dirty_pages() >= self.least_pages:
            self._flush_now()
            if thorough:
                self._last_thorough = now


class GroupCommitService(_FlushBase):
    """SYNC_FLUSH: one flush per round covers all appends requested before it."""

    def __init__(self, files: MappedFileQueue) -> None:
        # The interval is only a safety net; requests wake the service at once.
        super().__init__("GroupCommitService", files, 1.0)
        self._requested = 0

    def request(self, offset: int) -> None:
        if offset > self._requested:
            self._requested = offset
        self.wakeup()

    def run_once(self) -> None:
        if self._requested > self.flushed_offset:
            self._flush_now()
