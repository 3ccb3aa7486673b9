"""Fixtures for interop tests with the official RocketMQ 5.x gRPC clients, each in its own subprocess:

* ``py5``: the Python client (rocketmq-python-client 5.1.2) from its own virtualenv ``.venv-py5``;
* ``node5``: the Node.js client (rocketmq-client-nodejs 1.0.8) from tests/interop/grpc/node/node_modules.

``scripts/setup-grpc-clients`` installs both (scripts/test runs it); a test skips, naming the missing piece and
that command, only when they are absent. ``grpc_server`` starts a real ``cometmq serve`` with its gRPC endpoint on
a free port (``COMETMQ_GRPC_PORT``). Clients get HOME in a per-test temporary folder (both write logs there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.interop.cometmq_server import CometServer, free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PY5 = ROOT / ".venv-py5" / "bin" / "python"
PY5_SCRIPT = HERE / "clients" / "py5.py"
NODE_DIR = HERE / "node"
NODE_SCRIPT = NODE_DIR / "client.js"
SETUP_HINT = "run scripts/setup-grpc-clients"


@dataclass
class Result:
    argv: list[str]
    rc: int | None
    lines: list[dict[str, Any]]
    stderr: str

    def events(self, name: str) -> list[dict[str, Any]]:
        return [ln for ln in self.lines if ln.get("event") == name]

    def describe(self) -> str:
        return f"argv={self.argv} rc={self.rc}\nstdout={self.lines}\nstderr={self.stderr[-3000:]}"


@dataclass
class Background:
    proc: subprocess.Popen[str]
    argv: list[str]
    lines: list[dict[str, Any]] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    readers: list[threading.Thread] = field(default_factory=list)

    def start_readers(self) -> None:
        def out() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                with self.cond:
                    try:
                        self.lines.append(json.loads(raw))
                    except ValueError:
                        pass
                    self.cond.notify_all()

        def err() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                self.stderr.append(raw)

        for fn in (out, err):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self.readers.append(t)

    def _close_pipes(self) -> None:
        """Once the readers have seen the end of the pipes, close them (no ResourceWarning)."""
        for t in self.readers:
            t.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def events(self, name: str) -> list[dict[str, Any]]:
        with self.cond:
            return [ln for ln in self.lines if ln.get("event") == name]

    def wait_for(self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not pred(self.lines)):
                    return pred(self.lines)
                self.cond.wait(min(left, 0.2))
            return True

    def finish(self, timeout: float = 60) -> Result:
        try:
            rc: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._close_pipes()
        with self.cond:
            return Result(self.argv, rc, list(self.lines), "".join(self.stderr))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()


class ClientRunner:
    """``runner.run("produce", endpoints=..., topic=..., count=3)``; options become ``--kebab-case`` flags."""

    def __init__(self, cmd: list[str], home: Path) -> None:
        self.cmd = cmd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("COMETMQ_", "GRPC_"))}
        self.env.update(HOME=str(home), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        home.mkdir(parents=True, exist_ok=True)
        self.started: list[Background] = []

    def argv(self, command: str, options: dict[str, Any]) -> list[str]:
        out = [*self.cmd, command]
        for key, val in options.items():
            if val is None or val is False:
                continue
            out.append("--" + key.replace("_", "-"))
            if val is not True:
                out.append(str(val))
        return out

    def run(self, command: str, run_timeout: float = 90, **options: Any) -> Result:
        """Run to completion (killed after ``run_timeout`` s); ``timeout=`` is the script's own option."""
        argv = self.argv(command, options)
        try:
            p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=run_timeout, cwd=ROOT)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc = None
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        lines = []
        for raw in out.splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                pass
        return Result(argv, rc, lines, err)

    def start(self, command: str, **options: Any) -> Background:
        argv = self.argv(command, options)
        bg = Background(subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, cwd=ROOT), argv)
        bg.start_readers()
        self.started.append(bg)
        return bg

    def close(self) -> None:
        for bg in self.started:
            bg.kill()


@dataclass
class GrpcServer:
    server: CometServer
    grpc_port: int

    @property
    def endpoints(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def _py5_missing() -> str | None:
    if not PY5.exists():
        return f"{PY5} is missing ({SETUP_HINT})"
    r = subprocess.run([str(PY5), "-c", "import rocketmq.v5"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": "/tmp"})
    return None if r.returncode == 0 else f"rocketmq-python-client does not import in .venv-py5: {r.stderr[-500:]}"


def _node_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        return f"rocketmq-client-nodejs is not installed under {NODE_DIR} ({SETUP_HINT})"
    return None


@pytest.fixture(scope="session")
def py5_available() -> None:
    reason = _py5_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def node5_available() -> None:
    reason = _node_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def py5(tmp_path: Path, py5_available: None) -> Iterator[ClientRunner]:
    runner = ClientRunner([str(PY5), str(PY5_SCRIPT)], tmp_path / "py5-home")
    yield runner
    runner.close()


@pytest.fixture
def node5(tmp_path: Path, node5_available: None) -> Iterator[ClientRunner]:
    runner = ClientRunner(["node", str(NODE_SCRIPT)], tmp_path / "node-home")
    yield runner
    runner.close()


@pytest.fixture
def grpc_server(tmp_path: Path) -> Iterator[Callable[..., GrpcServer]]:
    """``grpc_server(conf={...}, access_keys="ak:sk")`` -> a running ``cometmq serve`` with gRPC on a free port."""
    pytest.importorskip("grpc", reason="the grpc extra is not installed")
    servers: list[CometServer] = []

    def make(conf: dict[str, str] | None = None, access_keys: str | None = None) -> GrpcServer:
        port = free_port()
        env = {**os.environ, "COMETMQ_GRPC_PORT": str(port)}
        if access_keys:
            env["COMETMQ_ACCESS_KEYS"] = access_keys
        server = CometServer(tmp_path / f"cometmq-{len(servers)}", {"enablePropertyFilter": "true", **(conf or {})},
                             env=env)
        servers.append(server)
        server.start()
        return GrpcServer(server, port)

    yield make
    for s in servers:
        s.close()
