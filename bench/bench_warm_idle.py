"""The commit log's warm window after a burst: how much of it the broker holds, and what a burst after a pause costs.

    .venv/bin/python bench/bench_warm_idle.py --src OTHER/src --src src [-n 3] [--bursts 8] [--gap-ms 400]

The writer keeps its segment's pages faulted in ahead of it (``commitLogWarmAheadBytes``, 32 MiB) and drops them
from its mapping once it has not moved for ``store/warm.py``'s ``IDLE_RELEASE_S`` (store/warm.py). For each tree
(``--src``, runs alternating), ``cometmq serve`` is started on free ports (a fresh data folder, PYTHONPATH = that
src) and, in this process, the SDK sends ``--bursts`` bursts of ``--burst`` 100-byte messages (batches of 128, 4 in
flight on the topic's 4 queues, as ``bench/compare`` produces) with ``--gap-ms`` of idle between them: a pause long
enough for the shorter release to drop the window and the longer not to. After the last burst the broker's VmRSS is
read every 100 ms for 1.5 s. Prints one JSON object per tree: the medians over runs of the bursts' rate (the first
burst left out: it creates the segment) and of the RSS at each reading.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUEUES = 4
BATCH = 128


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def _bursts(namesrv: str, pid: int, bursts: int, burst: int, gap_s: float) -> dict[str, Any]:
    from cometmq.client import Message, Producer
    from cometmq.client.admin import Admin

    topic = "WarmIdle"
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(topic, read_queues=QUEUES, wait=10.0)
    body = b"x" * 100
    rates = []
    async with Producer("warm-idle", namesrv=namesrv) as producer:
        queues = await producer.queues(topic)
        for q in queues:
            await producer.send(Message(topic, body), queue=q)

        async def lane(q: Any, n: int) -> None:
            while n > 0:
                k = min(BATCH, n)
                await producer.send_batch([Message(topic, body) for _ in range(k)], queue=q)
                n -= k

        for _ in range(bursts):
            await asyncio.sleep(gap_s)
            start = time.perf_counter()
            await asyncio.gather(*(lane(q, burst // len(queues)) for q in queues))
            rates.append(burst / (time.perf_counter() - start))
        rss = []
        for _ in range(16):
            rss.append(round(_rss_mib(pid), 1))
            await asyncio.sleep(0.1)
    return {"rates": rates[1:], "rss_after": rss}


def run_once(src: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from cometmq.net.loop import run

    data = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "cometmq.cli", "serve", "--data", str(data), "--grpc-port", "0",
           "--broker-port", "0", "--namesrv-port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "cometmq serving" not in line:
            raise RuntimeError(f"{src}: no ready line: {line!r}")
        namesrv = line.split("namesrv ", 1)[1].split(",", 1)[0]
        return run(_bursts(namesrv, proc.pid, args.bursts, args.burst, args.gap_ms / 1000))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", default=None, help="a src folder (repeat to compare; default: src)")
    ap.add_argument("-n", "--runs", type=int, default=3)
    ap.add_argument("--bursts", type=int, default=8)
    ap.add_argument("--burst", type=int, default=40_000, help="messages per burst")
    ap.add_argument("--gap-ms", type=float, default=400.0, help="idle between bursts")
    args = ap.parse_args()
    srcs = [Path(s).resolve() for s in (args.src or ["src"])]
    rows: dict[Path, list[dict[str, Any]]] = {s: [] for s in srcs}
    with tempfile.TemporaryDirectory(prefix="warm-idle-") as tmp:
        for i in range(args.runs):
            for src in srcs:
                row = run_once(src, args, Path(tmp))
                rows[src].append(row)
                print(f"# {src} run {i + 1}: median burst {statistics.median(row['rates']):,.0f} msg/s, "
                      f"RSS after {row['rss_after'][::5]}", file=sys.stderr)
    for src, runs in rows.items():
        rates = [statistics.median(r["rates"]) for r in runs]
        rss = [statistics.median(r["rss_after"][i] for r in runs) for i in range(len(runs[0]["rss_after"]))]
        print(json.dumps({"src": str(src), "runs": len(runs), "burst_msgs_per_s": round(statistics.median(rates)),
                          "burst_range": [round(min(rates)), round(max(rates))],
                          "rss_mib_every_100ms": rss}))


if __name__ == "__main__":
    main()
