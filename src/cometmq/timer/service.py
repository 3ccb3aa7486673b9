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

Durability. A checkpoint (``config/timercheck``, written atomically every ``flush_interval_ms``)
holds the enqueue offset, the TimerLog end, the first slot not known to be fully delivered (the read
slot) and the commit-log offset where that slot's puts began. After ``kill -9`` the TimerLog tail
is re-validated (CRC) and re-linked into the wheel, the enqueue offset is taken from the newest entry,
slots from the read slot on are replayed, and every record put since the checkpoint's commit-log
offset is found by its TIMER_SRC_PHY property, so replay skips what was already delivered: nothing is
lost and nothing is delivered twice (``duplicates_avoided`` counts what replay skipped). A clean stop
does the same with nothing to replay but the open slot.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import json
import logging
import mmap
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.protocol.properties import UNIQ_KEY
from cometmq.store.commitlog import dispatch_request_from_record
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult, PutStatus
from cometmq.timer.config import TimerConfig
from cometmq.timer.message import (
    TIMER_DEL_UNIQKEY,
    TIMER_OUT_MS,
    TIMER_SRC_PHY,
    TIMER_TOPIC,
    delete_key,
    delivery_message,
    parse_timer_record,
    roll_message,
)
from cometmq.timer.timerlog import MAGIC_DEFAULT, MAGIC_DELETE, MAGIC_ROLL, UNIT_SIZE, TimerEntry, TimerLog
from cometmq.timer.wheel import TimerWheel, WheelFormatError, wheel_size

log = logging.getLogger(__name__)

PutFn = Callable[[list[MessageInner]], Awaitable[PutResult]]
#: put results after which the messages are in the log (a flush timeout still stored them)
_STORED = (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)
_UNPUTTABLE = (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED)
#: lateness histogram bucket upper bounds (ms); the last bucket is everything above
LATENESS_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 300_000)
_ARRIVAL_CACHE = 65_536
_SAFETY_RECHECK_S = 30.0


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _at(item: _Item) -> int:
    return item.at


class LatenessHistogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS_MS) + 1)
        self.count = 0
        self.total_ms = 0
        self.max_ms = 0

    def record(self, late_ms: int) -> None:
        self.record_many(late_ms, [0])

    def record_many(self, at_ms: int, dues: list[int]) -> None:
        """Messages due at ``dues`` delivered at ``at_ms``."""
        counts = self.counts
        find = bisect.bisect_left
        bounds = LATENESS_BUCKETS_MS
        total = 0
        worst = self.max_ms
        for due in dues:
            late = at_ms - due
            if late < 0:
                late = 0
            counts[find(bounds, late)] += 1
            total += late
            if late > worst:
                worst = late
        self.count += len(dues)
        self.total_ms += total
        self.max_ms = worst

    def quantile(self, q: float) -> int | None:
        """The upper bound of the bucket holding quantile ``q`` (None: no data; -1: above the last)."""
        if not self.count:
            return None
        want = q * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= want and c:
                return LATENESS_BUCKETS_MS[i] if i < len(LATENESS_BUCKETS_MS) else -1
        return -1

    def as_dict(self) -> dict[str, Any]:
        return {"bucketsMs": list(LATENESS_BUCKETS_MS), "counts": list(self.counts), "count": self.count,
                "sumMs": self.total_ms, "maxMs": self.max_ms, "p50Ms": self.quantile(0.5),
                "p99Ms": self.quantile(0.99)}


@dataclass
class TimerStats:
    enqueued: int = 0
    delivered: int = 0
    rolled: int = 0
    cancelled: int = 0
    duplicates_avoided: int = 0
    #: entries whose timer record could not be read back (removed, or not what the entry names)
    lost: int = 0
    illegal: int = 0
    put_failures: int = 0
    lateness: LatenessHistogram = field(default_factory=LatenessHistogram)


@dataclass(slots=True)
class _Item:
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


class _SlotWork:
    """A slot read ahead (prefetched) or being delivered (open).

    Once open, its messages wait in three places: ``sched`` (sorted by time when the slot opened;
    ``sched_pos`` moves along it by bisection, so a slot of 200,000 costs one sort, not a heap),
    ``late`` (a heap for messages that came after the slot opened, due later in the slot) and ``due``
    (due now, put in batches from ``due_pos``)."""

    __slots__ = ("commit_start", "deletes", "due", "due_pos", "head_seen", "items", "last_at", "late", "put_end",
                 "sched", "sched_at", "sched_pos", "seq", "slot", "todo", "walks")

    def __init__(self, slot: int, head: int) -> None:
        self.slot = slot
        #: the newest entry seen; entries linked later are walked from the new head down to it
        self.head_seen = head
        #: chain segments still to read: (next position, stop position, exclusive)
        self.walks: list[tuple[int, int]] = [(head, -1)] if head >= 0 else []
        self.items: list[_Item] = []
        #: the latest ``at`` among ``items``
        self.last_at = 0
        self.deletes: set[str] = set()
        self.todo: list[TimerEntry] = []
        self.sched: list[_Item] = []
        self.sched_at: list[int] = []
        self.sched_pos = 0
        self.late: list[tuple[int, int, _Item]] = []
        self.due: list[_Item] = []
        self.due_pos = 0
        self.seq = 0
        self.commit_start = 0
        self.put_end = 0

    def follow(self, head: int) -> bool:
        """Note entries linked since the last look (a new head); True when there are some."""
        if head > self.head_seen:
            self.walks.append((head, self.head_seen))
            self.head_seen = head
            return True
        return False

    def add(self, item: _Item, now: int) -> None:
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

    def take(self, max_n: int) -> list[_Item]:
        batch = self.due[self.due_pos:self.due_pos + max_n]
        self.due_pos += len(batch)
        if self.due_pos >= len(self.due):
            self.due, self.due_pos = [], 0
        return batch

    def give_back(self, items: list[_Item]) -> None:
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

    def waiting(self) -> list[_Item]:
        return self.due[self.due_pos:] + self.sched[self.sched_pos:] + [x[2] for x in self.late]


@dataclass(frozen=True, slots=True)
class _Closed:
    slot: int
    commit_start: int
    put_end: int


@dataclass(frozen=True)
class _Geometry:
    precision_ms: int
    slots: int
    roll_slots: int
    file_size: int


class TimerMessageService:
    def __init__(self, store: MessageStore, config: TimerConfig, put: PutFn, *,
                 clock: Callable[[], int] = _wall_ms, root: Path | None = None) -> None:
        self.store = store
        self.config = config
        self._put = put
        self.clock = clock
        root = Path(store.config.store_path) if root is None else root
        self.timerlog_dir = root / "timerlog"
        self.wheel_path = root / "timerwheel"
        self.checkpoint_path = root / "config" / "timercheck"
        self.geometry = _Geometry(config.precision_ms, config.wheel_slots, config.roll_slots,
                                  config.timerlog_file_size)
        self.timerlog: TimerLog | None = None
        self.wheel: TimerWheel | None = None
        self._wheel_mm: mmap.mmap | None = None
        self._wheel_fd = -1
        self.enqueue_offset = 0
        #: the first slot the dequeue has not taken
        self.read_slot = 0
        self._cur: _SlotWork | None = None
        self._prepared: dict[int, _SlotWork] = {}
        self._prepared_count = 0
        self._closed: deque[_Closed] = deque()
        self._arrivals: deque[DispatchRequest] = deque()
        #: timer records already put again (found after a crash): replay skips them
        self._recovered_src: set[int] = set()
        self._seg_max: dict[int, int] = {}
        #: scheduled messages minus delete markers in pending slots (not counting the open slot)
        self._pending = 0
        self._next_occ: int | None = None
        self._next_occ_valid = False
        self._backoff_until = 0
        self._horizon_slot = 0
        self._pf_frontier = 0
        self._pf_todo: set[int] = set()
        self.stats = TimerStats()
        self.recovered_abnormally = False
        self.loaded = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._enq_event: asyncio.Event | None = None
        self._dq_event: asyncio.Event | None = None
        self._stop_event: asyncio.Event | None = None
        self._caught_up: asyncio.Event | None = None
        self._ck_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # == geometry shortcuts ======================================================================
    @property
    def precision_ms(self) -> int:
        return self.geometry.precision_ms

    @property
    def roll_slots(self) -> int:
        return self.geometry.roll_slots

    def _tl(self) -> TimerLog:
        assert self.timerlog is not None, "the timer service is not loaded"
        return self.timerlog

    def _wh(self) -> TimerWheel:
        assert self.wheel is not None, "the timer service is not loaded"
        return self.wheel

    # == lifecycle =================================================================================
    def load(self) -> None:
        """Open the TimerLog and the wheel and recover them (blocking: run it in a thread)."""
        started = time.monotonic()
        ck = self._read_checkpoint()
        if ck is not None:
            try:
                self.geometry = _Geometry(int(ck["precision_ms"]), int(ck["slots"]), int(ck["roll_slots"]),
                                          int(ck["timerlog_file_size"]))
            except (KeyError, TypeError, ValueError):
                log.error("timer checkpoint %s lacks its wheel shape; using the configured one", self.checkpoint_path)
        self._open_files()
        self._recover(ck)
        wanted = _Geometry(self.config.precision_ms, self.config.wheel_slots, self.config.roll_slots,
                           self.config.timerlog_file_size)
        if self.geometry != wanted:
            if not self._outstanding():
                log.info("timer: no message pending; switching the wheel to %s", wanted)
                self._close_files()
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
        self._write_checkpoint(self._snapshot(clean=False))
        self._release_wheel_pages()
        self.loaded = True
        log.info("timer loaded in %.3f s: %d scheduled, enqueue offset %d, read slot %d%s",
                 time.monotonic() - started, self._pending, self.enqueue_offset, self.read_slot,
                 " (recovered after a crash)" if self.recovered_abnormally else "")

    async def start(self) -> None:
        if not self.loaded:
            await asyncio.to_thread(self.load)
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
        if self.loaded:
            await self.checkpoint(clean=True)
            self._close_files()
            self.loaded = False

    def wakeup(self) -> None:
        """Re-evaluate now (tests with an injected clock call this after moving it)."""
        for ev in (self._enq_event, self._dq_event):
            if ev is not None:
                ev.set()

    # == files =======================================================================================
    def _open_files(self) -> None:
        geo = self.geometry
        self.timerlog = TimerLog(self.timerlog_dir, geo.file_size, preallocate=self.config.preallocate)
        self.timerlog.load()
        size = wheel_size(geo.slots)
        self.wheel_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.wheel_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have != size:
                if have:
                    log.error("timer wheel %s is %d bytes, expected %d: rebuilt from the timer log",
                              self.wheel_path, have, size)
                    self._force_rebuild = True
                os.ftruncate(fd, 0)
                os.ftruncate(fd, size)
                if self.config.preallocate:
                    os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        try:
            wheel = TimerWheel(geo.slots, geo.precision_ms, memoryview(mm))
        except WheelFormatError as exc:
            log.error("timer wheel %s: %s; rebuilt from the timer log", self.wheel_path, exc)
            mm[:64] = bytes(64)
            wheel = TimerWheel(geo.slots, geo.precision_ms, memoryview(mm))
            self._force_rebuild = True
        self._wheel_fd, self._wheel_mm, self.wheel = fd, mm, wheel

    def _release_wheel_pages(self) -> None:
        """The start-up scan read every page of the wheel: unmap them (the page cache keeps them), so
        only the slots in use count towards the process's memory."""
        mm = self._wheel_mm
        if mm is not None:
            try:
                self._flush_files()
                mm.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass

    def _close_files(self) -> None:
        if self.wheel is not None:
            self.wheel.release()
            self.wheel = None
        if self._wheel_mm is not None:
            try:
                self._wheel_mm.flush()
                self._wheel_mm.close()
            except (BufferError, ValueError, OSError):
                log.exception("timer wheel: close failed")
            self._wheel_mm = None
        if self._wheel_fd >= 0:
            os.close(self._wheel_fd)
            self._wheel_fd = -1
        if self.timerlog is not None:
            self.timerlog.close()
            self.timerlog = None

    def _flush_files(self) -> None:
        """Make the TimerLog and the wheel durable (runs in a thread; fdatasync releases the GIL)."""
        if self.timerlog is not None:
            self.timerlog.flush()
        if self._wheel_fd >= 0:
            os.fdatasync(self._wheel_fd)

    # == checkpoint ==================================================================================
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
        geo = self.geometry
        s = self.stats
        return {"version": 1, "precision_ms": geo.precision_ms, "slots": geo.slots, "roll_slots": geo.roll_slots,
                "timerlog_file_size": geo.file_size, "enqueue_offset": self.enqueue_offset,
                "timerlog_end": self._tl().write_pos, "read_slot": read_slot, "commit_offset": commit,
                "segments": {str(k): v for k, v in sorted(self._seg_max.items())}, "clean": clean,
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
            if self.timerlog is not None:
                self.timerlog.release_flushed()
                self._delete_done_segments(int(snap["read_slot"]))

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
    _force_rebuild = False

    def _recover(self, ck: dict[str, Any] | None) -> None:
        tl, wheel = self._tl(), self._wh()
        now_slot = self.clock() // self.precision_ms
        if ck is None:
            self.read_slot = now_slot
            self.enqueue_offset = 0
            if tl.files.files:
                log.error("timer: a timer log but no checkpoint; every entry is re-linked from slot %d", now_slot)
                self.recovered_abnormally = True
                self._full_rebuild()
            else:
                tl.set_end(0)
                cq = self.store.queues.get((TIMER_TOPIC, 0))
                self.enqueue_offset = cq.min_offset if cq is not None else 0
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

    def _note_segment(self, pos: int, slot: int) -> None:
        start = pos - pos % self._tl().file_size
        if self._seg_max.get(start, -1) < slot:
            self._seg_max[start] = slot

    # == enqueue =====================================================================================
    def on_arrival(self, req: DispatchRequest) -> None:
        """The store's arrival listener: note timer-topic records and wake the enqueue."""
        if req.topic != TIMER_TOPIC or req.queue_id != 0:
            return
        if len(self._arrivals) < _ARRIVAL_CACHE:
            self._arrivals.append(req)
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
        wheel.link(slot, pos, delete=delete)
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
        if self._next_occ_valid and (self._next_occ is None or slot < self._next_occ):
            self._next_occ = slot
            self._wake_dequeue()
        elif not self._next_occ_valid or slot <= self._horizon_slot:
            self._wake_dequeue()  # may change what to open next, or what to read ahead

    def _wake_dequeue(self) -> None:
        ev = self._dq_event
        if ev is not None and not ev.is_set():
            ev.set()

    def _advance_idle(self, now: int) -> None:
        """With nothing open and nothing pending before now, the read slot catches up with the clock
        (roll and catch-up placement are measured from it)."""
        if self._cur is not None:
            return
        now_slot = now // self.precision_ms
        if self.read_slot < now_slot and self._wh().next_occupied(self.read_slot, now_slot) is None:
            self.read_slot = now_slot
            self._next_occ_valid = False

    # == dequeue =====================================================================================
    def _earliest_occupied(self) -> int | None:
        if not self._next_occ_valid or (self._next_occ is not None and self._next_occ < self.read_slot):
            wheel = self._wh()
            self._next_occ = wheel.next_occupied(self.read_slot, self.read_slot + wheel.slots)
            self._next_occ_valid = True
        return self._next_occ

    async def _dequeue_loop(self) -> None:
        assert self._dq_event is not None and self._caught_up is not None
        ev = self._dq_event
        # A marker stored before a crash must be indexed before its slot is delivered.
        await self._caught_up.wait()
        while not self._stopping:
            ev.clear()
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
            if cur.collect_due(now):
                # Safe before the walk ends: a marker is newer than the message it cancels, so the
                # newest-first walk meets it first.
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
                    cands.append(ahead * self.precision_ms - self.config.prefetch_ms)
        return min(cands) if cands else None

    async def _wait(self, ev: asyncio.Event, deadline_ms: int | None) -> None:
        if deadline_ms is None:
            timeout = _SAFETY_RECHECK_S
        else:
            timeout = min(_SAFETY_RECHECK_S, max(0, deadline_ms - self.clock()) / 1000)
            if timeout <= 0:
                return
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            pass

    def _open(self, slot: int) -> None:
        wheel = self._wh()
        work = self._prepared.pop(slot, None)
        self._pf_todo.discard(slot)
        if work is None:
            work = _SlotWork(slot, wheel.head(slot))
        else:
            self._prepared_count -= len(work.items)
            work.follow(wheel.head(slot))  # entries linked since the read-ahead (messages, markers)
        items, work.items = work.items, []
        now = self.clock()
        if work.last_at <= now:
            work.due = items  # all due already (a burst due at the slot's start): no order needed
        else:
            due = [i for i in items if i.at <= now]
            later = [i for i in items if i.at > now] if due else items
            later.sort(key=_at)
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

    def _close(self, cur: _SlotWork) -> None:
        self._wh().mark_done(cur.slot)
        self._closed.append(_Closed(cur.slot, cur.commit_start, cur.put_end))
        self._cur = None
        self._next_occ_valid = False

    def _walk(self, work: _SlotWork, budget: int) -> None:
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
                if item.at > work.last_at:
                    work.last_at = item.at
                self._prepared_count += 1
        if last is not None and n >= budget and last.prev_pos > stop:
            work.walks[0] = (last.prev_pos, stop)
        else:
            work.walks.pop(0)

    def _add_to_open(self, cur: _SlotWork, item: _Item | None) -> None:
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
                work = self._prepared[slot] = _SlotWork(slot, wheel.head(slot))
            else:
                work.follow(wheel.head(slot))
            if not work.walks:
                todo.discard(slot)
                continue
            self._walk(work, self.config.dequeue_chunk)
            if not work.walks:
                todo.discard(slot)
            return True
        horizon = (now + self.config.prefetch_ms) // self.precision_ms
        start = max(self._pf_frontier + 1, self.read_slot)
        found = wheel.next_occupied(start, horizon + 1)
        if found is None:
            self._pf_frontier = max(self._pf_frontier, horizon)
            return False
        self._pf_frontier = found
        todo.add(found)
        return True

    def _prepare(self, work: _SlotWork, entry: TimerEntry) -> _Item | None:
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
            log.warning("timer: the record of entry %d (commit log %d) is gone or is not a timer record",
                        entry.pos, entry.offset_py)
            self.stats.lost += 1
            return None
        slot_start = work.slot * self.precision_ms
        if entry.is_roll:
            msg = roll_message(rec, entry.offset_py)
            return _Item(slot_start, entry.due_ms, entry.offset_py, msg, True, len(msg.body) + 256)
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
        nbytes = len(msg_.body) + len(msg_.properties_raw or b"") + 128
        return _Item(max(entry.due_ms, slot_start), entry.due_ms, entry.offset_py, msg_, False, nbytes)

    async def _deliver_due(self, cur: _SlotWork) -> None:
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
        if result.status in _STORED:
            self._delivered(cur, batch, result)
        elif result.status in _UNPUTTABLE:
            await self._put_one_by_one(cur, batch)
        else:
            self.stats.put_failures += 1
            log.error("timer: putting %d due messages failed (%s %s); retrying in 1 s", len(batch),
                      result.status.value, result.remark)
            cur.give_back(batch)
            self._backoff_until = self.clock() + 1000

    async def _put_one_by_one(self, cur: _SlotWork, batch: list[_Item]) -> None:
        for item in batch:
            result = await self._put([item.msg])
            if result.status in _STORED:
                self._delivered(cur, [item], result)
            elif result.status in _UNPUTTABLE:
                log.error("timer: message from %d cannot be put (%s %s); dropped", item.src,
                          result.status.value, result.remark)
                self.stats.illegal += 1
            else:
                cur.give_back([item])
                self._backoff_until = self.clock() + 1000

    def _delivered(self, cur: _SlotWork, batch: list[_Item], result: PutResult) -> None:
        st = self.stats
        dues = [item.due for item in batch if not item.roll]
        st.rolled += len(batch) - len(dues)
        st.delivered += len(dues)
        st.lateness.record_many(self.clock(), dues)
        if result.end_offset > cur.put_end:
            cur.put_end = result.end_offset

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
