"""Spark's own servers in subprocesses, started from the PySpark package's scripts: a standalone master and
worker (``spark-class``) and a Spark Connect server (``spark-submit --class ...SparkConnectServer``).

Each :class:`SparkProc` runs in a process group of its own, logs to a file, and is stopped by its PID:
SIGTERM, then (after a grace period) SIGKILL of its group, which holds the executors and Python workers it
spawned. Nothing else is ever signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyspark

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
BIN = SPARK_HOME / "bin"


class SparkProcError(RuntimeError):
    pass


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark JVM a test starts: loopback only, this interpreter for Python workers, and
    this checkout's cometmq first on their path (so the workers import the code under test)."""
    path = [str(ROOT / "src"), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ)
    env.update({"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
                "SPARK_NO_DAEMONIZE": "1"})
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env.update(extra)
    return env


class SparkProc:
    """One Spark JVM (and whatever it spawns) in a process group of its own."""

    def __init__(self, name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name, self.cmd, self.log, self.env, self.cwd = name, list(cmd), log, dict(env), cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SparkProc:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                         start_new_session=True)
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for(self, marker: str, timeout: float = 90.0) -> None:
        """Wait until the log shows ``marker``; fail with the log's tail if the process exits first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while marker not in self.log_text():
            if self.proc.poll() is not None:
                raise SparkProcError(f"{self.name} exited with rc {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SparkProcError(f"{self.name}: no {marker!r} in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, grace: float = 20.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:  # the group this object made: executors and Python workers the JVM left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def start_master(workdir: Path, port: int, webui_port: int) -> SparkProc:
    return SparkProc("spark master", [str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master",
                                      "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui_port)],
                     workdir / "master.log", spark_env(SPARK_DAEMON_MEMORY="384m"), workdir).start()


def start_worker(workdir: Path, master: str, port: int, webui_port: int, cores: int = 2,
                 memory: str = "2g") -> SparkProc:
    work = workdir / "worker-work"
    work.mkdir(exist_ok=True)
    return SparkProc("spark worker", [str(BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                                      "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui_port),
                                      "--cores", str(cores), "--memory", memory, "--work-dir", str(work), master],
                     workdir / "worker.log", spark_env(SPARK_DAEMON_MEMORY="384m"), workdir).start()


def start_connect_server(workdir: Path, port: int, master: str, conf: Mapping[str, str] | None = None) -> SparkProc:
    """``spark-submit`` of PySpark's Spark Connect server on 127.0.0.1:``port``, its Python (driver side and
    executors) able to import cometmq, its warehouse under ``workdir``."""
    env = spark_env()
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.warehouse.dir": str(workdir / "warehouse"),
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": env["PYTHONPATH"],
        "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
        "spark.executor.memory": "1g",
        **(conf or {}),
    }
    cmd = [str(BIN / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
           "--name", "cometmq-connect-tests", "--master", master, "--driver-memory", "1g"]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    return SparkProc("spark connect server", cmd, workdir / "connect.log", env, workdir).start()


def master_state(webui_port: int) -> dict[str, Any]:
    """The standalone master's state, as its web UI's ``/json`` gives it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json/", timeout=10) as r:
        state: dict[str, Any] = json.load(r)
        return state
