"""Waiting for a condition with a deadline: ``eventually`` on the event loop, ``wait_until`` in plain threads.

Both poll ``pred`` every ``step`` seconds, return the seconds it took to hold, and raise ``AssertionError``
naming ``what`` when ``timeout`` passes first. Prefer awaiting an event where the code offers one; these are for
effects with no event to wait on (another process, a background pass, a socket's far side).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


def _timed_out(timeout: float, what: str) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}")


async def eventually(pred: Callable[[], object], timeout: float = 10.0, *, what: str, step: float = 0.01) -> float:
    """Await until ``pred()`` is true; ``pred`` may be a coroutine function (e.g. a request to the broker)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        ok = pred()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return loop.time() - start
        if loop.time() - start > timeout:
            raise _timed_out(timeout, what)
        await asyncio.sleep(step)


def wait_until(pred: Callable[[], object], timeout: float, what: str, *, step: float = 0.1) -> float:
    """Block until ``pred()`` is true: for tests that drive subprocesses or a synchronous client."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise _timed_out(timeout, what)
        time.sleep(step)
    return time.monotonic() - start
