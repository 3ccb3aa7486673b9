"""The broker's one-line summary, logged every ``statsLogIntervalSec`` (60 s; 0: off), like RocketMQ's per-minute
TPS lines in its broker and store logs::

    [BROKER] broker-a putTps 120.5 getTps 118.2 putTotal 7230 getTotal 7092 topics 3 groups 2 consumers 4 \
producers 1 heldPulls 4 diskRatio 0.41

``putTotal`` and ``getTotal`` are the broker's counters (cometmq.broker.stats, kept with metrics on or off): messages
producers stored and messages handed to consumers (pull and POP). Totals are since the broker started; rates over
the interval just ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cometmq.common.periodic import Periodic

log = logging.getLogger("cometmq.broker.stats")


@dataclass(frozen=True, slots=True)
class Totals:
    put: int
    get: int


class StatsLog:
    """Log one summary line per interval; ``totals`` gives the counts since some origin, ``gauges`` the
    name/value pairs appended as they are."""

    def __init__(self, broker_name: str, interval_s: float, totals: Callable[[], Totals],
                 gauges: Callable[[], dict[str, object]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker_name = broker_name
        self.interval_s = interval_s
        self._totals = totals
        self._gauges = gauges
        self._clock = clock
        self._origin = Totals(0, 0)
        self._last = Totals(0, 0)
        self._last_at = 0.0
        self._periodic = Periodic("broker-stats-log", interval_s, self.log_once, logger=log)

    def start(self) -> None:
        if self.interval_s <= 0:
            return
        self._origin = self._last = self._totals()
        self._last_at = self._clock()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def line(self) -> str:
        """The summary since the previous line (or since ``start``), and move the window on."""
        now, totals = self._clock(), self._totals()
        elapsed = max(now - self._last_at, 1e-9)
        put_tps = max(totals.put - self._last.put, 0) / elapsed
        get_tps = max(totals.get - self._last.get, 0) / elapsed
        self._last, self._last_at = totals, now
        gauges = " ".join(f"{name} {value}" for name, value in self._gauges().items())
        return (f"[BROKER] {self.broker_name} putTps {put_tps:.1f} getTps {get_tps:.1f} "
                f"putTotal {max(totals.put - self._origin.put, 0)} getTotal {max(totals.get - self._origin.get, 0)}"
                + (f" {gauges}" if gauges else ""))

    def log_once(self) -> None:
        log.info("%s", self.line())
