"""The timer service: the enqueue pipeline (timer topic -> TimerLog + wheel) and the dequeue pipeline
(wheel -> due messages put back under their real topic), with checkpoint and crash recovery.

Enqueue. The broker stores a timer message under ``rmq_sys_wheel_timer`` queue 0 (durable before the
ack). The store's arrival listener hands the dispatched request to ``on_arrival`` (a cache: the
consume queue is the source of truth, read from ``enqueue_offset``). Each record gets one TimerLog
entry linked into a wheel slot: its due slot; a nearer slot with the ROLL mark when it is at least
``roll_slots`` ahead (it is put back into the timer topic when that slot comes, so any delay works);
or the slot being delivered when it is already due.

Dequeue. One task walks the occupied slots in order (empty slots are skipped with a search of the
in-memory ``occupied`` map, not visited). Slots starting within ``prefetch_ms`` are read ahead: their
chains are walked and each record turned into the message to put, in chunks that yield to the loop.
A slot is opened at its start time; each of its messages is put at its own exact due time (never
early), in batches through the store's batch append; roll entries are put back into the timer topic
at once. Delete markers (RocketMQ's recall) cancel the message they name when they share its slot;
a marker for the open slot cancels anything of that slot not yet put.

Bursts. A slot of ``burst_messages`` or more is read ahead ``burst_prefetch_ms`` early and put in send
order; while that many are due, the store's key-index thread is deferred and the cyclic garbage collector
held off (both bounded), so the event loop's CPU goes to the puts (200,000 due at once: ~0.8 s).

Durability. A checkpoint (``config/timercheck``, written atomically every ``flush_interval_ms``)
holds the enqueue offset, the TimerLog end, the first slot not known to be fully delivered (the read
slot) and the commit-log offset where that slot's puts began. After ``kill -9`` the TimerLog tail
is re-validated (CRC) and re-linked into the wheel, the enqueue offset is taken from the newest entry,
slots from the read slot on are replayed, and every record put since the checkpoint's commit-log
offset is found by its TIMER_SRC_PHY property, so replay skips what was already delivered: nothing is
lost and nothing is delivered twice (``duplicates_avoided`` counts what replay skipped). A clean stop
does the same with nothing to replay but the open slot.

Replicas. With ``deliver`` off (a replica of a broker group) the enqueue runs on the replicated timer
records and nothing is delivered; the read slot follows the master's copies, so a promoted replica
(``set_deliver(True)``) neither delivers twice nor loses a message (:mod:`~cometmq.timer.replica`).

Modules: :mod:`~cometmq.timer.base` (state, files), :mod:`~cometmq.timer.enqueue`,
:mod:`~cometmq.timer.dequeue` (with :mod:`~cometmq.timer.slotwork`), :mod:`~cometmq.timer.recovery`
(checkpoint, recovery), :mod:`~cometmq.timer.replica` and :mod:`~cometmq.timer.stats`; this module ties them
together.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from cometmq.timer.base import Geometry, PutFn, TimerServiceBase, log
from cometmq.timer.dequeue import TimerDequeue
from cometmq.timer.enqueue import TimerEnqueue
from cometmq.timer.message import TIMER_TOPIC
from cometmq.timer.recovery import TimerRecovery
from cometmq.timer.replica import TimerReplica
from cometmq.timer.stats import LATENESS_BUCKETS_MS, LatenessHistogram, TimerStats


class TimerMessageService(TimerReplica, TimerRecovery, TimerEnqueue, TimerDequeue, TimerServiceBase):
    """The timer: ``load()`` (in a thread), ``start()``, ``on_arrival`` as the store's listener, ``stop()``."""

    # == lifecycle =================================================================================
    def load(self) -> None:
        """Open the TimerLog and the wheel and recover them (blocking: run it in a thread). A load that fails closes
        what it opened."""
        try:
            self._load()
        except BaseException:
            self._close_files()
            raise

    def _load(self) -> None:
        started = time.monotonic()
        ck = self._read_checkpoint()
        if ck is not None:
            try:
                self.geometry = Geometry(int(ck["precision_ms"]), int(ck["slots"]), int(ck["roll_slots"]),
                                         int(ck["timerlog_file_size"]))
            except (KeyError, TypeError, ValueError):
                log.error("timer checkpoint %s lacks its wheel shape; using the configured one", self.checkpoint_path)
        self._open_files()
        self._recover(ck)
        wanted = Geometry(self.config.precision_ms, self.config.wheel_slots, self.config.roll_slots,
                          self.config.timerlog_file_size)
        if self.geometry != wanted:
            if not self._outstanding():
                log.info("timer: no message pending; switching the wheel to %s", wanted)
                self._close_files()
                import shutil  # only here: shutil pulls bz2 and lzma

                shutil.rmtree(self.timerlog_dir, ignore_errors=True)
                self.wheel_path.unlink(missing_ok=True)
                self.geometry = wanted
                self._seg_max.clear()
                self._open_files()
                self._tl().set_end(0)
                self.read_slot = self.clock() // self.precision_ms
                self._wh().rebuild(self.read_slot)
            else:
                log.warning("timer: %d messages are pending on a wheel of %s; the configured %s takes effect "
                            "once none are", self._pending, self.geometry, wanted)
        snap = self._snapshot(clean=False)
        self._write_checkpoint(snap)
        self._update_floor(snap)
        self._release_wheel_pages()
        self.loaded = True
        log.info("timer loaded in %.3f s: %d scheduled, enqueue offset %d, read slot %d%s",
                 time.monotonic() - started, self._pending, self.enqueue_offset, self.read_slot,
                 " (recovered after a crash)" if self.recovered_abnormally else "")

    async def start(self) -> None:
        if not self.loaded:
            await asyncio.to_thread(self.load)
        self.start_tasks()

    def start_tasks(self) -> None:
        """Start the enqueue, dequeue and checkpoint loops of a loaded service, on the event loop's thread."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._enq_event = asyncio.Event()
        self._dq_event = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._caught_up = asyncio.Event()
        self._stopping = False
        self._tasks = [asyncio.create_task(self._enqueue_loop(), name="timer-enqueue"),
                       asyncio.create_task(self._dequeue_loop(), name="timer-dequeue"),
                       asyncio.create_task(self._checkpoint_loop(), name="timer-checkpoint")]

    async def stop(self) -> None:
        """Stop at a safe point, write a clean checkpoint and close the files."""
        if not self._tasks and not self.loaded:
            return
        self._stopping = True
        for ev in (self._enq_event, self._dq_event, self._stop_event):
            if ev is not None:
                ev.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=10)
            for t in pending:
                t.cancel()
            for t in self._tasks:
                try:
                    await t
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("timer task failed")
            self._tasks = []
        self._gc_pause.release()
        if self.loaded:
            await self.checkpoint(clean=True)
            self._close_files()
            self.loaded = False

    def wakeup(self) -> None:
        """Re-evaluate now (tests with an injected clock call this after moving it)."""
        for ev in (self._enq_event, self._dq_event):
            if ev is not None:
                ev.set()

    async def _checkpoint_loop(self) -> None:
        assert self._stop_event is not None
        interval = self.config.flush_interval_ms
        while not self._stopping:
            await self._wait(self._stop_event, self.clock() + interval)
            if self._stopping:
                break
            try:
                await self.checkpoint()
            except OSError:
                log.exception("timer checkpoint failed")

    # == metrics =====================================================================================
    def metrics(self) -> dict[str, Any]:
        """Backlog and lateness: what ``GET_TIMER_METRICS`` and the admin command report."""
        now = self.clock()
        p = self.precision_ms
        cur = self._cur
        in_flight = due_now = 0
        if cur is not None:
            waiting = cur.waiting()
            in_flight = len(cur.todo) + sum(1 for i in waiting if not i.roll)
            due_now = len(cur.todo) + sum(1 for i in waiting if i.at <= now and not i.roll)
        due_waiting = 0
        if self.wheel is not None:
            wheel = self.wheel
            now_slot = now // p
            slot = wheel.next_occupied(self.read_slot, now_slot + 1)
            visited = 0
            while slot is not None and visited < 100_000:
                rec = wheel.get(slot)
                due_waiting += rec.num
                visited += 1
                slot = wheel.next_occupied(slot + 1, now_slot + 1)
        st = self.stats
        cq = self.store.queues.get((TIMER_TOPIC, 0))
        return {
            "scheduled": max(0, self._pending) + in_flight,
            "dueUndelivered": due_now + due_waiting,
            "enqueued": st.enqueued, "delivered": st.delivered, "rolled": st.rolled, "cancelled": st.cancelled,
            "duplicatesAvoided": st.duplicates_avoided, "lost": st.lost, "illegal": st.illegal,
            "putFailures": st.put_failures,
            "enqueueOffset": self.enqueue_offset,
            "enqueueLag": (cq.max_offset - self.enqueue_offset) if cq is not None else 0,
            "readSlot": self.read_slot, "readTimeMs": self.read_slot * p, "nowMs": now,
            "prefetched": self._prepared_count,
            "precisionMs": p, "wheelSlots": self.geometry.slots, "rollWindowSlots": self.roll_slots,
            "timerLogPosition": self.timerlog.write_pos if self.timerlog is not None else 0,
            "timerLogSegments": len(self.timerlog.files.files) if self.timerlog is not None else 0,
            "lateness": st.lateness.as_dict(),
            "recoveredAbnormally": self.recovered_abnormally,
        }


__all__ = ["LATENESS_BUCKETS_MS", "LatenessHistogram", "PutFn", "TimerMessageService", "TimerStats"]
