"""The workloads every client implements, and the timing helpers they share.

All results are plain dicts. Throughput is *acknowledged* messages over the wall time from the first send to
the last acknowledgement; connection set-up and one warm-up round are outside the timed part.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_summary(samples_ms: list[float], sent: int) -> dict[str, Any]:
    s = sorted(samples_ms)

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {"sent": sent, "received": len(s), "median_ms": r(percentile(s, 0.5)), "p99_ms": r(percentile(s, 0.99)),
            "p999_ms": r(percentile(s, 0.999)), "max_ms": r(s[-1] if s else None)}


def stamp() -> bytes:
    """A body that carries its send time (perf_counter_ns: one clock, sender and receiver in one process)."""
    return str(time.perf_counter_ns()).encode()


def since_ms(body: bytes, now_ns: int) -> float:
    return (now_ns - int(body)) / 1e6


async def run_workers(n: int, batch: int, max_count: int, seconds: float,
                      step: Callable[[int, int], Awaitable[None]]) -> dict[str, Any]:
    """``n`` concurrent loops, each calling ``step(worker, k)`` to send ``k`` (<= ``batch``) messages and wait
    for their acknowledgement, until ``max_count`` messages were started or ``seconds`` passed."""
    started = 0
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal started, done
        while started < max_count and time.perf_counter() < deadline:
            k = min(batch, max_count - started)
            started += k
            await step(w, k)
            done += k

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(n)))
    wall = time.perf_counter() - t0
    return {"messages": done, "seconds": round(wall, 4), "msgs_per_s": round(done / wall) if wall > 0 else 0}


async def paced(count: int, interval_ms: float, send: Callable[[], Awaitable[Any]]) -> None:
    """Call ``send`` ``count`` times on a fixed schedule (a late send does not shift the later ones)."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for _ in range(count):
        next_at += interval_ms / 1000
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        await send()


class BenchClient(ABC):
    """``stream`` is a topic / stream key / stream name, fresh for each workload."""

    #: how this client is configured, for the report
    settings: str = ""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    @abstractmethod
    async def produce(self, stream: str, size: int, max_count: int, seconds: float) -> dict[str, Any]:
        """Throughput with the client's batching / pipelining."""

    async def fill(self, stream: str, size: int, count: int) -> dict[str, Any]:
        """Build a backlog of exactly ``count`` messages (not a reported workload)."""
        return await self.produce(stream, size, count, 3600.0)

    @abstractmethod
    async def consume(self, stream: str, count: int) -> dict[str, Any]:
        """Read a backlog of ``count`` messages from its start."""

    @abstractmethod
    async def latency(self, stream: str, count: int, interval_ms: float) -> dict[str, Any]:
        """An idle consumer woken by one message every ``interval_ms``: send -> delivery latency."""

    @abstractmethod
    async def acked(self, stream: str, size: int, producers: int, max_count: int, seconds: float,
                    fsync: bool = True) -> dict[str, Any]:
        """One message per request, each waiting for the broker's acknowledgement, ``producers`` at once.
        ``fsync``: acknowledge only after an fsync, where the system has that as a runtime switch (Redis)."""

    async def acked_auto_batch(self, stream: str, size: int, producers: int, max_count: int,
                               seconds: float) -> dict[str, Any]:
        """:meth:`acked` with the client's producer auto-batching on (concurrent sends coalesced into batch
        requests, each sender still waiting for its own acknowledgement); only clients that have it."""
        raise NotImplementedError(f"{type(self).__name__} has no producer auto-batching")

    async def delete(self, stream: str) -> None:
        """Drop the stream (so a later workload's memory is not inflated by this one)."""
        return None
