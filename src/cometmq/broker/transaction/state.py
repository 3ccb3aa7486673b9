"""The unresolved transactions and when to check each one: a pure structure, time passed in as ``now``.

One :class:`PendingHalf` per unresolved transaction, keyed by its *origin* (the half queue offset of its first
half record). A heap of ``(due, origin)`` says which is checked next; stale heap items (a transaction resolved
or rescheduled since) are skipped when they come up.

Restart progress
    The half and op records are in the commit log, so the table is rebuilt after a restart by reading the
    half queue from ``half_offset`` and the op queue from ``op_offset`` (:meth:`TransactionTable.progress`):

    - ``half_offset`` is the lowest queue offset of the *latest* half record of any pending transaction: every
      pending transaction has its latest record at or past it (each check re-appends one, and so does a renewal of
      a half whose check is far off: progress.py).
    - ``op_offset`` is what the op queue's end was when that record was appended. An op that resolves a
      transaction is written after every half record of it, so ops for transactions with a record at or past
      ``half_offset`` all lie at or past ``op_offset``. Older ops concern only older transactions.

    Both only grow, so a stale persisted pair is merely a longer scan, never a wrong one.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass

#: stale heap items tolerated beyond as many as there are live ones (see ``TransactionTable._drop_stale``)
_STALE_SLACK = 1024
_LATEST_OFFSET = operator.attrgetter("latest_offset")


@dataclass(slots=True)
class PendingHalf:
    #: half queue offset of the first half record: the transaction's identity
    origin: int
    #: the latest half record (the origin itself until the first check re-appends it)
    latest_offset: int
    latest_phy: int
    group: str
    #: checks sent so far (the latest record's TRANSACTION_CHECK_TIMES)
    check_times: int
    next_check_ms: int
    #: the op queue's end when the latest record was appended (see the module docstring)
    op_mark: int


class TransactionTable:
    def __init__(self) -> None:
        self.pending: dict[int, PendingHalf] = {}
        self._heap: list[tuple[int, int]] = []
        #: no item of the heap is larger (the largest pushed since it was last rebuilt)
        self._top: tuple[int, int] = (-1, -1)
        #: the heap is also sorted (each item pushed was no smaller than all before it: the usual case, due times
        #: grow): then stale items at its front are dropped with one slice, not popped one by one (a batched
        #: commit leaves one stale item per transaction at the front, and a heappop costs ~1 µs each)
        self._sorted = True

    def __len__(self) -> int:
        return len(self.pending)

    def get(self, origin: int) -> PendingHalf | None:
        return self.pending.get(origin)

    def add(self, half: PendingHalf) -> None:
        self.pending[half.origin] = half
        self._push((half.next_check_ms, half.origin))

    def _push(self, item: tuple[int, int]) -> None:
        if not self._heap:
            self._sorted, self._top = True, item
        heapq.heappush(self._heap, item)
        if item >= self._top:
            self._top = item
        else:
            self._sorted = False

    def add_batch(self, origins: list[int], latest_phys: list[int], group: str, due_ms: int, op_mark: int) -> None:
        """:meth:`add` of a half batch's new transactions (ascending origins, each its own latest record, one group,
        one due time): appended to the heap as they are when none of its items comes after them (a heap stays a
        heap when items no smaller than all of its own are appended in order: the usual case, due times grow),
        else pushed one by one."""
        if not origins:
            return
        pending = self.pending
        for origin, phy in zip(origins, latest_phys, strict=True):
            pending[origin] = PendingHalf(origin, origin, phy, group, 0, due_ms, op_mark)
        heap = self._heap
        items = [(due_ms, origin) for origin in origins]
        if (not heap or items[0] >= self._top) and items == sorted(items):
            if not heap:
                self._sorted = True
            heap.extend(items)
        else:
            for item in items:
                heapq.heappush(heap, item)
            self._sorted = False
        self._top = max(self._top, max(items))

    def record_appended(self, origin: int, queue_offset: int, phy: int, check_times: int, op_mark: int) -> None:
        """A newer half record of a pending transaction was appended (a check's copy)."""
        half = self.pending.get(origin)
        if half is not None and queue_offset > half.latest_offset:
            half.latest_offset, half.latest_phy = queue_offset, phy
            half.check_times, half.op_mark = check_times, op_mark

    def schedule(self, half: PendingHalf, due_ms: int) -> None:
        half.next_check_ms = due_ms
        self._push((due_ms, half.origin))

    def resolve(self, origin: int) -> PendingHalf | None:
        """Forget a transaction (committed, rolled back or discarded); None if it was not pending."""
        return self.pending.pop(origin, None)

    def _drop_stale(self) -> None:
        """Rebuild the heap from the pending transactions once most of its items are stale: a batch of commits
        leaves one item per transaction, and popping them one by one (what ``next_due`` and ``pop_due`` do when
        they reach them) costs a few µs each. Each pending transaction keeps the item of its due time (a second,
        equal one, which ``add`` of a transaction put back after a failed append leaves, goes too). What comes out,
        and in which order, is otherwise unchanged."""
        heap = self._heap
        if len(heap) > 2 * len(self.pending) + _STALE_SLACK:
            heap[:] = [(half.next_check_ms, half.origin) for half in self.pending.values()]
            heap.sort()  # (a heap, and sorted: mostly in order already, as the table adds them)
            self._sorted = True
            self._top = heap[-1] if heap else (-1, -1)

    def _live_from(self, start: int) -> int:
        """Of a sorted heap: the index of its first live item from ``start`` on (``len`` when none is)."""
        heap, pending = self._heap, self.pending
        i, n = start, len(heap)
        while i < n:
            due, origin = heap[i]
            half = pending.get(origin)
            if half is not None and half.next_check_ms == due:
                return i
            i += 1
        return n

    def pop_due(self, now_ms: int, limit: int) -> list[PendingHalf]:
        """Up to ``limit`` pending transactions whose check is due, earliest first."""
        self._drop_stale()
        out: list[PendingHalf] = []
        taken: set[int] = set()  # a transaction put back by ``add`` (a failed append) has two equal items
        heap = self._heap
        if self._sorted:  # the items come out in order: the due ones (and stale ones among them) are a prefix
            i = self._live_from(0)
            while i < len(heap) and heap[i][0] <= now_ms and len(out) < limit:
                due, origin = heap[i]
                if origin not in taken:
                    taken.add(origin)
                    out.append(self.pending[origin])
                i = self._live_from(i + 1)
            del heap[:i]
            return out
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            due, origin = heapq.heappop(heap)
            half = self.pending.get(origin)
            if half is not None and half.next_check_ms == due and origin not in taken:
                taken.add(origin)
                out.append(half)
        return out

    def next_due(self) -> int | None:
        """When the earliest check is due (stale items are dropped on the way)."""
        self._drop_stale()
        heap = self._heap
        if self._sorted:
            del heap[:self._live_from(0)]
            return heap[0][0] if heap else None
        while heap:
            due, origin = heap[0]
            half = self.pending.get(origin)
            if half is not None and half.next_check_ms == due:
                return due
            heapq.heappop(heap)
        return None

    def progress(self, half_end: int, op_end: int) -> tuple[int, int]:
        """``(half_offset, op_offset)`` to rebuild from after a restart; the queues' ends when nothing is
        pending."""
        if not self.pending:
            return half_end, op_end
        oldest = min(self.pending.values(), key=_LATEST_OFFSET)  # (the first such, as a lambda key finds it)
        return oldest.latest_offset, oldest.op_mark


class OutcomeMemory:
    """How recently resolved transactions ended (origin -> "committed" / "rolled back" / "discarded"): at least the
    last ``size`` remembered, at most about twice as many. Two generations of plain dicts: a full one becomes the old
    one, the one before it is forgotten at once. So a batched commit remembers its claims with a dict update, not
    an ordered insert and an eviction per transaction."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._new: dict[int, str] = {}
        self._old: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._new) + sum(1 for origin in self._old if origin not in self._new)

    def get(self, origin: int) -> str | None:
        got = self._new.get(origin)
        return self._old.get(origin) if got is None else got

    def remember(self, origin: int, outcome: str) -> None:
        self._new[origin] = outcome
        self._turn()

    def remember_all(self, origins: Iterable[int], outcome: str) -> None:
        self._new.update(zip(origins, itertools.repeat(outcome)))
        self._turn()

    def forget(self, origin: int) -> None:
        """(a claim whose append failed: as if it had not been made)"""
        self._new.pop(origin, None)
        self._old.pop(origin, None)

    def _turn(self) -> None:
        if len(self._new) >= self.size:
            self._old, self._new = self._new, {}
