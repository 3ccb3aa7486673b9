"""Failover times of a controller-mode broker group, as processes (tests/chaos/cluster.py: a nameserver, a
controller, 3 brokers with allAck and minInSyncReplicas 2, every link behind a fault proxy).

    .venv/bin/python bench/bench_failover.py --runs 10 --timeouts test default

Measurements (one JSON line each, then a summary line per kind and timeout profile):

- ``kill``: SIGKILL of the master -> the first acknowledged send (SEND_OK) on the new master, by an SDK producer
  sending every 20 ms with a 1 s timeout and no retries (its route refreshes on failure, the SDK's fast path).
  Also the time until the controller records the new master (``elected_s``) and the nameserver routes id 0 to it
  (``routed_s``).
- ``isolate``: the master partitioned from everyone (blackholed both ways, sockets open) -> the nameserver
  routes a new master (``routed_s``) and the first acknowledged send on it (``first_ok_s``).

Each measurement runs on a fresh cluster. ``test`` timeouts: heartbeat 500 ms, controller heartbeat timeout 3 s;
``default``: RocketMQ's (1 s, 10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.cluster import ChaosBroker, ChaosCluster  # noqa: E402

from cometmq.client import Producer  # noqa: E402
from cometmq.client.message import Message, SendStatus  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402

TOPIC = "FailoverBench"
CONTROLLER_STARTUP_GRACE_S = 11.0


async def _routed_master(c: ChaosCluster) -> str | None:
    r = await c.request(c.namesrv.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    if r.code != ResponseCode.SUCCESS or not r.body:
        return None
    for bd in json.loads(r.body).get("brokerDatas", []):
        addr = (bd.get("brokerAddrs") or {}).get("0")
        if addr:
            return str(addr)
    return None


async def measure(kind: str, timeouts: str, workdir: Path, deadline_s: float = 60.0) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "timeouts": timeouts}
    async with ChaosCluster(workdir, timeouts=timeouts) as c:
        await c.start(wait=60)
        controller_up = time.monotonic()
        await c.create_topic(TOPIC, 4)
        old = await c.master()
        assert old is not None
        async with Producer(namesrv=c.namesrv_addr, send_timeout=1.0, retries=0) as p:
            for _ in range(20):  # warm: routes, connections
                await p.send(Message(TOPIC, b"warm"))
            first_ok: float | None = None
            t0 = 0.0

            async def sender() -> None:
                nonlocal first_ok
                while first_ok is None:
                    start = time.monotonic()
                    with contextlib.suppress(Exception):
                        r = await p.send(Message(TOPIC, b"x"))
                        if r.status is SendStatus.SEND_OK and t0 and await _is_new_master(c, old):
                            first_ok = time.monotonic() - t0
                            return
                    await asyncio.sleep(max(0.0, 0.02 - (time.monotonic() - start)))

            async def watcher() -> None:
                while "elected_s" not in out or "routed_s" not in out:
                    g = await c.controller_state()
                    if "elected_s" not in out and g is not None and g.master_id is not None \
                            and g.master_id != old.controller_id:
                        out["elected_s"] = round(time.monotonic() - t0, 3)
                    addr = await _routed_master(c)
                    if "routed_s" not in out and addr is not None and addr != old.public_addr:
                        out["routed_s"] = round(time.monotonic() - t0, 3)
                    await asyncio.sleep(0.02)

            # a controller elects no replacement for CONTROLLER_STARTUP_GRACE_S after its own start (its
            # startup grace = its heartbeat timeout, 10 s, not settable from `cometmq controller`)
            await asyncio.sleep(max(0.0, controller_up + CONTROLLER_STARTUP_GRACE_S - time.monotonic()))
            t0 = time.monotonic()
            if kind == "kill":
                c.kill(old.name)
            else:
                await c.isolate(old.name)
            tasks = [asyncio.ensure_future(sender()), asyncio.ensure_future(watcher())]
            _done, pending = await asyncio.wait(tasks, timeout=deadline_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            out["first_ok_s"] = round(first_ok, 3) if first_ok is not None else None
        await c.stop_all()
    return out


async def _is_new_master(c: ChaosCluster, old: ChaosBroker) -> bool:
    g = await c.controller_state()
    return g is not None and g.master_id is not None and g.master_id != old.controller_id


def _summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for kind in sorted({r["kind"] for r in rows}):
        for prof in sorted({r["timeouts"] for r in rows}):
            rs = [r for r in rows if r["kind"] == kind and r["timeouts"] == prof]
            if not rs:
                continue
            parts = [f"summary {kind:<8} timeouts={prof:<8} runs={len(rs)}"]
            for key in ("first_ok_s", "elected_s", "routed_s"):
                vals = [r[key] for r in rs if r.get(key) is not None]
                if vals:
                    parts.append(f"{key} p50 {statistics.median(vals):.2f} max {max(vals):.2f}"
                                 + (f" ({len(rs) - len(vals)} missing)" if len(vals) < len(rs) else ""))
            lines.append(" | ".join(parts))
    return lines


async def main_async(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        for prof in args.timeouts:
            for kind in args.kinds:
                for i in range(args.runs if kind == "kill" else args.partition_runs):
                    row = await measure(kind, prof, Path(tmp) / f"{prof}-{kind}-{i}")
                    row["run"] = i
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    for line in _summary(rows):
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="kill measurements per timeout profile")
    ap.add_argument("--partition-runs", type=int, default=3, help="isolate measurements per timeout profile")
    ap.add_argument("--timeouts", nargs="+", default=["test", "default"], choices=["test", "default"])
    ap.add_argument("--kinds", nargs="+", default=["kill", "isolate"], choices=["kill", "isolate"])
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
