"""The POP state of one (group, topic, queue): which offsets are handed out, until when, and how often.

Pure: no I/O and no clock of its own — every method that depends on time takes ``now`` (ms), so the
state is tested with a fake clock. The service (``service.py``) logs every change first (``log.py``) and
applies it here; replaying the log over a snapshot rebuilds the same state after a restart.

Invariants, for ``committed <= o < cursor``: offset ``o`` is either in ``inflight`` (delivered and not yet
acked — visible again once ``visible_at`` has passed) or done (acked, sent to the DLQ, or skipped by the
subscription's filter). Below ``committed`` everything is done, so ``committed`` is the consumer offset a
push or pull consumer of the group would resume from.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

#: entries a lazily pruned heap may hold beyond twice what it tracks before it is rebuilt from what it tracks
HEAP_SLACK = 64


@dataclass(slots=True)
class Delivery:
    """The current delivery of one offset."""

    pop_time: int  # names this delivery; a handle with another pop time is stale
    visible_at: int  # pop_time + invisible time: redelivered after this
    attempts: int  # the reconsume count this delivery carried (0 for the first)
    ck_offset: int  # first offset of the pop that delivered it (RocketMQ's ckQueueOffset)


@dataclass(slots=True)
class QueueState:
    committed: int
    cursor: int
    inflight: dict[int, Delivery] = field(default_factory=dict)
    #: (visible_at, offset, pop_time) of deliveries, lazily pruned when superseded
    _expiry: list[tuple[int, int, int]] = field(default_factory=list)
    #: offsets in flight (a min-heap, lazily pruned): keeps ``committed`` current in O(log n) per ack
    _offsets: list[int] = field(default_factory=list)
    # Both heaps keep an acked offset (or a superseded delivery) until it reaches their top. While one message
    # stays in flight for hours (its invisible time extended again and again), every ack behind it stayed: they
    # grew without bound. ``_compact`` rebuilds them from ``inflight`` once they hold more than twice as much
    # (plus HEAP_SLACK): at most 2n + HEAP_SLACK entries for n in flight, O(log n) a change amortised, and
    # nothing lost, since what they track is ``inflight`` itself. (RocketMQ's own bound is another design: its
    # consumer offset moves at the pop and a checkpoint's acks are a 32-bit set, PopBufferMergeService.)

    # -- queries ------------------------------------------------------------------------------------
    def consume_offset(self) -> int:
        """Lowest offset not yet done: where a push/pull consumer of the group would resume."""
        heap, inflight = self._offsets, self.inflight
        while heap:
            if heap[0] in inflight:
                return heap[0]
            heapq.heappop(heap)
        return self.cursor

    def next_expiry(self) -> int | None:
        """When the earliest current delivery becomes visible again (None: nothing in flight)."""
        heap = self._expiry
        while heap:
            visible_at, off, pop_time = heap[0]
            d = self.inflight.get(off)
            if d is not None and d.pop_time == pop_time and d.visible_at == visible_at:
                return visible_at
            heapq.heappop(heap)
        return None

    def next_expiry_after(self, now: int) -> int | None:
        """When the earliest delivery still invisible at ``now`` becomes visible (None: none is)."""
        return min((d.visible_at for d in self.inflight.values() if d.visible_at > now), default=None)

    def blocked(self, now: int) -> bool:
        """For ordered consumption: a delivery is still invisible, so nothing else may be handed out."""
        return any(d.visible_at > now for d in self.inflight.values())

    def due(self, now: int) -> list[int]:
        """Offsets whose invisible time has passed, lowest first (candidates for redelivery)."""
        return sorted(o for o, d in self.inflight.items() if d.visible_at <= now)

    def has_due(self, now: int) -> bool:
        nxt = self.next_expiry()
        return nxt is not None and nxt <= now

    # -- changes ------------------------------------------------------------------------------------
    def deliver(self, offset: int, pop_time: int, invisible_ms: int, attempts: int, ck_offset: int) -> Delivery:
        d = Delivery(pop_time, pop_time + invisible_ms, attempts, ck_offset)
        if offset not in self.inflight:
            heapq.heappush(self._offsets, offset)
        self.inflight[offset] = d
        heapq.heappush(self._expiry, (d.visible_at, offset, pop_time))
        if offset >= self.cursor:
            self.cursor = offset + 1
            if not self._offsets or self._offsets[0] == offset:
                self.committed = self.consume_offset()
        self._compact()
        return d

    def advance_cursor(self, offset: int) -> None:
        """Offsets below ``offset`` that were never delivered are done (filtered out or skipped)."""
        if offset > self.cursor:
            self.cursor = offset
            self.committed = self.consume_offset()

    def done(self, offset: int, pop_time: int | None = None) -> bool:
        """Mark ``offset`` done (acked / sent to the DLQ). With ``pop_time``, only if it names the current
        delivery. Returns whether anything changed."""
        d = self.inflight.get(offset)
        if d is None or (pop_time is not None and d.pop_time != pop_time):
            return False
        del self.inflight[offset]
        if not self.inflight:
            self._expiry.clear()
            self._offsets.clear()
        if offset == self.committed:
            self.committed = self.consume_offset()
        self._compact()
        return True

    def tracked(self) -> int:
        """Entries the two heaps hold (bounded by ``_compact``)."""
        return len(self._offsets) + len(self._expiry)

    def _compact(self) -> None:
        """Rebuild a heap holding more than twice what is in flight (plus HEAP_SLACK) from ``inflight``."""
        limit = 2 * len(self.inflight) + HEAP_SLACK
        if len(self._offsets) > limit:
            self._offsets[:] = sorted(self.inflight)  # (a sorted list is a heap)
        if len(self._expiry) > limit:
            self._expiry[:] = sorted((d.visible_at, o, d.pop_time) for o, d in self.inflight.items())

    def reset(self, offset: int) -> None:
        """Forget everything in flight and start again at ``offset`` (an admin offset reset)."""
        self.inflight.clear()
        self._expiry.clear()
        self._offsets.clear()
        self.committed = self.cursor = offset
