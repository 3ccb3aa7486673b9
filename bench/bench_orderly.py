"""Orderly consumption: throughput with 1, 2 and 4 consumer processes over 8 queues, and the hand-over gap.

    .venv/bin/python bench/bench_orderly.py                                   # 40000 messages; 1, 2, 4 consumers
    .venv/bin/python bench/bench_orderly.py --messages 100000 --consumers 1 2 4 --batch-max-size 4
    .venv/bin/python bench/bench_orderly.py --skip-throughput --handover-runs 5

Starts ``python -m cometmq.cli serve`` (tests/interop/cometmq_server.py) on free ports with a temporary data
folder and runs the SDK's orderly consumer as separate processes (tests/interop/clients/sdk_orderly_consume.py).

* Throughput: ``--messages`` messages over ``--keys`` keys are stored first (each key's in one queue, as
  ``send_orderly`` places them, sent in batches per queue); then, for each consumer count, a new group of that
  many consumer processes consumes them. Measured from the moment the last of them has started (what was
  consumed before is subtracted) until everything is consumed.
* Hand-over gap: two consumers of a group, a steady stream of ``--rate`` msg/s; one leaves — SIGTERM (clean:
  it commits, unlocks, unregisters) or SIGKILL (the broker frees its locks when its connection closes). The
  gap is, per queue the leaver held, the time from the signal to that queue's next message being consumed by
  the other consumer (the largest over its queues is reported).

Prints one JSON object per measurement and appends them to ``--out`` (bench/results/orderly-<time>.jsonl).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer  # noqa: E402
from tests.interop.harness import ClientProcess, client_env, start_client  # noqa: E402

from cometmq.client import Message, MessageQueue, Producer, select_by_hash  # noqa: E402

TOPIC = "BenchOrderly"


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def wait_for(cond: Any, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


# -- producing ----------------------------------------------------------------------------------------------
async def store_backlog(namesrv: str, messages: int, keys: int) -> float:
    """``messages`` messages "k<key>:<seq>", each key's in the queue send_orderly would pick, in batches."""
    t0 = time.monotonic()
    async with Producer("PG_bench_orderly", namesrv=namesrv) as p:
        queues = await p.queues(TOPIC)
        per_queue: dict[MessageQueue, list[Message]] = defaultdict(list)
        for i in range(messages):
            key = f"k{i % keys}"
            m = Message(TOPIC, f"{key}:{i // keys}".encode(), keys=key)
            per_queue[select_by_hash(queues, m, key)].append(m)
        for q, msgs in per_queue.items():
            for j in range(0, len(msgs), 500):
                await p.send_batch(msgs[j:j + 500], queue=q)
    return time.monotonic() - t0


class Streamer:
    """Sends ``rate`` msg/s with send_orderly (keys round robin) from a background thread until stopped."""

    def __init__(self, namesrv: str, rate: int, keys: int) -> None:
        self.namesrv, self.rate, self.keys = namesrv, rate, keys
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        tick = 0.01
        per_tick = max(1, round(self.rate * tick))
        seq: dict[int, int] = defaultdict(int)
        async with Producer("PG_bench_stream", namesrv=self.namesrv) as p:
            next_t = time.monotonic()
            while not self._stop.is_set():
                batch = []
                for _ in range(per_tick):
                    k = self.sent % self.keys
                    batch.append(p.send_orderly(Message(TOPIC, f"k{k}:{seq[k]}".encode()), f"k{k}"))
                    seq[k] += 1
                    self.sent += 1
                await asyncio.gather(*batch)
                next_t += tick
                await asyncio.sleep(max(0.0, next_t - time.monotonic()))


# -- consumers ----------------------------------------------------------------------------------------------
def consumer(env: dict[str, str], server: CometServer, group: str, *, quiet: bool, batch: int) -> ClientProcess:
    args = ["--namesrv", server.namesrv, "--topic", TOPIC, "--group", group, "--seconds", "600",
            "--batch-max-size", str(batch)]
    if quiet:
        args.append("--quiet")
    return start_client("sdk_orderly_consume", args, env, python=sys.executable)


def progress(p: ClientProcess) -> int:
    for ln in reversed(list(p.lines)):
        if ln.get("event") in ("progress", "locked"):
            return int(ln["consumed"])
    return 0


def locked(p: ClientProcess) -> set[int]:
    ev = [ln for ln in list(p.lines) if ln.get("event") == "locked"]
    return set(ev[-1]["queues"]) if ev else set()


def stop_all(procs: list[ClientProcess]) -> None:
    for p in procs:
        p.stop()
    for p in procs:
        p.finish(timeout=30)


def throughput(server: CometServer, env: dict[str, str], n_consumers: int, messages: int, batch: int) -> dict[str, Any]:
    group = f"CG_bench_tp_{n_consumers}_{int(time.time())}"
    procs = [consumer(env, server, group, quiet=True, batch=batch) for _ in range(n_consumers)]
    try:
        for p in procs:
            p.wait_for("started", timeout=60)
        t0 = time.monotonic()
        c0 = sum(progress(p) for p in procs)
        wait_for(lambda: sum(progress(p) for p in procs) >= messages, 600, "the backlog consumed")
        elapsed = time.monotonic() - t0
    finally:
        stop_all(procs)
    return {"bench": "orderly_throughput", "consumers": n_consumers, "queues": 8, "messages": messages,
            "batch_max_size": batch, "consumed_before_timing": c0, "seconds": round(elapsed, 3),
            "msgs_per_s": round((messages - c0) / elapsed)}


def handover(server: CometServer, env: dict[str, str], how: str, rate: int, keys: int) -> dict[str, Any]:
    group = f"CG_bench_ho_{how}_{int(time.time() * 1000)}"
    a = consumer(env, server, group, quiet=False, batch=1)
    b = consumer(env, server, group, quiet=False, batch=1)
    streamer = Streamer(server.namesrv, rate, keys)
    try:
        a.wait_for("started", timeout=60)
        b.wait_for("started", timeout=60)
        wait_for(lambda: locked(a) and locked(b) and not locked(a) & locked(b) and
                 len(locked(a) | locked(b)) == 8, 30, "an even split")
        streamer.start()
        time.sleep(2.0)
        held = locked(a)
        t_signal = time.time_ns()
        a.stop(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
        a.proc.wait(timeout=30)
        wait_for(lambda: locked(b) >= held, 30, "the survivor to lock the leaver's queues")
        time.sleep(1.0)
    finally:
        streamer.stop()
        stop_all([a, b])
    firsts: dict[int, int] = {}
    for ln in b.lines:
        if ln.get("event") == "msg" and ln["recv_ns"] > t_signal and ln["queue_id"] in held:
            firsts.setdefault(ln["queue_id"], ln["recv_ns"])
    gaps = [(firsts[q] - t_signal) / 1e9 for q in held if q in firsts]
    return {"bench": "orderly_handover", "leave": how, "rate_msgs_per_s": rate, "leaver_queues": sorted(held),
            "gap_max_s": round(max(gaps), 3) if gaps else None,
            "gap_mean_s": round(sum(gaps) / len(gaps), 3) if gaps else None, "queues_measured": len(gaps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--batch-max-size", type=int, default=1)
    ap.add_argument("--rate", type=int, default=1000, help="hand-over stream, msg/s")
    ap.add_argument("--handover-runs", type=int, default=3, help="runs per way of leaving")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-handover", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                    f"orderly-{time.strftime('%Y%m%d-%H%M')}.jsonl")
    args = ap.parse_args()

    results: list[dict[str, Any]] = []
    host = {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}
    with tempfile.TemporaryDirectory(prefix="bench-orderly-") as tmp:
        server = CometServer(Path(tmp) / "server", {"flushConsumerOffsetInterval": "1000"})
        server.start()
        env = client_env(Path(tmp) / "home")
        try:
            server.create_topic(TOPIC, 8)
            if not args.skip_throughput:
                took = asyncio.run(store_backlog(server.namesrv, args.messages, args.keys))
                log(f"stored {args.messages} messages in {took:.1f}s")
                for n in args.consumers:
                    r = throughput(server, env, n, args.messages, args.batch_max_size)
                    results.append({**r, **host})
                    print(json.dumps(r), flush=True)
            if not args.skip_handover:
                for how in ("sigterm", "kill9"):
                    for _ in range(args.handover_runs):
                        r = handover(server, env, how, args.rate, args.keys)
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
