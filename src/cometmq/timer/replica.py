"""The timer on a replica: index what the master stores, deliver nothing, take over at promotion.

RocketMQ 5 runs a slave's timer enqueue (its own TimerLog and wheel, built from the replicated timer-topic records)
and runs delivery on the master only. cometmq does the same with ``deliver`` off, and goes further so that a
promoted replica neither delivers twice nor loses a message:

- Every copy the master puts (a delivery under the real topic, or a roll back into the timer topic) names its
  timer record in TIMER_SRC_PHY, and reaches the replica through replication. The replica's arrival listener
  notes those names in ``_recovered_src``, the set crash recovery fills the same way and the dequeue skips.
- Instead of delivering, the dequeue loop walks each slot once it is past and moves the read slot over it when
  every message in it is accounted for: copied by the master, cancelled by a delete marker, or gone from the log.
  A slot holding a message the master has not put yet (it placed it in a later slot) waits for its copy. So the
  replica never drops a pending message, and its wheel keeps turning with the master's.
- At promotion (``set_deliver(True)``) the ordinary dequeue opens the slots from the replica's read slot, skipping
  what the master already put; what it put but was not replicated is not in the new master's log, so delivering
  it again is right.
- The master's checkpoint (GET_TIMER_CHECK_POINT, copied every 10 s by broker/ha/metadata.py) gives the commit-log
  offset from which the master's copies of the replica's pending messages lie: a restarted replica re-reads them
  from there (the crash-recovery scan), so its set survives restarts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cometmq.protocol.properties import REAL_TOPIC, UNIQ_KEY
from cometmq.store.message import DispatchRequest
from cometmq.timer.base import log
from cometmq.timer.message import TIMER_DEL_UNIQKEY, TIMER_SRC_PHY, TIMER_TOPIC, delete_key, parse_timer_record
from cometmq.timer.recovery import TimerRecovery


class TimerReplica(TimerRecovery):
    # == served to replicas, and applied there ==================================================================
    def checkpoint_info(self) -> dict[str, Any]:
        """What GET_TIMER_CHECK_POINT answers: how far this timer has durably delivered (cometmq's own JSON)."""
        read_slot, commit = self._durable_point()
        return {"readSlot": read_slot, "readTimeMs": read_slot * self.precision_ms, "commitOffset": commit,
                "enqueueOffset": self.enqueue_offset, "precisionMs": self.precision_ms,
                "timerLogEnd": self._tl().write_pos, "deliver": self.deliver, "timeMs": self.clock()}

    def apply_master_checkpoint(self, info: Mapping[str, Any]) -> bool:
        """Take the master's checkpoint (a replica only): its commit offset becomes where a restart re-reads the
        master's copies from. Returns whether anything changed."""
        if self.deliver:
            return False
        try:
            commit, read_slot = int(info["commitOffset"]), int(info["readSlot"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not a timer checkpoint: {dict(info)!r:.200}") from None
        # The master's slots at or past its read slot are put from its commit offset on; the replica places a
        # message no later than the master does, so its pending slots (from its own read slot on) are covered only
        # by a checkpoint whose read slot is not past the replica's.
        if read_slot > self.read_slot or commit == self.master_commit_offset:
            return False
        if self.master_commit_offset is not None and commit < self.master_commit_offset:
            return False  # an older checkpoint (a former master's): keep the later bound
        self.master_commit_offset = commit
        return True

    # == the switch ===============================================================================================
    def set_deliver(self, on: bool) -> None:
        """Turn delivery on (promotion to master) or off (demotion to replica)."""
        if on == self.deliver:
            return
        self.deliver = on
        self._blocked = None
        if on:
            log.info("timer: delivering from slot %d (%d messages the old master put are skipped)", self.read_slot,
                     len(self._recovered_src))
            self._replica_deleted.clear()
        else:
            self._rewind()
        self._next_occ_valid = False
        self._wake_dequeue()

    def _rewind(self) -> None:
        """A master turned replica: what it was putting may be cut from its log by the new master, so it goes
        back to its durable point, forgets the slots it had read ahead, and learns from the log what was put."""
        read_slot, commit = self._durable_point()
        self._cur = None
        self._closed.clear()
        self._prepared.clear()
        self._prepared_count = 0
        self._pf_todo.clear()
        self._pf_frontier = 0
        self.read_slot = read_slot
        total, deletes = self._wh().rebuild(read_slot)
        self._pending = total - deletes
        self.master_commit_offset = commit
        self.on_log_truncated()
        log.info("timer: delivery stopped; following the master from slot %d", read_slot)

    def on_log_truncated(self) -> None:
        """The commit log was cut back (a replica joining a new master): copies past the cut no longer exist, so
        what was put is read again from the log, and the enqueue stays within the timer topic's queue."""
        self._recovered_src.clear()
        self._find_delivered(self.master_commit_offset or 0)
        cq = self.store.queues.get((TIMER_TOPIC, 0))
        self.enqueue_offset = min(self.enqueue_offset, cq.max_offset if cq is not None else 0)
        self._blocked = None

    # == following the master =====================================================================================
    def _note_copies(self, reqs: Iterable[DispatchRequest]) -> None:
        """On a replica: remember which timer records the master has put (copies) or cancelled (markers)."""
        found = False
        for req in reqs:
            props = req.properties
            src = props.get(TIMER_SRC_PHY)
            if src is not None:
                try:
                    self._recovered_src.add(int(src))
                    found = True
                except ValueError:
                    pass
            if req.topic == TIMER_TOPIC:
                key = props.get(TIMER_DEL_UNIQKEY)
                if key:
                    self._replica_deleted.add(key)
                    found = True
        if found and self._blocked is not None:
            self._wake_dequeue()

    def _follow_step(self) -> bool:
        """Move the read slot over the next past slot whose messages are all accounted for; False when there is
        none (nothing past, or a slot waits for the master)."""
        now = self.clock()
        slot = self._earliest_occupied()
        if slot is None or (slot + 1) * self.precision_ms > now:
            self._advance_idle(now)
            return False
        wheel = self._wh()
        head = wheel.head(slot)
        blocked = self._blocked
        if blocked is not None and blocked[0] == slot and blocked[1] == head:
            waiting = {src for src in blocked[2] if not self._accounted(src, None)}
        else:
            waiting = self._unaccounted(slot, head)
        if waiting:
            if blocked is None or blocked[0] != slot:
                log.debug("timer replica: slot %d waits for the master to put %d messages", slot, len(waiting))
            self._blocked = (slot, head, waiting)
            return False
        self._blocked = None
        for entry in self._tl().chain(head):
            self._recovered_src.discard(entry.offset_py)
        rec = wheel.get(slot)
        self._pending -= rec.num - rec.num_delete
        wheel.mark_done(slot)
        self.read_slot = slot + 1
        self._next_occ_valid = False
        return True

    def _unaccounted(self, slot: int, head: int) -> set[int]:
        entries = list(self._tl().chain(head))
        markers = set()
        for e in entries:
            if e.is_delete:
                key = self._record_key(e.offset_py, e.size_py, TIMER_DEL_UNIQKEY)
                if key:
                    markers.add(key)
        return {e.offset_py for e in entries
                if not e.is_delete and not self._accounted(e.offset_py, (e.size_py, markers))}

    def _accounted(self, src: int, read: tuple[int, set[str]] | None) -> bool:
        if src in self._recovered_src:
            return True
        size, markers = read if read is not None else (0, set())
        if read is None:
            unit = self._record_size(src)
            if unit is None:
                return True
            size = unit
        view = self.store.commitlog.read(src, size)
        rec = parse_timer_record(view) if view is not None else None
        if rec is None or not rec.is_timer_topic:
            return True  # gone from the log (retention, truncation): nothing left to deliver
        topic, uniq = rec.properties.get(REAL_TOPIC), rec.properties.get(UNIQ_KEY)
        if not topic:
            return True  # the master drops such a record too (it cannot be delivered)
        if uniq:
            key = delete_key(topic, uniq)
            return key in self._replica_deleted or key in markers
        return False

    def _record_size(self, src: int) -> int | None:
        """The stored size of the record at ``src`` (its first four bytes), None when it is not there."""
        view = self.store.commitlog.read(src, 4)
        if view is None:
            return None
        size = int.from_bytes(view[:4], "big")
        return size if size > 0 else None

    def _record_key(self, offset: int, size: int, key: str) -> str | None:
        view = self.store.commitlog.read(offset, size)
        rec = parse_timer_record(view) if view is not None else None
        return rec.properties.get(key) if rec is not None else None

    def _follow_deadline(self) -> int | None:
        slot = self._earliest_occupied()
        if slot is None or self._blocked is not None:
            return None  # an arrival wakes the loop (and the safety re-check runs every 30 s)
        return (slot + 1) * self.precision_ms
