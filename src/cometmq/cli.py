"""The ``cometmq`` command: namesrv, controller, broker, serve (namesrv and broker in one process), and cluster
(a local broker group)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cometmq import __version__

if TYPE_CHECKING:
    from cometmq.broker.controller import BrokerController

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cometmq: a RocketMQ-compatible message broker written in Python.")

log = logging.getLogger("cometmq")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM. Installed before anything starts, so a signal that arrives while
    the servers start (or just after the ready line) still stops them cleanly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _server_gc() -> None:
    from cometmq.common.gc_tuning import tune_for_server

    try:
        tune_for_server()
    except ValueError as exc:  # the servers are up by now: say so and keep Python's collector settings
        logging.getLogger("cometmq").error("%s; the garbage collector keeps its default settings", exc)


def _run(main: object) -> None:
    from cometmq.net.loop import run

    try:
        run(main)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass


def _broker_config(conf: Path | None, data: Path | None, host: str, port: int | None, namesrv: str | None):  # type: ignore[no-untyped-def]
    from cometmq.broker.config import BrokerConfig, load_broker_conf
    from cometmq.store.config import ConfigError

    try:
        cfg = load_broker_conf(conf) if conf else BrokerConfig()
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="-c/--config") from None
    changes: dict[str, object] = {"listen_host": host}
    if port is not None:
        changes["listen_port"] = port
    if namesrv is not None:
        changes["namesrv_addr"] = namesrv
    if data is not None or conf is None:
        changes["store"] = cfg.store.replace(store_path=(data or Path("data")).resolve())
    return cfg.replace(**changes)


_GRPC_PORT_HELP = "gRPC (RocketMQ 5) endpoint port; 0 = off [default: 8081, skipped with a warning if busy]"
_ACCESS_KEYS_HELP = "turn gRPC authentication on with these 'accessKey:secretKey,...' pairs"


async def _start_grpc(port: int | None, namesrv: str | None, host: str, access_keys: str | None,
                      broker: BrokerController | None = None) -> object | None:
    """Start the embedded gRPC endpoint (a proxy over remoting; ``broker``, the BrokerController of this process,
    is reached in process instead of over loopback TCP). Off when the port is 0, when the ``grpc`` extra is
    missing, or (default port only) when the port is busy; an explicit port must bind."""
    explicit = port is not None
    if port == 0:
        log.info("gRPC endpoint off (--grpc-port 0)")
        return None
    try:
        from cometmq.grpc.config import DEFAULT_GRPC_PORT, ProxyConfig
        from cometmq.grpc.server import GrpcProxy
    except ImportError as exc:
        log.warning("gRPC endpoint off: the grpc extra is not installed (pip install 'cometmq[grpc]'): %s", exc)
        return None
    if not namesrv:
        log.warning("gRPC endpoint off: it needs a nameserver (namesrvAddr / --namesrv)")
        return None
    local = {}
    if broker is not None and broker.server is not None:
        from cometmq.net.local import local_connector

        local[broker.addr] = local_connector(broker.server, broker.addr)
    proxy = GrpcProxy(ProxyConfig(namesrv=namesrv, host=host, port=DEFAULT_GRPC_PORT if port is None else port,
                                  **_auth_options(access_keys)), local=local)  # type: ignore[arg-type]
    try:
        await proxy.start()
    except OSError as exc:
        if explicit:
            raise
        log.warning("gRPC endpoint off: %s", exc)
        return None
    return proxy


def _auth_options(access_keys: str | None) -> dict[str, object]:
    if not access_keys:
        return {}
    from cometmq.grpc.auth import parse_access_keys

    try:
        return {"auth_enabled": True, "access_keys": parse_access_keys(access_keys)}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--access-keys") from None


def _grpc_note(proxy: object | None) -> str:
    return f", gRPC {proxy.addr}" if proxy is not None else ""  # type: ignore[attr-defined]


async def _stop_grpc(proxy: object | None) -> None:
    if proxy is not None:
        await proxy.stop()  # type: ignore[attr-defined]


@app.command()
def namesrv(
    port: Annotated[int, typer.Option(help="port to listen on")] = 9876,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    controller_data: Annotated[Path | None, typer.Option(
        help="run the controller in this nameserver, its log in DIR (RocketMQ's enableControllerInNamesrv)")] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
) -> None:
    """Run a nameserver (route registry)."""
    _setup_logging(log_level)
    from cometmq.namesrv.server import EmbeddedService, NamesrvConfig, NamesrvController

    async def main() -> None:
        stop = _stop_event()
        embedded: list[EmbeddedService] = []
        if controller_data is not None:
            from cometmq.controller.log import LocalLog
            from cometmq.controller.processors import ControllerConfig, ControllerProcessors

            embedded.append(ControllerProcessors(ControllerConfig(host=host, port=port), LocalLog(controller_data),
                                                 address=lambda: ctl.addr))
        ctl = NamesrvController(NamesrvConfig(host=host, port=port), embedded=embedded)
        await ctl.start()
        _server_gc()
        print(f"cometmq namesrv listening on {host}:{ctl.port}", flush=True)
        try:
            await stop.wait()
        finally:
            await ctl.stop()

    _run(main())


@app.command()
def controller(
    data: Annotated[Path, typer.Option(help="folder of the controller's log (controller.log)")],
    port: Annotated[int, typer.Option(help="port to listen on")] = 9878,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
) -> None:
    """Run a controller (one node, its decisions in a durable local log): elects each broker group's master."""
    _setup_logging(log_level)
    from cometmq.controller.log import LocalLog
    from cometmq.controller.server import ControllerConfig, ControllerServer

    async def main() -> None:
        stop = _stop_event()
        ctl = ControllerServer(ControllerConfig(host=host, port=port), LocalLog(data))
        await ctl.start()
        print(f"cometmq controller listening on {ctl.addr}", flush=True)
        try:
            await stop.wait()
        finally:
            await ctl.stop()

    _run(main())


@app.command()
def broker(
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    data: Annotated[Path | None, typer.Option(help="data folder (storePathRootDir)")] = None,
    port: Annotated[int | None, typer.Option(help="remoting port (listenPort)")] = None,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    namesrv: Annotated[str | None, typer.Option(help="nameservers, 'host:port;host:port'")] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
    grpc_port: Annotated[int | None, typer.Option(help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
) -> None:
    """Run a broker that registers with the given nameservers."""
    _setup_logging(log_level)
    from cometmq.broker.controller import BrokerController

    cfg = _broker_config(config, data, host, port, namesrv)

    async def main() -> None:
        stop = _stop_event()
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            proxy = await _start_grpc(grpc_port, cfg.namesrv_addr, host, access_keys, ctl)
        except BaseException:
            await ctl.stop()
            raise
        _server_gc()
        print(f"cometmq broker {cfg.broker_name} listening on {ctl.addr}{_grpc_note(proxy)}, "
              f"data in {cfg.store.store_path}", flush=True)
        try:
            await stop.wait()
        finally:
            await _stop_grpc(proxy)
            await ctl.stop()

    _run(main())


@app.command()
def serve(
    data: Annotated[Path | None, typer.Option(help="data folder")] = None,
    namesrv_port: Annotated[int, typer.Option(help="nameserver port")] = 9876,
    broker_port: Annotated[int, typer.Option(help="broker remoting port")] = 10911,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
    grpc_port: Annotated[int | None, typer.Option(help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
) -> None:
    """Run a nameserver and a broker in one process (development, tests, single machine)."""
    _setup_logging(log_level)
    from cometmq.broker.controller import BrokerController
    from cometmq.namesrv.server import NamesrvConfig, NamesrvController

    async def main() -> None:
        stop = _stop_event()
        ns = NamesrvController(NamesrvConfig(host=host, port=namesrv_port))
        await ns.start()
        cfg = _broker_config(config, data, host, broker_port, f"{host}:{ns.port}")
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            proxy = await _start_grpc(grpc_port, f"{host}:{ns.port}", host, access_keys, ctl)
        except BaseException:
            await ctl.stop()
            await ns.stop()
            raise
        _server_gc()
        print(f"cometmq serving: namesrv {host}:{ns.port}, broker {ctl.addr}{_grpc_note(proxy)}, "
              f"data in {cfg.store.store_path}", flush=True)
        try:
            await stop.wait()
        finally:
            await _stop_grpc(proxy)
            await ctl.stop()
            await ns.stop()

    _run(main())


@app.command()
def proxy(
    namesrv: Annotated[str, typer.Option(help="nameservers, 'host:port;host:port'")] = "127.0.0.1:9876",
    grpc_port: Annotated[int, typer.Option(min=1, max=65535, help="gRPC port to listen on")] = 8081,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP)] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
) -> None:
    """Serve the RocketMQ 5 gRPC protocol, talking remoting to the brokers found through the nameservers."""
    _setup_logging(log_level)
    try:
        from cometmq.grpc.config import ProxyConfig
        from cometmq.grpc.server import GrpcProxy
    except ImportError as exc:
        raise typer.BadParameter(f"the grpc extra is not installed (pip install 'cometmq[grpc]'): {exc}") from None
    cfg = ProxyConfig(namesrv=namesrv, host=host, port=grpc_port, **_auth_options(access_keys))  # type: ignore[arg-type]

    async def main() -> None:
        stop = _stop_event()
        gp = GrpcProxy(cfg)
        await gp.start()
        _server_gc()
        print(f"cometmq proxy listening on {gp.addr} (gRPC), nameservers {namesrv}", flush=True)
        try:
            await stop.wait()
        finally:
            await gp.stop()

    _run(main())


@app.command()
def cluster(
    data: Annotated[Path, typer.Option(help="folder of the group: DIR/broker-0, DIR/broker-1, … (data, "
                                            "broker.conf, broker.log) and DIR/namesrv.log")],
    replicas: Annotated[int, typer.Option(min=0, max=9, help="replicas besides the master")] = 2,
    base_port: Annotated[int, typer.Option(min=1, max=65400, help="broker i listens on BASE+10*i, its HA port "
                                                                  "on BASE+10*i+1")] = 10911,
    namesrv_port: Annotated[int, typer.Option(help="nameserver port")] = 9876,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="logging level of the processes")] = "INFO",
    start_timeout: Annotated[float, typer.Option(min=1, help="seconds each process may take to be ready")] = 60.0,
    stop_timeout: Annotated[float, typer.Option(min=0.1, help="seconds to stop before SIGKILL")] = 15.0,
) -> None:
    """Run a nameserver and one broker group (a master and REPLICAS replicas), each in its own process, until
    Ctrl-C or SIGTERM; see docs/replication.md."""
    group = LocalCluster(data, replicas, base_port=base_port, namesrv_port=namesrv_port, host=host,
                         log_level=log_level, start_timeout=start_timeout, stop_timeout=stop_timeout,
                         out=lambda line: print(line, flush=True))
    try:
        group.run()
    except ClusterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


# -- `cometmq cluster`: a local broker group, one process each --------------------------------------------------
# A nameserver and one broker group (a master and N replicas) on this machine, each in its own process, for
# trying replication and failover by hand (docs/replication.md). (Here rather than in a module of its own:
# tests/test_layers.py gives every top-level module of cometmq a layer.)
#
# Each process is ``python -m cometmq.cli namesrv|broker …`` with its output in a log file; the supervisor waits
# for each one's ready line, prints its role, address and PID, and on SIGINT/SIGTERM stops every child it started
# (SIGTERM, then SIGKILL after a timeout), by PID. A child that exits on its own (say, a master killed with
# ``kill -9`` to try a failover) is reported and the others keep running. On Linux the children also get SIGTERM
# if the supervisor itself dies (``PR_SET_PDEATHSIG``).

NAMESRV_READY = "cometmq namesrv listening on"
BROKER_NAME = "broker-a"
BROKER_READY = f"cometmq broker {BROKER_NAME} listening on"
CLUSTER_NAME = "DefaultCluster"
#: a group's brokers sit this many ports apart: remoting base + STEP*i, HA base + STEP*i + 1
PORT_STEP = 10


class ClusterError(Exception):
    """A process did not start (its log's tail is in the message)."""


@dataclass
class Child:
    role: str
    name: str
    addr: str
    log_path: Path
    ready_marker: str
    broker_id: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    reported_exit: bool = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Linux: SIGTERM this child when the supervisor dies, so a killed supervisor leaves no brokers behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_epoch(data: Path) -> int:
    """The master epoch a broker's data folder ended in (0: none yet, or unreadable)."""
    from cometmq.store.epoch_file import EpochFile, EpochFileCorrupt

    try:
        return EpochFile(data / "epochFileCheckpoint").last_epoch()
    except (EpochFileCorrupt, OSError):
        return 0


def broker_conf(*, broker_id: int, host: str, port: int, namesrv: str, data: Path) -> str:
    return (f"# written by `cometmq cluster`: a broker group of one master (brokerId 0) and its replicas\n"
            f"brokerClusterName={CLUSTER_NAME}\nbrokerName={BROKER_NAME}\nbrokerId={broker_id}\n"
            f"listenPort={port}\nhaListenPort={port + 1}\nnamesrvAddr={namesrv}\n"
            f"storePathRootDir={data}\n")


class LocalCluster:
    def __init__(self, data: Path, replicas: int, *, base_port: int, namesrv_port: int, host: str = "127.0.0.1",
                 log_level: str = "INFO", start_timeout: float = 60.0, stop_timeout: float = 15.0,
                 out: Callable[[str], None] = print) -> None:
        self.data = data.resolve()
        self.host = host
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.out = out
        self.namesrv = f"{host}:{namesrv_port}"
        self.namesrv_port = namesrv_port
        dirs = [self.data / f"broker-{i}" for i in range(1 + replicas)]
        # A re-run after a failover: the broker with the newest epoch is the master (restarting the old master
        # as the master again would make the others truncate what the newer master wrote).
        epochs = [last_epoch(d) for d in dirs]
        master = epochs.index(max(epochs))
        order = [master] + [i for i in range(len(dirs)) if i != master]
        #: (broker id, folder index, remoting port); broker ids follow the order: 0 = master, then 1, 2, …
        self.brokers = [(bid, i, base_port + PORT_STEP * i) for bid, i in enumerate(order)]
        self.children: list[Child] = []
        #: set by SIGINT/SIGTERM while ``run`` runs: stop waiting and stop everything
        self.stopping = threading.Event()

    # -- starting -----------------------------------------------------------------------------------------------
    def _spawn(self, child: Child, args: Sequence[str]) -> None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(child.log_path, "wb") as log_file:
            child.proc = subprocess.Popen(
                [sys.executable, "-m", "cometmq.cli", *args, "--log-level", self.log_level],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                # its own session: a Ctrl-C in the terminal reaches the supervisor only, which stops the
                # children in order (brokers before the nameserver they unregister from)
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.children.append(child)

    def _wait_ready(self, children: Sequence[Child]) -> None:
        deadline = time.monotonic() + self.start_timeout
        waiting = list(children)
        while waiting:
            for child in list(waiting):
                if child.ready_marker in child.log_path.read_text(errors="replace"):
                    waiting.remove(child)
                elif not child.running():
                    raise ClusterError(f"{child.name} exited before it was ready:\n{_tail(child.log_path)}")
            if self.stopping.is_set():
                raise ClusterError("stopped (SIGINT/SIGTERM) while starting")
            if waiting and time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                raise ClusterError(f"{names} not ready after {self.start_timeout:g} s:\n{_tail(waiting[0].log_path)}")
            if waiting:
                time.sleep(0.05)

    def start(self) -> None:
        """Start the nameserver, then the master, then the replicas; each is waited for. On failure, whatever
        was started is stopped and ClusterError raised."""
        self.data.mkdir(parents=True, exist_ok=True)
        try:
            ns = Child("namesrv", "namesrv", self.namesrv, self.data / "namesrv.log", NAMESRV_READY)
            self._spawn(ns, ["namesrv", "--host", self.host, "--port", str(self.namesrv_port)])
            self._wait_ready([ns])
            for group in (self.brokers[:1], self.brokers[1:]):
                started = []
                for broker_id, index, port in group:
                    folder = self.data / f"broker-{index}"
                    folder.mkdir(parents=True, exist_ok=True)
                    conf = folder / "broker.conf"
                    conf.write_text(broker_conf(broker_id=broker_id, host=self.host, port=port,
                                                namesrv=self.namesrv, data=folder))
                    child = Child("master" if broker_id == 0 else "replica", f"broker-{index}",
                                  f"{self.host}:{port}", folder / "broker.log", BROKER_READY, broker_id)
                    self._spawn(child, ["broker", "-c", str(conf), "--host", self.host, "--grpc-port", "0"])
                    started.append(child)
                self._wait_ready(started)
        except BaseException:
            self.stop()
            raise

    def describe(self) -> list[str]:
        lines = []
        for c in self.children:
            where = c.addr if c.broker_id is None else \
                f"{c.addr} (HA {_ha_addr(c.addr)}, brokerId {c.broker_id}, data {c.log_path.parent})"
            lines.append(f"{c.role:<8} {c.name:<9} pid {c.pid:<7} {where}")
        return lines

    # -- running and stopping ---------------------------------------------------------------------------------
    def report_exits(self) -> None:
        """Say once about each child that ended on its own (e.g. a master killed to try a failover)."""
        for c in self.children:
            if c.proc is not None and not c.reported_exit and c.proc.poll() is not None:
                c.reported_exit = True
                self.out(f"{c.role} {c.name} (pid {c.pid}) exited with code {c.proc.returncode}; "
                         f"log: {c.log_path}")

    def alive(self) -> bool:
        return any(c.running() for c in self.children)

    def stop(self) -> None:
        """SIGTERM the brokers (replicas first), then the nameserver; SIGKILL whoever outlives the timeout."""
        brokers = [c for c in reversed(self.children) if c.role != "namesrv"]
        for phase in (brokers, [c for c in self.children if c.role == "namesrv"]):
            live = [c for c in phase if c.running()]
            for c in live:
                assert c.proc is not None
                c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            for c in live:
                assert c.proc is not None
                try:
                    c.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.out(f"{c.name} (pid {c.pid}) did not stop in {self.stop_timeout:g} s: SIGKILL")
                    c.proc.kill()
                    c.proc.wait(10)

    def run(self) -> None:
        """Start, print the processes, then wait for SIGINT/SIGTERM (or every child gone) and stop them."""
        stop = self.stopping
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            for line in self.describe():
                self.out(line)
            master = next(c for c in self.children if c.role == "master")
            replica = next((c for c in self.children if c.role == "replica"), None)
            self.out(f"cometmq cluster ready: {len(self.children) - 1} brokers of {BROKER_NAME}, nameserver "
                     f"{self.namesrv}; Ctrl-C stops them all")
            if replica is not None:
                self.out(f"try a failover: kill -9 {master.pid}; cometmq admin promote -b {replica.addr}")
            while not stop.wait(0.2):
                self.report_exits()
                if not self.alive():
                    self.out("every process has exited")
                    break
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _ha_addr(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    return f"{host}:{int(port) + 1}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


from cometmq.cli_admin import admin_app  # noqa: E402 - the sub-app lives in its own module

app.add_typer(admin_app, name="admin")

bench_app = typer.Typer(no_args_is_help=True, help="Load tools against any nameserver (a JSON line of results).")
app.add_typer(bench_app, name="bench")


@bench_app.command("produce")
def bench_produce(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchTopic",
    count: Annotated[int, typer.Option(min=1)] = 100_000,
    size: Annotated[int, typer.Option(min=1, help="body bytes")] = 100,
    batch: Annotated[int, typer.Option(min=1, help="messages per request")] = 64,
    concurrency: Annotated[int, typer.Option(min=1, help="requests in flight")] = 4,
) -> None:
    """Send COUNT messages as fast as the broker acknowledges them."""
    from cometmq import bench_tool

    bench_tool.run(bench_tool.produce(namesrv, topic, count, size, batch, concurrency))


@bench_app.command("consume")
def bench_consume(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchTopic",
    group: Annotated[str, typer.Option()] = "cometmq-bench-consumer",
    count: Annotated[int, typer.Option(min=1)] = 100_000,
    mode: Annotated[str, typer.Option(help="lite (pull) or push")] = "lite",
) -> None:
    """Consume COUNT messages from the start of the topic."""
    from cometmq import bench_tool

    if mode not in ("lite", "push"):
        raise typer.BadParameter("mode must be lite or push", param_hint="--mode")
    bench_tool.run(bench_tool.consume(namesrv, topic, group, count, mode))


@bench_app.command("latency")
def bench_latency(
    namesrv: Annotated[str, typer.Option(help="nameserver host:port")] = "127.0.0.1:9876",
    topic: Annotated[str, typer.Option()] = "BenchLatency",
    count: Annotated[int, typer.Option(min=1)] = 1000,
    interval_ms: Annotated[float, typer.Option(min=0.1)] = 2.0,
) -> None:
    """Send one message every INTERVAL_MS to an idle push consumer; report send-to-listener latency."""
    from cometmq import bench_tool

    bench_tool.run(bench_tool.latency(namesrv, topic, count, interval_ms))


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
