"""The timer wheel: one 32-byte record per slot of ``precision_ms``, used circularly.

A slot record is ``(slot, first_pos, last_pos, num, num_delete)``, little-endian, with the slot and
the positions stored plus one, so that all-zero bytes are an empty slot (a new wheel file is empty
without being written):

- ``slot``: the absolute slot number (``time_ms // precision_ms``) the record is for. A record whose
  number is not the one asked for belongs to another turn of the wheel and reads as empty, so
  records are never cleared (a crash can always replay a slot it had not finished).
- ``first_pos`` / ``last_pos``: TimerLog positions of the oldest and newest entry of the slot; the
  entries are chained newest to oldest through their ``prev_pos``.
- ``num`` / ``num_delete``: scheduled messages and delete markers linked into the slot.

Everything here is arithmetic on a buffer: the caller passes ``now`` (or the read slot) in, and the
buffer may be a ``bytearray`` (tests, ``decode``) or a shared memory map of the ``timerwheel`` file.
``occupied`` is a derived, in-memory byte per slot that lets the dequeue skip empty slots in C
(``find``) instead of visiting them one by one in Python. It is an anonymous private mapping where the
system has one: its pages take memory only once a slot in them is marked (an idle broker's wheel of
~900,000 slots holds none), where a ``bytearray`` would hold every byte from the start (issue [16]).
"""

from __future__ import annotations

import mmap
import struct
import sys
from dataclasses import dataclass
from typing import NamedTuple

SLOT = struct.Struct("<qqqii")
SLOT_SIZE = SLOT.size  # 32
HEADER = struct.Struct("<4sIIQ")
HEADER_SIZE = 64
WHEEL_MAGIC = b"CMQW"
WHEEL_VERSION = 1


class WheelFormatError(ValueError):
    """The buffer does not hold a wheel of the expected shape."""


@dataclass(frozen=True, slots=True)
class Slot:
    slot: int
    first_pos: int = -1
    last_pos: int = -1
    num: int = 0
    num_delete: int = 0

    @property
    def empty(self) -> bool:
        return self.last_pos < 0


class Placement(NamedTuple):
    """Where an entry goes: its slot, and why it is not its own due slot (if it is not)."""

    slot: int
    roll: bool = False
    #: due in the slot being delivered now (or already past): deliver at once
    late: bool = False


#: slots per chunk of the start-up scan (``TimerWheel._used``): 128 KiB of records
_SCAN_SLOTS = 4096


def wheel_size(slots: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE


def zeroed_map(size: int) -> bytearray | mmap.mmap:
    """``size`` zero bytes, writable, whose pages take memory only once written (an anonymous private mapping;
    reading an untouched page maps the kernel's shared zero page); a ``bytearray`` where that is not available."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is not None:
        try:
            return mmap.mmap(-1, size, flags=private)
        except (OSError, ValueError):
            pass
    return bytearray(size)


def new_wheel_bytes(slots: int, precision_ms: int) -> bytearray:
    """A fresh wheel image: header, then every slot empty (zero)."""
    buf = bytearray(wheel_size(slots))
    HEADER.pack_into(buf, 0, WHEEL_MAGIC, WHEEL_VERSION, slots, precision_ms)
    return buf


def read_header(buf: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(slots, precision_ms)`` from a wheel image, or None when it has no header yet (all zero)."""
    if len(buf) < HEADER_SIZE:
        raise WheelFormatError(f"a wheel needs at least {HEADER_SIZE} bytes, got {len(buf)}")
    magic, version, slots, precision = HEADER.unpack_from(buf, 0)
    if magic == b"\x00\x00\x00\x00" and slots == 0:
        return None
    if magic != WHEEL_MAGIC or version != WHEEL_VERSION:
        raise WheelFormatError(f"not a timer wheel (magic {magic!r}, version {version})")
    return slots, precision


class TimerWheel:
    def __init__(self, slots: int, precision_ms: int, buffer: bytearray | memoryview | None = None) -> None:
        if slots < 2 or precision_ms < 1:
            raise WheelFormatError(f"bad wheel shape: {slots} slots of {precision_ms} ms")
        self.slots = slots
        self.precision_ms = precision_ms
        if buffer is None:
            buffer = new_wheel_bytes(slots, precision_ms)
        view = memoryview(buffer)
        if len(view) < wheel_size(slots):
            raise WheelFormatError(f"wheel buffer of {len(view)} bytes, {wheel_size(slots)} needed")
        header = read_header(view)
        if header is None:
            if any(view[HEADER_SIZE:wheel_size(slots)].cast("B")[:4096]):
                view[HEADER_SIZE:wheel_size(slots)] = bytes(slots * SLOT_SIZE)
            HEADER.pack_into(view, 0, WHEEL_MAGIC, WHEEL_VERSION, slots, precision_ms)
        elif header != (slots, precision_ms):
            raise WheelFormatError(f"the wheel holds {header[0]} slots of {header[1]} ms, "
                                   f"expected {slots} of {precision_ms}")
        self._buf = view
        #: 1 where a slot record holds entries not yet taken by the dequeue (derived; see rebuild)
        self.occupied = zeroed_map(slots)

    # -- time arithmetic ---------------------------------------------------------------------------
    def slot_of(self, time_ms: int) -> int:
        return time_ms // self.precision_ms

    def slot_start(self, slot: int) -> int:
        return slot * self.precision_ms

    def _offset(self, slot: int) -> int:
        return HEADER_SIZE + (slot % self.slots) * SLOT_SIZE

    # -- records ------------------------------------------------------------------------------------
    def get(self, slot: int) -> Slot:
        abs1, first1, last1, num, num_delete = SLOT.unpack_from(self._buf, self._offset(slot))
        if abs1 != slot + 1 or last1 <= 0:
            return Slot(slot)
        return Slot(slot, first1 - 1, last1 - 1, num, num_delete)

    def head(self, slot: int) -> int:
        """The newest entry of ``slot`` (the next entry's ``prev_pos``), -1 when empty."""
        abs1, _, last1, _, _ = SLOT.unpack_from(self._buf, self._offset(slot))
        return last1 - 1 if abs1 == slot + 1 else -1

    def link(self, slot: int, pos: int, *, delete: bool = False) -> int:
        """Make the entry at ``pos`` the newest of ``slot`` (write the entry first, then link it).
        Returns how many messages (not delete markers) the slot now holds."""
        off = self._offset(slot)
        abs1, first1, last1, num, num_delete = SLOT.unpack_from(self._buf, off)
        if abs1 != slot + 1 or last1 <= 0:
            first1, num, num_delete = pos + 1, 0, 0
        if delete:
            num_delete += 1
        else:
            num += 1
        SLOT.pack_into(self._buf, off, slot + 1, first1, pos + 1, num, num_delete)
        self.occupied[slot % self.slots] = 1
        return int(num)

    def put_slot(self, record: Slot) -> None:
        SLOT.pack_into(self._buf, self._offset(record.slot), record.slot + 1, record.first_pos + 1,
                       record.last_pos + 1, record.num, record.num_delete)

    def mark_done(self, slot: int) -> None:
        """The dequeue took ``slot``: stop reporting it as occupied (its record stays for replay)."""
        self.occupied[slot % self.slots] = 0

    def reset(self) -> None:
        """Forget every slot (a full rebuild follows)."""
        self._buf[HEADER_SIZE:wheel_size(self.slots)] = bytes(self.slots * SLOT_SIZE)
        self.occupied = zeroed_map(self.slots)

    # -- placement ----------------------------------------------------------------------------------
    def place(self, due_ms: int, read_slot: int, roll_slots: int, open_slot: int | None = None) -> Placement:
        """The slot an entry due at ``due_ms`` goes to, given the first slot not yet taken by the
        dequeue (``read_slot``) and the slot being delivered right now (``open_slot``, if any).

        Entries are always placed in ``[read_slot, read_slot + roll_slots)`` (or the open slot), so
        a slot record is never shared by two turns of the wheel while either is pending."""
        due_slot = due_ms // self.precision_ms
        if open_slot is not None and due_slot <= open_slot:
            return Placement(open_slot, late=True)
        if due_slot < read_slot:
            return Placement(read_slot, late=True)
        if due_slot - read_slot >= roll_slots:
            target = read_slot + roll_slots - 1
            if due_slot - target < roll_slots // 4:
                # The next hop would land just before the due time: roll a shorter way, so the final
                # placement happens at least half a window ahead.
                target = read_slot + roll_slots // 2
            return Placement(target, roll=True)
        return Placement(due_slot)

    # -- scanning -----------------------------------------------------------------------------------
    def next_occupied(self, start: int, end: int) -> int | None:
        """The first occupied slot in ``[start, end)`` (at most one turn), or None."""
        n = self.slots
        if end <= start:
            return None
        length = min(end - start, n)
        i0 = start % n
        occ = self.occupied
        if i0 + length <= n:
            i = occ.find(b"\x01", i0, i0 + length)
            return None if i < 0 else start + (i - i0)
        i = occ.find(b"\x01", i0, n)
        if i >= 0:
            return start + (i - i0)
        i = occ.find(b"\x01", 0, i0 + length - n)
        return None if i < 0 else start + (n - i0) + i

    def _used(self) -> list[int]:
        """Indexes of slot records that are not all-zero in their slot field (ever used). Read in chunks of
        ``_SCAN_SLOTS`` records, all-zero chunks skipped with one compare: no list of every slot's field (7 MiB
        for the default wheel of 918,016 slots, allocated and freed at each start); 5 ms instead of 56 for an
        empty wheel."""
        body = self._buf[HEADER_SIZE:wheel_size(self.slots)].cast("B")
        fields = body.cast("q") if sys.byteorder == "little" else None
        used: list[int] = []
        zero = bytes(_SCAN_SLOTS * SLOT_SIZE)
        for first in range(0, self.slots, _SCAN_SLOTS):
            chunk = body[first * SLOT_SIZE:(first + _SCAN_SLOTS) * SLOT_SIZE]
            if chunk.tobytes() == zero[:len(chunk)]:
                continue
            if fields is not None:
                firsts = fields[first * 4:(first + _SCAN_SLOTS) * 4:4].tolist()
            else:
                firsts = [rec[0] for rec in SLOT.iter_unpack(chunk)]
            used.extend(first + i for i, v in enumerate(firsts) if v)
        return used

    def _live(self, read_slot: int) -> list[Slot]:
        """Records of the slots in ``[read_slot, read_slot + slots)`` that hold entries."""
        hi = read_slot + self.slots
        out = []
        for i in self._used():
            abs1, first1, last1, num, num_delete = SLOT.unpack_from(self._buf, HEADER_SIZE + i * SLOT_SIZE)
            if last1 > 0 and read_slot < abs1 <= hi:
                out.append(Slot(abs1 - 1, first1 - 1, last1 - 1, num, num_delete))
        return out

    def rebuild(self, read_slot: int) -> tuple[int, int]:
        """Recompute ``occupied`` for the slots in ``[read_slot, read_slot + slots)``; returns the
        scheduled messages and delete markers they hold."""
        occ = zeroed_map(self.slots)
        total = deletes = 0
        for rec in self._live(read_slot):
            occ[rec.slot % self.slots] = 1
            total += rec.num
            deletes += rec.num_delete
        self.occupied = occ
        return total, deletes

    def pointing_past(self, read_slot: int, end_pos: int) -> list[int]:
        """Pending slots whose newest entry lies at or past ``end_pos`` (a TimerLog cut short)."""
        return [rec.slot for rec in self._live(read_slot) if rec.last_pos >= end_pos]

    # -- encode / decode ----------------------------------------------------------------------------
    def encode(self) -> bytes:
        return bytes(self._buf[:wheel_size(self.slots)])

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> TimerWheel:
        header = read_header(data)
        if header is None:
            raise WheelFormatError("the wheel image has no header")
        slots, precision = header
        return cls(slots, precision, bytearray(data[:wheel_size(slots)]))

    def release(self) -> None:
        """Let go of the buffer (needed before closing a memory map it views)."""
        self._buf.release()
