"""Small state files written atomically: temp file, fsync, rename, fsync of the folder."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """``mode``: the file's permission bits, exactly (the umask aside), set before any byte is written (a file of
    secrets); None: 0644 less the umask."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A temp name of this writer's own: two writers of one file (a background persist and a stop) must not
    # rename each other's temp file away; the last rename wins, each whole.
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else 0o600)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the folder's entries (files created, renamed or removed in it) durable."""
    try:
        dir_fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_optional(path: str | os.PathLike[str]) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
