"""NATS JetStream through nats-py: async publish (pipelined PubAcks), pull fetch, push subscription."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
from nats.js.api import DeliverPolicy, StorageType, StreamConfig

from compare_lib.clients.base import BenchClient, latency_summary, paced, run_workers, since_ms, stamp

MAX_PENDING = 4000


class NatsClient(BenchClient):
    settings = (f"nats-py: `js.publish_async` with up to {MAX_PENDING} PubAcks pending (nats-py's default window); "
                "backlog read and latency with an ordered push consumer (`js.subscribe(..., ordered_consumer=True)`, "
                "ack none, flow control; 4x faster here than pull `fetch(1000)`); acknowledged sends with "
                "`js.publish` (waits for its PubAck), "
                "one connection; file-storage stream, 1 replica")

    async def _connect(self) -> Any:
        return await nats.connect(str(self.cfg["url"]), max_reconnect_attempts=0)

    async def _stream(self, js: Any, stream: str) -> None:
        await js.add_stream(StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE))

    async def produce(self, stream: str, size: int, max_count: int, seconds: float) -> dict[str, Any]:
        body = b"x" * size
        nc = await self._connect()
        try:
            js = nc.jetstream(publish_async_max_pending=MAX_PENDING)
            await self._stream(js, stream)
            await js.publish(stream, body)  # warm-up
            futures: list[asyncio.Future[Any]] = []
            t0 = time.perf_counter()
            deadline = t0 + seconds
            sent = 0
            while sent < max_count and (sent % 256 or time.perf_counter() < deadline):
                futures.append(await js.publish_async(stream, body))
                sent += 1
            await js.publish_async_completed()
            wall = time.perf_counter() - t0
            ok = sum(1 for f in futures if not f.cancelled() and f.exception() is None)
        finally:
            await nc.close()
        return {"messages": ok, "failed": sent - ok, "seconds": round(wall, 4), "msgs_per_s": round(ok / wall),
                "extra_messages": 1}

    async def consume(self, stream: str, count: int) -> dict[str, Any]:
        nc = await self._connect()
        received = 0
        done = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            nonlocal received
            received += 1
            if received >= count:
                done.set()

        try:
            js = nc.jetstream()
            t0 = time.perf_counter()
            sub = await js.subscribe(stream, cb=on_msg, stream=stream, ordered_consumer=True,
                                     deliver_policy=DeliverPolicy.ALL)
            await asyncio.wait_for(done.wait(), 600)
            wall = time.perf_counter() - t0
            await sub.unsubscribe()
        finally:
            await nc.close()
        return {"messages": received, "seconds": round(wall, 4), "msgs_per_s": round(received / wall)}

    async def latency(self, stream: str, count: int, interval_ms: float) -> dict[str, Any]:
        nc = await self._connect()
        samples: list[float] = []
        try:
            js = nc.jetstream()
            await self._stream(js, stream)

            async def on_msg(msg: Any) -> None:
                samples.append(since_ms(msg.data, time.perf_counter_ns()))

            await js.subscribe(stream, cb=on_msg, stream=stream, ordered_consumer=True,
                               deliver_policy=DeliverPolicy.NEW)
            await js.publish(stream, stamp())  # warm-up through the whole path
            await asyncio.sleep(0.3)
            samples.clear()
            await paced(count, interval_ms, lambda: js.publish(stream, stamp()))
            deadline = time.monotonic() + 10
            while len(samples) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await nc.close()
        return latency_summary(samples, count)

    async def acked(self, stream: str, size: int, producers: int, max_count: int, seconds: float,
                    fsync: bool = True) -> dict[str, Any]:
        body = b"x" * size
        nc = await self._connect()
        try:
            js = nc.jetstream()
            await self._stream(js, stream)
            await js.publish(stream, body)

            async def step(w: int, k: int) -> None:
                await js.publish(stream, body)

            return await run_workers(producers, 1, max_count, seconds, step)
        finally:
            await nc.close()

    async def delete(self, stream: str) -> None:
        nc = await self._connect()
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()
