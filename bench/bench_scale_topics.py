"""Topic-count scaling of topic creation and nameserver registration ([18]).

Rows (one command; ``--row`` picks one, default both):

``topics``     a ``cometmq namesrv`` and a ``cometmq broker`` (subprocesses, free loopback ports); N topics
               (default 10,000, 8 queues) created one after another through the SDK's ``Admin.create_topic``
               (it waits until the nameserver's route shows each). Reports the total, each 1,000's time, the
               first and last 1,000 and the CPU seconds the broker and the nameserver used.
``nameserver`` one ``cometmq namesrv`` subprocess; B simulated brokers (default 100) of T topics each (default
               1,000, 8 queues) in this process. They are not broker processes: each is the broker's own
               registrar (``cometmq.broker.registration.NamesrvRegistrar``) with a fixed topic table, sending
               the real REGISTER_BROKER (and, where the registrar does, QUERY_DATA_VERSION) frames over TCP. A
               "30 s round" is every broker's periodic re-registration, fired back to back; the nameserver's
               CPU per round is read from /proc. A second client asks GET_ROUTEINFO_BY_TOPIC for random topics
               all along (rounds running) and its latencies are reported (p50/p99/max). A third measurement
               sends Java-style forced full registrations (``forceRegister=true``, the RocketMQ default) as raw
               frames, JSON and deflated, and reports the nameserver's CPU per registration.

Run: PYTHONPATH=src .venv/bin/python bench/bench_scale_topics.py [--row topics|nameserver] [--topics N]
     [--brokers B] [--broker-topics T] [--rounds R] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start(args: list[str], ready: str, log: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-m", "cometmq.cli", *args], stdout=subprocess.PIPE,
                         stderr=log.open("w"), text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if ready not in line:
        p.kill()
        raise SystemExit(f"{args[0]} did not start: {line!r}; see {log}")
    return p


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- row: topics -------------------------------------------------------------------------------------------------


async def create_topics(ns: str, count: int, queues: int, step: int) -> dict[str, Any]:
    from cometmq.client import Admin

    admin = Admin(namesrv=ns, timeout=30)
    await admin.start()
    try:
        await admin.create_topic("BenchWarmup", read_queues=queues)
        per_step: list[float] = []
        slowest = 0.0
        t_all = time.perf_counter()
        t_step = t_all
        for i in range(count):
            t0 = time.perf_counter()
            await admin.create_topic(f"ScaleTopic{i:06d}", read_queues=queues)
            slowest = max(slowest, time.perf_counter() - t0)
            if (i + 1) % step == 0:
                now = time.perf_counter()
                per_step.append(now - t_step)
                t_step = now
                print(f"  {i + 1:>6} topics: last {step} in {per_step[-1]:.2f} s "
                      f"({per_step[-1] / step * 1000:.1f} ms each)", flush=True)
        total = time.perf_counter() - t_all
    finally:
        await admin.close()
    return {"total_s": round(total, 2), "per_step_s": [round(s, 2) for s in per_step],
            "first_step_s": round(per_step[0], 2) if per_step else None,
            "last_step_s": round(per_step[-1], 2) if per_step else None,
            "mean_ms": round(total / max(count, 1) * 1000, 2), "slowest_ms": round(slowest * 1000, 1)}


def row_topics(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-topics-") as tmp:
        d = Path(tmp)
        nsp, bp = free_port(), free_port()
        ns = start(["namesrv", "--port", str(nsp)], "cometmq namesrv", d / "namesrv.log")
        broker = None
        try:
            broker = start(["broker", "--data", str(d / "data"), "--port", str(bp), "--namesrv", f"127.0.0.1:{nsp}",
                            "--grpc-port", "0"], "cometmq broker", d / "broker.log")
            cpu0 = cpu_s(ns.pid), cpu_s(broker.pid)
            result = asyncio.run(create_topics(f"127.0.0.1:{nsp}", a.topics, a.queues, a.step))
            cpu1 = cpu_s(ns.pid), cpu_s(broker.pid)
            result.update(row="topics", topics=a.topics, queues=a.queues,
                          namesrv_cpu_s=round(cpu1[0] - cpu0[0], 2), broker_cpu_s=round(cpu1[1] - cpu0[1], 2))
            return result
        finally:
            if broker is not None:
                stop(broker)
            stop(ns)


# -- row: nameserver -------------------------------------------------------------------------------------------


async def route_prober(ns: str, topics: list[str], samples: list[float], stop_event: asyncio.Event) -> None:
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import RequestCode, ResponseCode
    from cometmq.protocol.remoting import make_request

    rng = random.Random(7)
    async with RemotingClient() as client:
        while not stop_event.is_set():
            topic = rng.choice(topics)
            t0 = time.perf_counter()
            reply = await client.invoke(ns, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 10)
            samples.append(time.perf_counter() - t0)
            if reply.code != ResponseCode.SUCCESS:
                raise SystemExit(f"route of {topic}: {reply.code} {reply.remark}")
            await asyncio.sleep(0.002)


async def route_cost(ns: str, pid: int, topics: list[str], *, clients: int = 16, each: int = 500) -> dict[str, Any]:
    """The nameserver's CPU per GET_ROUTEINFO_BY_TOPIC: ``clients`` connections asking back to back (the scaling
    model's input for many clients refreshing routes)."""
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import RequestCode, ResponseCode
    from cometmq.protocol.remoting import make_request

    async def one(i: int) -> None:
        rng = random.Random(i)
        async with RemotingClient() as client:
            for _ in range(each):
                reply = await client.invoke(ns, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                             {"topic": rng.choice(topics)}), 10)
                if reply.code != ResponseCode.SUCCESS:
                    raise SystemExit(f"route: {reply.code} {reply.remark}")

    t0, c0 = time.perf_counter(), cpu_s(pid)
    await asyncio.gather(*(one(i) for i in range(clients)))
    n, cpu, wall = clients * each, cpu_s(pid) - c0, time.perf_counter() - t0
    return {"queries": n, "clients": clients, "namesrv_cpu_us_per_query": round(cpu / n * 1e6, 1),
            "queries_per_s": round(n / wall), "namesrv_cpu_share": round(cpu / wall, 2)}


async def namesrv_rounds(ns: str, pid: int, a: argparse.Namespace) -> dict[str, Any]:
    from cometmq.broker.registration import NamesrvRegistrar
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.route import TopicConfig

    tables = [[TopicConfig(f"B{b:03d}Topic{t:05d}", a.queues, a.queues) for t in range(a.broker_topics)]
              for b in range(a.brokers)]
    out: dict[str, Any] = {}
    async with RemotingClient(connect_timeout=10) as client:
        registrars = []
        for b in range(a.brokers):
            table = tables[b]
            registrars.append(NamesrvRegistrar(client, [ns], "BenchCluster", f"bench-broker-{b:03d}", 0,
                                               f"127.0.0.2:{20000 + b}", f"127.0.0.2:{30000 + b}",
                                               lambda table=table: list(table), interval_s=3600))
        t0, c0 = time.perf_counter(), cpu_s(pid)
        for r in registrars:  # the first registration: every table is new to the nameserver
            await r.register_now()
        out["first_registration"] = {"wall_s": round(time.perf_counter() - t0, 2),
                                     "namesrv_cpu_s": round(cpu_s(pid) - c0, 3)}
        all_topics = [tc.topic_name for table in tables for tc in table]
        samples_idle: list[float] = []
        stop_event = asyncio.Event()
        prober = asyncio.create_task(route_prober(ns, all_topics, samples_idle, stop_event))
        await asyncio.sleep(2.0)
        stop_event.set()
        await prober
        out["route_query_cost"] = await route_cost(ns, pid, all_topics)
        samples_busy: list[float] = []
        stop_event = asyncio.Event()
        prober = asyncio.create_task(route_prober(ns, all_topics, samples_busy, stop_event))
        rounds: list[dict[str, float]] = []
        for _ in range(a.rounds):
            t0, c0 = time.perf_counter(), cpu_s(pid)
            await asyncio.gather(*(r.register_now() for r in registrars))
            rounds.append({"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s(pid) - c0})
            await asyncio.sleep(0.5)
        stop_event.set()
        await prober
        out["periodic_round"] = {
            "rounds": len(rounds),
            "namesrv_cpu_s_per_round": round(statistics.median(r["cpu_s"] for r in rounds), 3),
            "namesrv_cpu_ms_per_broker": round(statistics.median(r["cpu_s"] for r in rounds) / a.brokers * 1000, 2),
            "round_wall_s": round(statistics.median(r["wall_s"] for r in rounds), 2)}
        out["route_latency_ms"] = {
            name: {"n": len(s), "p50": round(pct(s, 0.5) * 1000, 2), "p99": round(pct(s, 0.99) * 1000, 2),
                   "max": round(max(s) * 1000, 1)}
            for name, s in (("idle", samples_idle), ("during_rounds", samples_busy))}
        for r in registrars:
            await r.stop()
    return out


async def forced_full(ns: str, pid: int, a: argparse.Namespace) -> dict[str, Any]:
    """Java brokers' default (forceRegister=true): the full table every 30 s, unchanged. Raw frames."""
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import RequestCode, ResponseCode
    from cometmq.protocol.remoting import make_request
    from cometmq.protocol.route import DataVersion, RegisterBrokerBody, TopicConfig, body_crc32

    n = min(a.brokers, 20)
    out: dict[str, Any] = {}
    async with RemotingClient(connect_timeout=10) as client:
        for compressed in (False, True):
            bodies = []
            for b in range(n):
                configs = tuple(TopicConfig(f"J{b:03d}Topic{t:05d}", a.queues, a.queues)
                                for t in range(a.broker_topics))
                bodies.append(RegisterBrokerBody(configs, DataVersion(1_700_000_000_000 + b, 1)).encode(compressed))

            async def register(b: int, body: bytes, compressed: bool = compressed) -> None:
                fields = {"brokerAddr": f"127.0.0.3:{20000 + b}", "brokerId": 0, "brokerName": f"java-broker-{b:03d}",
                          "clusterName": "JavaCluster", "haServerAddr": f"127.0.0.3:{30000 + b}",
                          "compressed": "true" if compressed else "false", "bodyCrc32": body_crc32(body)}
                reply = await client.invoke(ns, make_request(RequestCode.REGISTER_BROKER, fields, body), 30)
                if reply.code != ResponseCode.SUCCESS:
                    raise SystemExit(f"register: {reply.code} {reply.remark}")

            for b, body in enumerate(bodies):  # first time: new tables
                await register(b, body)
            c0 = cpu_s(pid)
            reps = 3
            for _ in range(reps):
                for b, body in enumerate(bodies):
                    await register(b, body)
            per = (cpu_s(pid) - c0) / (reps * n)
            out["deflated" if compressed else "json"] = {
                "body_bytes": len(bodies[0]), "namesrv_cpu_ms_per_unchanged_registration": round(per * 1000, 2)}
            for b in range(n):
                await client.invoke(ns, make_request(RequestCode.UNREGISTER_BROKER, {
                    "brokerAddr": f"127.0.0.3:{20000 + b}", "brokerId": 0, "brokerName": f"java-broker-{b:03d}",
                    "clusterName": "JavaCluster"}), 10)
    return out


def row_nameserver(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-ns-") as tmp:
        d = Path(tmp)
        nsp = free_port()
        ns = start(["namesrv", "--port", str(nsp)], "cometmq namesrv", d / "namesrv.log")
        try:
            addr = f"127.0.0.1:{nsp}"
            result: dict[str, Any] = {"row": "nameserver", "brokers": a.brokers, "topics_per_broker": a.broker_topics,
                                      "queues": a.queues, "simulated": "NamesrvRegistrar per broker, real frames"}
            result.update(asyncio.run(namesrv_rounds(addr, ns.pid, a)))
            result["java_style_forced_full"] = asyncio.run(forced_full(addr, ns.pid, a))
            return result
        finally:
            stop(ns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row", choices=("topics", "nameserver", "all"), default="all")
    ap.add_argument("--topics", type=int, default=10_000, help="topics row: topics to create")
    ap.add_argument("--step", type=int, default=1_000, help="topics row: report every STEP topics")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--brokers", type=int, default=100, help="nameserver row: simulated brokers")
    ap.add_argument("--broker-topics", type=int, default=1_000, help="nameserver row: topics per broker")
    ap.add_argument("--rounds", type=int, default=3, help="nameserver row: periodic rounds measured")
    ap.add_argument("--json", type=Path, help="append the result lines (JSON) to this file")
    a = ap.parse_args()
    results = []
    if a.row in ("topics", "all"):
        results.append(row_topics(a))
        print(json.dumps(results[-1]), flush=True)
    if a.row in ("nameserver", "all"):
        results.append(row_nameserver(a))
        print(json.dumps(results[-1]), flush=True)
    if a.json is not None:
        with a.json.open("a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
