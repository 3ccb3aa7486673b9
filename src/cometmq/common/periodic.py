"""The one base for background work on the event loop: a step run every interval, owned by a component.

The asyncio counterpart of ``ServiceThread`` (common/service.py, for loops that run in threads). A component
holds a ``Periodic`` per loop, starts it in its own ``start`` and stops it in its own ``stop``; the step is a
plain or async callable (what it returns is ignored, unless it is awaitable). ``wakeup()`` runs the step at once
instead of at the end of the interval; a wakeup during a pass runs another pass right after it, so none is lost.
An exception in one step is logged with the service's name (once a spell of the same failure: common/failures.py)
and the loop goes on: a background loop must survive one bad pass.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from cometmq.common.failures import Failures
from cometmq.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Step = Callable[[], object]


class Periodic:
    """Run ``step`` every ``interval_s`` seconds (after the first interval), or at once on ``wakeup()``.

    ``interval_s`` is read before each wait, so a component may change it while running.
    """

    def __init__(self, name: str, interval_s: float, step: Step, *, logger: logging.Logger | None = None) -> None:
        self.name = name
        self.interval_s = interval_s
        self._step = step
        #: failing steps, logged once a spell (a lasting cause would otherwise log a traceback every pass)
        self._failures = Failures(logger or log, name)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop on the running event loop; starting a running service does nothing."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end (a pass in progress is cancelled); idempotent."""
        task, self._task = self._task, None
        self._wake = None
        if task is not None and task is asyncio.current_task():
            return  # stopped by its own step: the loop ends when the step returns, the step is not cancelled
        await cancel_and_wait([task])

    def wakeup(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            if not wake.is_set():
                try:
                    async with asyncio.timeout(self.interval_s):
                        await wake.wait()
                except TimeoutError:
                    pass
            wake.clear()
            try:
                result = self._step()
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failures.failed(exc, f"{self.name} failed a pass; it runs again in {self.interval_s:.3g} s")
            else:
                self._failures.passed()
            if self._task is not asyncio.current_task():
                return  # stopped (or restarted) by the step itself
