"""cometmq through its own SDK (``cometmq.client``), as ``cometmq bench`` drives it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cometmq.client import ConsumeStatus, LitePullConsumer, Message, MessageExt, Producer, PushConsumer
from cometmq.client.admin import Admin
from compare_lib.clients.base import BenchClient, latency_summary, paced, run_workers, since_ms, stamp

BATCH = 128
CONCURRENCY = 4
QUEUES = 4
#: the acked_64_autobatch row's batchMaxDelayMs: the default (a batch goes as soon as none is in flight; the delay only
#: bounds how long one waits behind a batch in flight)
AUTO_BATCH_DELAY_MS = 10.0


class CometClient(BenchClient):
    settings = (f"cometmq SDK: `Producer.send_batch` of {BATCH} messages, {CONCURRENCY} batches in flight (one per "
                f"queue, {QUEUES} queues); backlog read with `LitePullConsumer.poll` (pulls of up to 1024); latency "
                "with a `PushConsumer` (long polling); acknowledged sends with `Producer.send`, one connection; "
                f"the auto-batching row: the same sends with `Producer(auto_batch=True, batch_max_delay_ms="
                f"{AUTO_BATCH_DELAY_MS:g})` (batch_max_bytes 32 KiB), concurrent sends coalesced into "
                "SEND_BATCH_MESSAGE requests")

    @property
    def namesrv(self) -> str:
        return str(self.cfg["namesrv"])

    async def _topic(self, topic: str) -> None:
        async with Admin(namesrv=self.namesrv) as admin:
            await admin.create_topic(topic, read_queues=QUEUES, wait=10.0)

    async def produce(self, stream: str, size: int, max_count: int, seconds: float) -> dict[str, Any]:
        await self._topic(stream)
        body = b"x" * size
        async with Producer(f"cmp-{stream}", namesrv=self.namesrv) as producer:
            queues = await producer.queues(stream)
            for q in queues:  # warm-up: connection and route in place before the clock starts
                await producer.send(Message(stream, body), queue=q)

            async def step(w: int, k: int) -> None:
                q = queues[w % len(queues)]
                if k == 1:
                    await producer.send(Message(stream, body), queue=q)
                else:
                    await producer.send_batch([Message(stream, body) for _ in range(k)], queue=q)

            result = await run_workers(CONCURRENCY, BATCH, max_count, seconds, step)
        result["extra_messages"] = len(queues)
        return result

    async def fill(self, stream: str, size: int, count: int) -> dict[str, Any]:
        await self._topic(stream)
        body = b"x" * size
        async with Producer(f"cmp-{stream}", namesrv=self.namesrv) as producer:
            queues = await producer.queues(stream)

            async def step(w: int, k: int) -> None:
                await producer.send_batch([Message(stream, body) for _ in range(k)], queue=queues[w % len(queues)])

            return await run_workers(CONCURRENCY, BATCH, count, 3600.0, step)

    async def consume(self, stream: str, count: int) -> dict[str, Any]:
        received = 0
        async with LitePullConsumer(f"cmp-reader-{stream}", namesrv=self.namesrv, consume_from="first") as c:
            await c.subscribe(stream)
            t0 = time.perf_counter()
            while received < count:
                received += len(await c.poll(5.0))
            wall = time.perf_counter() - t0
        return {"messages": received, "seconds": round(wall, 4), "msgs_per_s": round(received / wall)}

    async def latency(self, stream: str, count: int, interval_ms: float) -> dict[str, Any]:
        await self._topic(stream)
        samples: list[float] = []
        got_all = asyncio.Event()

        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            now = time.perf_counter_ns()
            samples.extend(since_ms(m.body, now) for m in msgs if m.body != b"0")
            if len(samples) >= count:
                got_all.set()
            return ConsumeStatus.CONSUME_SUCCESS

        async with Producer(f"cmp-lat-{stream}", namesrv=self.namesrv) as producer:
            consumer = PushConsumer(f"cmp-lat-{stream}", namesrv=self.namesrv, listener=listener,
                                    consume_from="last")
            consumer.subscribe(stream)
            async with consumer:
                while not consumer.assignment:
                    await asyncio.sleep(0.02)
                await producer.send(Message(stream, b"0"))  # route and connection in place
                await asyncio.sleep(0.3)  # every queue has its long poll parked
                samples.clear()
                got_all.clear()
                await paced(count, interval_ms, lambda: producer.send(Message(stream, stamp())))
                try:
                    await asyncio.wait_for(got_all.wait(), 10)
                except TimeoutError:
                    pass
        return latency_summary(samples, count)

    async def acked(self, stream: str, size: int, producers: int, max_count: int, seconds: float,
                    fsync: bool = True) -> dict[str, Any]:
        await self._topic(stream)
        body = b"x" * size
        async with Producer(f"cmp-ack-{stream}", namesrv=self.namesrv) as producer:
            await producer.send(Message(stream, body))

            async def step(w: int, k: int) -> None:
                await producer.send(Message(stream, body))

            return await run_workers(producers, 1, max_count, seconds, step)

    async def acked_auto_batch(self, stream: str, size: int, producers: int, max_count: int,
                               seconds: float) -> dict[str, Any]:
        await self._topic(stream)
        body = b"x" * size
        async with Producer(f"cmp-ackb-{stream}", namesrv=self.namesrv, auto_batch=True,
                            batch_max_delay_ms=AUTO_BATCH_DELAY_MS) as producer:
            await producer.send(Message(stream, body))
            assert producer.batcher is not None
            batches0, batched0 = producer.batcher.batches_sent, producer.batcher.messages_batched

            async def step(w: int, k: int) -> None:
                await producer.send(Message(stream, body))

            result = await run_workers(producers, 1, max_count, seconds, step)
            batches = producer.batcher.batches_sent - batches0
            result["requests"] = batches
            result["msgs_per_request"] = round((producer.batcher.messages_batched - batched0) / batches, 1) \
                if batches else 0
            return result
