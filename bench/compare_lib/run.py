"""Sessions and repeats: one fresh broker (and one client process) per (repeat, system, workload) in full mode,
systems alternating.

A session starts the broker on free 127.0.0.1 ports in a temp folder, runs its workloads in a fixed order
(the backlog first, so its RSS reading is not inflated by earlier workloads), and stops everything it
started by PID, also on errors and Ctrl-C; the folder is deleted. In full mode a session runs one workload, so
no row runs on what an earlier row left: a broker that keeps its log after a topic is deleted (cometmq, as
RocketMQ) would otherwise write each row into a page cache grown by the rows before it, which on a virtual machine
costs ~8 µs per new page (bench/bench_page_touch.py), while the peers' deleted streams free theirs.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compare_lib.servers import SERVERS, Server, ServerError

BENCH_DIR = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


@dataclass(frozen=True)
class Mode:
    name: str
    repeats: int
    produce_seconds: float  # each produce workload stops at this time ...
    produce_max: int  # ... or this many messages
    backlog: int  # messages of 100 B in the consume / RSS backlog
    latency_count: int  # messages, one every latency_interval_ms
    latency_interval_ms: float
    acked_seconds: float
    acked_max: int
    reuse_servers: bool = False  # one server per system for all repeats (its memory then carries earlier runs)
    server_per_workload: bool = False  # a fresh server (and data folder) for each workload, not one per session
    settle_s: float = 1.0  # pause between building the backlog and reading the broker's memory
    settled_s: float = 3.0  # ... and its second reading, this long after the fill (what a broker holds once idle)


QUICK = Mode("quick", repeats=3, produce_seconds=0.6, produce_max=200_000, backlog=20_000, latency_count=150,
             latency_interval_ms=2.0, acked_seconds=0.5, acked_max=20_000, reuse_servers=True, settle_s=0.3,
             settled_s=0.6)
FULL = Mode("full", repeats=3, produce_seconds=8.0, produce_max=2_000_000, backlog=1_000_000, latency_count=2500,
            latency_interval_ms=2.0, acked_seconds=6.0, acked_max=300_000, server_per_workload=True)

#: the order of workloads in a session; cometmq-sync runs only the durable-acknowledgement ones + one produce
WORKLOADS = ("backlog", "produce_100b", "produce_1k", "latency", "acked_1", "acked_64", "acked_1_nofsync",
             "acked_64_nofsync", "acked_64_autobatch")
# acked_N: fsync before each acknowledgement where the system can (cometmq-sync; Redis appendfsync always;
# nats-sync: JetStream with sync_interval always, NATS 2.10+; plain "nats" runs them without, its default);
# acked_N_nofsync only where that is a runtime switch (Redis everysec; cometmq ASYNC is the "cometmq" system);
# acked_64_autobatch: acked_64 with the SDK's producer auto-batching on (cometmq only: Producer(auto_batch=True))
DEFAULT = WORKLOADS[:6]
PER_SYSTEM = {"cometmq": (*DEFAULT, "acked_64_autobatch"),
              "cometmq-sync": ("produce_100b", "acked_1", "acked_64", "acked_64_autobatch"),
              "nats-sync": ("acked_1", "acked_64"),
              "redis": WORKLOADS[:8]}

Log = Callable[[str], None]


class DriverError(RuntimeError):
    pass


class Driver:
    """The client process of one session (compare_lib.driver)."""

    def __init__(self, system: str, cfg: dict[str, Any], log_path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR),
                                                                           os.environ.get("PYTHONPATH")]))}
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen([sys.executable, "-m", "compare_lib.driver", system, json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     text=True, start_new_session=True)

    def call(self, op: str, timeout: float = 600.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": args, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 30)
        if not ready:
            raise DriverError(f"{op}: no answer from the client process in {timeout + 30:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise DriverError(f"{op}: the client process exited (rc {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=15)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()


def _measure(server: Server, driver: Driver, op: str, timeout: float, **args: Any) -> dict[str, Any]:
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    answer = driver.call(op, timeout, **args)
    wall, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    if not answer.get("ok"):
        raise DriverError(answer.get("error", "unknown error") + "\n" + answer.get("trace", ""))
    result: dict[str, Any] = dict(answer["result"])
    n = result.get("messages")
    result["server_cpu_s"] = round(cpu, 3)
    result["client_cpu_s"] = answer.get("client_cpu_s")
    result["call_wall_s"] = round(wall, 3)
    if n:
        result["server_cpu_us_per_msg"] = round(cpu / n * 1e6, 2)
        if answer.get("client_cpu_s") is not None:
            result["client_cpu_us_per_msg"] = round(float(answer["client_cpu_s"]) / n * 1e6, 2)
    return result


def _workload(name: str, server: Server, driver: Driver, mode: Mode, tag: str) -> list[dict[str, Any]]:
    stream = f"{tag}-{name}".replace("_", "-")
    if name == "backlog":
        idle = server.rss_bytes()
        fill = _measure(server, driver, "fill", 3600, stream=stream, size=100, count=mode.backlog)
        filled = time.monotonic()
        time.sleep(mode.settle_s)  # let the broker settle (flushes, dispatch) before reading its memory
        backlog = server.rss_bytes()
        time.sleep(max(0.0, filled + mode.settled_s - time.monotonic()))
        rss = {"workload": "rss", "idle_mib": round(idle / MIB, 1),
               "backlog_mib": round(backlog / MIB, 1), "backlog_settled_mib": round(server.rss_bytes() / MIB, 1),
               "backlog": mode.backlog, "fill_msgs_per_s": fill["msgs_per_s"]}
        consume = _measure(server, driver, "consume", 1800, stream=stream, count=mode.backlog)
        driver.call("delete", 120, stream=stream)
        return [rss, {"workload": "consume", **consume}]
    if name in ("produce_100b", "produce_1k"):
        size = 100 if name == "produce_100b" else 1024
        r = _measure(server, driver, "produce", mode.produce_seconds * 4 + 120, stream=stream, size=size,
                     max_count=mode.produce_max, seconds=mode.produce_seconds)
        r["mib_per_s"] = round(r["msgs_per_s"] * size / MIB, 2)
        driver.call("delete", 120, stream=stream)
        return [{"workload": name, **r}]
    if name == "latency":
        r = _measure(server, driver, "latency", mode.latency_count * mode.latency_interval_ms / 1000 * 3 + 60,
                     stream=stream, count=mode.latency_count, interval_ms=mode.latency_interval_ms)
        driver.call("delete", 120, stream=stream)
        return [{"workload": name, **r}]
    if name.startswith("acked_"):
        producers = int(name.split("_")[1])
        r = _measure(server, driver, "acked", mode.acked_seconds * 4 + 120, stream=stream, size=100,
                     producers=producers, max_count=mode.acked_max, seconds=mode.acked_seconds,
                     fsync=not name.endswith("_nofsync"), auto_batch=name.endswith("_autobatch"))
        driver.call("delete", 120, stream=stream)
        return [{"workload": name, **r}]
    raise ValueError(f"unknown workload {name!r}")


def start_server(system: str, repeat: int, scratch: Path, log: Log) -> Server | dict[str, Any]:
    """A started server, or the error row that says why it did not start."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{system}-r{repeat}-", dir=scratch))
    server = SERVERS[system](workdir)
    log(f"[r{repeat}] {system}: starting")
    try:
        server.start()
    except ServerError as exc:
        log(f"[r{repeat}] {system}: FAILED to start: {str(exc).splitlines()[0][:300]}")
        stop_server(server, scratch)
        return {"system": system, "repeat": repeat, "workload": "startup", "error": str(exc)[-2000:]}
    return server


def stop_server(server: Server, scratch: Path) -> None:
    """Stop by PID, keep its log in the scratch folder, delete its data."""
    try:
        server.stop()
    finally:
        if server.log_path.exists():
            shutil.copyfile(server.log_path, scratch / f"{server.workdir.name}.log")
        shutil.rmtree(server.workdir, ignore_errors=True)


def session(server: Server, repeat: int, mode: Mode, scratch: Path, log: Log,
            workloads: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Run one system's workloads on a running server with a fresh client process; rows carry system and
    repeat. The server is left running (the caller owns it)."""
    system = server.system
    base = {"system": system, "repeat": repeat}
    rows: list[dict[str, Any]] = []
    wanted = workloads_of(system, workloads)
    driver = Driver(system, server.client_config(), scratch / f"{server.workdir.name}-client-r{repeat}.log")
    try:
        for name in wanted:
            try:
                for row in _workload(name, server, driver, mode, f"r{repeat}"):
                    rows.append({**base, **row})
                    log(f"[r{repeat}] {system} {row['workload']}: {_brief(row)}")
            except (DriverError, OSError) as exc:
                rows.append({**base, "workload": name, "error": str(exc)[:2000]})
                log(f"[r{repeat}] {system} {name}: FAILED {str(exc).splitlines()[0][:300]}")
                if driver.proc.poll() is not None:
                    break
    except BaseException:  # Ctrl-C / SIGTERM: do not wait for the client to finish its workload
        driver.proc.kill()
        raise
    finally:
        driver.close()
    return rows


def workloads_of(system: str, workloads: tuple[str, ...] | None) -> list[str]:
    """``system``'s workloads, in session order, of those asked for (None: all)."""
    return [w for w in PER_SYSTEM.get(system, DEFAULT) if workloads is None or w in workloads]


def _brief(row: dict[str, Any]) -> str:
    keys = ("msgs_per_s", "median_ms", "p99_ms", "p999_ms", "idle_mib", "backlog_mib", "server_cpu_us_per_msg")
    return ", ".join(f"{k}={row[k]}" for k in keys if k in row)


def plan(systems: list[str], repeats: int) -> list[tuple[int, str]]:
    """Repeats in rounds; each round visits every system, the order rotated so none is always first."""
    order: list[tuple[int, str]] = []
    for r in range(repeats):
        k = r % len(systems)
        order.extend((r + 1, s) for s in systems[k:] + systems[:k])
    return order


def run_all(systems: list[str], mode: Mode, scratch: Path, log: Log,
            workloads: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Every (repeat, system) of the plan. A fresh server per session (with ``mode.server_per_workload``, per
    workload of it), or with ``mode.reuse_servers`` one server per system for the whole run (quick mode:
    RabbitMQ alone takes ~10 s to start)."""
    rows: list[dict[str, Any]] = []
    running: dict[str, Server] = {}
    failed: set[str] = set()
    try:
        for repeat, system in plan(systems, mode.repeats):
            parts: list[tuple[str, ...] | None] = [workloads]
            if mode.server_per_workload and not mode.reuse_servers:
                parts = [(w,) for w in workloads_of(system, workloads)]
            for part in parts:
                server = running.get(system)
                if server is None:
                    if system in failed:
                        break
                    started = start_server(system, repeat, scratch, log)
                    if isinstance(started, dict):
                        rows.append(started)
                        if mode.reuse_servers:
                            failed.add(system)
                        break
                    server = running[system] = started
                    rows.append({"system": system, "repeat": repeat, "workload": "startup",
                                 "seconds": round(server.started_s, 2)})
                try:
                    rows.extend(session(server, repeat, mode, scratch, log, part))
                finally:
                    if not mode.reuse_servers:
                        del running[system]
                        stop_server(server, scratch)
    finally:
        for server in running.values():
            stop_server(server, scratch)
    return rows


def mode_dict(mode: Mode) -> dict[str, Any]:
    return asdict(mode)
