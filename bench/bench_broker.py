"""End-to-end broker benchmarks with the official RocketMQ C++ client (wheel ``rocketmq==0.4.4``).

    .venv/bin/python bench/bench_broker.py            # full run (~1.5-2 minutes on 2 vCPUs)
    .venv/bin/python bench/bench_broker.py --quick    # smaller counts (~25 s)
    .venv/bin/python bench/bench_broker.py --only latency --only rtt --md out.md --jsonl out.jsonl

Starts ``python -m cometmq.cli serve`` on free 127.0.0.1 ports with a temporary data folder (stopped by its
PID at the end; ``--conf KEY=VALUE`` adds broker.conf lines), then measures, each C++ client in its own
process (bench/cpp_bench_client.py, which prints no line per message):

1. ``send``     sync send rate of one producer (100 B and 1 KiB bodies; once more with producer and broker
                pinned to one vCPU) and of 2 and 4 producer processes at once;
2. ``consume``  push-consume rate of a backlog (100k; built first with batch sends from two producers),
                timed from the consumer's ``start()`` to its last delivery;
3. ``latency``  long-poll wake-up: an idle push consumer, one message every 20 ms (body = ``time.time_ns()``
                before ``send_sync``), send->receive latency median / p99 / max, samples > 1 s and near 5 s;
4. ``rtt``      per-request cost: a raw asyncio TCP echo of a 200-byte frame vs our RemotingClient doing
                GET_MAX_OFFSET (30) and SEND_MESSAGE (10) round trips against the broker, in interleaved
                rounds, with client and servers pinned to one vCPU and to two; plus server CPU per request.

Prints one JSON object per measurement, then a short summary (``--jsonl`` / ``--md`` also write them to
files). Broker and echo-server CPU figures come from psutil (user + system time of the process). The machine
may be shared: a ``noise`` line before each part lists other processes using CPU, and ``host_busy_cpus`` is
the mean number of busy CPUs (all processes) while a part ran.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "interop"))
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  (tests/interop/harness.py: client_env)
from broker_bench_common import (  # noqa: E402
    RESULTS,
    Broker,
    Client,
    HostSampler,
    _cpu,
    _create_topics,
    _max_offsets,
    foreign_load,
    log,
    machine_info,
    our_pids,
    pin,
    report,
    set_jsonl,
)
from broker_bench_rtt import bench_rtt  # noqa: E402
from cpp_bench_client import pct  # noqa: E402

# ---------------------------------------------------------------------------------------------- 1. send


def run_producers(env: dict[str, str], broker: Broker, n: int, *, topic: str, count: int, body: int,
                  mode: str = "sync", batch_size: int = 16, warmup: int = 200,
                  pin_cpus: set[int] | None = None) -> dict[str, Any]:
    """Start n producer processes, wait until all finished their warm-up, start them together, and
    aggregate: rate = all sent / (last end - first start). ``pin_cpus``: pin the producers and the broker
    (every thread) to these CPUs for the measured part."""
    procs = [Client(env, "produce", "--namesrv", broker.namesrv, "--topic", topic, "--count", str(count),
                    "--body-size", str(body), "--mode", mode, "--batch-size", str(batch_size),
                    "--warmup", str(warmup), "--wait-go", "--group", f"PG_bench_{topic}")
             for _ in range(n)]
    try:
        for p in procs:
            p.wait_for("ready", 60)
        if pin_cpus:
            for p in procs:
                pin(p.proc.pid, pin_cpus)
            pin(broker.pid, pin_cpus)
        with HostSampler(broker, 0.2) as hs:
            cpu0, w0 = broker.cpu(), time.time()
            for p in procs:
                p.go()
            sums = [p.wait_for("summary", 300) for p in procs]
            cpu1 = broker.cpu()
    finally:
        if pin_cpus:
            pin(broker.pid, os.sched_getaffinity(0))
        for p in procs:
            rc = p.finish(60)
            if rc not in (0, None) and p.event("summary") is None:
                log(f"producer failed: {p.describe()}")
    sent = sum(s["sent"] for s in sums)
    failed = sum(s["failed"] for s in sums)
    t0 = min(s["t0"] for s in sums)
    t1 = max(s["t1"] for s in sums)
    wall = t1 - t0
    out = {"producers": n, "mode": mode, "body": body, "pinned": sorted(pin_cpus) if pin_cpus else None,
           "sent": sent, "failed": failed,
           "wall_s": round(wall, 3), "msgs_per_s": round(sent / wall) if wall > 0 else None,
           "broker_cpu_s": round(cpu1 - cpu0, 3),
           "broker_cpu_us_per_msg": round((cpu1 - cpu0) / max(sent, 1) * 1e6, 1),
           "broker_cpu_util": round((cpu1 - cpu0) / max(time.time() - w0, 1e-9), 2),
           "host_busy_cpus": hs.mean_host()}
    if mode == "batch":
        out["batch_size"] = batch_size
    if n == 1:
        out["send_us"] = sums[0]["send_us"]
        out["worst_sends"] = sums[0].get("worst_sends")
    else:
        out["per_producer_msgs_per_s"] = [s["msgs_per_s"] for s in sums]
        out["send_us_p50"] = [s["send_us"].get("p50") for s in sums]
    errors = [e for s in sums for e in s.get("errors", [])]
    if errors:
        out["errors"] = errors[:3]
    return out


def bench_send(env: dict[str, str], broker: Broker, quick: bool) -> None:
    count = 3000 if quick else 20000
    for body in (100, 1024):
        r = run_producers(env, broker, 1, topic="BenchSend", count=count, body=body)
        report(bench="send_sync", **r)
    # On a VM a wake-up that crosses vCPUs costs tens of µs (see part 4); with the producer and the broker on
    # one vCPU every hand-off is a plain context switch: the rate then shows the CPU cost rather than placement.
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        r = run_producers(env, broker, 1, topic="BenchSend", count=count, body=100, pin_cpus={cpus[0]})
        report(bench="send_sync", **r)
    for n in ((4,) if quick else (2, 4)):
        per = 1000 if quick else count // n
        r = run_producers(env, broker, n, topic="BenchSend", count=per, body=100)
        report(bench="send_sync_parallel", **r)


# -------------------------------------------------------------------------------------------- 2. consume


def bench_consume(env: dict[str, str], broker: Broker, quick: bool, threads: int = 0) -> None:
    total = 10_000 if quick else 100_000
    topic = "BenchBacklog"
    # build the backlog: two producers, batches of 16 x 100 B (under the 4 KiB compression threshold)
    r = run_producers(env, broker, 2, topic=topic, count=total // 2, body=100, mode="batch", batch_size=16,
                      warmup=0)
    report(bench="backlog_build", **r)
    offsets = asyncio.run(_max_offsets(broker, topic))
    if sum(offsets) != total:
        log(f"backlog holds {sum(offsets)} messages, expected {total}: {offsets}")
    cpu0 = broker.cpu()
    rss0 = broker.rss_mib()
    c = Client(env, "consume", "--namesrv", broker.namesrv, "--topic", topic, "--group", "CG_bench_backlog",
               "--count", str(sum(offsets)), "--timeout", "150", "--thread-count", str(threads))
    try:
        cps = psutil.Process(c.proc.pid)
        ccpu0 = _cpu(cps)
        with HostSampler(broker, 0.1) as hs:
            s = c.wait_for("summary", 200)
            cpu1 = broker.cpu()
            ccpu1 = _cpu(cps)
        rss1 = broker.rss_mib()
    finally:
        c.finish(60)
    got = s["received"]
    from_start = (s["last_ns"] - s["start_ns"]) / 1e9 if s["last_ns"] else None
    from_first = (s["last_ns"] - s["first_ns"]) / 1e9 if s["last_ns"] else None
    report(bench="push_consume_backlog", backlog=sum(offsets), received=got, complete=s["complete"],
           seconds_from_start=round(from_start, 3) if from_start else None,
           msgs_per_s_from_start=round(got / from_start) if from_start else None,
           startup_to_first_ms=round((s["first_ns"] - s["start_ns"]) / 1e6, 1) if s["first_ns"] else None,
           msgs_per_s_from_first=round(got / from_first) if from_first else None,
           broker_cpu_s=round(cpu1 - cpu0, 3), broker_cpu_us_per_msg=round((cpu1 - cpu0) / max(got, 1) * 1e6, 1),
           consumer_cpu_s=round(ccpu1 - ccpu0, 2), consumer_threads=threads or "client default",
           broker_rss_mib_before=rss0, broker_rss_mib_after=rss1, host_busy_cpus=hs.mean_host(),
           consumer_rc=c.proc.returncode)


# -------------------------------------------------------------------------------------------- 3. latency


def bench_latency(env: dict[str, str], broker: Broker, quick: bool) -> None:
    count = 150 if quick else 500
    topic = "BenchLatency"
    cons = Client(env, "consume", "--namesrv", broker.namesrv, "--topic", topic, "--group", "CG_bench_latency",
                  "--count", str(count), "--latency", "--timeout", str(count * 0.02 + 40))
    prod = None
    try:
        started = cons.wait_for("started", 30)
        prod = Client(env, "produce", "--namesrv", broker.namesrv, "--topic", topic, "--count", str(count),
                      "--body-size", "64", "--stamp", "--interval-ms", "20", "--warmup", "8",
                      "--warmup-interval-ms", "50", "--wait-go", "--group", "PG_bench_latency")
        prod.wait_for("ready", 60)
        # the consumer must have its long polls parked on every queue: wait for all 8 warm-up messages
        # (2 per queue) to arrive, then give it a moment to re-park
        deadline = time.monotonic() + 20
        warm = 0
        while time.monotonic() < deadline:
            warm = _warm_count(cons)
            if warm >= 8:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        cps, pps = psutil.Process(cons.proc.pid), psutil.Process(prod.proc.pid)
        with HostSampler(broker, 0.05) as hs:
            cpu0 = (broker.cpu(), _cpu(cps), _cpu(pps), time.monotonic())
            prod.go()
            psum = prod.wait_for("summary", count * 0.02 + 60)
            cpu1 = (broker.cpu(), _cpu(cps), _cpu(pps), time.monotonic())
            s = cons.wait_for("summary", count * 0.02 + 60)
    finally:
        if prod is not None:
            prod.finish(60)
        cons.finish(60)
    samples = s.get("samples_ns", [])  # (recv_ns, latency_ns, index)
    sends = psum.get("all_send_ns", [])  # send_sync duration per index
    ms = sorted(lat / 1e6 for _, lat, _ in samples)
    start_ns = started["start_ns"]
    worst = sorted(samples, key=lambda x: -x[1])[:5]
    slow = [(lat, i) for _, lat, i in samples if lat > 10e6]
    report(bench="long_poll_latency", messages=count, interval_ms=20, received=s["received"],
           complete=s["complete"], warm_seen_before_go=warm,
           median_ms=round(pct(ms, 0.5), 3) if ms else None, p90_ms=round(pct(ms, 0.9), 3) if ms else None,
           p99_ms=round(pct(ms, 0.99), 3) if ms else None, max_ms=round(ms[-1], 3) if ms else None,
           min_ms=round(ms[0], 3) if ms else None,
           over_10ms=len(slow), over_100ms=sum(v > 100 for v in ms), over_1s=sum(v > 1000 for v in ms),
           near_5s=sum(4000 < v < 6000 for v in ms),
           # of the samples above 10 ms, how many had a send_sync that itself took > 10 ms (time spent before
           # or while the broker stored it, not in the long-poll wake-up)
           over_10ms_with_slow_send=sum(1 for _, i in slow if i < len(sends) and sends[i] > 10e6),
           worst=[{"ms": round(lat / 1e6, 2), "index": i,
                   "send_ms": round(sends[i] / 1e6, 2) if i < len(sends) else None,
                   "at_s_after_consumer_start": round((recv - lat - start_ns) / 1e9, 3),
                   "busy_around": hs.around(recv / 1e9)}
                  for recv, lat, i in worst],
           host_busy_cpus=hs.mean_host(),
           producer_send_us=psum.get("send_us"),
           cpu_util={k: round((cpu1[i] - cpu0[i]) / (cpu1[3] - cpu0[3]), 3)
                     for i, k in enumerate(("broker", "consumer", "producer"))},
           target="median <= 2 ms, max < 100 ms",
           target_met=bool(ms) and pct(ms, 0.5) <= 2 and ms[-1] < 100)




def _warm_count(cons: Client) -> int:
    with cons.cond:
        return sum(1 for ln in cons.lines if ln.get("event") == "warm")


# ----------------------------------------------------------------------------------------------- summary


def markdown(machine: dict[str, Any], argv: list[str]) -> str:
    """The results as a markdown section (tables), for docs or bench/results/."""
    def rows(bench: str) -> list[dict[str, Any]]:
        return [r for r in RESULTS if r.get("bench") == bench]

    run = (rows("run") or [{}])[-1]
    out = [f"Command: `.venv/bin/python bench/bench_broker.py{''.join(' ' + a for a in argv)}` "
           f"({run.get('seconds')} s)", "",
           f"Machine: {machine['nproc']} vCPUs ({machine['cpu_model']}), {machine['mem_gib']} GiB, "
           f"{machine['platform']}; Python {machine['python']}, uvloop {machine.get('uvloop')}, "
           f"C++ client wheel rocketmq {machine.get('rocketmq_wheel')}; cometmq at {machine.get('git_commit')}"
           f"{' (src/ had uncommitted changes)' if machine.get('src_dirty') else ''}.", ""]
    noise = rows("noise")
    if noise:
        out.append("Other load on the (shared) machine when each part began: " + "; ".join(
            f"{n['before']}: {n['foreign_cpu_percent']}% CPU" + (f" ({n['top'][0].split(' ', 1)[1][:60]})"
                                                                 if n["top"] and n["foreign_cpu_percent"] >= 20 else "")
            for n in noise) + ".")
        out.append("")
    sends = rows("send_sync") + rows("send_sync_parallel") + rows("backlog_build")
    if sends:
        out += ["### 1. Sends (C++ client, one process per producer)", "",
                "| what | producers | body | messages | msg/s | send p50 / p99 µs | broker CPU µs/msg | broker CPU | "
                "host busy CPUs |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sends:
            what = "batch of " + str(r["batch_size"]) if r["mode"] == "batch" else "send_sync"
            if r.get("pinned"):
                what += " (producer + broker pinned to one vCPU)"
            lat = (f"{r['send_us']['p50']:.0f} / {r['send_us']['p99']:.0f}" if "send_us" in r
                   else "p50 " + ", ".join(f"{v:.0f}" for v in r.get("send_us_p50", [])))
            out.append(f"| {what} | {r['producers']} | {r['body']} B | {r['sent']} | **{r['msgs_per_s']}** | {lat} | "
                       f"{r['broker_cpu_us_per_msg']} | {r['broker_cpu_util'] * 100:.0f}% | {r['host_busy_cpus']} |")
        out.append("")
    for r in rows("push_consume_backlog"):
        out += ["### 2. Push consume of a backlog", "",
                f"{r['backlog']} messages of 100 B, one push consumer (C++ client, {r['consumer_threads']} threads), "
                f"timed from `start()` to the last delivery: **{r['msgs_per_s_from_start']} msg/s** "
                f"({r['seconds_from_start']} s; first message {r['startup_to_first_ms']} ms after `start()`). "
                f"Broker CPU {r['broker_cpu_us_per_msg']} µs/msg ({r['broker_cpu_s']} s in all), consumer process "
                f"CPU {r['consumer_cpu_s']} s; host busy {r['host_busy_cpus']} CPUs. Broker RSS "
                f"{r['broker_rss_mib_before']} → {r['broker_rss_mib_after']} MiB.", ""]
    for r in rows("long_poll_latency"):
        out += ["### 3. Long-poll wake-up latency", "",
                f"Idle push consumer; {r['messages']} messages, one every {r['interval_ms']} ms, body = "
                f"`time.time_ns()` taken just before `send_sync`; latency = consumer callback entry - that stamp.",
                "", "| received | median | p90 | p99 | max | > 10 ms | > 100 ms | > 1 s | 4-6 s | target |",
                "|---|---|---|---|---|---|---|---|---|---|",
                f"| {r['received']}/{r['messages']} | **{r['median_ms']} ms** | {r['p90_ms']} ms | {r['p99_ms']} ms | "
                f"**{r['max_ms']} ms** | {r['over_10ms']} | {r['over_100ms']} | {r['over_1s']} | {r['near_5s']} | "
                f"{'met' if r['target_met'] else 'NOT met'} ({r['target']}) |", "",
                "Worst samples: " + "; ".join(
                    f"{w['ms']} ms (msg {w['index']}, its send_sync took {w['send_ms']} ms, host busy "
                    f"{(w.get('busy_around') or {}).get('host_cpus')} CPUs)" for w in r["worst"][:3]) + ".",
                f"Producer send_sync during this part: p50 {r['producer_send_us']['p50']:.0f} µs, max "
                f"{r['producer_send_us']['max']:.0f} µs. CPU use: {r['cpu_util']}.", ""]
    rtt = rows("rtt")
    if rtt:
        out += ["### 4. Per-request cost against a raw TCP round trip", "",
                "Same process, uvloop: a 200-byte frame echoed by a tiny asyncio server vs our `RemotingClient` "
                "doing GET_MAX_OFFSET and SEND_MESSAGE (100 B, as the C++ client builds it) against the broker, "
                "in interleaved rounds. *added* = median over rounds of (round p50 - raw round p50). *same CPU*: "
                "client and server pinned to one vCPU; *cross CPU*: on two (every wake-up crosses vCPUs).", "",
                "| placement | request | p50 µs | p99 µs | added vs raw µs | our client codec µs | "
                "server CPU µs/req | host busy CPUs |", "|---|---|---|---|---|---|---|---|"]
        host = {r["placement"]: r.get("host_busy_cpus") for r in rtt if r["what"] == "raw_tcp_echo"}
        for r in rtt:
            if r["what"] == "raw_tcp_echo":
                out.append(f"| {r['placement']} | raw TCP echo | {r['p50']:.1f} | {r['p99']:.1f} | - | - | "
                           f"{r['server_cpu_us_per_req']} | {host.get(r['placement'])} |")
            else:
                out.append(f"| {r['placement']} | {r['what']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                           f"**{r['added_vs_raw_us_paired']}** | {r['client_codec_us']} | {r['broker_cpu_us_per_req']} "
                           f"(echo + {r['broker_cpu_minus_echo_server_us']}) | {host.get(r['placement'])} |")
        out.append("")
    return "\n".join(out)


def summary_text(machine: dict[str, Any]) -> str:
    lines = [f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
             f"uvloop {machine.get('uvloop')}, wheel rocketmq {machine.get('rocketmq_wheel')}"]
    for r in RESULTS:
        b = r.get("bench")
        if b == "send_sync":
            lines.append(f"sync send, 1 producer, {r['body']} B{', all on one vCPU' if r.get('pinned') else ''}: "
                         f"{r['msgs_per_s']} msg/s "
                         f"(send p50 {r['send_us']['p50']} µs, p99 {r['send_us']['p99']} µs; "
                         f"broker {r['broker_cpu_us_per_msg']} CPU µs/msg)")
        elif b == "send_sync_parallel":
            lines.append(f"sync send, {r['producers']} producers, {r['body']} B: {r['msgs_per_s']} msg/s total "
                         f"(broker CPU {r['broker_cpu_util'] * 100:.0f}%, {r['broker_cpu_us_per_msg']} µs/msg)")
        elif b == "backlog_build":
            lines.append(f"backlog build, {r['producers']} producers, batches of {r['batch_size']}: "
                         f"{r['msgs_per_s']} msg/s")
        elif b == "push_consume_backlog":
            lines.append(f"push consume of {r['backlog']} backlog: {r['msgs_per_s_from_start']} msg/s from start() "
                         f"({r['seconds_from_start']} s, first message after {r['startup_to_first_ms']} ms; "
                         f"{r['msgs_per_s_from_first']} msg/s from the first; broker {r['broker_cpu_us_per_msg']} "
                         f"CPU µs/msg)")
        elif b == "long_poll_latency":
            lines.append(f"long-poll wake-up, {r['received']}/{r['messages']} msgs every 20 ms: median "
                         f"{r['median_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms, >1 s: {r['over_1s']} "
                         f"(target median <= 2 ms, max < 100 ms: {'met' if r['target_met'] else 'NOT met'})")
        elif b == "rtt":
            if r["what"] == "raw_tcp_echo":
                lines.append(f"[{r['placement']}] raw TCP echo 200 B: p50 {r['p50']} µs (p99 {r['p99']}); echo server "
                             f"{r['server_cpu_us_per_req']} CPU µs/round trip")
            else:
                lines.append(f"[{r['placement']}] {r['what']} round trip: p50 {r['p50']} µs (p99 {r['p99']}) = raw + "
                             f"{r['added_vs_raw_us_paired']} µs (paired by round; our client's codec ~"
                             f"{r['client_codec_us']} µs of it); broker {r['broker_cpu_us_per_req']} CPU µs/request "
                             f"(echo server + {r['broker_cpu_minus_echo_server_us']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts (< 1.5 minutes)")
    ap.add_argument("--only", action="append", choices=["send", "consume", "latency", "rtt"],
                    help="run only these parts (repeatable)")
    ap.add_argument("--jsonl", type=Path, default=None, help="also write the JSON lines to this file")
    ap.add_argument("--consume-threads", type=int, default=0,
                    help="push consumer thread count for part 2 (0 = the C++ client's default)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="broker.conf line for the broker under test (repeatable), e.g. messageIndexEnable=false")
    ap.add_argument("--md", type=Path, default=None, help="also write the results as markdown tables here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (broker log, client logs)")
    args = ap.parse_args(argv)
    parts = args.only or ["send", "consume", "latency", "rtt"]
    if args.jsonl:
        jsonl = open(args.jsonl, "w")  # noqa: SIM115
        set_jsonl(jsonl)

    t_begin = time.monotonic()
    machine = machine_info()
    report(bench="machine", quick=args.quick, **machine)
    workdir = Path(tempfile.mkdtemp(prefix="cometmq-bench-broker-"))
    env = harness.client_env(workdir / "home")
    broker = Broker(workdir, args.conf)
    if args.conf:
        report(bench="broker_conf", lines=args.conf)
    log(f"{broker.ready_line} (pid {broker.pid}); work dir {workdir}")
    try:
        asyncio.run(_create_topics(broker, ["BenchSend", "BenchBacklog", "BenchLatency", "BenchRtt"]))
        def noise(phase: str) -> None:
            report(bench="noise", before=phase, **foreign_load(our_pids(broker)))

        if "send" in parts:
            noise("send")
            log("1/4 sync send")
            bench_send(env, broker, args.quick)
        if "consume" in parts:
            noise("consume")
            log("2/4 push consume of a backlog")
            bench_consume(env, broker, args.quick, args.consume_threads)
        if "latency" in parts:
            noise("latency")
            log("3/4 long-poll wake-up latency")
            bench_latency(env, broker, args.quick)
        if "rtt" in parts:
            noise("rtt")
            log("4/4 request round trips")
            bench_rtt(broker, args.quick)
        noise("end")
        report(bench="broker_end", rss_mib=broker.rss_mib(), cpu_s=round(broker.cpu(), 2))
    finally:
        rc = broker.stop()
        errs = [ln for ln in broker.log_path.read_text(errors="replace").splitlines()
                if " ERROR " in ln or "Traceback" in ln]
        report(bench="run", seconds=round(time.monotonic() - t_begin, 1), broker_exit=rc,
               broker_log_errors=len(errs), broker_log_first_errors=errs[:3])
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        if args.jsonl:
            set_jsonl(None)
            jsonl.close()
    print("\n" + summary_text(machine), flush=True)
    if args.md:
        args.md.write_text(markdown(machine, list(argv if argv is not None else sys.argv[1:])) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
