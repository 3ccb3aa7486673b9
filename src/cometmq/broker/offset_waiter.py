"""Acknowledgements on the event loop: wait until an offset that only grows has passed a point — the commit
log's flushed offset (SYNC_FLUSH), or the in-sync replicas' confirm offset (replication).

The store's flush thread reports each new flushed offset once per group commit; one thread-safe
call per flush then resolves every waiting future it covers, instead of one call per message (the HA
service reports the confirm offset from the loop's own thread, which resolves them at once).
Timeouts are swept by one timer rather than a ``wait_for`` per message, which would cost more than
the append itself.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading


class OffsetWaiter:
    def __init__(self, loop: asyncio.AbstractEventLoop, flushed_offset: int = 0,
                 sweep_interval_s: float = 0.1) -> None:
        self._loop = loop
        #: flushes made on the loop's own thread (inline group commit) need no thread-safe hand-off
        self._loop_thread = threading.get_ident()
        self._heap: list[tuple[int, int, float, asyncio.Future[bool]]] = []
        self._seq = itertools.count()
        self._flushed = flushed_offset
        self._latest = flushed_offset
        self._scheduled = False
        self._sweep_interval_s = sweep_interval_s
        self._sweeper: asyncio.TimerHandle | None = None

    def on_flushed(self, offset: int) -> None:
        """The offset grew to ``offset`` (called in any thread: the flush thread, or the loop's own)."""
        self._latest = offset
        if threading.get_ident() == self._loop_thread:
            if self._heap:
                self._release()
            return
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

    def _release(self) -> None:
        self._scheduled = False
        self._flushed = max(self._flushed, self._latest)
        heap = self._heap
        while heap and heap[0][0] <= self._flushed:
            fut = heapq.heappop(heap)[3]
            if not fut.done():
                fut.set_result(True)

    def _sweep(self) -> None:
        """Fail waiters whose deadline passed; the heap is by offset, so look at every one."""
        self._sweeper = None
        now = self._loop.time()
        keep = []
        for item in self._heap:
            if item[2] <= now:
                if not item[3].done():
                    item[3].set_result(False)
            elif not item[3].done():
                keep.append(item)
        heapq.heapify(keep)
        self._heap = keep
        if keep:
            self._sweeper = self._loop.call_later(self._sweep_interval_s, self._sweep)

    def wait(self, offset: int, timeout_s: float) -> asyncio.Future[bool]:
        """A future that becomes True once the log is flushed to ``offset``, False after ``timeout_s``."""
        fut: asyncio.Future[bool] = self._loop.create_future()
        if offset <= self._flushed or offset <= self._latest:
            fut.set_result(True)
            return fut
        heapq.heappush(self._heap, (offset, next(self._seq), self._loop.time() + timeout_s, fut))
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self._sweep_interval_s, self._sweep)
        return fut

    def fail_all(self) -> None:
        """Resolve every waiting future False now (what it waits for will not come in time)."""
        heap, self._heap = self._heap, []
        for item in heap:
            if not item[3].done():
                item[3].set_result(False)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for item in self._heap:
            if not item[3].done():
                item[3].set_result(False)
        self._heap = []
