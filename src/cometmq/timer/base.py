"""The timer service's state and files, shared by its enqueue, dequeue and recovery parts
(see :mod:`cometmq.timer.service` for how they fit together)."""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.config import TimerConfig, timer_files
from cometmq.timer.message import queued_records_floor
from cometmq.timer.slotwork import BurstGcPause, ClosedSlot, SlotWork
from cometmq.timer.stats import TimerStats
from cometmq.timer.timerlog import TimerLog
from cometmq.timer.wheel import TimerWheel, WheelFormatError, wheel_size

log = logging.getLogger("cometmq.timer.service")

PutFn = Callable[[list[MessageInner]], Awaitable[PutResult]]
SAFETY_RECHECK_S = 30.0
#: the longest the garbage collector is held off during a burst of due messages
_GC_PAUSE_MAX_S = 2.0


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Geometry:
    precision_ms: int
    slots: int
    roll_slots: int
    file_size: int


class TimerServiceBase:
    """Fields and file handling common to the pipelines; :class:`TimerMessageService` is the one to use."""

    _force_rebuild = False

    def __init__(self, store: MessageStore, config: TimerConfig, put: PutFn, *,
                 clock: Callable[[], int] = wall_ms, root: Path | None = None, deliver: bool = True) -> None:
        self.store = store
        self.config = config
        self._put = put
        self.clock = clock
        root = Path(store.config.store_path) if root is None else root
        self.timerlog_dir, self.wheel_path, self.checkpoint_path = timer_files(root)
        self.geometry = Geometry(config.precision_ms, config.wheel_slots, config.roll_slots,
                                 config.timerlog_file_size)
        self.timerlog: TimerLog | None = None
        self.wheel: TimerWheel | None = None
        self._wheel_mm: mmap.mmap | None = None
        self._wheel_fd = -1
        self.enqueue_offset = 0
        #: the first slot the dequeue has not taken
        self.read_slot = 0
        self._cur: SlotWork | None = None
        self._prepared: dict[int, SlotWork] = {}
        self._prepared_count = 0
        self._closed: deque[ClosedSlot] = deque()
        self._arrivals: deque[DispatchRequest] = deque()
        #: timer records already put again (found after a crash): replay skips them
        self._recovered_src: set[int] = set()
        #: after a recovery that found records already put: (the checkpoint's commit-log offset they were found
        #: from, the last slot they can belong to). Checkpoints keep that offset until that slot is durably done,
        #: so a second crash finds those records again instead of putting them twice.
        self._replay_floor: tuple[int, int] | None = None
        self._seg_max: dict[int, int] = {}
        #: the TimerLog position of the first entry not known done, the slot that was judged from, and the lowest
        #: commit-log offset a pending message's record lies at (None: none): retention keeps the log from there
        self._pin_pos = 0
        self._pin_slot = 0
        self._floor: int | None = None
        store.cleaner.pin("timer", self.retention_floor)
        #: scheduled messages minus delete markers in pending slots (not counting the open slot)
        self._pending = 0
        self._next_occ: int | None = None
        self._next_occ_valid = False
        self._backoff_until = 0
        self._horizon_slot = 0
        self._pf_frontier = 0
        self._pf_todo: set[int] = set()
        self.stats = TimerStats()
        #: off on a replica: index the master's timer records, deliver nothing (timer/replica.py)
        self.deliver = deliver
        #: a replica's bound from the master's checkpoint: its copies of pending messages lie past this offset
        self.master_commit_offset: int | None = None
        self._replica_deleted: set[str] = set()
        #: a replica's slot waiting for the master: (slot, its head, the records not yet accounted for)
        self._blocked: tuple[int, int, set[int]] | None = None
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
        self._gc_pause = BurstGcPause(_GC_PAUSE_MAX_S)

    def retention_floor(self) -> int | None:
        """The lowest commit-log offset the timer still needs (a pending message's record), None when none: the
        store's retention keeps the log from there (called from its clean thread; answers from kept state)."""
        if not self.loaded:  # (before the first checkpoint's look: every record of the timer topic)
            return queued_records_floor(self.store)
        return self._floor

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

    # == shared by the pipelines =====================================================================
    async def _wait(self, ev: asyncio.Event, deadline_ms: int | None) -> None:
        if deadline_ms is None:
            timeout = SAFETY_RECHECK_S
        else:
            timeout = min(SAFETY_RECHECK_S, max(0, deadline_ms - self.clock()) / 1000)
            if timeout <= 0:
                return
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            pass

    # implemented by timer/replica.py
    def _note_copies(self, reqs: Iterable[DispatchRequest]) -> None:
        raise NotImplementedError

    def _follow_step(self) -> bool:
        raise NotImplementedError

    def _follow_deadline(self) -> int | None:
        raise NotImplementedError

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

    def _earliest_occupied(self) -> int | None:
        if not self._next_occ_valid or (self._next_occ is not None and self._next_occ < self.read_slot):
            wheel = self._wh()
            self._next_occ = wheel.next_occupied(self.read_slot, self.read_slot + wheel.slots)
            self._next_occ_valid = True
        return self._next_occ

    def _note_segment(self, pos: int, slot: int) -> None:
        start = pos - pos % self._tl().file_size
        if self._seg_max.get(start, -1) < slot:
            self._seg_max[start] = slot
