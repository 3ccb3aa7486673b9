"""bench_broker.py's common parts: results and logging, the machine and its noise, the broker under test
(``cometmq serve`` in a subprocess), C++ client processes, and admin helpers."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "bench" / "cpp_bench_client.py"
sys.path.insert(0, str(ROOT / "tests" / "interop"))
sys.path.insert(0, str(ROOT / "bench"))

from cometmq.net.client import RemotingClient  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from cometmq.protocol.remoting import make_request  # noqa: E402

PY = sys.executable
RESULTS: list[dict[str, Any]] = []
_JSONL: Any = None


def set_jsonl(fh: Any) -> None:
    """Also write every reported line to ``fh`` (None: stop)."""
    global _JSONL
    _JSONL = fh


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


def _cpu(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return float(t.user + t.system)
