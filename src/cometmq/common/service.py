"""One small base class for every background loop that runs in a thread.

A service waits on an event with a timeout, so ``wakeup()`` makes it run at once and the
interval is only the longest it sleeps. ``stop()`` wakes it, lets it finish one last pass
(``on_shutdown``) and joins the thread.
"""

from __future__ import annotations

import abc
import logging
import threading

from cometmq.common.failures import Failures

log = logging.getLogger(__name__)


class ServiceThread(abc.ABC):
    """Run ``run_once()`` every ``interval_s`` seconds or as soon as ``wakeup()`` is called."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.name = name
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: failing passes, logged once a spell (a lasting cause would otherwise log a traceback every pass)
        self._failures = Failures(log, f"service {name}")

    # -- to override -------------------------------------------------------------------
    @abc.abstractmethod
    def run_once(self) -> None:
        """One pass of the service's work."""

    def on_shutdown(self) -> None:
        """Called once in the service thread after the loop ends (default: one last pass)."""
        self.run_once()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        # Callers publish their work before waking us; the loop clears the flag before it runs, so
        # a flag still set means a pass that will see that work is already due. Skip the costly set.
        if not self._wake.is_set():
            self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stopped.is_set():
                break
            try:
                self.run_once()
            except Exception as exc:  # a background loop must survive one bad pass
                self._failures.failed(exc, f"service {self.name} failed a pass")
            else:
                self._failures.passed()
        try:
            self.on_shutdown()
        except Exception:
            log.exception("service %s failed on shutdown", self.name)
