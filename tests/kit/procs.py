"""Child processes a test started: stopped by their PID and their pipes closed, whatever the test's outcome."""

from __future__ import annotations

import subprocess


def reap(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Kill ``proc`` if it still runs, wait for it, and close its pipes (a test's ``finally``)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
