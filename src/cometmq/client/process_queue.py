"""A push consumer's per-queue state: messages pulled but not yet consumed, and the pull that feeds them.

The offset a consumer may commit for a queue is the smallest offset still being consumed — or, when
nothing is, the offset the next pull starts from. Messages finish out of order under a concurrent
listener, so committing "the last one done" could skip one still running; this never does.

An orderly consumer (cometmq.client.orderly) also keeps here what it needs per queue: the messages it
*took* (handed to its listener, not yet committed — a rollback puts them back), whether it holds the
queue's broker lock and since when, and the lock held while one batch is being consumed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from cometmq.client.message import MessageExt
from cometmq.protocol.client_bodies import MessageQueue

__all__ = ["ProcessQueue", "PullRequest"]


class ProcessQueue:
    """Messages of one queue in flight (pulled, not yet consumed), with their count and body bytes."""

    __slots__ = ("_ascending", "_consuming", "_last_put", "_msgs", "consume_lock", "dropped", "last_consume_time",
                 "last_lock_time", "last_pull_time", "locked", "next_offset", "size_bytes", "try_unlock_times")

    def __init__(self, start_offset: int) -> None:
        #: queue offset -> message; kept in ascending order while offsets only grow (the usual case)
        self._msgs: dict[int, MessageExt] = {}
        self._ascending = True
        self._last_put = -1
        self.size_bytes = 0
        #: where the next pull starts; every offset below it is consumed, filtered out, or in ``_msgs``
        self.next_offset = start_offset
        self.dropped = False
        self.last_pull_time = time.monotonic()
        self.last_consume_time = time.monotonic()
        # -- orderly consumption --
        #: taken by the orderly listener and not yet committed (offset -> message), ascending
        self._consuming: dict[int, MessageExt] = {}
        #: the broker granted this client the queue's lock (at ``last_lock_time``, monotonic seconds)
        self.locked = False
        self.last_lock_time = 0.0
        #: held while a batch of this queue is in the listener: giving the queue up waits for it
        self.consume_lock = asyncio.Lock()
        self.try_unlock_times = 0

    @property
    def count(self) -> int:
        """Messages pulled and not yet done (for an orderly queue: taken but uncommitted ones included)."""
        return len(self._msgs) + len(self._consuming)

    def __contains__(self, queue_offset: int) -> bool:
        return queue_offset in self._msgs or queue_offset in self._consuming

    def put(self, msgs: Iterable[MessageExt], next_offset: int) -> list[MessageExt]:
        """Add pulled messages and move the pull position; returns the ones that were new."""
        added = []
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs or off in self._consuming:
                continue
            if off < self._last_put:
                self._ascending = False
            self._last_put = off
            self._msgs[off] = m
            self.size_bytes += len(m.body)
            added.append(m)
        self.last_pull_time = time.monotonic()
        self.next_offset = next_offset
        return added

    def advance(self, next_offset: int) -> None:
        """Nothing (new) was found: the next pull starts at ``next_offset``."""
        self.last_pull_time = time.monotonic()
        self.next_offset = next_offset

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Forget consumed messages; returns the offset that may now be committed."""
        for m in msgs:
            gone = self._msgs.pop(m.queue_offset, None)
            if gone is not None:
                self.size_bytes -= len(gone.body)
        if not self._msgs:
            self._ascending = True
            self._last_put = -1
        self.last_consume_time = time.monotonic()
        return self.committable

    @property
    def committable(self) -> int:
        """The smallest offset still in flight (taken ones included), else where the next pull starts."""
        if not self._msgs:
            return min(self._consuming) if self._consuming else self.next_offset
        lo = next(iter(self._msgs)) if self._ascending else min(self._msgs)
        return min(lo, min(self._consuming)) if self._consuming else lo  # taken ones: a batch or a few

    @property
    def max_span(self) -> int:
        """Distance between the smallest and largest offsets in flight (0 when empty)."""
        if not self._msgs:
            return max(self._consuming) - min(self._consuming) if self._consuming else 0
        lo = self.committable
        hi = next(reversed(self._msgs)) if self._ascending else max(self._msgs)
        if self._consuming:
            hi = max(hi, *self._consuming)
        return hi - lo

    # -- orderly consumption (ProcessQueue.takeMessages / commit / rollback / makeMessageToConsumeAgain) ---------
    @property
    def taken(self) -> int:
        """Messages handed to the orderly listener and not yet committed."""
        return len(self._consuming)

    def lock_valid(self, now: float, max_age: float) -> bool:
        """Locked, and the grant is at most ``max_age`` seconds old (the broker's lifetime is longer)."""
        return self.locked and now - self.last_lock_time <= max_age

    def take(self, n: int) -> list[MessageExt]:
        """Hand the next ``n`` messages in offset order to the listener (they stay here until committed)."""
        if not self._msgs:
            return []
        if not self._ascending:
            self._resort()
        out = [self._msgs.pop(off) for off in list(itertools.islice(self._msgs, n))]
        for m in out:
            self._consuming[m.queue_offset] = m
        if not self._msgs:
            self._last_put = -1
        return out

    def commit(self) -> int:
        """Everything taken is done: forget it and return the offset that may now be committed."""
        for m in self._consuming.values():
            self.size_bytes -= len(m.body)
        self._consuming.clear()
        self.last_consume_time = time.monotonic()
        return self.committable

    def rollback(self) -> int:
        """Put every taken (uncommitted) message back, to be consumed again from the first; returns how many."""
        n = len(self._consuming)
        if n:
            self._msgs.update(self._consuming)
            self._consuming.clear()
            self._resort()
        return n

    def make_again(self, msgs: Iterable[MessageExt]) -> None:
        """Put these taken messages back (as given: e.g. with their reconsume count raised) to be taken again."""
        again = False
        for m in msgs:
            if self._consuming.pop(m.queue_offset, None) is not None:
                self._msgs[m.queue_offset] = m
                again = True
        if again:
            self._resort()

    def _resort(self) -> None:
        self._msgs = dict(sorted(self._msgs.items()))
        self._ascending = True
        self._last_put = next(reversed(self._msgs)) if self._msgs else -1


@dataclass(eq=False)
class PullRequest:
    """One assigned queue: where to pull next, its process queue, and the pull now in flight or scheduled."""

    mq: MessageQueue
    pq: ProcessQueue
    next_offset: int
    #: the broker id the last answer suggested (0 = master)
    broker_id: int = 0
    errors: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    #: the next pull's timer, or its ``call_soon`` handle
    timer: asyncio.Handle | None = field(default=None, repr=False)
    # -- orderly consumption --
    #: locked, start offset read, pulling (an orderly queue waits for its lock before it starts)
    started: bool = False
    #: the task consuming this queue one batch at a time, and what wakes it (new messages, a lock, a timer)
    consume_task: asyncio.Task[None] | None = field(default=None, repr=False)
    wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def cancel(self) -> None:
        """Stop the pull in flight and any scheduled one."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
