"""The timer checkpoint (``config/timercheck``) and crash recovery of the TimerLog and the wheel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.store.commitlog import dispatch_request_from_record
from cometmq.timer.base import TimerServiceBase, log
from cometmq.timer.message import TIMER_SRC_PHY, TIMER_TOPIC, queued_records_floor
from cometmq.timer.timerlog import UNIT_SIZE


class TimerRecovery(TimerServiceBase):
    def _read_checkpoint(self) -> dict[str, Any] | None:
        raw = read_optional(self.checkpoint_path)
        if raw is None:
            return None
        try:
            ck = json.loads(raw)
            if not isinstance(ck, dict):
                raise ValueError("not an object")
            for key in ("enqueue_offset", "read_slot", "timerlog_end", "commit_offset"):
                int(ck[key])
            return ck
        except (ValueError, KeyError, TypeError) as exc:
            log.error("timer checkpoint %s is unreadable (%s); rebuilding from the timer log", self.checkpoint_path,
                      exc)
            return None

    def _durable_point(self) -> tuple[int, int]:
        """(read slot, commit-log offset) a restart may resume from without loss: slots whose puts
        are not yet flushed count as undelivered (replay finds their puts from that offset on)."""
        flushed = self.store.flushed_offset
        closed = self._closed
        while closed and closed[0].put_end <= flushed:
            closed.popleft()
        if closed:
            return closed[0].slot, closed[0].commit_start
        if self._cur is not None:
            return self._cur.slot, self._cur.commit_start
        return self.read_slot, self.store.commitlog.max_offset

    def _snapshot(self, *, clean: bool) -> dict[str, Any]:
        read_slot, commit = self._durable_point()
        floor = self._replay_floor
        if floor is not None:
            if read_slot > floor[1]:
                self._replay_floor = None  # every slot replay may have skipped a record of is durably done
            else:
                commit = min(commit, floor[0])
        if not self.deliver:
            # A replica re-reads the master's copies from the master's bound (timer/replica.py); before the
            # first one is known, from the start of the log.
            commit = self.master_commit_offset if self.master_commit_offset is not None else 0
        geo = self.geometry
        s = self.stats
        return {"version": 1, "precision_ms": geo.precision_ms, "slots": geo.slots, "roll_slots": geo.roll_slots,
                "timerlog_file_size": geo.file_size, "enqueue_offset": self.enqueue_offset,
                "timerlog_end": self._tl().write_pos, "read_slot": read_slot, "commit_offset": commit,
                "segments": {str(k): v for k, v in sorted(self._seg_max.items())}, "clean": clean,
                "deliver": self.deliver,
                "time_ms": self.clock(),
                "stats": {"enqueued": s.enqueued, "delivered": s.delivered, "rolled": s.rolled,
                          "cancelled": s.cancelled}}

    def _write_checkpoint(self, snap: dict[str, Any]) -> None:
        write_atomic(self.checkpoint_path, json.dumps(snap, sort_keys=True).encode())

    async def checkpoint(self, *, clean: bool = False) -> None:
        """Flush the TimerLog and wheel, then record how far they (and delivery) are durable."""
        async with self._ck_lock:
            if self.timerlog is None:
                return
            snap = self._snapshot(clean=clean)
            await asyncio.to_thread(self._flush_files)
            await asyncio.to_thread(self._write_checkpoint, snap)
            await asyncio.to_thread(self._update_floor, snap)
            if self.timerlog is not None:
                self.timerlog.release_flushed()
                self._delete_done_segments(int(snap["read_slot"]))

    def _update_floor(self, snap: dict[str, Any]) -> None:
        """The lowest commit-log offset a pending message's record lies at, as of ``snap``: the first TimerLog entry
        in a slot not durably done (entries follow their records' order), or the first record not yet indexed."""
        tl = self._tl()
        read_slot = int(snap["read_slot"])
        if read_slot < self._pin_slot:  # (a replica following a new master from an earlier slot)
            self._pin_pos = 0
        self._pin_slot = read_slot
        self._pin_pos, entry = tl.first_from_slot(max(self._pin_pos, tl.min_pos), int(snap["timerlog_end"]),
                                                  read_slot)
        queued = queued_records_floor(self.store, int(snap["enqueue_offset"]))
        self._floor = min((x for x in (entry, queued) if x is not None), default=None)

    def _delete_done_segments(self, durable_read_slot: int) -> None:
        tl = self._tl()
        done: set[int] = set()
        for start in tl.segment_starts()[:-1]:
            top = self._seg_max.get(start)
            if top is None:
                top = self._scan_segment_max(start)
            if top >= durable_read_slot:
                break
            done.add(start)
        if done and tl.delete_segments(done):
            for start in done:
                self._seg_max.pop(start, None)
            log.info("timer log: deleted %d delivered segment(s)", len(done))

    def _scan_segment_max(self, start: int) -> int:
        tl = self._tl()
        top = -1
        for e in tl.scan(start):
            if e.pos >= start + tl.file_size:
                break
            top = max(top, e.slot)
        self._seg_max[start] = top
        return top

    # == recovery ====================================================================================
    def _recover(self, ck: dict[str, Any] | None) -> None:
        tl, wheel = self._tl(), self._wh()
        now_slot = self.clock() // self.precision_ms
        if ck is None:
            self.read_slot = now_slot
            self.enqueue_offset = 0
            if tl.files.files:
                self.recovered_abnormally = True
                self.read_slot = self._read_slot_without_checkpoint(now_slot)
                log.error("timer: a timer log but no (readable) checkpoint; every entry is re-linked from slot %d "
                          "(now %d)", self.read_slot, now_slot)
                self._full_rebuild()
            else:
                tl.set_end(0)
                cq = self.store.queues.get((TIMER_TOPIC, 0))
                self.enqueue_offset = cq.min_offset if cq is not None else 0
                first = cq.get_unit(cq.min_offset) if cq is not None else None
                if first is not None:
                    # Built after timer records were stored (the broker builds it on first use): copies a master
                    # has put of them since are in the log; a replica's follow and a promotion must know them.
                    self._find_delivered(first[0])
        else:
            self.read_slot = int(ck["read_slot"])
            self.enqueue_offset = int(ck["enqueue_offset"])
            self._seg_max = {int(k): int(v) for k, v in dict(ck.get("segments") or {}).items()}
            end = int(ck["timerlog_end"])
            clean = bool(ck.get("clean")) and not self._force_rebuild
            if clean and tl.read(end) is None and self._entry_free(end):
                tl.set_end(end)
            else:
                self.recovered_abnormally = True
                self._replay_tail(end)
            self._find_delivered(int(ck["commit_offset"]))
            if self._recovered_src:
                self._replay_floor = (int(ck["commit_offset"]), now_slot)
            if not ck.get("deliver", True):
                self.master_commit_offset = int(ck["commit_offset"])
        cq = self.store.queues.get((TIMER_TOPIC, 0))
        if cq is None:
            if self.enqueue_offset:
                log.warning("timer: the timer topic's queue is gone; indexing restarts at offset 0")
            self.enqueue_offset = 0
        else:
            self.enqueue_offset = min(max(self.enqueue_offset, cq.min_offset), cq.max_offset)
        total, deletes = wheel.rebuild(self.read_slot)
        self._pending = total - deletes
        self._next_occ_valid = False

    def _read_slot_without_checkpoint(self, now_slot: int) -> int:
        """Where delivery resumes when the checkpoint is lost: the first slot holding a message not yet put.

        Slots are delivered (and rolled) in order and every copy names its timer record (TIMER_SRC_PHY), so the
        records put are found in the commit log from the oldest entry's record on; every slot before the newest
        one put from is done. Resuming there (not at now) delivers the messages that fell due while the broker was
        down; replay skips those already put (``_recovered_src``). Entries before it without a copy were cancelled
        or lost their record; a pending one beyond the wheel's reach from it cannot be linked and is logged."""
        tl = self._tl()
        first = next(iter(tl.scan(tl.min_pos)), None)
        if first is None:
            return now_slot
        scan_from = max(first.offset_py, self.store.commitlog.min_offset)
        self._find_delivered(scan_from)
        put = self._recovered_src
        done_below = max((e.slot for e in tl.scan(tl.min_pos) if e.offset_py in put), default=-1)

        def pending() -> Iterator[int]:
            return (e.slot for e in tl.scan(tl.min_pos)
                    if not e.is_delete and e.offset_py not in put and e.slot >= done_below)

        read_slot = min(min(pending(), default=now_slot), now_slot)
        reach = read_slot + self._wh().slots
        out_of_reach = sum(1 for slot in pending() if slot >= reach)
        if out_of_reach:
            log.error("timer: %d pending messages lie beyond the wheel's %d slots from slot %d and cannot be "
                      "re-linked without a checkpoint; they will not be delivered", out_of_reach, self._wh().slots,
                      read_slot)
        if put:
            self._replay_floor = (scan_from, now_slot)
        return read_slot

    def _outstanding(self) -> bool:
        """Whether any pending slot holds an entry replay would still put (a geometry change waits)."""
        wheel, tl = self._wh(), self._tl()
        slot = wheel.next_occupied(self.read_slot, self.read_slot + wheel.slots)
        while slot is not None:
            for e in tl.chain(wheel.head(slot)):
                if not e.is_delete and e.offset_py not in self._recovered_src:
                    return True
            slot = wheel.next_occupied(slot + 1, self.read_slot + wheel.slots)
        return False

    def _entry_free(self, pos: int) -> bool:
        """Nothing was written at ``pos`` (a clean stop's end really is the end)."""
        tl = self._tl()
        mf = tl.files.find(pos)
        if mf is None:
            return True
        local = pos - mf.file_from_offset
        return bytes(mf.mm[local:local + 8]) == bytes(8)

    def _replay_tail(self, start: int) -> None:
        """After a crash: keep the TimerLog entries that check, link any the wheel missed, and take
        the enqueue offset from the newest; rebuild the wheel when it is not consistent."""
        tl, wheel = self._tl(), self._wh()
        end, entries = tl.recover_end(start)
        tl.set_end(end)
        rebuild = self._force_rebuild
        linked = 0
        for e in entries:
            self._note_segment(e.pos, e.slot)
            if e.queue_offset + 1 > self.enqueue_offset:
                self.enqueue_offset = e.queue_offset + 1
            if rebuild or e.slot < self.read_slot:
                continue
            head = wheel.head(e.slot)
            if head >= e.pos:
                continue
            if head != e.prev_pos:
                rebuild = True
                continue
            wheel.link(e.slot, e.pos, delete=e.is_delete)
            linked += 1
        if not rebuild and wheel.pointing_past(self.read_slot, end):
            rebuild = True
        if rebuild:
            self._full_rebuild()
        log.info("timer recovery: timer log ends at %d (%d entries past the checkpoint, %d re-linked%s)", end,
                 len(entries), linked, ", wheel rebuilt" if rebuild else "")

    def _full_rebuild(self) -> None:
        tl, wheel = self._tl(), self._wh()
        wheel.reset()
        end = tl.min_pos
        hi = self.read_slot + wheel.slots
        for e in tl.scan(tl.min_pos):
            end = e.pos + UNIT_SIZE
            self._note_segment(e.pos, e.slot)
            if e.queue_offset + 1 > self.enqueue_offset:
                self.enqueue_offset = e.queue_offset + 1
            if self.read_slot <= e.slot < hi:
                wheel.link(e.slot, e.pos, delete=e.is_delete)
        tl.set_end(end)
        self._force_rebuild = False

    def _find_delivered(self, commit_offset: int) -> None:
        """Timer records already put again since the checkpoint (their copies name them)."""
        log_ = self.store.commitlog
        start = max(commit_offset, log_.min_offset)
        if start >= log_.max_offset:
            return
        found = 0
        for offset, view in log_.scan(start, None, check_crc=False):
            req = dispatch_request_from_record(offset, view)
            if req is None:
                break
            src = req.properties.get(TIMER_SRC_PHY)
            if src is not None:
                try:
                    self._recovered_src.add(int(src))
                    found += 1
                except ValueError:
                    pass
        if found:
            log.info("timer recovery: %d messages were put since the checkpoint; replay will skip them", found)
