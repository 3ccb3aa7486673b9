"""The enqueue pipeline: timer-topic records -> one TimerLog entry each, linked into a wheel slot."""

from __future__ import annotations

import asyncio
import threading

from cometmq.store.commitlog import dispatch_request_from_record
from cometmq.store.message import DispatchRequest
from cometmq.timer.base import TimerServiceBase, log
from cometmq.timer.message import TIMER_DEL_UNIQKEY, TIMER_OUT_MS, TIMER_TOPIC
from cometmq.timer.timerlog import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, TimerEntry

#: dispatched timer-topic records kept for the enqueue (beyond it, they are read back from the log)
_ARRIVAL_CACHE = 65_536


class TimerEnqueue(TimerServiceBase):
    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        """``on_arrival`` for a dispatched batch (one wake-up for all of it)."""
        if not self.deliver:
            self._note_copies(reqs)
        arrivals = self._arrivals
        found = False
        for req in reqs:
            if req.topic == TIMER_TOPIC and req.queue_id == 0:
                found = True
                if len(arrivals) < _ARRIVAL_CACHE:
                    arrivals.append(req)
        if found:
            self._wake_enqueue()

    def on_arrival(self, req: DispatchRequest) -> None:
        """The store's arrival listener: note timer-topic records and wake the enqueue."""
        if not self.deliver:
            self._note_copies((req,))
        if req.topic != TIMER_TOPIC or req.queue_id != 0:
            return
        if len(self._arrivals) < _ARRIVAL_CACHE:
            self._arrivals.append(req)
        self._wake_enqueue()

    def _wake_enqueue(self) -> None:
        ev, loop = self._enq_event, self._loop
        if ev is None or loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            if not ev.is_set():
                ev.set()
        else:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass

    async def _enqueue_loop(self) -> None:
        assert self._enq_event is not None and self._caught_up is not None
        ev = self._enq_event
        limit = self.config.enqueue_batch
        while not self._stopping:
            try:
                n = self.enqueue_available(limit)
            except OSError as exc:
                log.error("timer enqueue failed (%s); retrying in 1 s", exc)
                await self._wait(ev, self.clock() + 1000)
                continue
            if n >= limit:
                await asyncio.sleep(0)
                continue
            if not self._caught_up.is_set():
                self._caught_up.set()
                if self._dq_event is not None:
                    self._dq_event.set()
            ev.clear()
            if self._has_unindexed():
                continue
            await self._wait(ev, None)

    def _has_unindexed(self) -> bool:
        cq = self.store.queues.get((TIMER_TOPIC, 0))
        return cq is not None and self.enqueue_offset < cq.max_offset

    def enqueue_available(self, limit: int = 1 << 30) -> int:
        """Index up to ``limit`` timer-topic records from the enqueue offset; returns how many."""
        cq = self.store.queues.get((TIMER_TOPIC, 0))
        if cq is None or self.timerlog is None:
            return 0
        nxt = self.enqueue_offset
        if nxt < cq.min_offset:
            log.warning("timer: records %d..%d of the timer topic were removed before being indexed", nxt,
                        cq.min_offset)
            self.stats.lost += cq.min_offset - nxt
            nxt = self.enqueue_offset = cq.min_offset
        end = min(cq.max_offset, nxt + limit)
        if nxt >= end:
            return 0
        now = self.clock()
        self._advance_idle(now)
        self._horizon_slot = (now + self.config.prefetch_ms) // self.precision_ms
        arrivals = self._arrivals
        read = self.store.commitlog.read
        count = 0
        try:
            while nxt < end:
                while arrivals and arrivals[0].queue_offset < nxt:
                    arrivals.popleft()
                req: DispatchRequest | None = None
                if arrivals and arrivals[0].queue_offset == nxt:
                    req = arrivals.popleft()
                else:
                    unit = cq.get_unit(nxt)
                    if unit is not None:
                        view = read(unit[0], unit[1])
                        if view is not None:
                            req = dispatch_request_from_record(unit[0], view)
                if req is None:
                    log.error("timer: record %d of the timer topic cannot be read; skipped", nxt)
                    self.stats.lost += 1
                    nxt += 1
                    continue
                self._enqueue_one(req)
                nxt += 1
                count += 1
        finally:
            self.enqueue_offset = nxt
        return count

    def _enqueue_one(self, req: DispatchRequest) -> None:
        props = req.properties
        try:
            due = int(props[TIMER_OUT_MS])
        except (KeyError, ValueError):
            log.error("timer record at %d has no usable TIMER_OUT_MS; skipped", req.phy_offset)
            self.stats.illegal += 1
            return
        delete = TIMER_DEL_UNIQKEY in props
        wheel, tl = self._wh(), self._tl()
        cur = self._cur
        place = wheel.place(due, self.read_slot, self.roll_slots, cur.slot if cur is not None else None)
        slot = place.slot
        magic = MAGIC_DEFAULT
        if place.roll:
            magic |= MAGIC_ROLL
        if delete:
            magic |= MAGIC_DELETE
        prev = wheel.head(slot)
        pos = tl.append(prev, magic, due, slot, req.phy_offset, req.size, req.queue_offset)
        num = wheel.link(slot, pos, delete=delete)
        self._note_segment(pos, slot)
        self.stats.enqueued += 1
        if cur is not None and slot == cur.slot:
            wheel.mark_done(slot)
            cur.todo.append(TimerEntry(pos, prev, magic, due, slot, req.phy_offset, req.size, req.queue_offset))
            self._wake_dequeue()
            return
        self._pending += -1 if delete else 1
        if slot <= self._pf_frontier:
            self._pf_todo.add(slot)
        elif num == self.config.burst_messages:
            self._wake_dequeue()  # a burst is read ahead earlier (burst_prefetch_ms): take a new look
        if self._next_occ_valid and (self._next_occ is None or slot < self._next_occ):
            self._next_occ = slot
            self._wake_dequeue()
        elif not self._next_occ_valid or slot <= self._horizon_slot:
            self._wake_dequeue()  # may change what to open next, or what to read ahead
