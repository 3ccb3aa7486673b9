"""The consensus interface of the controller, and ``LocalLog``: the single-node durable log embedded by default.

The controller's decisions are entries of a ``ReplicatedLog``; every node applies the committed entries in the same
order to its state machine (``state.ControllerState``). An implementation over a real consensus engine (3 or 5
nodes) plugs in behind the same protocol; see docs/controller.md for the evaluation.

``LocalLog`` file format (``controller.log``): an 8-byte magic, then one frame per entry:
``u32 length | u32 crc32(length bytes + payload) | payload`` (big-endian). Appends are group-committed: one write
and one fdatasync per batch, and an append is reported committed (its subscribers called, its future resolved)
only after that sync. Recovery drops a torn tail: a bad frame within the last batch's reach of the end
(``MAX_BATCH_BYTES``) is what a crash between write and sync leaves; a bad frame further back is corruption of
synced entries and the log refuses to start (``LogCorruptError``) rather than forget committed decisions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ..common.atomic_file import fsync_dir

log = logging.getLogger(__name__)

#: called with (index, entry) for every committed entry, in order, indexes from 1
Applier = Callable[[int, bytes], None]

MAGIC = b"CMQCLOG1"
FILE_NAME = "controller.log"
_FRAME = struct.Struct(">II")
#: the most bytes one group commit writes: a bad frame this close to the end may be a torn (never synced) batch
MAX_BATCH_BYTES = 1 << 20
#: the largest entry; controller events are a few hundred bytes
MAX_ENTRY_BYTES = 256 << 10


class LogError(Exception):
    """The log cannot take or keep entries."""


class NotLeaderError(LogError):
    """This node cannot append: the wiring answers CONTROLLER_NOT_LEADER (2007) with the leader's address."""

    def __init__(self, leader_address: str | None) -> None:
        super().__init__(f"not the controller leader (leader: {leader_address or 'unknown'})")
        self.leader_address = leader_address


class LogClosedError(LogError):
    """The log is not started, stopped, or failed (a write or sync error, or a subscriber that raised)."""


class LogCorruptError(LogError):
    """The file holds damaged entries that were synced: the node must not start on it."""


class ReplicatedLog(Protocol):
    """An ordered log of entries agreed by the controller nodes."""

    def subscribe(self, apply: Applier) -> None:
        """Call ``apply`` for every committed entry in index order, from the first (before ``start``)."""

    async def start(self) -> None:
        """Recover and replay the committed entries to the subscribers, then take appends."""

    async def stop(self) -> None:
        """Finish the appends in flight, refuse new ones, release files and connections."""

    async def append(self, entry: bytes) -> int:
        """Append on the leader; returns the entry's index once it is committed and applied by every subscriber.
        Raises ``NotLeaderError`` on a follower. Cancelling the wait does not withdraw the entry."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_address(self) -> str | None: ...

    @property
    def applied_index(self) -> int:
        """The index of the last entry given to the subscribers (0: none)."""


def encode_frame(entry: bytes) -> bytes:
    head = len(entry).to_bytes(4, "big")
    return head + zlib.crc32(entry, zlib.crc32(head)).to_bytes(4, "big") + entry


def _frame_at(buf: bytes, pos: int) -> bytes | None:
    """The entry of the valid frame at ``pos``, or None (short, oversized or CRC mismatch)."""
    if pos + _FRAME.size > len(buf):
        return None
    length, crc = _FRAME.unpack_from(buf, pos)
    end = pos + _FRAME.size + length
    if length > MAX_ENTRY_BYTES or end > len(buf):
        return None
    entry = buf[pos + _FRAME.size:end]
    return entry if zlib.crc32(entry, zlib.crc32(buf[pos:pos + 4])) == crc else None


def recover(path: Path) -> list[bytes]:
    """Read the log at ``path``, cutting a torn tail off the file (synced); create it when missing or torn at
    creation. Raises ``LogCorruptError`` for damage before the tail."""
    try:
        buf = path.read_bytes()
    except FileNotFoundError:
        buf = b""
    if len(buf) <= len(MAGIC) and MAGIC.startswith(buf.rstrip(b"\0")):  # missing, or torn while created
        _create(path)
        return []
    if not buf.startswith(MAGIC):
        raise LogCorruptError(f"{path}: not a controller log (bad magic)")
    entries: list[bytes] = []
    pos = len(MAGIC)
    while pos < len(buf):
        entry = _frame_at(buf, pos)
        if entry is None:
            break
        entries.append(entry)
        pos += _FRAME.size + len(entry)
    if pos < len(buf):
        if len(buf) - pos > MAX_BATCH_BYTES:
            raise LogCorruptError(f"{path}: damaged entry {len(entries) + 1} at byte {pos}, "
                                  f"{len(buf) - pos} bytes before the end")
        log.warning("%s: dropping a torn tail of %d bytes after entry %d", path, len(buf) - pos, len(entries))
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, pos)
            os.fsync(fd)
        finally:
            os.close(fd)
    return entries


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, MAGIC)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


class LocalLog:
    """A single-node ``ReplicatedLog``: committed = written and synced to the local file. Always the leader."""

    def __init__(self, directory: str | os.PathLike[str], *, address: str | None = None) -> None:
        self.path = Path(directory) / FILE_NAME
        self._address = address
        self._subscribers: list[Applier] = []
        self._fd: int | None = None
        self._index = 0
        self._pending: deque[tuple[bytes, asyncio.Future[int]]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._state = "new"  # new -> open -> stopping -> stopped; open -> failed
        self._failure: BaseException | None = None

    # -- ReplicatedLog ----------------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return True

    @property
    def leader_address(self) -> str | None:
        return self._address

    @property
    def applied_index(self) -> int:
        return self._index

    def subscribe(self, apply: Applier) -> None:
        if self._state != "new":
            raise LogError("subscribe before start: a later subscriber would miss the entries replayed")
        self._subscribers.append(apply)

    async def start(self) -> None:
        if self._state != "new":
            raise LogError(f"cannot start a log that is {self._state}")
        entries = await asyncio.to_thread(recover, self.path)
        for entry in entries:
            self._deliver(entry)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._state = "open"

    async def stop(self) -> None:
        if self._state in ("open", "failed"):
            self._state = "stopping"
            if self._flusher is not None:
                await asyncio.gather(self._flusher, return_exceptions=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._state = "stopped"

    async def append(self, entry: bytes) -> int:
        if self._state != "open":
            raise LogClosedError(f"controller log is {self._state}") from self._failure
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {len(entry)} bytes exceeds {MAX_ENTRY_BYTES}")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((entry, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="controller-log-flush")
        return await future

    # -- internals ------------------------------------------------------------------------------------------------
    def _deliver(self, entry: bytes) -> int:
        self._index += 1
        for apply in self._subscribers:
            apply(self._index, entry)
        return self._index

    async def _flush_loop(self) -> None:
        while self._pending:
            batch: list[tuple[bytes, asyncio.Future[int]]] = []
            size = 0
            while self._pending and (not batch or size + len(self._pending[0][0]) + _FRAME.size <= MAX_BATCH_BYTES):
                item = self._pending.popleft()
                batch.append(item)
                size += len(item[0]) + _FRAME.size
            data = b"".join(encode_frame(entry) for entry, _ in batch)
            try:
                await asyncio.to_thread(self._write_and_sync, data)
                for entry, future in batch:
                    index = self._deliver(entry)
                    if not future.done():
                        future.set_result(index)
            except Exception as exc:  # a failed sync leaves the file unknown, a failed apply the state: stop here
                log.error("controller log failed: %s", exc)
                self._fail(exc, batch)
                return

    def _write_and_sync(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.fdatasync(self._fd)

    def _fail(self, exc: BaseException, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        self._failure = exc
        if self._state == "open":
            self._state = "failed"
        for _, future in [*batch, *self._pending]:
            if not future.done():
                future.set_exception(LogClosedError(f"controller log failed: {exc}"))
        self._pending.clear()
