"""One fake clock for every suite: milliseconds since the epoch that move when the test moves them."""

from __future__ import annotations

import time

START_MS = 1_790_000_000_000  # a fixed instant (October 2026): far from 0, so no test mistakes "unset" for a time


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class FakeClock:
    """A ``Callable[[], int]`` of epoch milliseconds for the components that take a clock.

    It stands still until ``advance(ms)`` or an assignment to ``now``. ``start_ms=None`` starts it at the wall time
    (for code that compares it with file times, as retention does). ``ticking=True`` also lets real time pass, so a
    live broker's own timeouts still run while the test jumps ahead (POP invisibility). ``seconds`` is the same
    time in float seconds, for components whose clock is in seconds (the nameserver's route table).
    """

    def __init__(self, start_ms: int | None = START_MS, *, ticking: bool = False) -> None:
        self._start_ms = wall_ms() if start_ms is None else start_ms
        self._ticking = ticking
        self._since_ns = time.monotonic_ns()
        self._moved_ms = 0

    def __call__(self) -> int:
        now = self._start_ms + self._moved_ms
        if self._ticking:
            now += (time.monotonic_ns() - self._since_ns) // 1_000_000
        return now

    @property
    def now(self) -> int:
        return self()

    @now.setter
    def now(self, ms: int) -> None:
        self._moved_ms += ms - self()

    def advance(self, ms: int) -> None:
        self._moved_ms += ms

    def seconds(self) -> float:
        return self() / 1000

    def __repr__(self) -> str:
        return f"FakeClock(now={self()}{', ticking' if self._ticking else ''})"
