"""Consume-queue files: grown as they fill, mapped only while in use.

The format is RocketMQ's: a file holds ``mappedFileSizeConsumeQueue`` bytes of 20-byte units (300,000 units, 6 MB by
default) and is named by the offset of its first byte. What differs from the commit log's segments is how a file
takes disk and memory, because a broker may have 100,000 queues, most holding a few messages:

* **Growth.** A file is created at its first unit and grows in chunks (one page first, then doubling, at most 1 MiB
  a step) up to its full size. Each chunk is reserved with ``posix_fallocate`` *before* it is mapped, so on a full
  disk the growth fails with ENOSPC (the dispatch stops there and is retried from the commit log) and a write to the
  mapping can never fault on a missing block (SIGBUS). A queue holding a few units takes one page of disk. The
  on-disk length is therefore no record of how much is written: past it, and past the written units inside it, the
  file reads as zeros (units of size 0): recovery counts up to the last unit that is not (empty units before it
  are a queue offset gap, written so by the dispatch, and stay). A file left short
  that is not its queue's last (a queue offset gap marked it full) is extended as a sparse file at load, so every
  read inside a file's size stays inside the file.
* **Mappings are a cache.** A file is mapped when it is first read or written and stays mapped while it is among the
  ``maxOpenConsumeQueueFiles`` most recently used (``MappingLRU``); the least recently used is unmapped when another
  is mapped. The bound also keeps file descriptors in check (Python's mmap holds a duplicate descriptor while
  mapped; the store keeps the bound under half the process's descriptor limit) and ``vm.max_map_count``; a flush
  opens the file for its ``fdatasync``.
  Unmapping is dropping the reference: a reader still holding a view keeps the mapping alive until it lets go.
  Dirty pages of an unmapped file stay in the page cache, and the flush policy still sees them (the positions are
  kept in memory), so unmapping never loses or flushes anything by itself.
* **New files are made in the background.** Creating a folder or a file costs ~0.3-0.4 ms of kernel time on this
  kind of VM's ext4, and a new queue needs a folder for its topic, one for itself and a file: done on the dispatch
  path, a send spread over thousands of new queues paid ~1 ms a queue. So a new file starts *pending*: its first
  page is a buffer in memory (``bytearray``) that units are written to and read from like a mapping, and the
  consume-queue flush pass (``MessageStore.flush_consume_queues``, every flushIntervalConsumeQueue) makes the
  folders and the file, copies the buffer in and maps it, under the store lock, before it flushes. A pending file
  that fills its page before that is made at once. Durability is unchanged: a queue is dirty from its first unit
  until that unit is flushed, and the checkpoint's dispatched offset never passes a dirty queue's first unflushed
  unit, so a crash (even SIGKILL, which loses the buffer) re-dispatches those units from the commit log.
* **Start-up reads without mapping.** Recovery reads a small file's units with one ``pread`` (an image dropped when
  recovery ends), so starting with 100,000 queues maps nothing.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path

from cometmq.common.atomic_file import fsync_dir
from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.mapped_file import MappedFileQueue, log

PAGE_SIZE = mmap.PAGESIZE
#: growth steps double up to this
MAX_GROWTH_STEP = 1 << 20
#: recovery reads files up to this long with one pread instead of mapping them
IMAGE_MAX_BYTES = 256 * 1024
#: a pending file's first buffer (16 units); it doubles up to a page, then the file is made at once
PENDING_FIRST_BYTES = 16 * CQ_UNIT_SIZE

_EMPTY = b""
_SIZE_FIELD = struct.Struct(">8xi").unpack_from


def _first_nonzero(buf: bytes | bytearray | mmap.mmap, start: int, end: int) -> int:
    """Where the first byte of ``buf[start:end]`` that is not zero is (``end`` when there is none), a chunk at a
    time."""
    chunk = 1 << 16
    pos = start
    while pos < end:
        n = min(chunk, end - pos)
        rest = buf[pos : pos + n].lstrip(b"\x00")
        if rest:
            return pos + n - len(rest)
        pos += n
    return end


def _last_nonzero(buf: bytes | bytearray | mmap.mmap, start: int, end: int) -> int:
    """One past the last byte of ``buf[start:end]`` that is not zero (``start`` when there is none), a chunk at a
    time from the end."""
    chunk = 1 << 16
    pos = end
    while pos > start:
        n = min(chunk, pos - start)
        rest = buf[pos - n : pos].rstrip(b"\x00")
        if rest:
            return pos - n + len(rest)
        pos -= n
    return start


def first_unit(buf: bytes | bytearray | mmap.mmap, start: int, end: int) -> int:
    """The index of the first unit of ``buf``'s units ``[start, end)`` that holds a record (size > 0); ``end`` when
    none does. Units of size 0 are a queue offset gap (or a leading hole) and are stepped over."""
    pos = start * CQ_UNIT_SIZE
    stop = end * CQ_UNIT_SIZE
    while True:
        pos = _first_nonzero(buf, pos, stop)
        if pos >= stop:
            return end
        k = pos // CQ_UNIT_SIZE
        if _SIZE_FIELD(buf, k * CQ_UNIT_SIZE)[0] > 0:
            return k
        pos = (k + 1) * CQ_UNIT_SIZE


def units_end(buf: bytes | bytearray | mmap.mmap, start: int, end: int) -> int:
    """One past the last unit of ``buf``'s units ``[start, end)`` that holds a record (size > 0); ``start`` when
    none does. Empty units before it (a gap) are inside; bytes after it that make no unit (a torn write) are not."""
    lo = start * CQ_UNIT_SIZE
    pos = end * CQ_UNIT_SIZE
    while True:
        pos = _last_nonzero(buf, lo, pos)
        if pos <= lo:
            return start
        k = (pos - 1) // CQ_UNIT_SIZE
        if _SIZE_FIELD(buf, k * CQ_UNIT_SIZE)[0] > 0:
            return k + 1
        pos = k * CQ_UNIT_SIZE


def mapping_bound(configured: int) -> int:
    """maxOpenConsumeQueueFiles, kept under half the process's file-descriptor limit (a mapping holds a descriptor)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return configured
    return min(configured, max(16, soft // 2))


class MappingLRU:
    """The consume-queue files mapped now, least recently used first; at most ``max_open`` of them."""

    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._open: OrderedDict[ConsumeQueueFile, None] = OrderedDict()
        self._lock = threading.Lock()
        #: new files still in memory, for the flush pass to make (``take_pending``)
        self.pending: list[ConsumeQueueFile] = []
        #: mappings made / dropped to stay within the bound (metrics, tests)
        self.mapped = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def use(self, f: ConsumeQueueFile) -> None:
        try:
            self._open.move_to_end(f)
        except KeyError:  # unmapped meanwhile by another thread: its next access maps it again
            pass

    def install(self, f: ConsumeQueueFile, mm: mmap.mmap, length: int) -> None:
        """Make ``mm`` (``length`` bytes) ``f``'s mapping and unmap the least recently used beyond the bound."""
        with self._lock:
            f._mm = mm
            f._len = length
            f._image = None
            self._open[f] = None
            self._open.move_to_end(f)
            self.mapped += 1
            while len(self._open) > self.max_open:
                victim, _ = self._open.popitem(last=False)
                victim._mm = None
                self.evicted += 1

    def drop(self, f: ConsumeQueueFile) -> None:
        with self._lock:
            self._open.pop(f, None)
            f._mm = None

    def forget(self, f: ConsumeQueueFile) -> None:
        """Stop counting ``f`` (deleted) among the mapped files; its mapping goes with the last reference to it."""
        with self._lock:
            self._open.pop(f, None)

    def mapped_files(self) -> list[ConsumeQueueFile]:
        with self._lock:
            return list(self._open)

    def take_pending(self) -> list[ConsumeQueueFile]:
        with self._lock:
            pending, self.pending = self.pending, []
        return [f for f in pending if f.pending]

    def add_pending(self, f: ConsumeQueueFile) -> None:
        with self._lock:
            self.pending.append(f)


class ConsumeQueueFile:
    """One consume-queue file: positions in memory, bytes on disk, a mapping while it is in use.

    Offers what ``MappedFileQueue`` and ``ConsumeQueue`` use of a ``MappedFile``. ``_mm``/``_len`` are the mapping and
    the file's length; the write path reads them directly (``ConsumeQueue.put``)."""

    __slots__ = ("__weakref__", "_dead", "_image", "_len", "_lru", "_mm", "_new_dirs", "_reserved",
                 "file_from_offset", "flushed_position", "path", "pending", "released_position", "size",
                 "wrote_position")

    def __init__(self, path: Path, size: int, lru: MappingLRU, *, length: int = 0, new: bool = False) -> None:
        self.path = path
        self.size = size
        self.file_from_offset = int(path.name)
        self._lru = lru
        #: the mapping, or a new file's first page while it is pending
        self._mm: mmap.mmap | bytearray | None = None
        #: the file's length on disk (the mapping's or the pending buffer's length while there is one)
        self._len = length
        #: blocks of [0, _len) reserved by this process (a file from disk is reserved before its first write)
        self._reserved = False
        #: folders whose entries the first flush must sync (the file's own, and any made for it)
        self._new_dirs: list[Path] = []
        #: recovery's copy of a small file's bytes (None otherwise)
        self._image: bytes | None = None
        #: destroyed (a pending file made meanwhile is removed)
        self._dead = False
        #: a new file not on disk yet: its first page is ``_mm``, a buffer in memory
        self.pending = new
        if new:
            self._len = min(PENDING_FIRST_BYTES, size)
            self._mm = bytearray(self._len)
            lru.add_pending(self)
        self.wrote_position = 0
        self.flushed_position = 0
        self.released_position = 0

    def __repr__(self) -> str:
        return f"ConsumeQueueFile({self.path}, length={self._len}, wrote={self.wrote_position})"

    # -- positions -------------------------------------------------------------------------
    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.size

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote_position

    @property
    def length(self) -> int:
        """Bytes the file has on disk now (it grows to ``size``)."""
        return self._len

    @property
    def mapped(self) -> bool:
        return self._mm is not None

    # -- mapping ---------------------------------------------------------------------------
    @property
    def mm(self) -> mmap.mmap | bytearray | bytes:
        """The mapping (made now if the file is not mapped; empty for an empty file)."""
        m = self._mm
        if m is not None:
            self._lru.use(self)
            return m
        return self._map()

    def _map(self) -> mmap.mmap | bytes:
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            if not self._dead:
                raise
            # Deleted (retention) after a reader found it, and unmapped before: its units read as zeros (size 0,
            # nothing to serve) instead of failing the read.
            return bytes(max(self._len, self.wrote_position))
        try:
            length = os.fstat(fd).st_size
            if length == 0:
                self._len = 0
                return _EMPTY
            m = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        self._lru.install(self, m, length)
        return m

    def buf(self) -> mmap.mmap | bytearray | bytes:
        """Bytes to read units from: the mapping, or recovery's image of the file."""
        m = self._mm
        if m is not None:
            self._lru.use(self)
            return m
        image = self._image
        if image is not None:
            return image
        return self._map()

    def ensure(self, end: int) -> mmap.mmap | bytearray:
        """The mapping (or pending buffer), writable up to ``end``: grows the file first when it is shorter
        (reserving the new blocks, so a full disk fails here with ENOSPC instead of faulting later on a write to the
        mapping). A pending file that must grow is made now."""
        m = self._mm
        if m is not None and end <= self._len and (self._reserved or self.pending):
            self._lru.use(self)
            return m
        if self.pending:
            if isinstance(m, bytearray) and end <= min(PAGE_SIZE, self.size):
                # Grow the buffer (a copy: a reader's view of the old one stays valid, and shows a prefix).
                grown = bytearray(min(max(2 * len(m), end), PAGE_SIZE, self.size))
                grown[: len(m)] = m
                self._mm = grown
                self._len = len(grown)
                return grown
            self.prepare()
            self.install()
        length = self._len
        new_len = length
        if end > length:
            step = min(max(length, PAGE_SIZE), MAX_GROWTH_STEP)
            new_len = max(end, length + step)
            new_len = min(-(-new_len // PAGE_SIZE) * PAGE_SIZE, self.size)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not self._reserved and length:
                # A file from disk: reserve what it has before writing into it (a no-op for the blocks we reserved
                # before the restart; a file cut short or copied sparse gets its blocks now).
                os.posix_fallocate(fd, 0, length)
            if new_len > length:
                try:
                    os.posix_fallocate(fd, length, new_len - length)  # extends the file too
                except OSError:
                    try:
                        os.ftruncate(fd, length)
                    except OSError:
                        pass
                    raise
            m = mmap.mmap(fd, new_len)
        finally:
            os.close(fd)
        self._reserved = True
        self._lru.install(self, m, new_len)
        return m

    def drop_image(self) -> None:
        self._image = None

    def prepare(self) -> None:
        """Make a pending file on disk (its folders first), one page long with its blocks reserved: the slow part of
        making it, done without the store lock. Idempotent; ``install`` then copies the buffer in."""
        if not self.pending or self._dead:
            return
        self._create(min(PAGE_SIZE, self.size))

    def _create(self, reserve: int) -> int:
        """Make the file (and its folders) if it is not there, reserving ``reserve`` bytes (0: none); its length."""
        directory = self.path.parent
        if not directory.is_dir():
            made: list[Path] = []
            d = directory
            while not d.is_dir():
                made.append(d)
                d = d.parent
            directory.mkdir(parents=True, exist_ok=True)
            # the new folders' entries live in their parents: sync those with the first flush
            self._new_dirs.extend(m.parent for m in made)
        if directory not in self._new_dirs:
            self._new_dirs.insert(0, directory)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            length = os.fstat(fd).st_size
            if length < reserve:
                os.posix_fallocate(fd, 0, reserve)
                length = reserve
        finally:
            os.close(fd)
        return length

    def install(self) -> None:
        """Copy the pending buffer into the prepared file and map it (the caller holds the store lock, so nothing is
        written to the buffer meanwhile). A file destroyed meanwhile is removed again."""
        if self._dead:
            self.pending = False
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            return
        buf = self._mm
        if not self.pending or not isinstance(buf, bytearray):
            return
        fd = os.open(self.path, os.O_RDWR)
        try:
            length = os.fstat(fd).st_size
            os.pwrite(fd, buf, 0)
            m = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        self._reserved = True
        self.pending = False
        self._lru.install(self, m, length)

    def load_image(self) -> bytes | None:
        """Read the whole (small) file into an image for recovery's reads; None when it is too long."""
        if self._mm is not None or self.pending or self._len > IMAGE_MAX_BYTES:
            return None
        image = self._image
        if image is None:
            image = self._image = self._pread(0, self._len)
        return image

    def _pread(self, pos: int, n: int) -> bytes:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, n, pos)
        finally:
            os.close(fd)
        return data + bytes(n - len(data)) if len(data) < n else data

    # -- data ------------------------------------------------------------------------------
    def view(self, pos: int, size: int) -> memoryview:
        """A view of ``size`` bytes at ``pos`` (zero-copy from the mapping or recovery's image)."""
        return memoryview(self.buf())[pos : pos + size]

    def count_units(self, units_per_file: int) -> int:
        """Units in use: up to the last unit that holds a record (size > 0); the file's unwritten tail, and anything
        past its length on disk, reads as zeros. Empty units before that one stay: a queue offset gap (a record that
        named a queue offset past its queue's end is written there, after empty units) or the leading hole of a
        queue that starts inside its first file. A search that stopped at the first empty unit (as RocketMQ's
        recovery does: it never writes a gap) ended the queue inside such a gap. A torn unit after the last (bytes
        but no size) is not counted: recovery cuts it."""
        limit = min(units_per_file, self._len // CQ_UNIT_SIZE)
        if limit == 0:
            return 0
        src: bytes | bytearray | mmap.mmap | None = self.load_image()
        if src is None:
            src = self.buf()
        n = units_end(src, 0, limit)
        if self._image is not None and len(self._image) > n * CQ_UNIT_SIZE:
            self._image = self._image[: n * CQ_UNIT_SIZE]  # recovery reads nothing past the last unit
        return n

    # -- durability ------------------------------------------------------------------------
    def flush(self) -> int:
        """fdatasync everything written so far (through a descriptor opened for it); returns the flushed position."""
        return self.flush_to(self.wrote_position)

    def flush_to(self, target: int, synced_dirs: set[Path] | None = None) -> int:
        """fdatasync up to ``target`` (a pending file must have been made: the flush pass does that first).
        ``synced_dirs``: folders already synced in this pass after every file of it was made (not synced again)."""
        if target > self.flushed_position and not self.pending:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:  # deleted meanwhile (retention, a topic deleted): nothing left to flush
                return self.flushed_position
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            while self._new_dirs:
                # The file's name (and its new folders') must survive a crash as well as its bytes.
                d = self._new_dirs[0]
                if synced_dirs is None or d not in synced_dirs:
                    fsync_dir(d)
                    if synced_dirs is not None:
                        synced_dirs.add(d)
                self._new_dirs.pop(0)
            self.flushed_position = min(max(self.flushed_position, target), self.wrote_position)
        return self.flushed_position

    def dirty_pages(self) -> int:
        return (self.wrote_position // PAGE_SIZE) - (self.flushed_position // PAGE_SIZE)

    def release_flushed(self, keep_bytes: int) -> None:
        """Unmap flushed pages older than the last ``keep_bytes`` (when mapped; the page cache keeps them)."""
        m = self._mm
        if not isinstance(m, mmap.mmap):
            return
        end = self.flushed_position - keep_bytes if self.flushed_position < self.size else self.size
        end = min(end, len(m))
        if end - self.released_position >= PAGE_SIZE:
            start = self.released_position - self.released_position % PAGE_SIZE
            end -= end % PAGE_SIZE
            try:
                m.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass
            self.released_position = end

    def release_pages(self, start: int, end: int) -> None:
        m = self._mm
        if not isinstance(m, mmap.mmap):
            return
        start -= start % PAGE_SIZE
        end = min(end, len(m))
        end -= end % PAGE_SIZE
        if end > start:
            try:
                m.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass

    def advise_writes_from(self, pos: int) -> None:
        """Nothing to advise: a queue file's units are flushed in the background, never one send at a time, so
        the size of the page-cache folio around a unit costs no acknowledgement anything (``MappedFile``'s)."""

    def zero_from(self, pos: int) -> None:
        """Zero the file from ``pos`` to its end on disk (a truncated tail must read as unwritten units), then
        fdatasync: what stays before ``pos`` is durable too (the caller marks it flushed)."""
        self._image = None
        buf = self._mm
        if self.pending and isinstance(buf, bytearray):
            buf[pos:] = bytes(len(buf) - pos) if pos < len(buf) else b""
            return
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            chunk = 1 << 20
            p = pos
            while p < self._len:
                n = min(chunk - (p % chunk), self._len - p)
                if os.pread(fd, n, p).strip(b"\x00"):
                    os.pwrite(fd, bytes(n), p)
                p += n
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def extend_sparse(self) -> None:
        """Make the file its full size without writing (the missing tail is a hole that reads as zeros): for a file
        that is not its queue's last and so is never written again, while readers may look anywhere in it."""
        if self.pending:
            buf = self._mm
            if isinstance(buf, bytearray) and not buf.strip(b"\x00"):
                # Nothing written (a gap skipped all of it): a sparse file of its full size, never mapped.
                self.pending = False
                self._mm = None
                self._len = self._create(0)
            else:
                self.prepare()
                self.install()
        if self._len >= self.size:
            return
        self._mm = None
        self._lru.drop(self)
        os.truncate(self.path, self.size)
        self._len = self.size

    def close(self) -> None:
        self._lru.drop(self)
        self._image = None

    def destroy(self) -> None:
        """Delete the file. Its mapping, if it has one, is left to go with the last reference to it: a reader that
        found the file just before (retention deletes under the store lock, reads take none) still reads its units."""
        self._dead = True
        self.pending = False
        self._lru.forget(self)
        self._image = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class ConsumeQueueFiles(MappedFileQueue):
    """The files of one consume queue (``MappedFileQueue``'s lookups and truncation over ``ConsumeQueueFile``)."""

    def __init__(self, directory: Path, file_size: int, lru: MappingLRU) -> None:
        super().__init__(directory, file_size, preallocate=False)
        self.lru = lru
        self.files: list[ConsumeQueueFile] = []  # type: ignore[assignment]

    @property
    def first(self) -> ConsumeQueueFile | None:  # type: ignore[override]
        return self.files[0] if self.files else None

    @property
    def last(self) -> ConsumeQueueFile | None:  # type: ignore[override]
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> ConsumeQueueFile | None:  # type: ignore[override]
        return super().find(offset)  # type: ignore[return-value]

    def load(self, directory: str | None = None) -> None:
        """The files on disk, not mapped (``directory``: this queue's folder as a string, when the caller has it).
        As ``MappedFileQueue.load``, except that any file may be shorter than its size (it grows as it fills): a
        short one that is not the last is extended sparse, so reads inside it stay inside the file."""
        try:
            with os.scandir(directory or self.directory) as it:
                entries = sorted((e.name, e.stat().st_size) for e in it if len(e.name) == 20 and e.name.isdigit())
        except FileNotFoundError:
            return
        expected: int | None = None
        for i, (name, length) in enumerate(entries):
            start = int(name)
            path = self.directory / name
            if start % self.file_size != 0 or (expected is not None and start != expected):
                log.error("consume-queue file %s does not follow the queue (expected start %s); it and later ones "
                          "are set aside", path, expected)
                for later, _ in entries[i:]:
                    p = self.directory / later
                    p.rename(p.with_name(later + ".bad"))
                break
            if length > self.file_size:
                log.warning("consume-queue file %s is %d bytes, past its size %d: cutting the excess off", path,
                            length, self.file_size)
                os.truncate(path, self.file_size)
                length = self.file_size
            f = ConsumeQueueFile(path, self.file_size, self.lru, length=length)
            if i < len(entries) - 1 and length < self.file_size:
                f.extend_sparse()
            # Positions are set by recovery; until then treat loaded files as full.
            f.wrote_position = f.flushed_position = self.file_size
            self._push(f)  # type: ignore[arg-type]
            expected = start + self.file_size

    def last_for_append(self, start_offset: int = 0) -> ConsumeQueueFile:  # type: ignore[override]
        """The file that takes the next unit: a new one (pending: nothing on disk yet) when there is none or the last
        is full."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full:
            return last
        if last is not None:
            if last._len < last.size:
                last.extend_sparse()  # marked full by a gap: readers may look anywhere in it
            start = last.end_offset
        else:
            start = start_offset - (start_offset % self.file_size)
        f = ConsumeQueueFile(self.directory / f"{start:020d}", self.file_size, self.lru, new=True)
        if last is None and start_offset > start:
            f.wrote_position = f.flushed_position = start_offset - start
        self._push(f)  # type: ignore[arg-type]
        return f

    def set_write_end(self, offset: int) -> None:
        """As ``MappedFileQueue.set_write_end``; a pending last file's units before ``offset`` stay unflushed (they are
        not on disk yet)."""
        last = self.last
        flushed = last.flushed_position if last is not None and last.pending else None
        super().set_write_end(offset)
        last = self.last
        if flushed is not None and last is not None and last.pending:
            last.flushed_position = min(flushed, last.wrote_position)

    def flush(self, least_pages: int = 0) -> int:
        """RocketMQ's consume-queue flush: a file is flushed when it is full or has at least ``least_pages`` dirty
        pages (0: whatever it has). Returns the flushed offset."""
        for f in list(self.files):
            if f.flushed_position < f.wrote_position and (
                    least_pages <= 0 or f.is_full or f.dirty_pages() >= least_pages):
                if f.pending:
                    f.prepare()
                    f.install()
                f.flush()
        return self.flushed_offset

    def release_flushed(self, keep_bytes: int) -> None:
        for f in self.files:
            if f._mm is not None and f.released_position < f.flushed_position:
                f.release_flushed(keep_bytes if f is self.files[-1] else 0)

    def drop_images(self) -> None:
        for f in self.files:
            f._image = None
