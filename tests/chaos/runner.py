"""One chaos run = a seed and a scenario: start the cluster, run the workload under the nemesis, heal, wait for a
master with a full SyncStateSet, drain, stop every process, check offline, write ``result.json``.

    python -m tests.chaos.runner --scenario kill-master --seeds 1-30 --duration 60 --out /tmp/chaos

prints one line per run and a summary table; exit status 1 if any run broke an invariant or did not finish. Each
run's folder (``<out>/<scenario>/seed-<n>/``) keeps the processes' logs and data folders, ``history.jsonl``,
``observations.jsonl``, ``events.json`` (what the harness did, with times) and ``result.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos import checker, workload
from tests.chaos.cluster import DEFAULT_CONTROLLERS, ChaosCluster, etcd_installed
from tests.chaos.history import History
from tests.chaos.nemesis import ELECTIONS_LIMIT_S, MAIN_SCENARIOS, SCENARIOS, Nemesis, make_schedule

TOPIC = "ChaosTopic"
QUEUES = 4


@dataclass
class RunConfig:
    producers: int = 2
    rate: float = 60.0  # sends per second per producer
    concurrency: int = 2
    timeouts: str = "test"
    controllers: int = DEFAULT_CONTROLLERS  # 3: on etcd (a member beside each); 1: LocalLog
    healthy_timeout: float = 60.0
    keep: bool = True  # keep the run's folder when it passed


async def run_once(scenario: str, seed: int, duration: float, out: Path,
                   config: RunConfig | None = None) -> dict[str, Any]:
    cfg = config or RunConfig()
    workdir = out / scenario / f"seed-{seed}"
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    schedule = make_schedule(scenario, seed, duration)
    result: dict[str, Any] = {"scenario": scenario, "seed": seed, "duration": duration,
                              "schedule": schedule.describe(), "workdir": str(workdir)}
    (workdir / "schedule.json").write_text(json.dumps(schedule.to_json(), indent=1))
    started = time.monotonic()
    cluster = ChaosCluster(workdir, timeouts=cfg.timeouts, controllers=cfg.controllers)
    result["controllers"] = cfg.controllers
    nemesis = Nemesis(cluster, schedule)
    history_path = workdir / "history.jsonl"
    try:
        await cluster.start()
        await cluster.create_topic(TOPIC, QUEUES)
        with History(history_path) as history:
            producers = workload.Producers(cfg.producers, cluster.namesrv_addr, TOPIC, history,
                                           run_id=f"{scenario}-{seed}", rate=cfg.rate,
                                           concurrency=cfg.concurrency, seed=seed)
            readers = workload.Readers(cluster.namesrv_addr, TOPIC, history, queues=QUEUES, seed=seed)
            await producers.start()
            await readers.start()
            work_started = time.monotonic()
            try:
                await nemesis.run(work_started + duration)
                rest = duration - (time.monotonic() - work_started)
                if rest > 0:
                    await asyncio.sleep(rest)
            except BaseException:  # (interrupted: no reader may outlive the history file)
                await readers.stop()
                raise
            finally:
                await producers.stop()
                await nemesis.heal_all()
            try:
                result["healthy_after_s"] = round(await cluster.wait_healthy(cfg.healthy_timeout), 3)
            except AssertionError:
                result["healthy_after_s"] = None
                cluster.dump_stacks()  # where the brokers wait, into their logs
                await asyncio.sleep(0.5)
            await readers.stop()
            master = await cluster.master()
            result["final_master"] = master and master.name
            drained = None
            if master is not None:
                try:
                    drained = await workload.drain(cluster.namesrv_addr, TOPIC, history, addr=master.public_addr,
                                                   queues=range(QUEUES), timeout=30)
                except TimeoutError:
                    result["drain"] = "timeout"
            result["stats"] = vars(producers.stats)
        await cluster.observe_once()
        killed = await cluster.stop_all()
        if killed:
            result["sigkilled_at_stop"] = killed
        _save(cluster, nemesis, workdir)
        if master is None:
            result.update(ok=False, error="no master with a full SyncStateSet after healing")
            return result
        finals = [checker.FinalBroker(b.name, b.data_dir, master=b is master) for b in cluster.brokers]
        observations = [(o.epoch, o.master) for o in cluster.observations
                        if o.epoch is not None and o.master is not None]
        check = checker.check(history_path, finals, TOPIC, drained=drained, master_observations=observations)
        (workdir / "check.json").write_text(check.dumps())
        result["counts"] = check.counts
        result["failed"] = check.failed()
        # a controller leader lost: elections decided again within ELECTIONS_LIMIT_S (a liveness requirement)
        elections = [f["elections_s"] for f in nemesis.applied if "elections_s" in f]
        slow = [e for e in elections if e is None or e > ELECTIONS_LIMIT_S]
        if slow:
            result["failed"].append("controller-elections")
        result["ok"] = check.ok and result.get("healthy_after_s") is not None and not slow
        if not check.ok:
            result["report"] = check.report()
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc())
        with contextlib.suppress(Exception):
            _save(cluster, nemesis, workdir)
    finally:
        await cluster.close()
        result["elapsed_s"] = round(time.monotonic() - started, 1)
        result["faults"] = nemesis.applied
        (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))
        if result.get("ok") and not cfg.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _save(cluster: ChaosCluster, nemesis: Nemesis, workdir: Path) -> None:
    with open(workdir / "observations.jsonl", "w") as f:
        for o in cluster.observations:
            f.write(json.dumps(o.to_json()) + "\n")
    (workdir / "events.json").write_text(json.dumps({"events": cluster.events, "faults": nemesis.applied,
                                                     "topology": cluster.topology()}, indent=1, default=str))


def one_line(r: dict[str, Any]) -> str:
    counts = r.get("counts") or {}
    status = "ok  " if r.get("ok") else "FAIL"
    bits = [f"{status} {r['scenario']:<28} seed {r['seed']:>3}", f"{r.get('elapsed_s', 0):6.1f}s"]
    if counts:
        bits.append(" ".join(f"{k}={counts[k]}" for k in ("ok", "ok_lost", "info", "duplicates")
                             if k in counts))
    if r.get("healthy_after_s") is not None:
        bits.append(f"healed in {r['healthy_after_s']:.1f}s")
    for key, label in (("elections_s", "elections again"), ("elected_s", "elected")):
        vals = [f.get(key) for f in r.get("faults") or () if key in f]
        if vals:
            bits.append(f"{label} " + ",".join("-" if v is None else f"{v:.1f}" for v in vals) + "s")
    if r.get("failed"):
        bits.append(f"violated {','.join(r['failed'])}")
    if r.get("error"):
        bits.append(f"error {r['error'].splitlines()[0][:200]}")
    return " | ".join(bits)


#: summary columns: the checker's counts (ok = acknowledged, info = indeterminate)
SUMMARY_KEYS = ("ok", "ok_lost", "duplicates", "info", "info_found", "info_not_found", "fail")


def _fault_values(rs: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    return [f.get(key) for r in rs for f in r.get("faults") or () if key in f]


def summary(results: Sequence[dict[str, Any]]) -> str:
    """Per scenario: runs, passed, the summed counts, and the worst controller times (``elections_s`` of
    controller-leader faults, ``elected_s`` of master-and-controller faults; "-": never)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["scenario"], []).append(r)
    head = f"{'scenario':<28} {'runs':>4} {'pass':>4} " + " ".join(f"{k:>14}" for k in SUMMARY_KEYS) \
        + f" {'elections max':>13} {'elected max':>11}"
    lines = [head, "-" * len(head)]
    for name, rs in by.items():
        tot = {k: sum(int((r.get("counts") or {}).get(k, 0)) for r in rs) for k in SUMMARY_KEYS}
        worst = []
        for key in ("elections_s", "elected_s"):
            vals = _fault_values(rs, key)
            worst.append("" if not vals else "-" if None in vals else f"{max(v for v in vals if v is not None):.2f}")
        lines.append(f"{name:<28} {len(rs):>4} {sum(1 for r in rs if r.get('ok')):>4} "
                     + " ".join(f"{tot[k]:>14}" for k in SUMMARY_KEYS) + f" {worst[0]:>13} {worst[1]:>11}")
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


async def main_async(args: argparse.Namespace) -> int:
    scenarios = list(SCENARIOS) if args.scenario == "all" else \
        list(MAIN_SCENARIOS) if args.scenario == "main" else args.scenario.split(",")
    for s in scenarios:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}; known: {', '.join(SCENARIOS)}, main, all")
    if args.controllers > 1 and not etcd_installed():
        raise SystemExit("--controllers 3 runs an etcd member beside each controller: etcd is not installed "
                         "(apt-get install etcd-server), or use --controllers 1")
    cfg = RunConfig(producers=args.producers, rate=args.rate, timeouts=args.timeouts, keep=not args.prune,
                    controllers=args.controllers)
    results = []
    for seed in parse_seeds(args.seeds):
        for s in scenarios:
            r = await run_once(s, seed, args.duration, Path(args.out), cfg)
            results.append(r)
            print(one_line(r), flush=True)
    print(summary(results), flush=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(
        [{k: r.get(k) for k in ("scenario", "seed", "ok", "counts", "failed", "error", "healthy_after_s",
                                "elapsed_s", "schedule", "workdir", "controllers", "faults")} for r in results],
        indent=1, default=str))
    return 0 if all(r.get("ok") for r in results) else 1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.runner", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="main", help=f"one of {', '.join(SCENARIOS)}; a comma list; main; all")
    p.add_argument("--seeds", default="1", help="e.g. 1-30 or 1,4,7")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of workload under faults per run")
    p.add_argument("--out", default="/tmp/cometmq-chaos", help="folder of the runs")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--rate", type=float, default=60.0, help="sends per second per producer")
    p.add_argument("--timeouts", choices=("test", "default"), default="test")
    p.add_argument("--controllers", type=int, choices=(1, 3, 5), default=DEFAULT_CONTROLLERS,
                   help="controller nodes: 3 or 5 on etcd (a member beside each), 1 on its local log")
    p.add_argument("--prune", action="store_true", help="delete a passing run's folder")
    sys.exit(asyncio.run(main_async(p.parse_args(argv))))


if __name__ == "__main__":
    main()
