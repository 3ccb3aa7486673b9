"""The message-key index: hash files on disk that map "topic#key" to commit-log offsets.

Each file is a fixed-size, memory-mapped hash table in the RocketMQ IndexFile style, so memory stays
bounded by the page cache rather than by the number of keys:

    header (64 B) | hash_slots x 4 B slot heads | max_entries x 20 B entries

A slot head is the number of the newest entry whose key hashes to that slot (0 = empty; entries are
numbered from 1). An entry is (key hash u32, commit-log offset i64, ms since the file's anchor time i32,
previous entry number in the same slot i32), so each slot is a chain walked newest first. Hashes are
crc32 (stable across processes, unlike ``hash()``); collisions only cost false positives, which the
caller filters out by reading the record.

A put writes the entry, then the header's count, then the slot head: a crash between the steps leaves
at worst an entry past the count that nothing reaches, which ``load`` clears. Entries are appended in
log order, so ``truncate_after`` undoes the newest entries exactly by popping them off their chains.
Files are named by creation time (17 digits, UTC yyyyMMddHHmmssSSS), bumped to stay strictly increasing.

A file is sparse (its size is set, not written), but every byte is given its disk blocks (``posix_fallocate``)
before the mapping writes it: the header and the hash slots when the file is made (or first written after a
restart), the entries a step ahead of the count. A write into a mapped hole on a full disk would otherwise kill the
process (SIGBUS), and a recovery re-indexing on that full disk would kill it again at every start. On a full disk
the reservation fails instead: the keys it could not take are not indexed, as when no file can be made, and are
never indexed later (RocketMQ's IndexService drops a key it cannot index too): logged once until keys are indexed
again, and counted (``IndexService.unindexed_keys``).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from cometmq.common.native import load_c_helper

log = logging.getLogger(__name__)


#: cometmq.store._indexc when built, else None: the same index bytes either way, the C one ~10x cheaper
C_HELPER: Any = load_c_helper("cometmq.store._indexc")

MAGIC = 0x43495831  # "CIX1": our own layout, not RocketMQ's byte format
HEADER_SIZE = 64
SLOT_SIZE = 4
ENTRY_SIZE = 20
# magic, hash_slots, max_entries, reserved, anchor_ts, begin_ts, begin_phy | count, used, end_ts, end_phy
_HEADER = struct.Struct(">IIIIqqqiiqq")
_HOT = struct.Struct(">iiqq")  # the part of the header every put rewrites
_HOT_POS = 40
_BEGIN = struct.Struct(">qqq")  # anchor_ts, begin_ts, begin_phy: set by the first put into a file
_BEGIN_POS = 16
_BEGIN_TS = struct.Struct(">q")
_BEGIN_TS_POS = 24
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">Iqii")
_ZERO_ENTRY = bytes(ENTRY_SIZE)
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
#: entries are given disk blocks this far ahead of the count (``IndexFile.reserve_entries``)
RESERVE_STEP = 1 << 20


def key_hash(key: str) -> int:
    """crc32 of the key's UTF-8 bytes (lone surrogates passed through rather than rejected)."""
    try:
        return zlib.crc32(key.encode())
    except UnicodeEncodeError:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))


def _file_size(hash_slots: int, max_entries: int) -> int:
    return HEADER_SIZE + hash_slots * SLOT_SIZE + max_entries * ENTRY_SIZE


class IndexFile:
    """One hash file. Header fields are mirrored in attributes so a put reads no header bytes."""

    __slots__ = ("anchor_ts", "begin_phy", "begin_ts", "count", "dirty", "end_phy", "end_ts", "entry_base",
                 "fd", "hash_slots", "max_entries", "mm", "no_space", "path", "released_entries", "reserved",
                 "used_slots")

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, hash_slots: int, max_entries: int) -> None:
        self.path, self.fd, self.mm = path, fd, mm
        self.hash_slots, self.max_entries = hash_slots, max_entries
        # Entry n (1-based) lives at entry_base + n * ENTRY_SIZE.
        self.entry_base = HEADER_SIZE + hash_slots * SLOT_SIZE - ENTRY_SIZE
        (_, _, _, _, self.anchor_ts, self.begin_ts, self.begin_phy, self.count, self.used_slots,
         self.end_ts, self.end_phy) = _HEADER.unpack_from(mm, 0)
        self.dirty = False
        self.released_entries = 0
        #: bytes from the file's start given disk blocks by this process (0: none yet, e.g. a file from disk)
        self.reserved = 0
        #: why the last reservation failed (a full disk), None when it did not
        self.no_space: OSError | None = None

    def release_flushed(self, full: bool) -> None:
        """Drop this process's mapping of entries already on disk (the page cache keeps them), so RSS
        stays bounded as the index grows. Slots are touched at random, so only a full file drops them."""
        start = HEADER_SIZE + self.hash_slots * SLOT_SIZE if not full else 0
        first = max(self.entry_base + (self.released_entries + 1) * ENTRY_SIZE, start)
        end = self.entry_base + (self.count + 1) * ENTRY_SIZE - mmap.PAGESIZE
        first -= first % mmap.PAGESIZE
        end -= end % mmap.PAGESIZE
        if full:
            first, end = 0, len(self.mm) - len(self.mm) % mmap.PAGESIZE
        if end > first:
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, first, end - first)
            except (OSError, ValueError):
                return
            self.released_entries = self.count

    @classmethod
    def create(cls, path: Path, hash_slots: int, max_entries: int) -> IndexFile:
        size = _file_size(hash_slots, max_entries)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        # The header and the slots (written at random) get their blocks now, the entries a step at a time.
        reserve = min(size, -(-(HEADER_SIZE + hash_slots * SLOT_SIZE + RESERVE_STEP) // mmap.PAGESIZE) * mmap.PAGESIZE)
        try:
            os.ftruncate(fd, size)  # sparse: only what is reserved has disk blocks
            os.posix_fallocate(fd, 0, reserve)  # a full disk fails here (ENOSPC), not at a write (SIGBUS)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        _HEADER.pack_into(mm, 0, MAGIC, hash_slots, max_entries, 0, 0, 0, -1, 0, 0, 0, -1)
        f = cls(path, fd, mm, hash_slots, max_entries)
        f.reserved = reserve
        f.dirty = True
        return f

    @classmethod
    def open(cls, path: Path) -> IndexFile | str:
        """Map an existing file; returns the reason instead when it is not a valid index file."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            return str(exc)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise ValueError(f"{size} bytes is shorter than the header")
            header = os.pread(fd, HEADER_SIZE, 0)
            magic, slots, entries, _, _, _, begin_phy, count, used, _, end_phy = _HEADER.unpack(header)
            if magic != MAGIC:
                raise ValueError(f"bad magic {magic:#x}")
            if slots <= 0 or entries <= 0 or size != _file_size(slots, entries):
                raise ValueError(f"size {size} does not match {slots} slots and {entries} entries")
            if not (0 <= count <= entries and 0 <= used <= slots):
                raise ValueError(f"count {count} or used slots {used} out of range")
            if count > 0 and not 0 <= begin_phy <= end_phy:
                # A wild end offset would make the dispatcher skip records as if already indexed.
                raise ValueError(f"offset range {begin_phy}..{end_phy} is not valid")
            mm = mmap.mmap(fd, size)
        except (OSError, ValueError, struct.error) as exc:
            os.close(fd)
            return str(exc)
        return cls(path, fd, mm, slots, entries)

    def reserve_entries(self, count: int) -> int:
        """Give disk blocks to the file up to entry ``count`` (the header and slots too, when nothing was reserved
        yet), a step ahead, in whole pages; returns how many entries the reserved part holds: fewer than ``count``
        when the disk is full (``no_space`` says why; the caller writes only that many)."""
        count = min(count, self.max_entries)
        need = self.entry_base + (count + 1) * ENTRY_SIZE
        if need > self.reserved:
            size = len(self.mm)
            error: OSError | None = None
            for target in (max(need, self.reserved + RESERVE_STEP), need):
                target = min(size, -(-target // mmap.PAGESIZE) * mmap.PAGESIZE)
                try:
                    os.posix_fallocate(self.fd, self.reserved, target - self.reserved)
                except OSError as exc:
                    error = exc
                    continue
                self.reserved = target
                self.no_space = None
                break
            else:
                self.no_space = error
        return max(0, min(self.max_entries, (self.reserved - self.entry_base) // ENTRY_SIZE - 1))

    # -- chains ------------------------------------------------------------------------------
    def entry(self, n: int) -> tuple[int, int, int, int]:
        """Entry ``n``'s (hash, commit-log offset, ms from the anchor, previous entry)."""
        h, phy, delta, prev = _ENTRY.unpack_from(self.mm, self.entry_base + n * ENTRY_SIZE)
        return h, phy, delta, prev

    def head(self, slot_pos: int) -> int:
        """The slot's newest entry, skipping any that lie past the count (left by a torn write)."""
        n: int = _SLOT.unpack_from(self.mm, slot_pos)[0]
        while n > self.count:
            prev = self.entry(n)[3] if n <= self.max_entries else 0
            n = prev if 0 <= prev < n else 0
        return max(n, 0)

    def pop_to(self, count: int) -> None:
        """Undo the entries after ``count``, newest first, unlinking each from its chain."""
        mm, base, slots = self.mm, self.entry_base, self.hash_slots
        for n in range(self.count, count, -1):
            h, _, _, prev = self.entry(n)
            slot_pos = HEADER_SIZE + (h % slots) * SLOT_SIZE
            if _SLOT.unpack_from(mm, slot_pos)[0] == n:
                _SLOT.pack_into(mm, slot_pos, prev)
                if prev == 0:
                    self.used_slots = max(self.used_slots - 1, 0)
            mm[base + n * ENTRY_SIZE : base + (n + 1) * ENTRY_SIZE] = _ZERO_ENTRY
        self.count = min(self.count, count)
        if self.count == 0:
            self.used_slots = 0
            self.begin_phy = self.end_phy = -1
            _BEGIN.pack_into(mm, _BEGIN_POS, self.anchor_ts, self.begin_ts, -1)
        else:
            self.end_phy = self.entry(self.count)[1]
        _HOT.pack_into(mm, _HOT_POS, self.count, self.used_slots, self.end_ts, self.end_phy)
        self.dirty = True

    def clear_uncounted(self) -> None:
        """Remove entries written past the count by a put that a crash cut short."""
        n = self.count
        while n < self.max_entries and self.entry(n + 1) != (0, 0, 0, 0):
            n += 1
        if n > self.count:
            log.warning("index %s: clearing %d entries past the count", self.path.name, n - self.count)
            count, self.count = self.count, n
            self.pop_to(count)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


class IndexService:
    """All index files of a store, oldest first; only the last one takes puts."""

    def __init__(self, directory: Path, hash_slots: int, max_entries: int) -> None:
        if hash_slots <= 0 or max_entries <= 0:
            raise ValueError("hash_slots and max_entries must be positive")
        self.directory = Path(directory)
        self.hash_slots = hash_slots
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self._max_phy = -1
        # _lock guards the file list and every write. _flush_lock keeps files mapped: whoever unmaps holds
        # it, and so do fsync and query, which run without _lock so that puts are never held up by them.
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        #: keys not indexed for want of disk space (no new file, or no blocks for entries); never indexed later
        self.unindexed_keys = 0
        #: in a spell of keys not indexed (a full disk): logged at its start and end only
        self._failing = False
        #: why the last new file could not be made
        self._roll_error = ""

    # -- lifecycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Open the files in the folder; invalid ones are renamed aside (``*.corrupt``) and skipped."""
        with self._flush_lock, self._lock:
            self._close_all()
            self.directory.mkdir(parents=True, exist_ok=True)
            names = sorted((p for p in self.directory.iterdir() if p.name.isdigit() and p.is_file()),
                           key=lambda p: int(p.name))
            for path in names:
                opened = IndexFile.open(path)
                if isinstance(opened, str):
                    log.error("index file %s is invalid (%s); moving it aside", path.name, opened)
                    try:
                        os.replace(path, path.with_name(path.name + ".corrupt"))
                    except OSError as exc:
                        log.error("cannot rename %s: %s", path, exc)
                    continue
                self.files.append(opened)
            if self.files:
                self.files[-1].clear_uncounted()
            self._max_phy = self._recompute_max_phy()

    def close(self) -> None:
        """Unmap every file. Dirty pages stay in the page cache; call ``flush`` first for durability."""
        with self._flush_lock, self._lock:
            self._close_all()

    def _close_all(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
        self._max_phy = -1

    @property
    def max_phy_offset(self) -> int:
        """The highest commit-log offset indexed (-1 when empty); a restart re-reads it from headers."""
        return self._max_phy

    # -- write ------------------------------------------------------------------------------------
    def put(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index one key of the record at ``phy_offset``; False when no file could take it."""
        return self.put_hashed([(key_hash(key), phy_offset, store_timestamp)]) == 1

    def put_many(self, entries: list[tuple[str, int, int]]) -> int:
        """Index many (key, phy_offset, store_timestamp) in order, as ``put`` would one by one (same files,
        same bytes); returns how many were indexed (fewer only when no file could take the rest)."""
        return self.put_hashed([(key_hash(key), phy, ts) for key, phy, ts in entries])

    def put_hashed(self, entries: list[tuple[int, int, int]]) -> int:
        """``put_many`` with each key already hashed by ``key_hash``: (hash, phy_offset, store_timestamp).

        One lock and one header write per file touched instead of per key: the hot header fields (count, used
        slots, end time, end offset) are written once at the end. An entry is complete before the in-memory
        count (what readers go by) shows it. A crash between the entries and the header leaves a header that
        lags; the index is rebuilt from the checkpoint's dispatch offset on recovery, which re-puts and
        truncates what lies past it."""
        n = len(entries)
        i = 0
        reason = ""
        with self._lock:
            f = self.files[-1] if self.files else None
            while i < n:
                ts0 = entries[i][2]
                if f is None or f.count >= f.max_entries or not (
                        _I32_MIN <= ts0 - f.anchor_ts <= _I32_MAX or f.count == 0):
                    f = self._roll()
                    if f is None:
                        reason = self._roll_error
                        break
                done = self._put_run(f, entries, i)
                if done == i:  # no disk space for the entries: the rest is not indexed
                    reason = f"no disk space for entries past {f.count} in {f.path.name} ({f.no_space})"
                    break
                i = done
            if i < n:
                self.unindexed_keys += n - i
                if not self._failing:
                    self._failing = True
                    log.error("index: %s: %d key(s) not indexed; keys are not indexed until there is space, nor "
                              "later (as RocketMQ's IndexService drops them): counted, logged once", reason, n - i)
            elif n and self._failing:
                self._failing = False
                log.warning("index: disk space found again; keys are indexed again (%d in all were not)",
                            self.unindexed_keys)
        return i

    def _put_run(self, f: IndexFile, entries: list[tuple[int, int, int]], i: int) -> int:
        """Put entries from ``i`` into ``f`` until it is full or a timestamp falls out of its range; returns
        the next index. Called with the lock held. The C helper, when built, writes the common case (and
        without the GIL); it stops before any entry that needs ``_put_one``'s handling."""
        n = len(entries)
        room = f.reserve_entries(f.count + n - i)  # (entries written only where disk blocks are reserved)
        if room <= f.count:
            return i
        while i < n and f.count < room:
            if C_HELPER is not None:
                (i, f.count, f.used_slots, f.end_ts, f.end_phy, self._max_phy) = C_HELPER.put_run(
                    f.mm, entries, i, f.count, f.used_slots, f.end_ts, f.end_phy, self._max_phy, f.hash_slots,
                    room, f.entry_base, f.anchor_ts, f.begin_ts)
                if i >= n or f.count >= room:
                    break
            h, phy, ts = entries[i]
            if not self._put_one(f, h, phy, ts):
                break
            i += 1
        _HOT.pack_into(f.mm, _HOT_POS, f.count, f.used_slots, f.end_ts, f.end_phy)
        f.dirty = True
        return i

    def _put_one(self, f: IndexFile, h: int, phy: int, ts: int) -> bool:
        """Write one entry into ``f`` (not full); False, writing nothing, when ``ts`` is out of its range.
        The header's hot fields are left to the caller."""
        mm = f.mm
        count = f.count
        if count == 0:
            f.anchor_ts = f.begin_ts = f.end_ts = ts
            f.begin_phy = phy
            _BEGIN.pack_into(mm, _BEGIN_POS, ts, ts, phy)
        elif not _I32_MIN <= ts - f.anchor_ts <= _I32_MAX:
            return False
        elif ts < f.begin_ts:
            f.begin_ts = ts  # a clock step back: keep the range a true bound
            _BEGIN_TS.pack_into(mm, _BEGIN_TS_POS, ts)
        slot_pos = HEADER_SIZE + (h % f.hash_slots) * SLOT_SIZE
        prev = _SLOT.unpack_from(mm, slot_pos)[0]
        if prev > count or prev < 0:
            prev = f.head(slot_pos)  # left by a torn write: walk back from it
        if prev == 0:
            f.used_slots += 1
        count += 1
        _ENTRY.pack_into(mm, f.entry_base + count * ENTRY_SIZE, h, phy, ts - f.anchor_ts, prev)
        _SLOT.pack_into(mm, slot_pos, count)
        f.count = count
        if ts > f.end_ts:
            f.end_ts = ts
        if phy > f.end_phy:
            f.end_phy = phy
        if phy > self._max_phy:
            self._max_phy = phy
        return True

    def _roll(self) -> IndexFile | None:
        """Start a new file (called with _lock held); None when the disk refuses (``_roll_error`` says why: the
        caller logs it once)."""
        now_ms = time.time_ns() // 1_000_000
        stamp = int(time.strftime("%Y%m%d%H%M%S", time.gmtime(now_ms // 1000))) * 1000 + now_ms % 1000
        if self.files:
            stamp = max(stamp, int(self.files[-1].path.name) + 1)
        for attempt in range(8):  # a stray file may already hold the name: take the next one
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                f = IndexFile.create(self.directory / f"{stamp + attempt:017d}", self.hash_slots,
                                     self.max_entries)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                self._roll_error = f"cannot create an index file in {self.directory}: {exc}"
                return None
        else:
            self._roll_error = f"cannot create an index file in {self.directory}: names taken"
            return None
        self.files.append(f)
        return f

    # -- read ---------------------------------------------------------------------------------------
    def query(self, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        """Commit-log offsets of entries whose hash matches ``key`` and whose store time lies in
        [begin_ts, end_ts], newest first, without repeats. May include collisions: verify each."""
        h = key_hash(key)
        found: list[int] = []
        seen: set[int] = set()
        # Only the unmap lock: puts go on meanwhile, and an entry is complete before the count shows it.
        with self._flush_lock:
            for f in reversed(list(self.files)):
                if len(found) >= max_num:
                    break
                if f.count == 0 or f.begin_ts > end_ts or f.end_ts < begin_ts:
                    continue
                mm, base = f.mm, f.entry_base
                n = f.head(HEADER_SIZE + (h % f.hash_slots) * SLOT_SIZE)
                lo, hi = begin_ts - f.anchor_ts, end_ts - f.anchor_ts
                while n > 0 and len(found) < max_num:
                    eh, phy, delta, prev = _ENTRY.unpack_from(mm, base + n * ENTRY_SIZE)
                    if eh == h and lo <= delta <= hi and phy not in seen:
                        seen.add(phy)
                        found.append(phy)
                    n = prev if 0 <= prev < n else 0  # chains only point back: a loop means damage
        return found

    # -- durability and retention ------------------------------------------------------------------
    def flush(self) -> None:
        """fsync files written since the last flush (covers their mapped pages on Linux)."""
        with self._flush_lock:
            with self._lock:
                dirty = [f for f in self.files if f.dirty]
                for f in dirty:
                    f.dirty = False
            last = self.files[-1] if self.files else None
            for f in dirty:
                try:
                    os.fsync(f.fd)
                except OSError as exc:
                    f.dirty = True
                    log.error("index flush of %s failed: %s", f.path.name, exc)
                    continue
                f.release_flushed(full=f is not last)

    def release_idle(self) -> None:
        """Drop every file's pages from this process's mapping, the last one's hash slots too (``flush`` keeps
        those: they are written at random while keys come). The page cache keeps them, written or not (a shared
        file mapping: the next ``flush`` still writes what is not on disk yet), and a put or a lookup maps them
        again. For a store with nothing to index for now (the maintenance pass finds nothing new)."""
        with self._lock:
            for f in self.files:
                f.release_flushed(full=True)

    def delete_files_before(self, min_phy_offset: int) -> int:
        """Delete files that only point below ``min_phy_offset`` (never the last); returns how many."""
        with self._flush_lock, self._lock:
            doomed = [f for f in self.files[:-1] if f.end_phy < min_phy_offset]
            for f in doomed:
                self.files.remove(f)
                self._destroy(f)
            return len(doomed)

    def truncate_after(self, phy_offset: int) -> None:
        """Forget entries at ``phy_offset`` or beyond: whole files that start there go, and the newest
        entries of the others are unlinked, so ``max_phy_offset`` ends below ``phy_offset``."""
        with self._flush_lock, self._lock:
            for f in [f for f in self.files if f.count > 0 and f.begin_phy >= phy_offset]:
                self.files.remove(f)
                self._destroy(f)
            for f in reversed(self.files):
                if f.count == 0:
                    continue
                if f.end_phy < phy_offset:
                    break
                count = f.count
                while count > 0 and f.entry(count)[1] >= phy_offset:
                    count -= 1
                f.pop_to(count)
                if f.end_phy >= phy_offset:  # out-of-order remnants: still report below the cut
                    f.end_phy = phy_offset - 1
                    _HOT.pack_into(f.mm, _HOT_POS, f.count, f.used_slots, f.end_ts, f.end_phy)
            self._max_phy = self._recompute_max_phy()

    def _recompute_max_phy(self) -> int:
        return max((f.end_phy for f in self.files), default=-1)

    @staticmethod
    def _destroy(f: IndexFile) -> None:
        f.close()
        try:
            f.path.unlink()
        except OSError as exc:
            log.error("cannot delete index file %s: %s", f.path, exc)
