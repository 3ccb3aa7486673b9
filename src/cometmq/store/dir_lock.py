"""One broker per data folder: an exclusive lock on ``DATA/lock``, held while the broker runs.

RocketMQ does the same (``storePathRootDir/lock``, ``FileChannel.tryLock``; a second broker stops with "Lock
failed, MQ already started"). The lock is a POSIX record lock (``fcntl.lockf``): the kernel drops it when the
process ends, even after a crash, so a stale file never blocks a start. Such locks belong to the process, so
brokers restarted inside one process (tests, embedding) never block each other; the count below keeps the lock
until the last of them lets go (closing any descriptor of the file would drop it).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from cometmq.store.config import ConfigError

LOCK_NAME = "lock"

_held: dict[Path, tuple[int, int]] = {}  # folder -> (descriptor, holders in this process)
_guard = threading.Lock()


class DataFolderInUse(ConfigError):
    """Another process holds the data folder's lock."""


def lock_data_folder(folder: str | Path) -> Path:
    """Take the lock of ``folder`` (made if missing) for this process; returns the folder as the key to
    :func:`unlock_data_folder`. Raises :class:`DataFolderInUse` when another process holds it, and ConfigError
    when the folder cannot be made or written."""
    path = Path(folder).resolve()
    with _guard:
        if path in _held:
            fd, count = _held[path]
            _held[path] = (fd, count + 1)
            return path
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"data folder {path} cannot be used: {exc.strerror or exc}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (process {owner})" if owner.isdigit() else ""
            raise DataFolderInUse(f"data folder {path} is in use by another broker{who}; stop it first, or give "
                                  "another --data / storePathRootDir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[path] = (fd, 1)
        return path


def unlock_data_folder(path: Path) -> None:
    """Let go of a lock taken by :func:`lock_data_folder`; the last holder in this process releases it."""
    with _guard:
        entry = _held.get(path)
        if entry is None:
            return
        fd, count = entry
        if count > 1:
            _held[path] = (fd, count - 1)
            return
        del _held[path]
        os.close(fd)  # closing drops the lock; the file stays (RocketMQ's stays too)
