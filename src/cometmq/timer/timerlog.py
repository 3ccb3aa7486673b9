"""The TimerLog: append-only segments of fixed 56-byte entries, one per timer-topic record indexed.

Entry (big-endian, as RocketMQ's TimerLog; our own field set)::

    size(4)=56 | prev_pos(8) | magic(4) | due_ms(8) | slot(8) | offset_py(8) | size_py(4) |
    queue_offset(8) | crc(4)

- ``prev_pos``: the previous entry linked into the same wheel slot (-1: none), so a slot's entries
  are read newest to oldest from the wheel's ``last_pos``.
- ``magic``: MAGIC_DEFAULT, plus MAGIC_ROLL for an entry parked in a nearer slot than its due time
  (it is put back into the timer topic when its slot comes) and MAGIC_DELETE for a delete marker.
- ``due_ms``: the message's exact delivery time; ``slot``: the wheel slot the entry is linked into
  (the due slot, or a roll / catch-up slot), so the wheel can be rebuilt from the log alone.
- ``offset_py`` / ``size_py``: the timer-topic record in the commit log; ``queue_offset``: its offset
  in the timer topic's consume queue, which tells recovery how far the enqueue had got.
- ``crc``: CRC32 of the first 52 bytes; recovery stops at the first entry that does not check.

Segments are named by their start offset like commit-log segments; their size is a whole number of
entries, so an entry never straddles two segments and no blank filler is needed.
"""

from __future__ import annotations

import logging
import mmap
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cometmq.store.mapped_file import MappedFileQueue

log = logging.getLogger(__name__)

_BODY = struct.Struct(">iqiqqqiq")
_CRC = struct.Struct(">I")
#: an entry's slot and offset_py, 24 bytes in
_SLOT_OFFSET = struct.Struct(">qq")
UNIT_SIZE = _BODY.size + _CRC.size  # 56
MAGIC_DEFAULT = 1
MAGIC_ROLL = 1 << 1
MAGIC_DELETE = 1 << 2


@dataclass(frozen=True, slots=True)
class TimerEntry:
    pos: int
    prev_pos: int
    magic: int
    due_ms: int
    slot: int
    offset_py: int
    size_py: int
    queue_offset: int

    @property
    def is_roll(self) -> bool:
        return bool(self.magic & MAGIC_ROLL)

    @property
    def is_delete(self) -> bool:
        return bool(self.magic & MAGIC_DELETE)


def encode_entry(prev_pos: int, magic: int, due_ms: int, slot: int, offset_py: int, size_py: int,
                 queue_offset: int) -> bytes:
    body = _BODY.pack(UNIT_SIZE, prev_pos, magic, due_ms, slot, offset_py, size_py, queue_offset)
    return body + _CRC.pack(zlib.crc32(body))


def decode_entry(buf: bytes | bytearray | memoryview | mmap.mmap, at: int, pos: int) -> TimerEntry | None:
    """The entry at ``buf[at:]`` (whose log position is ``pos``), or None if it is not a valid one."""
    if len(buf) - at < UNIT_SIZE:
        return None
    size, prev, magic, due, slot, off, sz, qoff = _BODY.unpack_from(buf, at)
    if size != UNIT_SIZE or not magic & MAGIC_DEFAULT:
        return None
    if zlib.crc32(buf[at:at + _BODY.size]) != _CRC.unpack_from(buf, at + _BODY.size)[0]:
        return None
    return TimerEntry(pos, prev, magic, due, slot, off, sz, qoff)


def entry_file_size(requested: int) -> int:
    """The segment size used for a requested one: a whole number of entries."""
    return max(UNIT_SIZE * 16, requested - requested % UNIT_SIZE)


class TimerLog:
    def __init__(self, directory: Path, file_size: int, *, preallocate: bool = True) -> None:
        self.directory = directory
        self.file_size = entry_file_size(file_size)
        self.files = MappedFileQueue(directory, self.file_size, preallocate=preallocate)

    # -- lifecycle ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Open the segments on disk; the write position is set by ``set_end`` afterwards."""
        self.files.load()

    def set_end(self, pos: int) -> None:
        """Make ``pos`` the end of the log (later bytes zeroed, later segments removed)."""
        if not self.files.files:
            return
        if pos < self.files.min_offset:
            pos = self.files.min_offset
        self.files.set_write_end(pos)

    def recover_end(self, start: int) -> tuple[int, list[TimerEntry]]:
        """Entries that check from ``start`` on, and where they end (the first bad or empty entry)."""
        entries = list(self.scan(start))
        end = entries[-1].pos + UNIT_SIZE if entries else max(start, self.files.min_offset)
        return end, entries

    def close(self) -> None:
        self.files.close()

    # -- positions ----------------------------------------------------------------------------------
    @property
    def write_pos(self) -> int:
        return self.files.max_offset

    @property
    def min_pos(self) -> int:
        return self.files.min_offset

    def segment_start(self, pos: int) -> int:
        return pos - pos % self.file_size

    # -- write / read ---------------------------------------------------------------------------------
    def append(self, prev_pos: int, magic: int, due_ms: int, slot: int, offset_py: int, size_py: int,
               queue_offset: int) -> int:
        """Append one entry; returns its position. Raises OSError when a segment cannot be created."""
        mf = self.files.last_for_append(0)
        pos = mf.wrote_position
        mf.mm[pos:pos + UNIT_SIZE] = encode_entry(prev_pos, magic, due_ms, slot, offset_py, size_py,
                                                  queue_offset)
        mf.wrote_position = pos + UNIT_SIZE
        return mf.file_from_offset + pos

    def read(self, pos: int) -> TimerEntry | None:
        mf = self.files.find(pos)
        if mf is None:
            return None
        local = pos - mf.file_from_offset
        if local + UNIT_SIZE > mf.wrote_position:
            return None
        return decode_entry(mf.mm, local, pos)

    def scan(self, start: int) -> Iterator[TimerEntry]:
        """Valid entries from ``start`` (an entry boundary) to the first invalid or empty one.

        Reads whole mapped segments, whatever their write positions say (recovery sets those)."""
        pos = max(start, self.files.min_offset)
        while True:
            mf = self.files.find(pos)
            if mf is None:
                return
            local = pos - mf.file_from_offset
            mm = mf.mm
            while local + UNIT_SIZE <= mf.size:
                entry = decode_entry(mm, local, mf.file_from_offset + local)
                if entry is None:
                    return
                yield entry
                local += UNIT_SIZE
            pos = mf.end_offset

    def first_from_slot(self, start: int, end: int, slot: int) -> tuple[int, int | None]:
        """The position of the first entry in ``[start, end)`` linked into ``slot`` or later, and the commit-log
        offset of its record; ``(end, None)`` when there is none. Entries below ``end`` were written whole (no CRC
        check: only two fields are read, a few hundred thousand entries a second)."""
        pos = max(start, self.files.min_offset)
        while pos < end:
            mf = self.files.find(pos)
            if mf is None:
                return end, None
            base = mf.file_from_offset
            local, stop, mm = pos - base, min(mf.size, end - base), mf.mm
            while local + UNIT_SIZE <= stop:
                at, offset_py = _SLOT_OFFSET.unpack_from(mm, local + 24)
                if at >= slot:
                    return base + local, offset_py
                local += UNIT_SIZE
            pos = base + local
        return end, None

    def chain(self, head: int, stop: int = -1, limit: int | None = None) -> Iterator[TimerEntry]:
        """Entries from ``head`` back through ``prev_pos``, until ``stop`` (exclusive) or the start.

        Positions must fall strictly: a link that does not is corrupt and ends the walk."""
        pos = head
        count = 0
        while pos >= 0 and pos > stop:
            entry = self.read(pos)
            if entry is None:
                log.error("timer log: no valid entry at %d (a slot chain ends early)", pos)
                return
            yield entry
            count += 1
            if limit is not None and count >= limit:
                return
            if entry.prev_pos >= pos:
                log.error("timer log: entry at %d links forward to %d; chain cut", pos, entry.prev_pos)
                return
            pos = entry.prev_pos

    # -- maintenance --------------------------------------------------------------------------------
    def flush(self) -> int:
        return self.files.flush()

    def release_flushed(self, keep_bytes: int = 1 << 20) -> None:
        self.files.release_flushed(keep_bytes)

    def delete_segments(self, starts: set[int]) -> int:
        """Delete leading segments whose starts are in ``starts`` (never the last one)."""
        deleted = 0
        while len(self.files.files) > 1 and self.files.files[0].file_from_offset in starts:
            self.files.delete_first(1)
            deleted += 1
        return deleted

    def segment_starts(self) -> list[int]:
        return [mf.file_from_offset for mf in self.files.files]
