"""Redis streams through redis-py's asyncio client (hiredis parser), XADD / XREAD."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aioredis

from compare_lib.clients.base import BenchClient, latency_summary, paced, run_workers, since_ms, stamp

PIPELINE = 128
CONCURRENCY = 4
READ_COUNT = 5000


class RedisClient(BenchClient):
    settings = (f"redis-py asyncio with hiredis: pipelines (transaction=False) of {PIPELINE} XADDs, {CONCURRENCY} "
                f"pipelines in flight on their own connections; backlog read with XREAD COUNT {READ_COUNT}; latency "
                "with a blocking XREAD on its own connection; acknowledged sends one XADD per request from a pool "
                "(one connection per concurrent producer), with appendfsync always and, to compare with cometmq "
                "ASYNC_FLUSH, everysec")

    def _redis(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=int(self.cfg["port"]))

    async def produce(self, stream: str, size: int, max_count: int, seconds: float) -> dict[str, Any]:
        body = b"x" * size
        r = self._redis()
        try:
            pipes = [r.pipeline(transaction=False) for _ in range(CONCURRENCY)]
            for p in pipes:  # warm-up: one connection per pipeline
                p.xadd(stream, {"d": body})
            await asyncio.gather(*(p.execute() for p in pipes))

            async def step(w: int, k: int) -> None:
                p = pipes[w]
                for _ in range(k):
                    p.xadd(stream, {"d": body})
                await p.execute()

            result = await run_workers(CONCURRENCY, PIPELINE, max_count, seconds, step)
        finally:
            await r.aclose()
        result["extra_messages"] = CONCURRENCY
        return result

    async def fill(self, stream: str, size: int, count: int) -> dict[str, Any]:
        body = b"x" * size
        r = self._redis()
        try:
            pipes = [r.pipeline(transaction=False) for _ in range(CONCURRENCY)]

            async def step(w: int, k: int) -> None:
                p = pipes[w]
                for _ in range(k):
                    p.xadd(stream, {"d": body})
                await p.execute()

            return await run_workers(CONCURRENCY, PIPELINE, count, 3600.0, step)
        finally:
            await r.aclose()

    async def consume(self, stream: str, count: int) -> dict[str, Any]:
        r = self._redis()
        received = 0
        last: bytes | str = "0-0"
        try:
            await r.ping()
            t0 = time.perf_counter()
            while received < count:
                resp: Any = await r.xread({stream: last}, count=READ_COUNT, block=5000)
                if not resp:
                    break
                entries = resp[0][1]
                received += len(entries)
                last = entries[-1][0]
            wall = time.perf_counter() - t0
        finally:
            await r.aclose()
        return {"messages": received, "seconds": round(wall, 4), "msgs_per_s": round(received / wall)}

    async def latency(self, stream: str, count: int, interval_ms: float) -> dict[str, Any]:
        producer, reader = self._redis(), self._redis()
        samples: list[float] = []
        stop = asyncio.Event()

        async def read_loop() -> None:
            last: bytes | str = "$"
            while not stop.is_set():
                resp: Any = await reader.xread({stream: last}, count=100, block=500)
                now = time.perf_counter_ns()
                if resp:
                    entries = resp[0][1]
                    samples.extend(since_ms(fields[b"d"], now) for _, fields in entries)
                    last = entries[-1][0]

        try:
            await producer.ping()
            await reader.ping()
            task = asyncio.create_task(read_loop())
            await asyncio.sleep(0.2)  # the XREAD is parked
            await paced(count, interval_ms, lambda: producer.xadd(stream, {"d": stamp()}))
            deadline = time.monotonic() + 10
            while len(samples) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            stop.set()
            await task
        finally:
            await producer.aclose()
            await reader.aclose()
        return latency_summary(samples, count)

    async def acked(self, stream: str, size: int, producers: int, max_count: int, seconds: float,
                    fsync: bool = True) -> dict[str, Any]:
        body = b"x" * size
        r = aioredis.Redis(host="127.0.0.1", port=int(self.cfg["port"]), max_connections=producers)
        try:
            await r.config_set("appendfsync", "always" if fsync else "everysec")
            await asyncio.gather(*(r.xadd(stream, {"d": body}) for _ in range(producers)))  # open the connections

            async def step(w: int, k: int) -> None:
                await r.xadd(stream, {"d": body})

            return await run_workers(producers, 1, max_count, seconds, step)
        finally:
            with contextlib.suppress(Exception):
                await r.config_set("appendfsync", "everysec")
            await r.aclose()

    async def delete(self, stream: str) -> None:
        r = self._redis()
        try:
            await r.delete(stream)
        finally:
            await r.aclose()
