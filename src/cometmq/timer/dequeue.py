"""The dequeue pipeline: walk the occupied slots in order, read them ahead, and put each due message
back under its real topic at its exact due time, in batches through the store's batch append."""

from __future__ import annotations

import asyncio

from cometmq.store.status import PutResult
from cometmq.timer.base import TimerServiceBase, log
from cometmq.timer.message import TIMER_DEL_UNIQKEY, delivery_message, parse_timer_record, roll_message
from cometmq.timer.slotwork import ClosedSlot, PutItem, SlotWork, at_of, src_of
from cometmq.timer.timerlog import TimerEntry

#: while the open slot has burst_messages or more to put, the store's index builder is deferred this long
#: (rolling)
_BURST_DEFER_S = 0.25


class TimerDequeue(TimerServiceBase):
    async def _dequeue_loop(self) -> None:
        assert self._dq_event is not None and self._caught_up is not None
        ev = self._dq_event
        # A marker stored before a crash must be indexed before its slot is delivered.
        await self._caught_up.wait()
        while not self._stopping:
            ev.clear()
            if not self.deliver:  # a replica: follow the master's deliveries (timer/replica.py)
                try:
                    did = self._follow_step()
                except Exception:
                    log.exception("timer replica step failed; retrying in 1 s")
                    did = False
                if did:
                    await asyncio.sleep(0)
                else:
                    await self._wait(ev, self._follow_deadline())
                continue
            try:
                did = await self._dequeue_step()
            except Exception:
                log.exception("timer dequeue step failed; retrying in 1 s")
                self._backoff_until = self.clock() + 1000
                did = False
            if self._stopping:
                break
            if did:
                await asyncio.sleep(0)
                continue
            cur = self._cur
            if self._gc_pause.active and (cur is None or not cur.remaining()):
                self._gc_pause.release()  # the burst is out: collect while idle, not in the middle of it
            await self._wait(ev, self._next_deadline())

    async def _dequeue_step(self) -> bool:
        """Do one bounded piece of dequeue work; False when there is nothing to do before a deadline."""
        now = self.clock()
        if now < self._backoff_until:
            return False
        cur = self._cur
        chunk = self.config.dequeue_chunk
        if cur is not None:
            if cur.todo:
                # Entries linked since the slot opened (late messages, delete markers) come first.
                todo, cur.todo = cur.todo[:chunk], cur.todo[chunk:]
                for entry in todo:
                    self._add_to_open(cur, self._prepare(cur, entry))
                return True
            if cur.walks and self._wh().get(cur.slot).num_delete:
                # The slot holds delete markers: read all of it before putting any. A marker is not always newer
                # than the message it cancels (one sent while the message was out on a roll is linked before the
                # roll copy), so the newest-first walk may meet the message chunks before its marker.
                self._walk(cur, chunk)
                return True
            if cur.collect_due(now):
                await self._deliver_due(cur)
                return True
            if cur.walks:
                self._walk(cur, chunk)
                return True
            if cur.next_at() is None and now >= (cur.slot + 1) * self.precision_ms:
                self._close(cur)
                return True
        else:
            slot = self._earliest_occupied()
            if slot is not None and slot * self.precision_ms <= now:
                self._open(slot)
                return True
            self._advance_idle(now)
        return self._prefetch_step(now)

    def _next_deadline(self) -> int | None:
        cands: list[int] = []
        if self._backoff_until > self.clock():
            cands.append(self._backoff_until)
        cur = self._cur
        if cur is not None:
            at = cur.next_at()
            cands.append((cur.slot + 1) * self.precision_ms if at is None else at)
        slot = self._earliest_occupied()
        if slot is not None:
            cands.append(slot * self.precision_ms)
            if self._prepared_count < self.config.prefetch_max_messages:
                if self._pf_todo:
                    cands.append(0)
                # The next slot the read-ahead has not looked at, from its own frontier (not from a new
                # reading of the clock, which may already be past the horizon the last step used).
                wheel = self._wh()
                ahead = wheel.next_occupied(max(self._pf_frontier + 1, self.read_slot), self.read_slot + wheel.slots)
                if ahead is not None:
                    cands.append(ahead * self.precision_ms - self._lead_ms(ahead))
        return min(cands) if cands else None


    def _open(self, slot: int) -> None:
        wheel = self._wh()
        work = self._prepared.pop(slot, None)
        self._pf_todo.discard(slot)
        if work is None:
            work = SlotWork(slot, wheel.head(slot))
        else:
            self._prepared_count -= len(work.items)
            work.follow(wheel.head(slot))  # entries linked since the read-ahead (messages, markers)
        items, work.items = work.items, []
        if not work.ordered:
            items.sort(key=src_of)  # send order for messages due at the same time
        now = self.clock()
        if work.last_at <= now:
            work.due = items  # all due already (a burst due at the slot's start)
        else:
            due = [i for i in items if i.at <= now]
            later = [i for i in items if i.at > now] if due else items
            later.sort(key=at_of)
            work.due, work.sched, work.sched_at = due, later, [i.at for i in later]
        rec = wheel.get(slot)
        self._pending -= rec.num - rec.num_delete
        work.commit_start = self.store.commitlog.max_offset
        wheel.mark_done(slot)
        for s in [s for s in self._prepared if s < slot]:  # skipped by an idle catch-up: cannot happen
            stale = self._prepared.pop(s)
            self._prepared_count -= len(stale.items)
        self._cur = work
        self.read_slot = slot + 1
        self._next_occ_valid = False

    def _close(self, cur: SlotWork) -> None:
        self._wh().mark_done(cur.slot)
        self._closed.append(ClosedSlot(cur.slot, cur.commit_start, cur.put_end))
        self._cur = None
        self._next_occ_valid = False

    def _walk(self, work: SlotWork, budget: int) -> None:
        """Read up to ``budget`` more entries of the slot's chain segments."""
        open_ = work is self._cur
        now = self.clock()
        start, stop = work.walks[0]
        last: TimerEntry | None = None
        n = 0
        for entry in self._tl().chain(start, stop=stop, limit=budget):
            last = entry
            n += 1
            item = self._prepare(work, entry)
            if item is None:
                continue
            if open_:
                work.add(item, now)
            else:
                work.items.append(item)
                work.ordered = False
                if item.at > work.last_at:
                    work.last_at = item.at
                self._prepared_count += 1
        if last is not None and n >= budget and last.prev_pos > stop:
            work.walks[0] = (last.prev_pos, stop)
        else:
            work.walks.pop(0)

    def _add_to_open(self, cur: SlotWork, item: PutItem | None) -> None:
        if item is not None:
            cur.add(item, self.clock())

    def _prefetch_step(self, now: int) -> bool:
        """Read ahead one chunk of a slot starting within ``prefetch_ms``; False when there is none.

        Slots up to ``_pf_frontier`` have been looked at; the enqueue notes in ``_pf_todo`` the ones
        among them that got entries since, so a step does not re-examine every slot in the horizon."""
        if self._prepared_count >= self.config.prefetch_max_messages:
            return False
        wheel = self._wh()
        todo = self._pf_todo
        while todo:
            slot = min(todo)
            if slot < self.read_slot:
                todo.discard(slot)
                continue
            work = self._prepared.get(slot)
            if work is None:
                work = self._prepared[slot] = SlotWork(slot, wheel.head(slot))
            else:
                work.follow(wheel.head(slot))
            if not work.walks:
                todo.discard(slot)
                continue
            self._walk(work, self.config.dequeue_chunk)
            if not work.walks:
                todo.discard(slot)
                if not work.ordered:
                    # Chains are walked newest first: put the slot in send order now, ahead of its time.
                    work.items.sort(key=src_of)
                    work.ordered = True
            return True
        horizon = (now + self.config.prefetch_ms) // self.precision_ms
        start = max(self._pf_frontier + 1, self.read_slot)
        found = wheel.next_occupied(start, horizon + 1)
        if found is None:
            # The next occupied slot, if it holds a burst, is read ahead sooner (burst_prefetch_ms):
            # reading 200,000 messages takes seconds. Slots before it are empty, so the frontier moves
            # past nothing unread.
            far = (now + self.config.burst_prefetch_ms) // self.precision_ms
            nxt = wheel.next_occupied(start, far + 1) if far > horizon else None
            if nxt is None or self._lead_ms(nxt) == self.config.prefetch_ms:
                self._pf_frontier = max(self._pf_frontier, horizon)
                return False
            found = nxt
        self._pf_frontier = found
        todo.add(found)
        return True

    def _lead_ms(self, slot: int) -> int:
        """How long before its start a slot is read ahead: longer for a burst."""
        if self._wh().get(slot).num >= self.config.burst_messages:
            return max(self.config.prefetch_ms, self.config.burst_prefetch_ms)
        return self.config.prefetch_ms

    def _prepare(self, work: SlotWork, entry: TimerEntry) -> PutItem | None:
        """Turn one entry into the message to put (None: a marker, cancelled, skipped or unreadable)."""
        if entry.offset_py in self._recovered_src:
            self.stats.duplicates_avoided += 1
            return None
        try:
            view = self.store.commitlog.read(entry.offset_py, entry.size_py)
            rec = parse_timer_record(view) if view is not None else None
        except (ValueError, IndexError):  # a segment removed under us
            rec = None
        if rec is None or not rec.is_timer_topic or rec.queue_offset != entry.queue_offset:
            start = self.store.commitlog.min_offset
            if entry.offset_py < start:
                log.error("timer: a message due at %d is lost: its record (commit log %d) was deleted by the log's "
                          "retention (the log now starts at %d)", entry.due_ms, entry.offset_py, start)
            else:
                log.warning("timer: the record of entry %d (commit log %d) is gone or is not a timer record",
                            entry.pos, entry.offset_py)
            self.stats.lost += 1
            return None
        slot_start = work.slot * self.precision_ms
        if entry.is_roll:
            msg = roll_message(rec, entry.offset_py)
            return PutItem(slot_start, entry.due_ms, entry.offset_py, msg, True, len(msg.body) + 256)
        if entry.is_delete:
            key = rec.properties.get(TIMER_DEL_UNIQKEY)
            if key:
                work.deletes.add(key)
            return None
        msg_ = delivery_message(rec, entry.offset_py)  # consumes rec
        if msg_ is None:
            log.error("timer record at %d has no REAL_TOPIC; dropped", entry.offset_py)
            self.stats.illegal += 1
            return None
        # The record is encoded now, while the slot is read ahead: at the due time its append only writes in
        # the offsets and store time (a burst of 200,000 puts at once).
        self.store.commitlog.prepare(msg_)
        nbytes = len(msg_.body) + len(msg_.properties_raw or b"") + 128
        return PutItem(max(entry.due_ms, slot_start), entry.due_ms, entry.offset_py, msg_, False, nbytes)

    async def _deliver_due(self, cur: SlotWork) -> None:
        if cur.remaining() >= self.config.burst_messages:
            # Many due at once: the store's key index waits (briefly) rather than halve the puts' CPU,
            # and so does the cyclic garbage collector.
            builder = self.store.index_builder
            if builder is not None:
                builder.defer(_BURST_DEFER_S)
            if self.config.burst_gc_pause:
                self._gc_pause.hold()
        batch = cur.take(self.config.put_batch_messages)
        max_b = min(self.config.put_batch_bytes, self.store.config.commitlog_segment_size // 4)
        if sum(i.nbytes for i in batch) > max_b:
            size = 0
            for n, item in enumerate(batch):
                size += item.nbytes
                if size > max_b and n:
                    cur.give_back(batch[n:])
                    batch = batch[:n]
                    break
        deletes = cur.deletes
        if deletes:
            kept = [i for i in batch if i.delete_key() not in deletes]
            self.stats.cancelled += len(batch) - len(kept)
            batch = kept
        if not batch:
            return
        result = await self._put([i.msg for i in batch])
        if result.stored:
            self._delivered(cur, batch, result)
        elif result.unputtable:
            await self._put_one_by_one(cur, batch)
        else:
            self.stats.put_failures += 1
            log.error("timer: putting %d due messages failed (%s %s); retrying in 1 s", len(batch),
                      result.status.value, result.remark)
            cur.give_back(batch)
            self._backoff_until = self.clock() + 1000

    async def _put_one_by_one(self, cur: SlotWork, batch: list[PutItem]) -> None:
        for item in batch:
            result = await self._put([item.msg])
            if result.stored:
                self._delivered(cur, [item], result)
            elif result.unputtable:
                log.error("timer: message from %d cannot be put (%s %s); dropped", item.src,
                          result.status.value, result.remark)
                self.stats.illegal += 1
            else:
                cur.give_back([item])
                self._backoff_until = self.clock() + 1000

    def _delivered(self, cur: SlotWork, batch: list[PutItem], result: PutResult) -> None:
        st = self.stats
        dues = [item.due for item in batch if not item.roll]
        st.rolled += len(batch) - len(dues)
        st.delivered += len(dues)
        st.lateness.record_many(self.clock(), dues)
        if result.end_offset > cur.put_end:
            cur.put_end = result.end_offset
        if not cur.due:
            cur.drop_spent()
