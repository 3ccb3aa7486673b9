"""Builds the key index in a background thread, off the append path.

The dispatcher hands over each dispatched batch; the builder adds their UNIQ_KEY and KEYS to the
index. Under SYNC_FLUSH this work overlaps the wait for the disk instead of lengthening every send.
The checkpoint never claims more than the builder has applied, so recovery re-indexes what a crash
left out; lookups wait until the index has caught up, so a client reads its own writes.
Before the store starts its services (during recovery) batches are indexed at once, in the caller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from cometmq.common.service import ServiceThread
from cometmq.protocol.properties import RawProperties
from cometmq.store.index import C_HELPER, IndexService, key_hash
from cometmq.store.message import DispatchRequest

log = logging.getLogger(__name__)

WAKE_AFTER_BATCHES = 256
#: a drain applies the queued batches together until they hold at least this many records
DRAIN_CHUNK_RECORDS = 4096
#: the longest the builder stays deferred at a stretch (then it drains even during a burst)
MAX_DEFER_S = 2.0


def hashed_entries(batch: list[DispatchRequest], floor: int) -> list[tuple[int, int, int]]:
    """(key hash, phy offset, store time) for the UNIQ_KEY and each of the KEYS of the records past ``floor``
    (those at or below it were indexed before a restart); keys are "topic#key" as RocketMQ indexes them."""
    if C_HELPER is not None:
        done: list[tuple[int, int, int]] | None = C_HELPER.collect(batch, floor, RawProperties)
        if done is not None:
            return done
    entries: list[tuple[int, int, int]] = []
    add = entries.append
    for req in batch:
        phy = req.phy_offset
        if phy <= floor:
            continue
        props = req.properties
        uniq = props.get("UNIQ_KEY")
        if uniq:
            add((key_hash(f"{req.topic}#{uniq}"), phy, req.store_timestamp))
        keys = props.get("KEYS")
        if keys:
            for key in keys.split(" "):
                if key:
                    add((key_hash(f"{req.topic}#{key}"), phy, req.store_timestamp))
    return entries


class IndexBuilder(ServiceThread):
    def __init__(self, index: IndexService) -> None:
        # Woken only when work piles up: a wake-up per small append costs a thread switch (~40 µs measured
        # per single send) while lookups drain the queue themselves.
        super().__init__("IndexBuildService", 0.05)
        self.index = index
        self._queue: deque[list[DispatchRequest]] = deque()
        self._cond = threading.Condition()
        self._work_lock = threading.Lock()
        self._running = False
        #: commit-log offset just past the last record handed over / indexed
        self.submitted_offset = 0
        self.applied_offset = 0
        #: monotonic times: the builder's pass waits until ``_defer_until``; deferred since ``_defer_since``
        self._defer_until = 0.0
        self._defer_since = 0.0

    def start(self) -> None:
        self._running = True
        super().start()

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
        self._running = False
        self.drain()

    def submit(self, requests: list[DispatchRequest]) -> None:
        """The dispatcher's hook (runs in the appending thread)."""
        if not requests:
            return
        last = requests[-1]
        self.submitted_offset = last.phy_offset + last.size
        self._queue.append(requests)
        if not self._running:
            self.drain()
        elif len(self._queue) >= WAKE_AFTER_BATCHES:
            self.wakeup()

    def defer(self, seconds: float) -> None:
        """Leave the queue for up to ``seconds`` more: a burst of appends in the event loop (the timer
        delivering many messages due together) gets the GIL instead of sharing it with this thread.
        Lookups still drain the queue themselves, and after ``MAX_DEFER_S`` at a stretch it drains anyway."""
        now = time.monotonic()
        if self._defer_until <= now:
            self._defer_since = now
        self._defer_until = max(self._defer_until, now + seconds)

    def run_once(self) -> None:
        now = time.monotonic()
        if now < self._defer_until and now - self._defer_since < MAX_DEFER_S:
            return
        self.drain()

    def drain(self) -> None:
        """Index everything handed over so far (also callable from other threads). The batches queued are
        applied together, up to ``DRAIN_CHUNK_RECORDS`` records at a time: one key collection, one index write
        and one wake-up of waiting lookups for a pass's many single-message batches, not one each (a pass holds
        the GIL that much less time while the event loop waits for it)."""
        with self._work_lock:
            queue = self._queue
            while queue:
                records = queue.popleft()
                if queue and len(records) < DRAIN_CHUNK_RECORDS:
                    records = list(records)
                    while queue and len(records) < DRAIN_CHUNK_RECORDS:
                        records += queue.popleft()
                self._apply(records)
                last = records[-1]
                with self._cond:
                    self.applied_offset = last.phy_offset + last.size
                    self._cond.notify_all()

    def _apply(self, batch: list[DispatchRequest]) -> None:
        entries = hashed_entries(batch, self.index.max_phy_offset)
        if entries:
            self.index.put_hashed(entries)  # one lock and one header write for the batch

    def reset_to(self, offset: int) -> None:
        """After truncating the log (and the index) to ``offset``: what was applied past it is gone."""
        self.drain()
        with self._cond:
            self.applied_offset = min(self.applied_offset, offset)
            self.submitted_offset = min(self.submitted_offset, offset)

    def caught_up(self) -> bool:
        """Whether everything handed over is indexed (nothing queued, nothing being applied)."""
        return not self._queue and self.applied_offset >= self.submitted_offset

    def durable_point(self, dispatched: int) -> int:
        """The highest offset a checkpoint may claim as indexed, given the dispatcher's offset."""
        if self._queue or self.applied_offset < self.submitted_offset:
            return min(dispatched, self.applied_offset)
        return dispatched

    def wait_applied(self, offset: int, timeout_s: float) -> bool:
        self.drain()  # index what is queued now, in the caller: read-your-writes without waiting for a pass
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.applied_offset < offset and (self._queue or self.applied_offset < self.submitted_offset):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def on_shutdown(self) -> None:
        self.drain()
