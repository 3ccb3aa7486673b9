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
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "bench" / "cpp_bench_client.py"
sys.path.insert(0, str(ROOT / "tests" / "interop"))
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  (tests/interop/harness.py: client_env)
from cpp_bench_client import lat_stats, pct  # noqa: E402

from cometmq.net.client import RemotingClient  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from cometmq.protocol.properties import encode_properties  # noqa: E402
from cometmq.protocol.remoting import FrameDecoder, encode, make_request, make_response  # noqa: E402

PY = sys.executable
RESULTS: list[dict[str, Any]] = []
_JSONL: Any = None


def report(**fields: Any) -> dict[str, Any]:
    RESULTS.append(fields)
    line = json.dumps(fields)
    print(line, flush=True)
    if _JSONL is not None:
        _JSONL.write(line + "\n")
        _JSONL.flush()
    return fields


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------ machine


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for mod in ("uvloop", "psutil"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    try:
        from importlib.metadata import version
        versions["rocketmq_wheel"] = version("rocketmq")
        versions["cometmq"] = version("cometmq")
    except Exception:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no",
                                     "src"], capture_output=True, text=True, timeout=5).stdout.strip())
    except Exception:
        commit, dirty = "", None
    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu_model": model,
            "mem_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
            "platform": platform.platform(), "git_commit": commit, "src_dirty": dirty, **versions}


class HostSampler:
    """Background thread: every ``period`` s, host busy CPUs (0..nproc) and the broker's CPUs over that slice.

    The machine is shared (other test runs may be going on): these samples tell whether a latency outlier
    coincided with a busy host."""

    def __init__(self, broker: Broker, period: float = 0.05) -> None:
        self.broker, self.period = broker, period
        self.samples: list[tuple[float, float, float]] = []  # (wall end of slice, host busy CPUs, broker CPUs)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))

    def _run(self) -> None:
        prev = (time.time(), self._busy(), self.broker.cpu())
        while not self._stop.wait(self.period):
            cur = (time.time(), self._busy(), self.broker.cpu())
            dt = cur[0] - prev[0]
            if dt > 0:
                self.samples.append((cur[0], (cur[1] - prev[1]) / dt, (cur[2] - prev[2]) / dt))
            prev = cur

    def __enter__(self) -> HostSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(2)

    def around(self, wall: float, width: float = 0.1) -> dict[str, float] | None:
        """Peak host / broker busy CPUs in the slices within ``width`` s of ``wall``."""
        near = [s for s in self.samples if abs(s[0] - wall) <= width]
        if not near:
            return None
        return {"host_cpus": round(max(s[1] for s in near), 2), "broker_cpus": round(max(s[2] for s in near), 2)}

    def mean_host(self) -> float | None:
        return round(sum(s[1] for s in self.samples) / len(self.samples), 3) if self.samples else None


def foreign_load(exclude: set[int], interval: float = 0.5) -> dict[str, Any]:
    """Other processes on this (shared) machine using CPU right now: total and the top three."""
    procs = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid in exclude:
            continue
        try:
            proc.cpu_percent(None)
            procs.append(proc)
        except psutil.Error:
            pass
    time.sleep(interval)
    busy = []
    for proc in procs:
        try:
            pcpu = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if pcpu >= 2:
            cmd = " ".join(proc.info.get("cmdline") or [proc.info.get("name") or "?"])
            busy.append((pcpu, cmd[:90]))
    busy.sort(reverse=True)
    return {"foreign_cpu_percent": round(sum(b[0] for b in busy)), "top": [f"{p:.0f}% {c}" for p, c in busy[:3]],
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def our_pids(broker: Broker | None) -> set[int]:
    me = psutil.Process()
    pids = {me.pid} | {c.pid for c in me.children(recursive=True)}
    if broker is not None:
        pids.add(broker.pid)
    return pids


# ------------------------------------------------------------------------------------------------- broker


class Broker:
    def __init__(self, workdir: Path, conf: list[str] | None = None) -> None:
        self.workdir = workdir
        self.namesrv_port = free_port()
        self.broker_port = free_port()
        while self.broker_port == self.namesrv_port:
            self.broker_port = free_port()
        self.log_path = workdir / "serve.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        cmd = [PY, "-m", "cometmq.cli", "serve", "--data", str(workdir / "data"), "--namesrv-port",
               str(self.namesrv_port), "--broker-port", str(self.broker_port), "--log-level", "WARNING"]
        if conf:
            (workdir / "broker.conf").write_text("".join(f"{kv}\n" for kv in conf))
            cmd += ["-c", str(workdir / "broker.conf")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=workdir)
        self.pid = self.proc.pid
        line: list[str] = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(30)
        if not line or "cometmq serving" not in line[0]:
            self.stop()
            raise RuntimeError(f"broker did not start: {line!r}; log: {self.log_path.read_text()[-2000:]}")
        if f":{self.broker_port}" not in line[0] or f":{self.namesrv_port}" not in line[0]:
            self.stop()
            raise RuntimeError(f"broker started on unexpected ports: {line[0]!r}")
        threading.Thread(target=self._drain, daemon=True).start()
        self.ps = psutil.Process(self.pid)
        self.ready_line = line[0].strip()

    def _drain(self) -> None:
        for _ in self.proc.stdout:  # type: ignore[union-attr]
            pass

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def rss_mib(self) -> float:
        return round(float(self.ps.memory_info().rss) / 2**20, 1)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# -------------------------------------------------------------------------------------------- C++ clients


class Client:
    """One bench/cpp_bench_client.py process; stdout JSON lines collected by a thread."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.args = list(args)
        self.proc = subprocess.Popen([PY, str(DRIVER), *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:  # type: ignore[union-attr]
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            with self.cond:
                self.lines.append(obj)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _read_err(self) -> None:
        for raw in self.proc.stderr:  # type: ignore[union-attr]
            self.stderr.append(raw)

    def event(self, name: str) -> dict[str, Any] | None:
        with self.cond:
            for ln in self.lines:
                if ln.get("event") == name:
                    return ln
        return None

    def wait_for(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for ln in self.lines:
                    if ln.get("event") == name:
                        return ln
                if self.proc.poll() is not None and not self._threads[0].is_alive():
                    raise RuntimeError(f"client exited rc={self.proc.returncode} before {name!r}: {self.describe()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {name!r} after {timeout}s: {self.describe()}")
                self.cond.wait(min(left, 0.2))

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> int | None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self._threads:
            t.join(5)
        return self.proc.returncode

    def describe(self) -> str:
        return (f"args={self.args} rc={self.proc.returncode} lines={json.dumps(self.lines[-3:])[:1500]} "
                f"stderr={''.join(self.stderr)[-1500:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------------------ admin helpers


async def _create_topics(broker: Broker, topics: list[str], queues: int = 4) -> None:
    async with RemotingClient() as cli:
        for topic in topics:
            req = make_request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                               {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
                                "writeQueueNums": queues, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                "topicSysFlag": 0, "order": "false"})
            rep = await cli.invoke(broker.addr, req, 5)
            if rep.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"create topic {topic}: {rep.code} {rep.remark}")
        deadline = time.monotonic() + 35  # the route must be on the name server before clients look it up
        for topic in topics:
            while True:
                rep = await cli.invoke(broker.namesrv, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                      {"topic": topic}), 5)
                if rep.code == ResponseCode.SUCCESS and rep.body:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no route for {topic} on the name server")
                await asyncio.sleep(0.1)


async def _max_offsets(broker: Broker, topic: str, queues: int = 4) -> list[int]:
    async with RemotingClient() as cli:
        out = []
        for q in range(queues):
            rep = await cli.invoke(broker.addr, make_request(RequestCode.GET_MAX_OFFSET, {"topic": topic,
                                                                                         "queueId": q}), 5)
            out.append(int(rep.ext_fields.get("offset", "-1")))
        return out


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


def _cpu(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return float(t.user + t.system)


def _warm_count(cons: Client) -> int:
    with cons.cond:
        return sum(1 for ln in cons.lines if ln.get("event") == "warm")


# ------------------------------------------------------------------------------------------------ 4. rtt


class _EchoClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) >= 4:
            n = int.from_bytes(buf[:4], "big")
            if len(buf) >= 4 + n:
                frame = bytes(buf[:4 + n])
                del buf[:4 + n]
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(frame)


def _cpu_fn(ps: psutil.Process) -> Any:
    return lambda: _cpu(ps)


def _max_offset_req() -> Any:
    return make_request(RequestCode.GET_MAX_OFFSET, {"topic": "BenchSend", "queueId": 0})


def _send_req(i: int) -> Any:
    """SEND_MESSAGE as the C++ client sends it: 100 B body, TAGS/UNIQ_KEY/WAIT properties, batch "0"."""
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": f"{os.getpid():08X}{i:024X}", "WAIT": "true"})
    return make_request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_bench_rtt", "topic": "BenchRtt", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": i % 4, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
        "properties": props.decode(), "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}, b"x" * 100)


def _client_codec_us(mk: Any, reply_ext: dict[str, str], reps: int = 5000) -> float:
    """Our client's own codec work per round trip: encode the request + decode the reply (in-process)."""
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        req = mk()
        encode(req)
        FrameDecoder().feed(encode(make_response(req, 0, None, reply_ext)))
    both = (time.perf_counter_ns() - t0) / reps / 1e3
    req = mk()
    t0 = time.perf_counter_ns()
    for _ in range(reps):  # the reply's encoding is the broker's job: subtract it
        encode(make_response(req, 0, None, reply_ext))
    return both - (time.perf_counter_ns() - t0) / reps / 1e3


async def _rtt(broker: Broker, echo_port: int, echo_ps: psutil.Process, n: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds (echo block, GET_MAX_OFFSET block, SEND block) so that noise from other work on the
    machine hits all three alike; per-round medians are kept for a paired comparison."""
    loop = asyncio.get_running_loop()
    frame = (196).to_bytes(4, "big") + b"r" * 196  # 200-byte frame: 4-byte length + 196 payload bytes
    transport, proto = await loop.create_connection(_EchoClient, "127.0.0.1", echo_port)
    sock = transport.get_extra_info("socket")
    nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) if sock is not None else None
    kinds = ("raw_tcp_echo", "get_max_offset", "send_message")
    samples: dict[str, list[int]] = {k: [] for k in kinds}
    round_p50: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, float] = {k: 0.0 for k in kinds}
    per = {"raw_tcp_echo": n // rounds, "get_max_offset": n // rounds, "send_message": n // 2 // rounds}
    seq = 0

    async def echo_once() -> int:
        proto.waiter = loop.create_future()
        t0 = time.perf_counter_ns()
        transport.write(frame)
        await proto.waiter
        return time.perf_counter_ns() - t0

    async with RemotingClient() as cli:
        async def broker_once(kind: str) -> int:
            nonlocal seq
            seq += 1
            req = _max_offset_req() if kind == "get_max_offset" else _send_req(seq)
            t0 = time.perf_counter_ns()
            rep = await cli.invoke(broker.addr, req, 5)
            dt = time.perf_counter_ns() - t0
            if rep.code != 0:
                raise RuntimeError(f"{kind} failed: {rep.code} {rep.remark}")
            return dt

        async def max_once() -> int:
            return await broker_once("get_max_offset")

        async def send_once() -> int:
            return await broker_once("send_message")

        ops: dict[str, Callable[[], Awaitable[int]]] = {
            "raw_tcp_echo": echo_once, "get_max_offset": max_once, "send_message": send_once}
        sizes = {"raw_tcp_echo": 200, "get_max_offset": len(encode(_max_offset_req())),
                 "send_message": len(encode(_send_req(0)))}
        reply_sizes = {"get_max_offset": len(encode(await cli.invoke(broker.addr, _max_offset_req(), 5))),
                       "send_message": len(encode(await cli.invoke(broker.addr, _send_req(0), 5)))}
        for kind in kinds:  # warm-up
            for _ in range(min(500, per[kind])):
                await ops[kind]()
        for _ in range(rounds):
            for kind in kinds:
                op = ops[kind]
                block = []
                server_cpu = _cpu_fn(echo_ps) if kind == "raw_tcp_echo" else broker.cpu
                c0 = server_cpu()
                for _ in range(per[kind]):
                    block.append(await op())
                cpu[kind] += server_cpu() - c0
                samples[kind] += block
                round_p50[kind].append(pct(sorted(block), 0.5) / 1e3)
    transport.close()
    return {"samples": samples, "round_p50": round_p50, "cpu": cpu, "sizes": sizes, "reply_sizes": reply_sizes,
            "nodelay": nodelay}


def pin(pid: int, cpus: set[int]) -> None:
    """CPU affinity of every thread of ``pid`` (Linux affinity is per thread)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def bench_rtt(broker: Broker, quick: bool) -> None:
    """Round trips, in two placements: client and server on one CPU (a wake-up is a context switch), and on
    two CPUs (a wake-up crosses CPUs: on this VM that alone costs tens of µs). Unpinned runs land in either,
    which makes raw TCP round trips bimodal (~14 µs vs ~100 µs here)."""
    n = 5000 if quick else 30000
    rounds = 5 if quick else 10
    all_cpus = os.sched_getaffinity(0)
    placements = [("same_cpu", {0}, {0})]
    if len(all_cpus) >= 2:
        a, b = sorted(all_cpus)[:2]
        placements = [("same_cpu", {a}, {a}), ("cross_cpu", {a}, {b})]
    echo = subprocess.Popen([PY, str(DRIVER), "echo-server", "--uvloop"], stdout=subprocess.PIPE, text=True)
    codec = {"get_max_offset": _client_codec_us(_max_offset_req, {"offset": "12345"}),
             "send_message": _client_codec_us(lambda: _send_req(1), {"msgId": "7F00000100002A9F0000000000001234",
                                                                      "queueId": "1", "queueOffset": "42"})}
    try:
        info = json.loads(echo.stdout.readline())  # type: ignore[union-attr]
        from cometmq.net.loop import run

        for placement, client_cpus, server_cpus in placements:
            os.sched_setaffinity(0, client_cpus)  # this (main) thread runs the client loop
            pin(broker.pid, server_cpus)
            pin(echo.pid, server_cpus)
            try:
                with HostSampler(broker, 0.1) as hs:
                    res = run(_rtt(broker, info["port"], psutil.Process(echo.pid), n, rounds))
                res["host_busy_cpus"] = hs.mean_host()
            finally:
                os.sched_setaffinity(0, all_cpus)
                pin(broker.pid, all_cpus)
            _report_rtt(res, placement, rounds, codec)
    finally:
        os.kill(echo.pid, signal.SIGTERM)
        echo.wait(10)


def _report_rtt(res: dict[str, Any], placement: str, rounds: int, codec: dict[str, float]) -> None:
    raw_rounds = res["round_p50"]["raw_tcp_echo"]
    raw_cpu = res["cpu"]["raw_tcp_echo"] / len(res["samples"]["raw_tcp_echo"]) * 1e6
    for kind, samples in res["samples"].items():
        row: dict[str, Any] = {"what": kind, "placement": placement, "round_trips": len(samples), "rounds": rounds,
                               "request_bytes": res["sizes"][kind], **lat_stats(samples)}
        if kind == "raw_tcp_echo":
            row["client_nodelay"] = res["nodelay"]
            row["loop"] = "uvloop both sides (as the broker)"
            row["server_cpu_us_per_req"] = round(raw_cpu, 1)
            row["host_busy_cpus"] = res.get("host_busy_cpus")  # includes this client and the servers (~1)
        else:
            diffs = sorted(b - r for b, r in zip(res["round_p50"][kind], raw_rounds, strict=True))
            row.update({
                "reply_bytes": res["reply_sizes"][kind],
                "added_vs_raw_us_p50": round(row["p50"] - pct(sorted(res["samples"]["raw_tcp_echo"]), 0.5) / 1e3, 1),
                "added_vs_raw_us_paired": round(pct(diffs, 0.5), 1),  # median over rounds of (p50 - raw p50)
                "client_codec_us": round(codec[kind], 1),
                "broker_cpu_us_per_req": round(res["cpu"][kind] / len(samples) * 1e6, 1)})
            row["broker_cpu_minus_echo_server_us"] = round(row["broker_cpu_us_per_req"] - raw_cpu, 1)
            row["added_minus_client_codec_us"] = round(row["added_vs_raw_us_paired"] - codec[kind], 1)
        report(bench="rtt", **row)


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
    global _JSONL
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
        _JSONL = open(args.jsonl, "w")  # noqa: SIM115

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
        if _JSONL is not None:
            _JSONL.close()
    print("\n" + summary_text(machine), flush=True)
    if args.md:
        args.md.write_text(markdown(machine, list(argv if argv is not None else sys.argv[1:])) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
