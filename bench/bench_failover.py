"""Failover times of a controller-mode broker group, as processes (tests/chaos/cluster.py: a nameserver, 3
controllers on etcd (``--controllers 1``: one on its local log), 3 brokers with allAck and minInSyncReplicas 2,
every link behind a fault proxy).

    .venv/bin/python bench/bench_failover.py --runs 10 --timeouts test default
    .venv/bin/python bench/bench_failover.py --runs 1 --partition-runs 1 --controller-runs 1   # a smoke run

Measurements (one JSON line each, then a summary line per kind and timeout profile):

- ``kill``: SIGKILL of the master -> the first acknowledged send (SEND_OK) on the new master, by an SDK producer
  sending every 20 ms with a 1 s timeout and ``--send-retries`` retries (default 0). Note: with 0 retries the SDK
  (``Producer.send``) never refreshes the route after a failed send, so the new master is learnt at the 30 s
  route poll (docs/reliability.md, open findings); ``--send-retries 1`` measures the refresh-on-failure path.
  Also the time until the controller records the new master (``elected_s``) and the nameserver routes id 0 to it
  (``routed_s``).
- ``isolate``: the master partitioned from everyone (blackholed both ways, sockets open) -> the nameserver
  routes a new master (``routed_s``) and the first acknowledged send on it (``first_ok_s``).
- ``controller``: SIGKILL of the controller leader node (the controller and its etcd member) -> a running
  controller decides an ELECT_MASTER again (``elections_s``, ``ChaosCluster.elections_work``); sends go on
  meanwhile (``first_ok_s`` is then just the next acknowledged send).

Each measurement runs on a fresh cluster, after the controllers' startup grace. ``test`` timeouts: heartbeat
500 ms, controller heartbeat timeout 3 s (brokers and ``cometmq controller --heartbeat-timeout-ms``); ``default``:
RocketMQ's (1 s, 10 s). The summary: p50 and max per kind and profile.
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

from tests.chaos.cluster import DEFAULT_CONTROLLERS, TIMEOUTS, ChaosBroker, ChaosCluster  # noqa: E402

from cometmq.client import Producer  # noqa: E402
from cometmq.client.message import Message, SendStatus  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402

TOPIC = "FailoverBench"


def startup_grace_s(timeouts: str) -> float:
    """A controller elects no replacement for its startup grace after its own start (= its heartbeat timeout,
    which the cluster sets to the brokers' controllerHeartBeatTimeoutMills), plus a margin."""
    return int(TIMEOUTS[timeouts]["controllerHeartBeatTimeoutMills"]) / 1000 + 1.0


async def _routed_master(c: ChaosCluster) -> str | None:
    r = await c.request(c.namesrv.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    if r.code != ResponseCode.SUCCESS or not r.body:
        return None
    for bd in json.loads(r.body).get("brokerDatas", []):
        addr = (bd.get("brokerAddrs") or {}).get("0")
        if addr:
            return str(addr)
    return None


async def measure(kind: str, timeouts: str, workdir: Path, deadline_s: float = 60.0,
                  controllers: int = DEFAULT_CONTROLLERS, send_retries: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "timeouts": timeouts, "controllers": controllers,
                           "send_retries": send_retries}
    async with ChaosCluster(workdir, timeouts=timeouts, controllers=controllers) as c:
        await c.start(wait=60)
        controller_up = time.monotonic()
        await c.create_topic(TOPIC, 4)
        old = await c.master()
        assert old is not None
        async with Producer(namesrv=c.namesrv_addr, send_timeout=1.0, retries=send_retries) as p:
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
                        if r.status is SendStatus.SEND_OK and t0 and (kind == "controller"
                                                                      or await _is_new_master(c, old)):
                            first_ok = time.monotonic() - t0
                            return
                    await asyncio.sleep(max(0.0, 0.02 - (time.monotonic() - start)))

            async def watcher() -> None:
                if kind == "controller":
                    elections = await c.wait_elections_work(deadline_s)
                    out["elections_s"] = None if elections is None else round(elections, 3)
                    return
                while "elected_s" not in out or "routed_s" not in out:
                    g = await c.controller_state()
                    if "elected_s" not in out and g is not None and g.master_id is not None \
                            and g.master_id != old.controller_id:
                        out["elected_s"] = round(time.monotonic() - t0, 3)
                    addr = await _routed_master(c)
                    if "routed_s" not in out and addr is not None and addr != old.public_addr:
                        out["routed_s"] = round(time.monotonic() - t0, 3)
                    await asyncio.sleep(0.02)

            await asyncio.sleep(max(0.0, controller_up + startup_grace_s(timeouts) - time.monotonic()))
            leader = await c.controller_leader() if kind == "controller" else None
            t0 = time.monotonic()
            if kind == "kill":
                c.kill(old.name)
            elif kind == "isolate":
                await c.isolate(old.name)
            else:
                assert leader is not None, "no controller leader"
                out["controller"] = leader.name
                c.kill(leader.name)
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
            for key in ("first_ok_s", "elected_s", "routed_s", "elections_s"):
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
                runs = {"kill": args.runs, "isolate": args.partition_runs, "controller": args.controller_runs}[kind]
                for i in range(runs):
                    row = await measure(kind, prof, Path(tmp) / f"{prof}-{kind}-{i}", controllers=args.controllers,
                                        send_retries=args.send_retries)
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
    ap.add_argument("--controller-runs", type=int, default=3,
                    help="controller-leader kill measurements per timeout profile")
    ap.add_argument("--kinds", nargs="+", default=["kill", "isolate", "controller"],
                    choices=["kill", "isolate", "controller"])
    ap.add_argument("--send-retries", type=int, default=0, help="the SDK producer's retries (0: as before)")
    ap.add_argument("--controllers", type=int, choices=[1, 3, 5], default=DEFAULT_CONTROLLERS,
                    help="controller nodes: 3 or 5 on etcd, 1 on its local log")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
