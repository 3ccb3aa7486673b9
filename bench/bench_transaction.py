"""Transactional send + commit rate with the SDK, against a real ``cometmq serve`` subprocess.

    .venv/bin/python bench/bench_transaction.py                 # 20,000 messages per part, 64 in flight
    .venv/bin/python bench/bench_transaction.py --count 2000    # quick
    .venv/bin/python bench/bench_transaction.py --part end-batch --count 50000

Parts (one JSON line each):
- ``plain``: ``Producer.send`` (the baseline: one round trip per message);
- ``commit``: ``TransactionProducer.send_in_transaction`` committing every message (half send, local
  transaction, END_TRANSACTION awaited: two round trips and three appends per message);
- ``check``: every local transaction answers UNKNOW, and the checker commits on the broker's check-back
  (transactionTimeOut 1000 ms here): how long until all are committed after the last half was sent.
- ``end-batch`` (alone, with ``--part end-batch``): ``send_half_batch`` stores ``--count`` halves, then ONE timed
  ``end_transactions`` commits them all (END_TRANSACTION_BATCH requests of 2,048 entries, as the Spark
  exactly-once writer sends them): µs per committed half of wall time and of the broker's CPU (psutil on its
  PID, user + system, over the commit only).
The clients run in this process on one event loop; the broker in its own process (both share the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer  # noqa: E402

from cometmq.client import (  # noqa: E402
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    TransactionClientInstance,
    TransactionProducer,
)

S = LocalTransactionState
BODY = b"x" * 100


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def run_workers(count: int, inflight: int, one: Any) -> float:
    """Run ``one(i)`` for i < count with ``inflight`` workers; returns the elapsed seconds."""
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < count:
            i = next_i
            next_i += 1
            await one(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return time.perf_counter() - t0


async def bench(server: CometServer, count: int, inflight: int) -> None:
    await asyncio.to_thread(server.create_topic, "BenchTx", 8)
    async with Producer("bench-plain", namesrv=server.namesrv) as plain:
        await plain.send(Message("BenchTx", BODY))  # routes and connection

        async def send_plain(i: int) -> None:
            await plain.send(Message("BenchTx", BODY))

        elapsed = await run_workers(count, inflight, send_plain)
    report(part="plain", messages=count, inflight=inflight, seconds=round(elapsed, 3),
           msgs_per_s=round(count / elapsed))

    async with TransactionProducer("bench-tx", namesrv=server.namesrv) as tx:
        await tx.send_in_transaction(Message("BenchTx", BODY), lambda m, a: S.COMMIT)

        async def send_tx(i: int) -> None:
            r = await tx.send_in_transaction(Message("BenchTx", BODY), lambda m, a: S.COMMIT)
            assert r.ok

        elapsed = await run_workers(count, inflight, send_tx)
    report(part="commit", messages=count, inflight=inflight, seconds=round(elapsed, 3),
           msgs_per_s=round(count / elapsed))

    checked = 0
    done = asyncio.Event()
    n_check = max(1, count // 4)

    def checker(msg: MessageExt) -> LocalTransactionState:
        nonlocal checked
        checked += 1
        if checked == n_check:
            done.set()
        return S.COMMIT

    instance = TransactionClientInstance(server.namesrv)
    async with TransactionProducer("bench-check", instance=instance, checker=checker) as tx:
        async def send_unknown(i: int) -> None:
            await tx.send_in_transaction(Message("BenchTx", BODY), lambda m, a: S.UNKNOW)

        sent_s = await run_workers(n_check, inflight, send_unknown)
        t0 = time.perf_counter()
        await asyncio.wait_for(done.wait(), 600)
        resolved_s = time.perf_counter() - t0
    report(part="check", messages=n_check, send_seconds=round(sent_s, 3),
           all_checked_and_committed_after_last_send_s=round(resolved_s, 3), transaction_timeout_ms=1000)


async def bench_end_batch(server: CometServer, count: int) -> None:
    """Halves stored in batches, then all of them committed with END_TRANSACTION_BATCH, timed."""
    await asyncio.to_thread(server.create_topic, "BenchTxBatch", 8)
    assert server.pid is not None
    broker = psutil.Process(server.pid)
    async with TransactionProducer("bench-tx-batch", namesrv=server.namesrv) as tx:
        # Like the Spark writer's rows: tags, keys and a user property, ~100-byte bodies.
        msgs = [Message("BenchTxBatch", BODY, tags="spark", keys=f"row-{i}", properties={"writeId": "q1-b7-p3"})
                for i in range(count)]
        t0 = time.perf_counter()
        results = await tx.send_half_batch(msgs)
        sent_s = time.perf_counter() - t0
        assert all(r.ok for r in results), "a half was not stored"
        decisions = [(r, S.COMMIT) for r in results]
        cpu0 = sum(broker.cpu_times()[:2])
        t0 = time.perf_counter()
        outcomes = await tx.end_transactions(decisions)
        wall_s = time.perf_counter() - t0
        cpu_s = sum(broker.cpu_times()[:2]) - cpu0
    bad = [o for o in outcomes if not o.ok or o.already_resolved]
    assert not bad, f"{len(bad)} commits failed, e.g. {bad[0]}"
    report(part="end-batch", halves=count, send_half_batch_s=round(sent_s, 3), commit_wall_s=round(wall_s, 3),
           commit_broker_cpu_s=round(cpu_s, 3), us_per_half_wall=round(wall_s * 1e6 / count, 2),
           us_per_half_broker_cpu=round(cpu_s * 1e6 / count, 2), load_1min=round(os.getloadavg()[0], 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--part", choices=["all", "end-batch"], default="all",
                    help="all: plain, commit and check (the default); end-batch: batched halves and their batched "
                         "commit only")
    args = ap.parse_args()
    report(machine=platform.machine(), python=platform.python_version(), cpus=__import__("os").cpu_count())
    with tempfile.TemporaryDirectory(prefix="bench-tx-") as tmp:
        # end-batch: no check-back while the halves wait (it would re-append them and answer the checks)
        conf = {"transactionTimeOut": "600000"} if args.part == "end-batch" else {
            "transactionTimeOut": "1000", "transactionCheckInterval": "5000"}
        server = CometServer(Path(tmp), conf)
        server.start()
        try:
            if args.part == "end-batch":
                asyncio.run(bench_end_batch(server, args.count))
            else:
                asyncio.run(bench(server, args.count, args.inflight))
        finally:
            server.close()


if __name__ == "__main__":
    main()
