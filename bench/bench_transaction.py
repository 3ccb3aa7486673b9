"""Transactional send + commit rate with the SDK, against a real ``cometmq serve`` subprocess.

    .venv/bin/python bench/bench_transaction.py                 # 20,000 messages per part, 64 in flight
    .venv/bin/python bench/bench_transaction.py --count 2000    # quick

Parts (one JSON line each):
- ``plain``: ``Producer.send`` (the baseline: one round trip per message);
- ``commit``: ``TransactionProducer.send_in_transaction`` committing every message (half send, local
  transaction, END_TRANSACTION awaited: two round trips and three appends per message);
- ``check``: every local transaction answers UNKNOW, and the checker commits on the broker's check-back
  (transactionTimeOut 1000 ms here): how long until all are committed after the last half was sent.
The clients run in this process on one event loop; the broker in its own process (both share the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--inflight", type=int, default=64)
    args = ap.parse_args()
    report(machine=platform.machine(), python=platform.python_version(), cpus=__import__("os").cpu_count())
    with tempfile.TemporaryDirectory(prefix="bench-tx-") as tmp:
        server = CometServer(Path(tmp), {"transactionTimeOut": "1000", "transactionCheckInterval": "5000"})
        server.start()
        try:
            asyncio.run(bench(server, args.count, args.inflight))
        finally:
            server.close()


if __name__ == "__main__":
    main()
