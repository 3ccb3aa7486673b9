"""Memory-mapped segment files and the ordered queue of them.

A segment is named by the 20-digit offset of its first byte. Writes copy into the mapping;
reads hand out memoryviews of it (no copy). Flushing msyncs the written range, which on Linux
reaches the disk like fsync does.
"""

from __future__ import annotations

import bisect
import errno
import functools
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cometmq.common.native import load_c_helper
from cometmq.store.epoch_file import EpochFileCorrupt

log = logging.getLogger(__name__)


class StoreFileCorrupt(EpochFileCorrupt):
    """A store file too damaged to start on without losing the whole log: an operator must look. A subclass of
    ``EpochFileCorrupt``, which ``cometmq serve`` turns into "cannot start: ..." without a traceback."""

PAGE_SIZE = mmap.PAGESIZE

#: Linux 5.14+: fault pages in writable without touching their contents
MADV_POPULATE_WRITE = 23


@functools.cache
def _ctypes_populate_write() -> Callable[[mmap.mmap, int, int], int] | None:
    """``populate_write`` through ctypes (libc's madvise; ctypes releases the GIL for the call), where the C helper
    was not built; None where libc cannot be reached."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int

    def populate_write(mm: mmap.mmap, start: int, length: int) -> int:
        probe = (ctypes.c_char * 1).from_buffer(mm)
        base = ctypes.addressof(probe)
        del probe  # no export may outlive this call: close() must be able to unmap
        return ctypes.get_errno() if fn(base + start, length, MADV_POPULATE_WRITE) != 0 else 0

    return populate_write


#: the C helpers (cometmq.common._osc), when built
_osc = load_c_helper("cometmq.common._osc")


def _populate() -> Callable[[mmap.mmap, int, int], int] | None:
    """madvise(MADV_POPULATE_WRITE) over part of a mapping, without the GIL (``mmap.madvise`` holds it): returns 0 or
    the errno. The C helper's, else ctypes' (loaded at the first warm, not at import)."""
    return _osc.populate_write if _osc is not None else _ctypes_populate_write()


def segment_name(offset: int) -> str:
    return f"{offset:020d}"


#: os.sendfile where the system has it (Linux, macOS, BSDs)
_sendfile = getattr(os, "sendfile", None)


class MappedFile:
    """One fixed-size segment file mapped into memory."""

    __slots__ = ("_fd", "_view", "_warm_lock", "file_from_offset", "flushed_position", "mm", "path",
                 "released_position", "size", "warmed_position", "wrote_position")

    def __init__(self, path: Path, size: int, *, preallocate: bool = True) -> None:
        self.path = path
        self.size = size
        self.file_from_offset = int(path.name)
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            current = os.fstat(fd).st_size
            if current != size:
                if existed and current > size:
                    raise OSError(f"segment {path} is {current} bytes, expected {size}")
                os.ftruncate(fd, size)
            if preallocate and not existed:
                # Reserve blocks now: with a full disk this fails here, with a clear error, instead of
                # raising SIGBUS later when a write touches an unbacked mapped page.
                os.posix_fallocate(fd, 0, size)
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            if not existed:
                try:
                    path.unlink()
                except OSError:
                    pass
            raise
        self._fd = fd
        self._view = memoryview(self.mm)
        #: pages before this were faulted in ahead of the writer (``warm``); the lock keeps close() out
        self.warmed_position = 0
        self._warm_lock = threading.Lock()
        self.wrote_position = 0
        self.flushed_position = 0
        self.released_position = 0

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

    # -- data ------------------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` at the write position; returns the position it was written at."""
        pos = self.wrote_position
        n = len(data)
        self.mm[pos : pos + n] = data
        self.wrote_position = pos + n
        return pos

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        self.mm[pos : pos + len(data)] = data

    def view(self, pos: int, size: int) -> memoryview:
        """A zero-copy view of ``size`` bytes at file position ``pos``."""
        return self._view[pos : pos + size]

    def send_to(self, sock_fd: int, pos: int, size: int) -> int:
        """Send ``size`` bytes at file position ``pos`` to the non-blocking socket ``sock_fd`` with sendfile(2):
        the kernel takes them from the page cache, no copy through this process. Returns how many it took now;
        0 when it took none: the socket is full, the connection failed (the caller's write through its
        transport reports that), the segment is closed or being warmed (its lock is not waited for: this runs on
        the event loop), or the system has no sendfile. The caller writes the rest from the mapping."""
        if _sendfile is None or not self._warm_lock.acquire(blocking=False):
            return 0
        try:
            if self._fd < 0:  # closed (the lock keeps close() from running during the call)
                return 0
            sent: int = _sendfile(sock_fd, self._fd, pos, size)
            return sent
        except OSError:
            return 0
        finally:
            self._warm_lock.release()

    def flush(self) -> int:
        """Flush everything written so far; returns the new flushed position."""
        target = self.wrote_position
        if target > self.flushed_position:
            # fdatasync writes the mapping's dirty pages like msync does, but releases the GIL while
            # it waits for the disk (mmap.flush holds it), so appends go on during a group commit.
            os.fdatasync(self._fd)
            self.flushed_position = target
        return self.flushed_position

    def dirty_pages(self) -> int:
        return (self.wrote_position // PAGE_SIZE) - (self.flushed_position // PAGE_SIZE)

    def release_flushed(self, keep_bytes: int) -> None:
        """Release flushed bytes older than the last ``keep_bytes`` (hot ones stay mapped)."""
        self._release_behind(self.flushed_position, keep_bytes, PAGE_SIZE)

    def release_written(self, keep_bytes: int, least_bytes: int) -> None:
        """Release written bytes older than the last ``keep_bytes``, flushed or not, once there are
        ``least_bytes`` of them. Their dirty state stays with the page cache, which the next flush writes, and
        that flush then has no mapping of them to write-protect: one TLB shoot-down for the whole range here
        instead of one per page during writeback."""
        self._release_behind(self.wrote_position, keep_bytes, least_bytes)

    def _release_behind(self, position: int, keep_bytes: int, least_bytes: int) -> None:
        """Release what lies more than ``keep_bytes`` before ``position`` (all of a full segment), once that is
        ``least_bytes`` past what was released already."""
        end = position - keep_bytes if position < self.size else self.size
        if end - self.released_position >= least_bytes:
            self.release_pages(self.released_position, end)
            self.released_position = end - end % PAGE_SIZE

    def release_pages(self, start: int, end: int) -> None:
        """Drop this process's mapping of a flushed range (the page cache keeps it): bounds RSS. The range is
        written, so it gets the kernel's usual read-ahead back (``advise_writes_from`` turned it off)."""
        start -= start % PAGE_SIZE
        end -= end % PAGE_SIZE
        if end > start:
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
                self.mm.madvise(mmap.MADV_NORMAL, start, end - start)
            except (OSError, ValueError):
                pass

    def advise_writes_from(self, pos: int) -> None:
        """Have the pages from ``pos`` on faulted in one at a time (MADV_RANDOM) instead of read ahead.

        Read-ahead grows as the writer faults pages in order, and on Linux 6.x it builds the page cache of an
        ext4 file from large folios, up to 2 MiB: one 200-byte append then dirties 2 MiB, and each fdatasync of
        a durable (SYNC_FLUSH) send writes 2 MiB. Measured on this machine kind: a 200-byte write + fdatasync
        took 0.13 ms on a fresh segment and 0.60 ms once 200 MB had been written through the mapping; with this
        advice 0.15 ms. Only the part not written yet is advised; ``release_pages`` gives the part behind the
        writer its read-ahead back, for cold reads of it later."""
        start = -(-pos // PAGE_SIZE) * PAGE_SIZE
        if start < self.size:
            try:
                self.mm.madvise(mmap.MADV_RANDOM, start, self.size - start)
            except (OSError, ValueError):  # not on this system: only the write size per flush is at stake
                pass

    def zero_from(self, pos: int) -> None:
        """Zero the file from ``pos`` to its end (truncating a torn or rejected tail).

        Stale records left past the end would be read back as valid by a later recovery scan, so the
        tail must be zero. Only chunks that hold something are written, so a clean tail costs a read, and only of
        what the file system says holds data (``SEEK_DATA``/``SEEK_HOLE``): a preallocated segment's unwritten
        extents read as zeros without being read. Reading them would fault the whole 1 GiB segment into the page
        cache (2.5 s, and the process's RSS grows by as much) on every restart after a crash. A file system
        without hole reporting calls the whole file data, and it is all read, as before."""
        chunk = 1 << 20
        zeros = bytes(chunk)
        wrote = False
        for start, end in self._data_ranges(pos):
            p = start
            while p < end:
                n = min(chunk - (p % chunk), end - p)
                if self.mm[p : p + n] != zeros[:n]:
                    self.mm[p : p + n] = zeros[:n]
                    wrote = True
                p += n
        if wrote:
            os.fdatasync(self._fd)

    def _data_ranges(self, pos: int) -> list[tuple[int, int]]:
        """The ranges from ``pos`` to the file's end that may hold something other than zeros (holes and
        unwritten extents left out; the page cache's dirty pages count as data)."""
        out: list[tuple[int, int]] = []
        p = pos
        while p < self.size:
            try:
                start = os.lseek(self._fd, p, os.SEEK_DATA)
                end = os.lseek(self._fd, start, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data from p on
                    break
                return [*out, (p, self.size)]  # no hole reporting here: read it all
            if start >= self.size:
                break
            out.append((start, min(end, self.size)))
            p = end
        return out

    def last_modified(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return time.time()

    def warm(self, target: int, step: int = 4 << 20) -> bool:
        """Fault the pages up to ``target`` in, writable, before the writer gets there (the contents are not
        touched). A first write to a page of a fresh segment otherwise faults inside the append, holding the
        GIL: on this kind of VM a 300 KiB append sometimes took 30 ms instead of 50 µs. The kernel does the work
        here with the GIL released. False when the system cannot (an old kernel: the caller stops trying);
        other failures (no memory, a sparse file on a full disk) end this pass only."""
        populate = _populate()
        if populate is None:
            return False
        target = min(target, self.size)
        with self._warm_lock:
            if self._fd < 0:
                return True
            start = max(self.warmed_position, self.wrote_position)
            start -= start % PAGE_SIZE
            while start < target:
                n = min(step, target - start)
                err = populate(self.mm, start, n)
                if err:
                    return err != errno.EINVAL
                start += n
                self.warmed_position = start
        return True

    def unwarm(self) -> int:
        """Drop the pages ``warm`` faulted in past the write position from this process's mapping (the page cache
        keeps them; a write or a later ``warm`` maps them again); returns the bytes dropped. The page holding the
        write position stays; the part not written yet keeps its advice (``advise_writes_from``)."""
        with self._warm_lock:
            if self._fd < 0:
                return 0
            start = -(-self.wrote_position // PAGE_SIZE) * PAGE_SIZE
            end = self.warmed_position
            if end <= start:
                return 0
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                return 0
            self.warmed_position = start
            return end - start

    def close(self) -> None:
        with self._warm_lock:
            self._close()

    def _close(self) -> None:
        try:
            self._view.release()
            self.mm.close()
        except BufferError:
            # A reader still holds a view (a response being written): the mapping is freed when it
            # lets go of it. The file descriptor can go now.
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1

    def destroy(self) -> None:
        """Close the file and delete it. The mapping is not unmapped here: it goes with the last reference to this
        segment. Retention deletes under the store lock and reads take none, so a reader may have found the segment
        just before; it still reads the bytes (the file's blocks are freed once it lets go) instead of failing on a
        released view or a closed mapping."""
        with self._warm_lock:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class FileRegion:
    """``size`` bytes at file position ``pos`` of a segment: what a pull answer can be sent straight from."""

    __slots__ = ("mf", "pos", "size")

    def __init__(self, mf: MappedFile, pos: int, size: int) -> None:
        self.mf, self.pos, self.size = mf, pos, size

    def send_to(self, sock_fd: int) -> int:
        """As much of the region as the socket takes now (see MappedFile.send_to)."""
        return self.mf.send_to(sock_fd, self.pos, self.size)


class MappedFileQueue:
    """The segments of one log, ordered by start offset, contiguous, all of one size."""

    def __init__(self, directory: Path, file_size: int, *, preallocate: bool = True, refuse_empty: bool = False,
                 set_aside_first: bool = False) -> None:
        self.directory = directory
        self.file_size = file_size
        self.preallocate = preallocate
        #: ``load`` refuses (StoreFileCorrupt) to set the first segment aside, unless ``set_aside_first``
        self.refuse_empty = refuse_empty
        self.set_aside_first = set_aside_first
        self.files: list[MappedFile] = []
        self._starts: list[int] = []

    def load(self) -> None:
        """Open the segments on disk. A gap or a wrongly sized file stops loading there.

        Bytes past the segment size (appended to the file: a copy gone wrong, a stray write) are no record: a
        record never reaches past its segment's size, so they are cut off, with a WARNING naming the file. A
        segment that does not fit otherwise is set aside with every later one (the log then ends before it: a
        suffix is lost). Setting aside the *first* segment would leave an empty log, whose offsets would start
        again from 0 under what consumers committed: with ``refuse_empty`` (the commit log) that is a refusal to
        start instead, ``StoreFileCorrupt`` naming the file, unless ``set_aside_first`` allows it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        names = sorted(p for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == 20)
        expected: int | None = None
        for path in names:
            start = int(path.name)
            size = path.stat().st_size
            aligned = start % self.file_size == 0 and (expected is None or start == expected)
            if size > self.file_size and aligned:
                log.warning("segment %s is %d bytes, %d past the segment size %d: bytes past the segment size "
                            "hold no record; cutting them off", path, size, size - self.file_size, self.file_size)
                os.truncate(path, self.file_size)
                size = self.file_size
            # A last segment cut short (a crash while it grew, a copy gone wrong) is extended and its
            # records recovered by the scan; anything else that does not fit is set aside.
            short_last = path == names[-1] and size < self.file_size
            if (size != self.file_size and not short_last) or not aligned:
                if not self.files and self.refuse_empty and not self.set_aside_first:
                    raise StoreFileCorrupt(
                        f"segment {path} does not fit the log (size {size}, segment size {self.file_size}, "
                        f"expected start {expected if expected is not None else 'a multiple of the size'}); it "
                        "is the first segment: setting it aside would empty the log (set "
                        "setAsideUnfitFirstSegment=true to start without it and what follows)")
                log.error("segment %s does not fit the queue (size %d); it and later ones are set aside",
                          path, size)
                for later in names[names.index(path):]:
                    later.rename(later.with_name(later.name + ".bad"))
                break
            mf = MappedFile(path, self.file_size, preallocate=False)
            # Positions are set by recovery; until then treat loaded files as full.
            mf.wrote_position = mf.flushed_position = self.file_size
            self._push(mf)
            expected = start + self.file_size

    def _push(self, mf: MappedFile) -> None:
        self.files.append(mf)
        self._starts.append(mf.file_from_offset)

    # -- lookup ----------------------------------------------------------------------------
    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """Offset just past the last written byte."""
        last = self.last
        return last.file_from_offset + last.wrote_position if last else 0

    @property
    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed_position:
                return mf.file_from_offset + mf.flushed_position
        return self.min_offset

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset``, or None when it lies outside the queue."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        try:
            mf = self.files[i]
        except IndexError:  # retention removed a segment under us
            return None
        # The range check also catches a list that shifted between the bisect and the lookup.
        start = mf.file_from_offset
        return mf if start <= offset < start + mf.size else None  # (end_offset, inlined: reads call this often)

    def last_for_append(self, start_offset: int = 0) -> MappedFile:
        """The segment to append to: a new one when there is none or the last is full."""
        last = self.last
        if last is not None and not last.is_full:
            return last
        if last is not None:
            start = last.end_offset
        else:
            start = start_offset - (start_offset % self.file_size)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / segment_name(start)
        # Segments are all one size (offsets and replicas' segments line up on it), so a segment that does not fit
        # the space left is refused, before any of it is allocated: ENOSPC, which the write path answers
        # SERVICE_NOT_AVAILABLE "disk full". Without preallocation it would be a sparse file, whose pages fault
        # (SIGBUS) when the disk fills under them.
        st = os.statvfs(self.directory)
        free = st.f_bavail * st.f_frsize
        if free < self.file_size:
            raise OSError(errno.ENOSPC, f"a new segment of {self.file_size} bytes does not fit in the {free} bytes "
                                        f"free on {self.directory}", str(path))
        mf = MappedFile(path, self.file_size, preallocate=self.preallocate)
        if last is None and start_offset > start:
            mf.wrote_position = mf.flushed_position = start_offset - start
        mf.advise_writes_from(mf.wrote_position)
        self._push(mf)
        return mf

    # -- maintenance -----------------------------------------------------------------------
    def flush(self) -> int:
        """Flush every segment with unflushed bytes; returns the flushed offset."""
        for mf in self.files:
            if mf.flushed_position < mf.wrote_position:
                mf.flush()
        return self.flushed_offset

    def release_flushed(self, keep_bytes: int) -> None:
        """Bound RSS: unmap flushed bytes behind the last ``keep_bytes`` of the queue."""
        for mf in self.files:
            if mf.released_position < mf.flushed_position:
                mf.release_flushed(keep_bytes if mf is self.files[-1] else 0)

    def release_written(self, keep_bytes: int, least_bytes: int) -> None:
        """``MappedFile.release_written`` on every segment (all of a full one)."""
        for mf in self.files:
            if mf.released_position < mf.wrote_position:
                mf.release_written(keep_bytes if mf is self.files[-1] else 0, least_bytes)

    def release_reads(self) -> None:
        """Unmap every segment's released part again: readers (a consumer far behind, a lookup by offset) fault
        pages of it back into the mapping, and the page cache keeps them anyway. One ``madvise`` per segment; a
        range with nothing mapped costs a page-table walk."""
        for mf in self.files:
            if mf.released_position > 0:
                mf.release_pages(0, mf.released_position)

    def dirty_pages(self) -> int:
        return sum(mf.dirty_pages() for mf in self.files if mf.flushed_position < mf.wrote_position)

    def set_write_end(self, offset: int) -> None:
        """Make ``offset`` the end of the log: later segments go, the tail of the last one is zeroed."""
        while self.files and self.files[-1].file_from_offset > offset:
            mf = self.files.pop()
            self._starts.pop()
            log.warning("removing segment %s past the end of the log at %d", mf.path.name, offset)
            mf.destroy()
        last = self.last
        if last is None:
            return
        pos = offset - last.file_from_offset
        if pos == last.size:
            last.wrote_position = last.flushed_position = pos
            return
        last.zero_from(pos)
        last.wrote_position = last.flushed_position = pos
        last.advise_writes_from(pos)

    def delete_first(self, count: int = 1) -> list[MappedFile]:
        removed = []
        for _ in range(min(count, len(self.files) - 1)):
            mf = self.files.pop(0)
            self._starts.pop(0)
            mf.destroy()
            removed.append(mf)
        return removed

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files.clear()
        self._starts.clear()
        try:
            self.directory.rmdir()
        except OSError:
            pass

    def close(self) -> None:
        for mf in self.files:
            mf.close()
