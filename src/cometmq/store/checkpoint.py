"""The checkpoint: how far the commit log and the consume queues/index are known to be on disk.

``dispatched_offset`` is a commit-log offset below which every consume-queue unit and index entry
has been flushed, so recovery re-dispatches only from there. Written atomically, so it is either the
old or the new one, never a torn mix.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from cometmq.common.atomic_file import read_optional, write_atomic


@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_flushed: int = 0
    dispatched_offset: int = 0
    timestamp_ms: int = 0
    #: set only by a clean shutdown: the exact end of the log then
    clean_end_offset: int = -1

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), sort_keys=True).encode())

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        """The saved checkpoint, or None when it is missing or unreadable."""
        data = read_optional(path)
        if data is None:
            return None
        try:
            raw = json.loads(data)
            return cls(
                commitlog_flushed=int(raw["commitlog_flushed"]),
                dispatched_offset=int(raw["dispatched_offset"]),
                timestamp_ms=int(raw.get("timestamp_ms", 0)),
                clean_end_offset=int(raw.get("clean_end_offset", -1)),
            )
        except (ValueError, KeyError, TypeError, OverflowError):  # (a number read as infinity)
            return None
