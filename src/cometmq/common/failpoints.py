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
| ``spark.commit.after_marker.<batchId>`` | a Spark exactly-once commit: the batch's marker is stored, no COMMIT sent |
| ``spark.commit.partial.<batchId>`` | a Spark exactly-once commit: half of the batch's COMMITs answered |

With ``COMETMQ_FAILPOINTS_KILL=session`` a failpoint SIGKILLs the process group of its session's leader instead
(e.g. a Spark driver started with ``start_new_session=True`` and its JVM, when the point is reached in a Python
worker the JVM started, which may sit in a process group of its own). Only for processes started in a session of
their own: the leader of a terminal's session is its shell.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

ENV = "COMETMQ_FAILPOINTS"
#: ``session``: a failpoint SIGKILLs its session leader's process group, not only its process
KILL_ENV = "COMETMQ_FAILPOINTS_KILL"
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
        if os.environ.get(KILL_ENV) == "session":
            os.killpg(os.getsid(0), signal.SIGKILL)
        os._exit(EXIT_CODE)


def armed(name: str) -> bool:
    """Whether ``name`` is armed (a caller that must reach the point somewhere particular can then arrange it)."""
    return name in _armed


def arm(spec: str) -> None:
    """Replace the armed points (tests in one process)."""
    global _armed
    _armed = _parse(spec)
