"""``cometmq bench``: load tools like RocketMQ's benchmark producer and consumer, built on the SDK.

Each prints a progress line a second on stderr and one JSON line of results on stdout at the end.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from cometmq.client import ConsumeStatus, LitePullConsumer, Message, MessageExt, Producer, PushConsumer


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _progress(name: str, counter: Callable[[], int], stop: asyncio.Event) -> None:
    last, t_last = 0, time.perf_counter()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass
        now, n = time.perf_counter(), counter()
        print(f"{name}: {n} total, {(n - last) / (now - t_last):,.0f}/s", file=sys.stderr, flush=True)
        last, t_last = n, now


async def _with_progress(name: str, counter: Callable[[], int], work: Awaitable[Any]) -> Any:
    stop = asyncio.Event()
    reporter = asyncio.create_task(_progress(name, counter, stop))
    try:
        return await work
    finally:
        stop.set()
        await reporter


async def produce(namesrv: str, topic: str, count: int, size: int, batch: int, concurrency: int) -> dict[str, Any]:
    body = b"x" * size
    sent = 0
    async with Producer("cometmq-bench-producer", namesrv=namesrv) as producer:
        queues = await producer.queues(topic)
        per_worker = count // concurrency

        async def worker(w: int) -> None:
            nonlocal sent
            done = 0
            q = queues[w % len(queues)]
            while done < per_worker:
                n = min(batch, per_worker - done)
                if n == 1:
                    await producer.send(Message(topic, body), queue=q)
                else:
                    await producer.send_batch([Message(topic, body) for _ in range(n)], queue=q)
                done += n
                sent += n

        t0 = time.perf_counter()
        await _with_progress("produce", lambda: sent, asyncio.gather(*(worker(w) for w in range(concurrency))))
        wall = time.perf_counter() - t0
    return {"bench": "produce", "topic": topic, "messages": sent, "body": size, "batch": batch,
            "concurrency": concurrency, "seconds": round(wall, 3), "msgs_per_s": round(sent / wall)}


async def consume(namesrv: str, topic: str, group: str, count: int, mode: str) -> dict[str, Any]:
    received = 0
    t0 = time.perf_counter()
    if mode == "lite":
        async with LitePullConsumer(group, namesrv=namesrv, consume_from="first") as consumer:
            await consumer.subscribe(topic)

            async def drain() -> None:
                nonlocal received
                while received < count:
                    received += len(await consumer.poll(5.0))

            t0 = time.perf_counter()
            await _with_progress("consume", lambda: received, drain())
    else:
        done = asyncio.Event()

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            nonlocal received
            received += len(msgs)
            if received >= count:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        push = PushConsumer(group, namesrv=namesrv, consume_from="first", batch_max_size=32, listener=listener)
        push.subscribe(topic)
        t0 = time.perf_counter()
        async with push:
            await _with_progress("consume", lambda: received, done.wait())
    wall = time.perf_counter() - t0
    return {"bench": "consume", "mode": mode, "topic": topic, "messages": received, "seconds": round(wall, 3),
            "msgs_per_s": round(received / wall)}


async def latency(namesrv: str, topic: str, count: int, interval_ms: float) -> dict[str, Any]:
    """An idle push consumer and a producer in this process: send one message every ``interval_ms`` and time
    send -> listener call (one clock, so no skew)."""
    samples: list[float] = []
    got_all = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now = time.perf_counter_ns()
        for m in msgs:
            samples.append((now - int(m.body)) / 1e6)
        if len(samples) >= count:
            got_all.set()
        return ConsumeStatus.CONSUME_SUCCESS

    async with Producer("cometmq-bench-latency", namesrv=namesrv) as producer:
        await producer.send(Message(topic, b"0"))  # make sure the topic exists before the consumer looks
        consumer = PushConsumer(f"cometmq-bench-latency-{int(time.time())}", namesrv=namesrv, listener=listener)
        consumer.subscribe(topic)
        async with consumer:
            while not consumer.assignment:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # every queue has its long poll parked
            next_at = loop.time()
            for _ in range(count):
                next_at += interval_ms / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                await producer.send(Message(topic, str(time.perf_counter_ns()).encode()))
            try:
                await asyncio.wait_for(got_all.wait(), 30)
            except TimeoutError:
                pass
    s = sorted(samples)
    return {"bench": "latency", "topic": topic, "sent": count, "received": len(s), "interval_ms": interval_ms,
            "median_ms": round(_percentile(s, 0.5), 3), "p99_ms": round(_percentile(s, 0.99), 3),
            "p999_ms": round(_percentile(s, 0.999), 3), "max_ms": round(s[-1], 3) if s else None}


def run(coro: Coroutine[Any, Any, dict[str, Any]]) -> None:
    from cometmq.net.loop import run as run_loop

    result = run_loop(coro)
    print(json.dumps(result), flush=True)
