"""The epoch file of a broker group replica: which master epoch wrote which range of the commit log.

Each entry says "epoch E starts at log offset S"; an entry ends where the next one starts, the last one at the
log end. Replicas compare their entries in the HA handshake to find the last offset where their logs agree
(``find_consistent_point``) and truncate what lies past it (reference/controller-ha.md §1.3).

On disk it is RocketMQ's ``epochFileCheckpoint`` (common/.../utils/CheckpointFile.java, EpochFileCache.java):

    2             <- the number of entries
    773307083     <- CRC32 & 0x7FFFFFFF of the entry lines, each with its "\\n"; 0 means "not checked"
    7-7000        <- epoch-startOffset, one line per entry, oldest first
    8-8000

and ``epochFileCheckpoint.bak`` holding the previous content. Unlike Java, each file is replaced atomically
(temp file, fsync, rename, fsync of the folder), the ``.bak`` first, so a crash at any point leaves one good copy.
Loading reads the main file and falls back to the ``.bak`` when the main is missing or does not verify; both bad
raises ``EpochFileCorrupt``. An empty list removes both files (Java writes nothing then, and its reader would fall
back to a stale ``.bak``).

Differences from Java's EpochFileCache, on purpose:
- ``append`` does as Kafka's leader-epoch cache: a new entry replaces the entries starting at or after its start
  offset (Java refuses it, RocketMQ #9689), and an epoch below the last is refused (fencing).
- ``last_epoch()`` is 0 when there is none (Java: -1); epochs start at 1, so 0 is never an epoch.
- ``find_consistent_point`` never returns a point past the local log end.

Callers make the commit log's truncation durable before truncating this file (RocketMQ #10666). The object is
not thread-safe: one owner (the broker's event loop) calls it.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cometmq.common.atomic_file import fsync_dir, read_optional, write_atomic

__all__ = [
    "EpochEntry",
    "EpochFencedError",
    "EpochFile",
    "EpochFileCorrupt",
    "EpochRange",
    "appended",
    "consistent_point",
    "decode",
    "encode",
    "truncated_prefix",
    "truncated_suffix",
]

_MAX_EPOCH = (1 << 31) - 1  # an int on the wire and in Java
_MAX_OFFSET = (1 << 63) - 1
_LINE = re.compile(r"(\d{1,10})-(\d{1,19})")
_NEWLINES = re.compile(r"\r\n|\r|\n")  # Java's BufferedReader.readLine


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochRange(NamedTuple):
    """An entry with its end: the next entry's start, or for the last one the log end given (None: open)."""

    epoch: int
    start_offset: int
    end_offset: int | None


class EpochFileCorrupt(Exception):
    """Neither the epoch file nor its ``.bak`` can be read: an operator must look (the log is not touched)."""


class EpochFencedError(ValueError):
    """An entry for an epoch older than the last one: a stale master or a stale role change."""


# -- the format ---------------------------------------------------------------------------------------------------
def _crc(entry_lines: str) -> int:
    return zlib.crc32(entry_lines.encode()) & 0x7FFFFFFF


def encode(entries: Sequence[tuple[int, int]]) -> bytes:
    lines = "".join(f"{epoch}-{start}\n" for epoch, start in entries)
    return f"{len(entries)}\n{_crc(lines)}\n{lines}".encode()


def decode(data: bytes) -> list[EpochEntry]:
    """Parse one file's content; ``ValueError`` naming what is wrong when it does not verify."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("not ASCII text") from None
    lines = _NEWLINES.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise ValueError("shorter than its two header lines")
    count_line, crc_line, *entry_lines = lines
    if not (count_line.isdigit() and crc_line.isdigit() and len(count_line) <= 10 and len(crc_line) <= 10):
        raise ValueError(f"bad header lines {count_line!r}, {crc_line!r}")
    count, expected_crc = int(count_line), int(crc_line)
    if count != len(entry_lines):
        raise ValueError(f"expects {count} entries, holds {len(entry_lines)} lines")
    crc = _crc("".join(line + "\n" for line in entry_lines))
    if expected_crc != 0 and crc != expected_crc:  # 0: Java's "do not check" value
        raise ValueError(f"CRC mismatch: file says {expected_crc}, entries give {crc}")
    entries: list[EpochEntry] = []
    for line in entry_lines:
        m = _LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"bad entry line {line!r}")
        entries.append(EpochEntry(int(m[1]), int(m[2])))
    _check_order(entries)
    return entries


def _check_order(entries: Sequence[EpochEntry]) -> None:
    for e in entries:
        if not 1 <= e.epoch <= _MAX_EPOCH or not 0 <= e.start_offset <= _MAX_OFFSET:
            raise ValueError(f"entry {e.epoch}-{e.start_offset} out of range")
    for prev, cur in itertools.pairwise(entries):
        if cur.epoch <= prev.epoch or cur.start_offset <= prev.start_offset:
            raise ValueError(f"entries out of order: {prev.epoch}-{prev.start_offset} then "
                             f"{cur.epoch}-{cur.start_offset}")


# -- the consistent point -----------------------------------------------------------------------------------------
def _ends(entries: Sequence[tuple[int, int]], max_offset: int) -> list[int]:
    return [entries[i + 1][1] for i in range(len(entries) - 1)] + ([max_offset] if entries else [])


def consistent_point(local: Sequence[tuple[int, int]], local_max_offset: int,
                     master: Sequence[tuple[int, int]], master_max_offset: int) -> int | None:
    """The offset up to which the local log agrees with the master's, or None when no entry is shared.

    As AutoSwitchHAClient.doTruncate and EpochFileCache.findConsistentPoint: the last entry of each list ends at
    its own log end; walk the local entries newest first; at the first one whose epoch the master has with the
    same start offset, the point is the smaller of the two entries' ends. An empty local list means a new
    replica: nothing to compare, nothing is truncated (the local log end is returned). The point is never past
    the local log end (Java's last entry keeps an endless end when the log ends before its start).
    """
    if not local:
        return local_max_offset
    if local[0][1] >= local_max_offset:
        # No byte of the local log lies under any of its epochs (an empty log that learned an epoch nobody wrote
        # in: a master replaces such an epoch by its own at the same start). Nothing to disagree with.
        return local_max_offset if local_max_offset <= master_max_offset else None
    master_ends = _ends(master, master_max_offset)
    by_epoch = {epoch: (start, end) for (epoch, start), end in zip(master, master_ends, strict=True)}
    local_ends = _ends(local, local_max_offset)
    for (epoch, start), end in zip(reversed(local), reversed(local_ends), strict=True):
        theirs = by_epoch.get(epoch)
        if theirs is not None and theirs[0] == start:
            return max(0, min(end, theirs[1], local_max_offset))
    return None


# -- changes, as pure functions of the entry list -----------------------------------------------------------------
def appended(entries: Sequence[EpochEntry], epoch: int, start_offset: int) -> list[EpochEntry] | None:
    """The entries after recording that ``epoch`` starts at ``start_offset``; None when nothing changes.

    As Kafka's LeaderEpochFileCache.assign: the entries starting at or after ``start_offset`` are replaced (Java
    refuses such an entry, RocketMQ #9689). The last epoch again at or past its own start is already covered:
    nothing changes; at an earlier start, its start moves back. An epoch below the last one raises
    ``EpochFencedError``.
    """
    if not 1 <= epoch <= _MAX_EPOCH:
        raise ValueError(f"epoch {epoch} out of range 1..{_MAX_EPOCH}")
    if not 0 <= start_offset <= _MAX_OFFSET:
        raise ValueError(f"start offset {start_offset} out of range")
    if entries:
        last = entries[-1]
        if epoch < last.epoch:
            raise EpochFencedError(f"epoch {epoch} is older than the last epoch {last.epoch}")
        if epoch == last.epoch and start_offset >= last.start_offset:
            return None
    kept = [e for e in entries if e.start_offset < start_offset and e.epoch < epoch]
    return [*kept, EpochEntry(epoch, start_offset)]


def truncated_suffix(entries: Sequence[EpochEntry], offset: int) -> list[EpochEntry]:
    """Without the entries that start at or after ``offset``."""
    return [e for e in entries if e.start_offset < offset]


def truncated_prefix(entries: Sequence[EpochEntry], offset: int) -> list[EpochEntry]:
    """Without the entries that end at or before ``offset`` (the last entry never ends). Starts are never moved
    (Kafka moves the first one up to ``offset``): replicas match entries on their start offsets."""
    starts = [e.start_offset for e in entries]
    keep_from = max(0, min(bisect.bisect_right(starts, offset) - 1, len(entries) - 1))
    return list(entries[keep_from:])


# -- the file -----------------------------------------------------------------------------------------------------
class EpochFile:
    """The epoch entries of one replica, kept in memory and rewritten durably on every change."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.bak_path = self.path.with_name(self.path.name + ".bak")
        self._entries: list[EpochEntry] = []
        self._starts: list[int] = []
        #: the content last read or written that verifies: what the next write keeps as the .bak
        self._good: bytes | None = None
        self._load()

    # -- loading and saving -----------------------------------------------------------------------------------
    def _load(self) -> None:
        problems: list[str] = []
        for path in (self.path, self.bak_path):
            data = read_optional(path)
            if data is None:
                problems.append(f"{path.name}: missing")
                continue
            try:
                entries = decode(data)
            except ValueError as exc:
                problems.append(f"{path.name}: {exc}")
                continue
            self._set(entries)
            self._good = data
            return
        if any(not p.endswith(": missing") for p in problems):
            raise EpochFileCorrupt(f"epoch file {self.path} unreadable ({'; '.join(problems)})")
        # neither file: a broker that never had an epoch

    def _set(self, entries: list[EpochEntry]) -> None:
        self._entries = entries
        self._starts = [e.start_offset for e in entries]

    def _save(self, entries: list[EpochEntry]) -> None:
        if not entries:
            # .bak first: a crash in between leaves the main file, i.e. the content before this change
            for path in (self.bak_path, self.path):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            fsync_dir(self.path.parent)
            self._good = None
        else:
            data = encode(entries)
            if self._good is not None:
                write_atomic(self.bak_path, self._good)
            write_atomic(self.path, data)
            self._good = data
        self._set(entries)

    # -- reading ----------------------------------------------------------------------------------------------
    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def last_epoch(self) -> int:
        """The newest epoch, 0 when there is none."""
        return self._entries[-1].epoch if self._entries else 0

    def last_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def ranges(self, max_offset: int | None = None) -> list[EpochRange]:
        """The entries with their ends; the last one ends at ``max_offset`` (None: open)."""
        ends: list[int | None] = [*self._starts[1:], max_offset]
        return [EpochRange(e.epoch, e.start_offset, end) for e, end in zip(self._entries, ends, strict=False)]

    def _range(self, i: int, max_offset: int | None) -> EpochRange:
        e = self._entries[i]
        end = self._starts[i + 1] if i + 1 < len(self._starts) else max_offset
        return EpochRange(e.epoch, e.start_offset, end)

    def entry(self, epoch: int, max_offset: int | None = None) -> EpochRange | None:
        """The entry of ``epoch`` with its end, or None."""
        for i, e in enumerate(self._entries):
            if e.epoch == epoch:
                return self._range(i, max_offset)
        return None

    def find_epoch(self, offset: int, max_offset: int | None = None) -> EpochRange | None:
        """The entry whose range holds ``offset`` (start ≤ offset < end), or None. The last entry's range is
        open unless ``max_offset`` is given."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        found = self._range(i, max_offset)
        if found.end_offset is not None and offset >= found.end_offset:
            return None
        return found

    def find_consistent_point(self, master_entries: Sequence[tuple[int, int]], local_max_offset: int,
                              master_max_offset: int) -> int | None:
        """See ``consistent_point``: this file's entries against the master's handshake."""
        return consistent_point(self._entries, local_max_offset, master_entries, master_max_offset)

    # -- changing ---------------------------------------------------------------------------------------------
    def append(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True when the file changed. See ``appended``."""
        new = appended(self._entries, epoch, start_offset)
        if new is None:
            return False
        self._save(new)
        return True

    def truncate_suffix(self, offset: int) -> bool:
        """Drop the entries starting at or after ``offset`` (the log was cut there); the one holding it stays.
        True when the file changed."""
        new = truncated_suffix(self._entries, offset)
        if len(new) == len(self._entries):
            return False
        self._save(new)
        return True

    def truncate_prefix(self, offset: int) -> bool:
        """Drop the entries that end at or before ``offset`` (retention deleted the log below it); the last entry
        always stays. True when the file changed."""
        new = truncated_prefix(self._entries, offset)
        if len(new) == len(self._entries):
            return False
        self._save(new)
        return True

    def reset(self, entries: Iterable[tuple[int, int]]) -> None:
        """Replace every entry (tests, tools): the entries must be in order."""
        new = [EpochEntry(epoch, start) for epoch, start in entries]
        _check_order(new)
        self._save(new)
