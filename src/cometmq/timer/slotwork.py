"""The dequeue's working sets: a message ready to put, a slot read ahead or being delivered, and a
slot closed but whose puts may not yet be flushed."""

from __future__ import annotations

import bisect
import gc
import heapq
import time
from dataclasses import dataclass
from operator import attrgetter

from cometmq.protocol.properties import UNIQ_KEY
from cometmq.store.message import MessageInner
from cometmq.timer.message import delete_key
from cometmq.timer.timerlog import TimerEntry


@dataclass(slots=True)
class PutItem:
    """A message ready to put: at ``at`` (ms), made from the timer record at ``src``."""

    at: int
    due: int
    src: int
    msg: MessageInner
    roll: bool
    nbytes: int

    def delete_key(self) -> str | None:
        """The name a delete marker would give this message (rolls are never cancelled in passing)."""
        if self.roll:
            return None
        uniq = self.msg.properties.get(UNIQ_KEY)
        return delete_key(self.msg.topic, uniq) if uniq else None


class SlotWork:
    """A slot read ahead (prefetched) or being delivered (open).

    Once open, its messages wait in three places: ``sched`` (sorted by time when the slot opened;
    ``sched_pos`` moves along it by bisection, so a slot of 200,000 costs one sort, not a heap),
    ``late`` (a heap for messages that came after the slot opened, due later in the slot) and ``due``
    (due now, put in batches from ``due_pos``)."""

    __slots__ = ("commit_start", "deletes", "due", "due_pos", "head_seen", "items", "last_at", "late", "ordered",
                 "put_end", "sched", "sched_at", "sched_pos", "seq", "slot", "spent", "todo", "walks")

    def __init__(self, slot: int, head: int) -> None:
        self.slot = slot
        #: the newest entry seen; entries linked later are walked from the new head down to it
        self.head_seen = head
        #: chain segments still to read: (next position, stop position, exclusive)
        self.walks: list[tuple[int, int]] = [(head, -1)] if head >= 0 else []
        self.items: list[PutItem] = []
        #: ``items`` are in send order (timer-record position): read-ahead sorts them once it has them all
        self.ordered = True
        #: the latest ``at`` among ``items``
        self.last_at = 0
        self.deletes: set[str] = set()
        self.todo: list[TimerEntry] = []
        self.sched: list[PutItem] = []
        self.sched_at: list[int] = []
        self.sched_pos = 0
        self.late: list[tuple[int, int, PutItem]] = []
        self.due: list[PutItem] = []
        self.due_pos = 0
        self.seq = 0
        self.commit_start = 0
        self.put_end = 0
        #: taken ``due`` lists, freed by ``drop_spent`` once a burst is out (freeing 200,000 messages takes
        #: ~0.1 s: not before the last batch of them is put)
        self.spent: list[list[PutItem]] = []

    def follow(self, head: int) -> bool:
        """Note entries linked since the last look (a new head); True when there are some."""
        if head > self.head_seen:
            self.walks.append((head, self.head_seen))
            self.head_seen = head
            return True
        return False

    def add(self, item: PutItem, now: int) -> None:
        if item.at <= now:
            self.due.append(item)
        else:
            heapq.heappush(self.late, (item.at, self.seq, item))
            self.seq += 1

    def collect_due(self, now: int) -> bool:
        """Move what has come due to ``due``; True when something is due."""
        if self.sched_pos < len(self.sched_at) and self.sched_at[self.sched_pos] <= now:
            k = bisect.bisect_right(self.sched_at, now, self.sched_pos)
            self.due.extend(self.sched[self.sched_pos:k])
            self.sched_pos = k
            if k == len(self.sched):
                self.sched, self.sched_at, self.sched_pos = [], [], 0
        late = self.late
        while late and late[0][0] <= now:
            self.due.append(heapq.heappop(late)[2])
        return self.due_pos < len(self.due)

    def take(self, max_n: int) -> list[PutItem]:
        batch = self.due[self.due_pos:self.due_pos + max_n]
        self.due_pos += len(batch)
        if self.due_pos >= len(self.due):
            self.spent.append(self.due)
            self.due, self.due_pos = [], 0
        return batch

    def drop_spent(self) -> None:
        self.spent.clear()

    def give_back(self, items: list[PutItem]) -> None:
        self.due = items + self.due[self.due_pos:]
        self.due_pos = 0

    def next_at(self) -> int | None:
        if self.due_pos < len(self.due):
            return 0
        cands = []
        if self.sched_pos < len(self.sched_at):
            cands.append(self.sched_at[self.sched_pos])
        if self.late:
            cands.append(self.late[0][0])
        return min(cands) if cands else None

    def remaining(self) -> int:
        """Messages of the open slot still to put (due now or later in the slot)."""
        return len(self.due) - self.due_pos + len(self.sched) - self.sched_pos + len(self.late)

    def waiting(self) -> list[PutItem]:
        return self.due[self.due_pos:] + self.sched[self.sched_pos:] + [x[2] for x in self.late]


@dataclass(frozen=True, slots=True)
class ClosedSlot:
    slot: int
    commit_start: int
    put_end: int



def at_of(item: PutItem) -> int:
    return item.at


#: the position of the timer record a message was made from: its send order
src_of = attrgetter("src")


class BurstGcPause:
    """Holds the cyclic garbage collector off while a burst of due messages is put.

    Putting 200,000 messages allocates as many dispatch records, and the collections they trigger
    walk every object the broker holds (a full one took 100-200 ms in the burst benchmark). Reference
    counting still frees everything acyclic; cycles wait until the burst is over. A pause lasts at
    most ``max_s`` (bursts in a row included), then the collector runs for at least as long before it may
    pause again; it never touches a collector someone else turned off."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._since: float | None = None
        self._not_before = 0.0
        self.pauses = 0

    @property
    def active(self) -> bool:
        return self._since is not None

    def hold(self) -> None:
        now = time.monotonic()
        if self._since is None:
            if now >= self._not_before and gc.isenabled():
                gc.disable()
                self._since = now
                self.pauses += 1
        elif now - self._since > self.max_s:
            self.release(forced=True)

    def release(self, *, forced: bool = False) -> None:
        """Give the collector back; ``forced`` (held too long): not to be held again for as long."""
        if self._since is not None:
            now = time.monotonic()
            if forced:
                self._not_before = now + (now - self._since)
            self._since = None
            gc.enable()


__all__ = ["BurstGcPause", "ClosedSlot", "PutItem", "SlotWork", "at_of", "src_of"]
