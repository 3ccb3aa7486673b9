"""How a background loop logs its failing passes: once a spell, not once a pass.

A loop that fails on every pass for a lasting reason (a full disk, a peer gone) would otherwise write a traceback
per pass, every few milliseconds for some services, for as long as the cause lasts: the log fills the disk that is
already full, and the first traceback, the one that says what went wrong, scrolls away. ``Failures`` keeps one
spell: its first failure is logged with the traceback; the same failure again (same type and message) only as a
count, at most every ``repeat_s``; a different one with its traceback; and the first pass that succeeds ends the
spell with one line. Used by both loop bases: ``ServiceThread`` (threads) and ``Periodic`` (the event loop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: how often a spell of the same failure is reported again (with how many passes failed since)
REPEAT_LOG_S = 60.0


class Failures:
    """The failing passes of one loop, ``name``, logged to ``logger``."""

    def __init__(self, logger: logging.Logger, name: str, *, repeat_s: float = REPEAT_LOG_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.name = name
        self.repeat_s = repeat_s
        self._clock = clock
        #: the failure of the spell (type and message), None outside a spell
        self._what: tuple[type[BaseException], str] | None = None
        self._logged_at = 0.0
        #: failed passes since the last line logged, and in the whole spell
        self._unlogged = 0
        self.in_spell = 0

    def failed(self, exc: BaseException, context: str) -> None:
        """A pass failed with ``exc``; ``context`` says what failed and what happens next (the logged line)."""
        what = (type(exc), str(exc))
        now = self._clock()
        self.in_spell += 1
        if what != self._what:
            self._what, self._logged_at, self._unlogged = what, now, 0
            self._log.error("%s", context, exc_info=exc)
            return
        self._unlogged += 1
        if now - self._logged_at >= self.repeat_s:
            self._log.error("%s (%d more passes failed so since the last report: %s: %s)", context, self._unlogged,
                            what[0].__name__, what[1])
            self._logged_at, self._unlogged = now, 0

    def passed(self) -> None:
        """A pass succeeded: a spell of failures, if any, is over."""
        if self._what is not None:
            self._log.warning("%s passes again, after %d failed pass(es)", self.name, self.in_spell)
            self._what, self._unlogged, self.in_spell = None, 0, 0
