"""What a /metrics scrape costs the broker's event loop: an in-process broker (namesrv + broker + exporter on one
loop, as tests/metrics builds them) with ``--topics`` topics of ``--queues`` queues, ``--msgs`` messages sent to
each, and ``--groups`` consumer groups with committed offsets (group i reads topic i % topics; every other group is
behind by a few messages on each queue, so lag, lag latency and ready series all carry work).

    PYTHONPATH=$PWD/src .venv/bin/python bench/bench_metrics_render.py --groups 10000 [--topics 100] [--runs 5]

Measured, ``--runs`` times each:

* render_s: ``MetricsExporter.render()`` called directly (the whole exposition, on the loop);
* scrape_s / stall_ms: a GET /metrics from another process (urllib in a child python, so that its reading does not
  take this one's GIL) while a ticker task on the loop wakes every millisecond; stall_ms is the longest the loop
  went without running it during the scrape (what every client of the broker waits, at worst, per scrape);
  idle_stall_ms is the same over 0.3 s with no scrape, for reference.

The collector's thresholds are those ``cometmq serve`` sets (common/gc_tuning.py; ``--gc default``: Python's own,
whose frequent full collections add their pauses to any stall).

One JSON line: medians (and maxima of the stalls), the answer's size and its series count. To compare two trees run
it alternately with PYTHONPATH=/abs/tree/src of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from asyncio.subprocess import PIPE
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

#: the scraper: a GET per line read, its wall time and the answer's size and series count written back
_SCRAPER = """
import sys, time, urllib.request
for url in sys.stdin:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url.strip(), timeout=120) as r:
        body = r.read()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(time.perf_counter() - t0, len(body), series, flush=True)
"""


async def _ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    loop = asyncio.get_running_loop()
    last = loop.time()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = loop.time()
        gaps.append(now - last)
        last = now


async def _stall_during(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """(The loop's longest gap between ticks in s while ``fn`` ran, its result)."""
    stop, gaps = asyncio.Event(), []
    tick = asyncio.create_task(_ticker(stop, gaps))
    await asyncio.sleep(0.02)
    gaps.clear()
    result = await fn()
    stop.set()
    await tick
    return max(gaps, default=0.0) - 0.001, result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from cometmq.broker.config import BrokerConfig
    from cometmq.broker.controller import BrokerController
    from cometmq.client import Admin, Message, Producer
    from cometmq.metrics import start_exporter
    from cometmq.namesrv.server import NamesrvConfig, NamesrvController

    with tempfile.TemporaryDirectory(prefix="cometmq-bmr-") as tmp:
        ns = NamesrvController(NamesrvConfig(port=0))
        await ns.start()
        cfg = BrokerConfig(listen_port=0, namesrv_addr=f"127.0.0.1:{ns.port}", metrics_exporter_type="PROM",
                           metrics_prometheus_port=0)
        cfg = cfg.replace(store=cfg.store.replace(store_path=Path(tmp) / "broker", commitlog_segment_size=64 << 20,
                                                  consume_queue_units_per_file=10_000))
        broker = BrokerController(cfg)
        await broker.start()
        exporter = await start_exporter(broker, "127.0.0.1", 0)
        try:
            namesrv = f"127.0.0.1:{ns.port}"
            topics = [f"BenchMetricsTopic{i}" for i in range(args.topics)]
            async with Admin(namesrv=namesrv) as admin:
                for t in topics:
                    await admin.create_topic(t, read_queues=args.queues, write_queues=args.queues)
            async with Producer("bench-metrics-pg", namesrv=namesrv) as p:
                for t in topics:
                    await p.send_batch([Message(t, b"x" * 100) for _ in range(args.msgs)])
            store = broker.store
            for g in range(args.groups):
                t = topics[g % args.topics]
                for q in range(args.queues):
                    top = store.max_offset(t, q)
                    broker.offsets.commit(f"bench-metrics-cg-{g}", t, q, max(top - 3, 0) if g % 2 else top)

            renders, scrapes, stalls, idle = [], [], [], []
            scraper = await asyncio.create_subprocess_exec(sys.executable, "-c", _SCRAPER, stdin=PIPE, stdout=PIPE)
            assert scraper.stdin is not None and scraper.stdout is not None
            sin, sout = scraper.stdin, scraper.stdout
            url = f"http://127.0.0.1:{exporter.port}/metrics\n".encode()

            async def scrape() -> list[str]:
                sin.write(url)
                await sin.drain()
                return (await sout.readline()).decode().split()

            try:
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    exporter.render()
                    renders.append(time.perf_counter() - t0)
                    stall, (wall, size, series) = await _stall_during(scrape)
                    stalls.append(stall)
                    scrapes.append(float(wall))
                    idle.append((await _stall_during(lambda: asyncio.sleep(0.3)))[0])
            finally:
                sin.close()
                await scraper.wait()
            return {"groups": args.groups, "topics": args.topics, "queues": args.queues, "series": int(series),
                    "bytes": int(size), "render_s": round(statistics.median(renders), 4),
                    "scrape_s": round(statistics.median(scrapes), 4),
                    "stall_ms": round(statistics.median(stalls) * 1e3, 1),
                    "stall_max_ms": round(max(stalls) * 1e3, 1),
                    "idle_stall_ms": round(statistics.median(idle) * 1e3, 1), "gc": args.gc,
                    "src": str(Path(sys.modules["cometmq"].__file__ or "").parent)}
        finally:
            await exporter.stop()
            await broker.stop()
            await ns.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--msgs", type=int, default=20, help="messages sent to each topic")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gc", choices=("server", "default"), default="server")
    args = parser.parse_args()
    if args.gc == "server":
        from cometmq.common.gc_tuning import tune_for_server

        tune_for_server()
    print(json.dumps({"at": time.strftime("%H:%M:%S"), **asyncio.run(main_async(args))}))


if __name__ == "__main__":
    main()
