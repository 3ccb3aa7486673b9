"""A push consumer's per-queue state: messages pulled but not yet consumed, and the pull that feeds them.

The offset a consumer may commit for a queue is the smallest offset still being consumed — or, when
nothing is, the offset the next pull starts from. Messages finish out of order under a concurrent
listener, so committing "the last one done" could skip one still running; this never does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from cometmq.client.message import MessageExt
from cometmq.protocol.client_bodies import MessageQueue

__all__ = ["ProcessQueue", "PullRequest"]


class ProcessQueue:
    """Messages of one queue in flight (pulled, not yet consumed), with their count and body bytes."""

    __slots__ = ("_ascending", "_last_put", "_msgs", "dropped", "last_consume_time", "last_pull_time", "next_offset",
                 "size_bytes")

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

    @property
    def count(self) -> int:
        return len(self._msgs)

    def __contains__(self, queue_offset: int) -> bool:
        return queue_offset in self._msgs

    def put(self, msgs: Iterable[MessageExt], next_offset: int) -> list[MessageExt]:
        """Add pulled messages and move the pull position; returns the ones that were new."""
        added = []
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs:
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
        """The smallest offset still in flight, else where the next pull starts."""
        if not self._msgs:
            return self.next_offset
        if self._ascending:
            return next(iter(self._msgs))
        return min(self._msgs)

    @property
    def max_span(self) -> int:
        """Distance between the smallest and largest offsets in flight (0 when empty)."""
        if not self._msgs:
            return 0
        lo = self.committable
        hi = next(reversed(self._msgs)) if self._ascending else max(self._msgs)
        return hi - lo


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
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop the pull in flight and any scheduled one."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
