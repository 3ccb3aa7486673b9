"""POP consumption: receive + ack throughput with 1 and 8 consumers, and redelivery accuracy.

    .venv/bin/python bench/bench_pop.py                        # 200000 messages; 1 and 8 consumers; accuracy
    .venv/bin/python bench/bench_pop.py --messages 50000 --consumers 1 8 --batch 32 --accuracy-messages 2000

Starts ``python -m cometmq.cli serve`` (tests/interop/cometmq_server.py) on free ports with a temporary data
folder (ASYNC_FLUSH), stores ``--messages`` 100-byte messages on a topic of 8 queues, then for each consumer
count a new group of that many SDK ``SimpleConsumer``s — spread over at most 2 worker processes (this machine
has 2 cores and the broker needs one of them too) — receives ``--batch`` messages at a time and acks each batch
with one BATCH_ACK_MESSAGE until every message is acked. Throughput is acked messages per second, from the
first receive to the last ack.

Redelivery accuracy: ``--accuracy-messages`` messages are popped with a 2 s invisible time and not acked; a
consumer long-polls for their redelivery; for each, the lateness is the receive time minus the moment its
invisible time ended (pop time + invisible time, both on the broker's wall clock, the same machine's).

Prints one JSON object per measurement and appends them to ``--out`` (bench/results/pop-<time>.jsonl).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer  # noqa: E402

from cometmq.client import Message, Producer  # noqa: E402
from cometmq.client.simple_consumer import SimpleConsumer  # noqa: E402

TOPIC = "BenchPop"


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


async def store_backlog(namesrv: str, messages: int, size: int) -> float:
    t0 = time.perf_counter()
    body = b"x" * size
    async with Producer("bench-pop-producer", namesrv=namesrv) as p:
        sem = asyncio.Semaphore(4)

        async def one(n: int) -> None:
            async with sem:
                await p.send_batch([Message(TOPIC, body) for _ in range(n)])

        await asyncio.gather(*(one(min(256, messages - i)) for i in range(0, messages, 256)))
    return time.perf_counter() - t0


def _worker(namesrv: str, group: str, consumers: int, batch: int, total: int, counter: Any,
            first: Any, last: Any) -> None:
    async def run_one(sc: SimpleConsumer) -> None:
        while counter.value < total:
            msgs = await sc.receive(batch, wait=1)
            if not msgs:
                continue
            with first.get_lock():
                if first.value == 0:
                    first.value = time.time()
            await sc.ack_many(msgs)
            with counter.get_lock():
                counter.value += len(msgs)
                last.value = time.time()

    async def main() -> None:
        scs = [SimpleConsumer(group, namesrv=namesrv, consume_from="first", invisible_duration=60)
               for _ in range(consumers)]
        for sc in scs:
            sc.subscribe(TOPIC)
            await sc.start()
        try:
            await asyncio.gather(*(run_one(sc) for sc in scs))
        finally:
            for sc in scs:
                await sc.close()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def throughput(namesrv: str, consumers: int, messages: int, batch: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    counter, first, last = ctx.Value("q", 0), ctx.Value("d", 0.0), ctx.Value("d", 0.0)
    group = f"bench-pop-{consumers}-{int(time.time())}"
    procs_n = min(consumers, 2)
    per = [consumers // procs_n + (1 if i < consumers % procs_n else 0) for i in range(procs_n)]
    procs = [ctx.Process(target=_worker, args=(namesrv, group, n, batch, messages, counter, first, last))
             for n in per]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 600
    while counter.value < messages and time.monotonic() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.1)
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    took = last.value - first.value
    return {"bench": "pop_throughput", "consumers": consumers, "processes": procs_n, "batch": batch,
            "acked": counter.value, "seconds": round(took, 2),
            "msgs_per_s": round(counter.value / took) if took > 0 else None}


async def accuracy(namesrv: str, messages: int) -> dict[str, Any]:
    group = f"bench-pop-accuracy-{int(time.time())}"
    invisible = 2.0
    async with Producer("bench-pop-producer", namesrv=namesrv) as p:
        await p.send_batch([Message(TOPIC + "Acc", b"y" * 100) for _ in range(messages)])
    popper = SimpleConsumer(group, namesrv=namesrv, consume_from="first", invisible_duration=invisible)
    popper.subscribe(TOPIC + "Acc")
    waiters = [SimpleConsumer(group, namesrv=namesrv, invisible_duration=60) for _ in range(4)]
    lateness: list[float] = []
    async with popper:
        visible_at: dict[str, int] = {}
        while len(visible_at) < messages:
            for m in await popper.receive(256, wait=1):
                visible_at[m.msg_id] = m.invisible_until_ms
        expected = messages

        async def wait_one(sc: SimpleConsumer) -> None:
            while len(lateness) < expected:
                msgs = await sc.receive(256, wait=1)
                now_ms = time.time() * 1000
                for m in msgs:
                    lateness.append(now_ms - visible_at[m.msg_id])
                if msgs:
                    await sc.ack_many(msgs)

        for sc in waiters:
            sc.subscribe(TOPIC + "Acc")
            await sc.start()
        try:
            await asyncio.wait_for(asyncio.gather(*(wait_one(sc) for sc in waiters)), 60)
        finally:
            for sc in waiters:
                await sc.close()
    return lateness_summary(lateness, messages, invisible)


def lateness_summary(samples: list[float], messages: int, invisible: float) -> dict[str, Any]:
    s = sorted(samples)

    def pct(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 1) if s else float("nan")

    return {"bench": "pop_redelivery_lateness_ms", "messages": messages, "invisible_s": invisible,
            "redelivered": len(s), "p50": pct(0.5), "p99": pct(0.99), "max": round(s[-1], 1) if s else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--accuracy-messages", type=int, default=2000)
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / f"pop-{time.strftime('%Y%m%d-%H%M')}.jsonl")
    args = ap.parse_args()
    host = {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pop-", dir=os.environ.get("BENCH_DIR")) as tmp:
        server = CometServer(Path(tmp) / "server", {"popSnapshotIntervalMs": "2000"})
        server.start()
        try:
            server.create_topic(TOPIC, 8)
            server.create_topic(TOPIC + "Acc", 8)
            took = asyncio.run(store_backlog(server.namesrv, args.messages, args.size))
            log(f"stored {args.messages} messages in {took:.1f}s")
            for n in args.consumers:
                r = throughput(server.namesrv, n, args.messages, args.batch)
                results.append({**r, **host})
                print(json.dumps(r), flush=True)
            if args.accuracy_messages:
                r = asyncio.run(accuracy(server.namesrv, args.accuracy_messages))
                results.append({**r, **host})
                print(json.dumps(r), flush=True)
        finally:
            server.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    log(f"results appended to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
