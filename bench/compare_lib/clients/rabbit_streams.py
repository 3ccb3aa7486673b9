"""RabbitMQ streams through rstream (the stream protocol): batched publish with confirms, subscribe."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rstream import ConfirmationStatus, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, Producer

from compare_lib.clients.base import BenchClient, latency_summary, paced, run_workers, since_ms, stamp

BATCH = 128
WINDOW = 8192  # unconfirmed messages at most (rstream has no limit of its own; the Java client's is 10,000)
CREDIT = 10


def _raw(data: bytes) -> bytes:
    return data


class RabbitClient(BenchClient):
    settings = (f"rstream: `Producer.send_batch` of {BATCH} raw messages with a confirm callback, at most {WINDOW} "
                f"unconfirmed; backlog read by `Consumer.subscribe` from the first offset (initial credit "
                f"{CREDIT} chunks, raw decoder); latency with a subscription at the next offset; acknowledged sends "
                "with `Producer.send_wait` (waits for the publish confirm), one connection")

    def _producer(self) -> Producer:
        return Producer("127.0.0.1", int(self.cfg["port"]), username="guest", password="guest")

    def _consumer(self) -> Consumer:
        return Consumer("127.0.0.1", int(self.cfg["port"]), username="guest", password="guest")

    async def produce(self, stream: str, size: int, max_count: int, seconds: float) -> dict[str, Any]:
        body = b"x" * size
        confirmed = 0
        failed = 0
        progress = asyncio.Event()

        def on_confirm(status: ConfirmationStatus) -> None:
            nonlocal confirmed, failed
            if status.is_confirmed:
                confirmed += 1
            else:
                failed += 1
            progress.set()

        async with self._producer() as producer:
            await producer.create_stream(stream, exists_ok=True)
            await producer.send_wait(stream, body)  # warm-up: publisher declared, connection in place
            sent = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while sent < max_count and time.perf_counter() < deadline:
                while sent - confirmed - failed > WINDOW:
                    progress.clear()
                    await progress.wait()
                k = min(BATCH, max_count - sent)
                await producer.send_batch(stream, [body] * k, on_publish_confirm=on_confirm)
                sent += k
            while confirmed + failed < sent:
                progress.clear()
                await asyncio.wait_for(progress.wait(), 30)
            wall = time.perf_counter() - t0
        return {"messages": confirmed, "failed": failed, "seconds": round(wall, 4),
                "msgs_per_s": round(confirmed / wall), "extra_messages": 1}

    async def consume(self, stream: str, count: int) -> dict[str, Any]:
        received = 0
        done = asyncio.Event()

        def on_message(msg: bytes, ctx: MessageContext) -> None:
            nonlocal received
            received += 1
            if received >= count:
                done.set()

        async with self._consumer() as consumer:
            t0 = time.perf_counter()
            await consumer.subscribe(stream, on_message, decoder=_raw, initial_credit=CREDIT,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await asyncio.wait_for(done.wait(), 600)
            wall = time.perf_counter() - t0
        return {"messages": received, "seconds": round(wall, 4), "msgs_per_s": round(received / wall)}

    async def latency(self, stream: str, count: int, interval_ms: float) -> dict[str, Any]:
        samples: list[float] = []

        def on_message(msg: bytes, ctx: MessageContext) -> None:
            samples.append(since_ms(msg, time.perf_counter_ns()))

        async with self._producer() as producer, self._consumer() as consumer:
            await producer.create_stream(stream, exists_ok=True)
            await consumer.subscribe(stream, on_message, decoder=_raw, initial_credit=CREDIT,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None))
            await producer.send_wait(stream, stamp())  # warm-up
            await asyncio.sleep(0.3)
            samples.clear()
            await paced(count, interval_ms, lambda: producer.send_wait(stream, stamp()))
            deadline = time.monotonic() + 10
            while len(samples) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return latency_summary(samples, count)

    async def acked(self, stream: str, size: int, producers: int, max_count: int, seconds: float,
                    fsync: bool = True) -> dict[str, Any]:
        body = b"x" * size
        async with self._producer() as producer:
            await producer.create_stream(stream, exists_ok=True)
            await producer.send_wait(stream, body)

            async def step(w: int, k: int) -> None:
                await producer.send_wait(stream, body)

            return await run_workers(producers, 1, max_count, seconds, step)

    async def delete(self, stream: str) -> None:
        async with self._producer() as producer:
            await producer.delete_stream(stream, missing_ok=True)
