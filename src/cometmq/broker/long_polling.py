"""Held pull requests (RocketMQ's PullRequestHoldService), woken by arrivals, not by polling.

A pull that finds nothing is parked per (topic, queueId). The store's dispatcher tells us of every
message it dispatches; a parked pull whose offset the message reaches, and whose filter it passes, is
re-run at once (with suspending disallowed). Each parked pull also has its own timer for its suspend
timeout. After parking, the queue's max offset is checked again, so a message that arrived between
the empty read and the parking is never missed (RocketMQ #7358). A periodic re-check remains only as
a safety net.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cometmq.broker.filters import PropertyFilter, TagFilter
from cometmq.common.periodic import Periodic
from cometmq.net.connection import DEFAULT_MAX_INFLIGHT, RemotingConnection
from cometmq.protocol.remoting import RemotingCommand
from cometmq.store.message import DispatchRequest

log = logging.getLogger(__name__)

#: ``replay(conn, request[, parsed header])`` runs a held pull again and answers it: synchronous (run at once),
#: or a coroutine (run as a task); the header argument is passed only when the held pull carries one
Replay = Callable[..., Awaitable[None] | None]
#: ``fast(held, arrival)`` answers a held pull woken by ``arrival`` at once and says True, or does nothing and
#: says False (the replay then answers it)
FastReplay = Callable[["HeldPull", DispatchRequest], bool]


@dataclass(eq=False)
class HeldPull:
    conn: RemotingConnection
    request: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    tag_filter: TagFilter | None
    wake_on_arrival: bool
    #: a SQL92 filter: only arrivals whose properties match wake this pull
    property_filter: PropertyFilter | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    done: bool = False
    #: the request's parsed header, handed to the replay (which then need not parse it again)
    header: Any = field(default=None, repr=False)


class PullRequestHoldService:
    def __init__(self, max_offset: Callable[[str, int], int], replay: Replay, *,
                 check_interval_s: float = 5.0, max_held_per_connection: int = DEFAULT_MAX_INFLIGHT) -> None:
        self._max_offset = max_offset
        #: pulls one connection may have held at once (``can_hold``): a held pull's handler has returned, so the
        #: connection's cap on handlers in flight does not count it, and its timeout is the client's to choose
        self.max_held_per_connection = max_held_per_connection
        self._replay = replay
        self._check = Periodic("pull-hold-check", check_interval_s, self._check_held, logger=log)
        self._table: dict[tuple[str, int], list[HeldPull]] = {}
        #: held pulls per connection, so a closing connection drops its own (one close callback per connection)
        self._by_conn: dict[RemotingConnection, set[HeldPull]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._replays: set[asyncio.Task[None]] = set()
        #: the broker's fast answer to a pull woken by the one record it gets (broker/pull_fast.py), if any
        self.fast_replay: FastReplay | None = None
        self.woken_by_arrival = 0
        self.woken_by_timeout = 0
        self.woken_by_check = 0

    @property
    def held_count(self) -> int:
        return sum(len(v) for v in self._table.values())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._check.start()

    async def stop(self) -> None:
        await self._check.stop()
        for held_list in self._table.values():
            for held in held_list:
                if held.timer is not None:
                    held.timer.cancel()
        self._table.clear()
        self._by_conn.clear()
        for task in list(self._replays):
            task.cancel()

    # -- parking ---------------------------------------------------------------------------------------
    def can_hold(self, conn: RemotingConnection) -> bool:
        """Whether ``conn`` may have one more pull held (below ``max_held_per_connection``)."""
        held = self._by_conn.get(conn)
        return held is None or len(held) < self.max_held_per_connection

    def suspend(self, held: HeldPull, timeout_s: float) -> None:
        assert self._loop is not None, "hold service not started"
        key = (held.topic, held.queue_id)
        self._table.setdefault(key, []).append(held)
        held.timer = self._loop.call_later(timeout_s, self._timed_out, held)
        by_conn = self._by_conn.get(held.conn)
        if by_conn is None:
            by_conn = self._by_conn[held.conn] = set()
            held.conn.add_close_callback(self._connection_closed)
        by_conn.add(held)
        # A message may have landed after the read that found nothing: look once more now.
        if held.wake_on_arrival and self._max_offset(held.topic, held.queue_id) > held.offset:
            self._wake(held)
            self.woken_by_arrival += 1

    def _connection_closed(self, conn: RemotingConnection) -> None:
        for held in list(self._by_conn.pop(conn, ())):
            self._drop(held)

    def _drop(self, held: HeldPull) -> None:
        if held.done:
            return
        held.done = True
        self._unlink(held)

    def _unlink(self, held: HeldPull) -> None:
        """Forget a pull marked done: its timer, and its places in the tables."""
        if held.timer is not None:
            held.timer.cancel()
        by_conn = self._by_conn.get(held.conn)
        if by_conn is not None:
            by_conn.discard(held)
        lst = self._table.get((held.topic, held.queue_id))
        if lst is not None:
            try:
                lst.remove(held)
            except ValueError:
                pass
            if not lst:
                del self._table[(held.topic, held.queue_id)]

    def _wake(self, held: HeldPull, arrival: DispatchRequest | None = None) -> None:
        if held.done:
            return
        held.done = True  # (answered once, whatever happens below)
        if held.conn.closed:
            self._unlink(held)
            return
        # The answer first, the bookkeeping after: the consumer's process runs as soon as the answer is written
        # (on this core, its wake-up preempts this process), and waits for nothing else.
        try:
            answered = arrival is not None and self.fast_replay is not None and self.fast_replay(held, arrival)
        finally:
            self._unlink(held)
        if answered:
            return
        # A synchronous replay answers now, inside the arrival's dispatch (the store's reads take no lock):
        # the answer leaves in the same loop turn as the append, with no task to create and schedule.
        if held.header is None:
            pending = self._replay(held.conn, held.request)
        else:
            pending = self._replay(held.conn, held.request, held.header)
        if pending is None:
            return
        task = asyncio.ensure_future(pending)
        self._replays.add(task)
        task.add_done_callback(self._replays.discard)

    def _timed_out(self, held: HeldPull) -> None:
        if not held.done:
            self.woken_by_timeout += 1
            self._wake(held)

    # -- arrivals --------------------------------------------------------------------------------------
    def on_arrival(self, req: DispatchRequest) -> None:
        """The store's arrival listener. Cheap when nobody waits on that queue: one dict lookup."""
        if not self._table:
            return
        key = (req.topic, req.queue_id)
        if key not in self._table:
            return
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._arrived, key, req)
        else:
            self._arrived(key, req)

    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        """``on_arrival`` for a dispatched batch: one call, and nothing per record while nobody waits."""
        table = self._table
        if not table:
            return
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._arrived_batch, reqs)
        else:
            self._arrived_batch(reqs)

    def _arrived_batch(self, reqs: list[DispatchRequest]) -> None:
        table = self._table
        for req in reqs:
            if not table:
                return
            key = (req.topic, req.queue_id)
            if key in table:
                self._arrived(key, req)

    def _arrived(self, key: tuple[str, int], req: DispatchRequest) -> None:
        held_list = self._table.get(key)
        if not held_list:
            return
        queue_offset, tags_code, properties = req.queue_offset, req.tags_code, req.properties
        for held in list(held_list):
            if not held.wake_on_arrival or queue_offset < held.offset:
                continue
            if held.tag_filter is not None and not held.tag_filter(tags_code):
                continue
            if held.property_filter is not None and not held.property_filter(properties):
                continue
            self.woken_by_arrival += 1
            self._wake(held, req)

    def _check_held(self) -> None:
        """The safety net (seeds 000, 002): every held pull whose queue has grown is woken, in case an arrival
        was missed; arrivals, not this check, are the wake-up mechanism."""
        for key, held_list in list(self._table.items()):
            max_off = self._max_offset(*key)
            for held in list(held_list):
                if held.wake_on_arrival and max_off > held.offset:
                    self.woken_by_check += 1
                    self._wake(held)
