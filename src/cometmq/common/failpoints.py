"""Crash points for fault injection (the chaos harness, tests/chaos): a process started with
``COMETMQ_FAILPOINTS=name[@N][,name[@N]…]`` dies at once (``os._exit``, no cleanup, no flush: what a power cut or
SIGKILL leaves) the N-th time (default: the first) it reaches ``hit(name)``. Unset, ``hit`` is one dict lookup.

The points (grep ``failpoints.hit``):

| name | where |
|---|---|
| ``ha.promote.epoch_written`` | a broker becoming master: its new epoch entry is durable, it takes no write yet |
| ``ha.demote.role_set`` | a master becoming a replica: its role changed, its master services not yet stopped |
| ``ha.truncate.log_cut`` | a replica's truncation: the log is cut back, its epoch file not yet |
| ``controller.elect.committed`` | the controller leader: an election is in the log, the brokers not yet told |
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "COMETMQ_FAILPOINTS"
#: the exit status of a process a failpoint ended (as a SIGKILL'd one)
EXIT_CODE = 137

log = logging.getLogger(__name__)


def _parse(text: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, count = part.partition("@")
        if not name or (count and not count.isdigit()) or (count and int(count) < 1):
            raise ValueError(f"{ENV}: {part!r} is not NAME or NAME@N (N ≥ 1)")
        points[name] = int(count or 1)
    return points


_armed: dict[str, int] = _parse(os.environ.get(ENV, ""))


def hit(name: str) -> None:
    """Die here if ``name`` is armed and this is its N-th hit."""
    if not _armed or name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] <= 0:
        sys.stderr.write(f"failpoint {name}: exiting\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)


def arm(spec: str) -> None:
    """Replace the armed points (tests in one process)."""
    global _armed
    _armed = _parse(spec)
