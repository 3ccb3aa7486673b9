"""Flushing the commit log: a timed flush (ASYNC_FLUSH) or group commit (SYNC_FLUSH).

Group commit: appends ask for a flush and wake the service; one msync then covers every append
made before it started, and listeners hear the new flushed offset once per round, not once per
append. Callers in threads can block in ``wait_flushed``; an asyncio broker registers a listener
and resolves its own futures on its loop.

Handing every group commit to the service thread costs two thread wake-ups per round (the request, then the
listener back on the loop): on this kind of VM ~0.2 ms and ~0.1 ms, as much as the fdatasync itself. So a caller
that gathers a whole batch (the broker's AppendBatcher) may instead ``commit`` in its own thread: the fdatasync
runs there with the GIL released, and the round needs no wake-up at all. That blocks the caller for one
fdatasync, so it is done only while fdatasync is fast (a moving average under ``inline_max_us``); on a slow disk
``commit`` hands the round to the service thread like any other request.
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
#: Before a flush, written bytes this far behind the tail are unmapped, once at least PRE_FLUSH_LEAST_BYTES of
#: them are mapped. Writeback write-protects every mapped page it writes, a TLB shoot-down (an interrupt to the
#: CPU running the event loop) per 4 KiB page: 14 % of the broker's CPU in a 1 KiB batched produce (perf). One
#: ``madvise`` over the range costs one. The pages stay in the page cache, dirty until the flush writes them; a
#: reader of them faults them back in from there (a minor fault, no disk read).
PRE_FLUSH_KEEP_BYTES = 1024 * 1024
PRE_FLUSH_LEAST_BYTES = 4 * 1024 * 1024
#: How often the pages readers mapped back in behind the writer's window are unmapped again (a consumer reading
#: an old backlog faults its pages into this process's mapping; without this the broker's RSS grows by every byte
#: of log read, pages the page cache keeps anyway). A reader of them later faults them back in from the page cache.
READ_RELEASE_INTERVAL_S = 1.0


class _FlushBase(ServiceThread):
    def __init__(self, name: str, files: MappedFileQueue, interval_s: float) -> None:
        super().__init__(name, interval_s)
        self.files = files
        self._listeners: list[FlushListener] = []
        self._cond = threading.Condition()
        self.flushed_offset = files.flushed_offset
        self.flush_count = 0
        self.io_error: OSError | None = None
        #: one flush at a time: the service thread and ``commit`` callers may both flush
        self._flush_lock = threading.Lock()
        #: moving average of a flush's duration, in seconds
        self.flush_seconds_avg = 0.0
        self._reads_released_at = time.monotonic()

    def add_listener(self, listener: FlushListener) -> None:
        self._listeners.append(listener)

    def _flush_now(self) -> int:
        with self._flush_lock:
            return self._flush_locked()

    def _flush_locked(self) -> int:
        try:
            t0 = time.perf_counter()
            self.files.release_written(PRE_FLUSH_KEEP_BYTES, PRE_FLUSH_LEAST_BYTES)
            flushed = self.files.flush()
            self.flush_seconds_avg += (time.perf_counter() - t0 - self.flush_seconds_avg) * 0.1
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

    def release_reads(self) -> None:
        """Every ``READ_RELEASE_INTERVAL_S``: unmap what readers mapped back in behind the released window."""
        now = time.monotonic()
        if now - self._reads_released_at >= READ_RELEASE_INTERVAL_S:
            self._reads_released_at = now
            self.files.release_reads()

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
        self.release_reads()


class GroupCommitService(_FlushBase):
    """SYNC_FLUSH: one flush per round covers all appends requested before it."""

    def __init__(self, files: MappedFileQueue, inline_max_us: int = 2000) -> None:
        # The interval is only a safety net; requests wake the service at once.
        super().__init__("GroupCommitService", files, 1.0)
        self._requested = 0
        self.inline_max_s = inline_max_us / 1e6
        #: rounds flushed by ``commit`` callers / handed to the thread by them
        self.inline_commits = 0
        self.handed_off = 0

    def commit(self, offset: int) -> bool:
        """Make the log durable up to ``offset`` in the calling thread if flushes are fast; True when it
        is durable on return. Otherwise (slow disk, or an I/O error) the round is requested from the
        service thread, and the caller waits for the flushed offset as usual."""
        if self.flushed_offset >= offset:
            return True
        if self.flush_seconds_avg <= self.inline_max_s and self.io_error is None:
            self.inline_commits += 1
            if self._flush_now() >= offset:
                return True
        self.handed_off += 1
        self.request(offset)
        return False

    def request(self, offset: int) -> None:
        if offset > self._requested:
            self._requested = offset
        self.wakeup()

    def run_once(self) -> None:
        if self._requested > self.flushed_offset:
            self._flush_now()
        self.release_reads()
