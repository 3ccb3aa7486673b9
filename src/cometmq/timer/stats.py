"""The timer's counters and its delivery-lateness histogram (what GET_TIMER_METRICS reports)."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: lateness histogram bucket upper bounds (ms); the last bucket is everything above
LATENESS_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000, 300_000)


class LatenessHistogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS_MS) + 1)
        self.count = 0
        self.total_ms = 0
        self.max_ms = 0

    def record(self, late_ms: int) -> None:
        self.record_many(late_ms, [0])

    def record_many(self, at_ms: int, dues: list[int]) -> None:
        """Messages due at ``dues`` delivered at ``at_ms``."""
        counts = self.counts
        find = bisect.bisect_left
        bounds = LATENESS_BUCKETS_MS
        total = 0
        worst = self.max_ms
        # Due times repeat within a batch (a burst: all of them), so each distinct one is placed once.
        for due, n in Counter(dues).items():
            late = at_ms - due
            if late < 0:
                late = 0
            counts[find(bounds, late)] += n
            total += late * n
            if late > worst:
                worst = late
        self.count += len(dues)
        self.total_ms += total
        self.max_ms = worst

    def quantile(self, q: float) -> int | None:
        """The upper bound of the bucket holding quantile ``q`` (None: no data; -1: above the last)."""
        if not self.count:
            return None
        want = q * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= want and c:
                return LATENESS_BUCKETS_MS[i] if i < len(LATENESS_BUCKETS_MS) else -1
        return -1

    def as_dict(self) -> dict[str, Any]:
        return {"bucketsMs": list(LATENESS_BUCKETS_MS), "counts": list(self.counts), "count": self.count,
                "sumMs": self.total_ms, "maxMs": self.max_ms, "p50Ms": self.quantile(0.5),
                "p99Ms": self.quantile(0.99)}


@dataclass
class TimerStats:
    enqueued: int = 0
    delivered: int = 0
    rolled: int = 0
    cancelled: int = 0
    duplicates_avoided: int = 0
    #: entries whose timer record could not be read back (removed, or not what the entry names)
    lost: int = 0
    illegal: int = 0
    put_failures: int = 0
    lateness: LatenessHistogram = field(default_factory=LatenessHistogram)



__all__ = ["LATENESS_BUCKETS_MS", "LatenessHistogram", "TimerStats"]
