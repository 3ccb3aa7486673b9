"""``cometmq cluster``: a nameserver, controllers and one broker group on this machine, one process each.

For trying replication and failover by hand, and for tests (docs/replication.md, docs/controller.md). Two modes:

- ``controllers=0``: a master (brokerId 0) and N replicas; a failover is an operator's ``cometmq admin promote``.
- ``controllers=1``: the controller runs inside the nameserver (``--controller-data``); ``controllers=3`` or 5: that
  many ``cometmq controller`` processes whose log is an etcd cluster, each node running its own etcd member
  (``--peers``; etcd-server must be installed). The brokers run in controller mode: the controller hands out their
  ids, elects the master and elects again when it is lost.

Each process is ``python -m cometmq.cli namesrv|controller|broker …`` with its output in a log file; the supervisor
waits for each one's ready line, prints its role, address and PID, and on SIGINT/SIGTERM stops every child it
started (SIGTERM, then SIGKILL after a timeout), by PID. A child that exits on its own (say, a master killed with
``kill -9`` to try a failover) is reported and the others keep running. On Linux the children also get SIGTERM if
the supervisor itself dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

NAMESRV_READY = "cometmq namesrv listening on"
CONTROLLER_READY = "cometmq controller listening on"
BROKER_NAME = "broker-a"
BROKER_READY = f"cometmq broker {BROKER_NAME} listening on"
CLUSTER_NAME = "DefaultCluster"
#: a group's brokers sit this many ports apart: remoting base + STEP*i, HA base + STEP*i + 1; so do controllers
#: (remoting port, etcd peer port + 1, etcd client port + 2)
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


def broker_conf(*, broker_id: int | None, host: str, port: int, namesrv: str, data: Path,
                controller_addr: str | None = None) -> str:
    """A broker.conf of the group: a fixed ``broker_id``, or controller mode (``controller_addr``, no id)."""
    head = (f"brokerClusterName={CLUSTER_NAME}\nbrokerName={BROKER_NAME}\n"
            f"listenPort={port}\nhaListenPort={port + 1}\nnamesrvAddr={namesrv}\nstorePathRootDir={data}\n")
    if controller_addr is None:
        return (f"# written by `cometmq cluster`: a broker group of one master (brokerId 0) and its replicas\n"
                f"brokerId={broker_id}\n{head}")
    return (f"# written by `cometmq cluster --controllers N`: the controller hands out the broker id and elects\n"
            f"# the master; a send is acknowledged once 2 brokers of the SyncStateSet hold it\n{head}"
            f"enableControllerMode=true\ncontrollerAddr={controller_addr}\n"
            f"allAckInSyncStateSet=true\nminInSyncReplicas=2\n")


class LocalCluster:
    def __init__(self, data: Path, replicas: int, *, base_port: int, namesrv_port: int, host: str = "127.0.0.1",
                 controllers: int = 0, controller_port: int = 9878, log_level: str = "INFO",
                 start_timeout: float = 60.0, stop_timeout: float = 15.0,
                 out: Callable[[str], None] = print) -> None:
        if controllers not in (0, 1, 3, 5):
            raise ClusterError(f"controllers must be 0, 1, 3 or 5, not {controllers}")
        if controllers and replicas + 1 < 2:
            raise ClusterError("a group run by a controller needs at least one replica")
        self.data = data.resolve()
        self.host = host
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.out = out
        self.namesrv = f"{host}:{namesrv_port}"
        self.namesrv_port = namesrv_port
        self.controllers = controllers
        #: the controllers' remoting addresses (the nameserver's, for one embedded controller)
        self.controller_addrs = ([self.namesrv] if controllers == 1 else
                                 [f"{host}:{controller_port + PORT_STEP * i}" for i in range(controllers)])
        dirs = [self.data / f"broker-{i}" for i in range(1 + replicas)]
        if controllers:
            order = list(range(len(dirs)))  # the controller knows who was master; every broker starts together
        else:
            # A re-run after a failover: the broker with the newest epoch is the master (restarting the old
            # master as the master again would make the others truncate what the newer master wrote).
            epochs = [last_epoch(d) for d in dirs]
            master = epochs.index(max(epochs))
            order = [master] + [i for i in range(len(dirs)) if i != master]
        #: (broker id, folder index, remoting port); fixed ids follow the order: 0 = master, then 1, 2, …
        self.brokers = [(bid, i, base_port + PORT_STEP * i) for bid, i in enumerate(order)]
        self.children: list[Child] = []
        #: the SIGINT/SIGTERM received while ``run`` runs: stop waiting and stop everything. A plain attribute, not a
        #: threading.Event: a handler that takes a lock (Event.set does) deadlocks when the signal lands while the
        #: main thread holds that lock, and the supervisor then never stops its children.
        self.stop_signal: int | None = None

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
            if self.stop_signal is not None:
                raise ClusterError("stopped (SIGINT/SIGTERM) while starting")
            if waiting and time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                raise ClusterError(f"{names} not ready after {self.start_timeout:g} s:\n{_tail(waiting[0].log_path)}")
            if waiting:
                time.sleep(0.05)

    def _start_controllers(self) -> None:
        if self.controllers < 3:
            return
        peers = ",".join(f"c{i}={addr}" for i, addr in enumerate(self.controller_addrs))
        started = []
        for i, addr in enumerate(self.controller_addrs):
            folder = self.data / f"controller-{i}"
            child = Child("ctl", f"controller-{i}", addr, folder / "controller.log.txt", CONTROLLER_READY)
            self._spawn(child, ["controller", "--data", str(folder), "--host", self.host,
                                "--port", addr.rpartition(":")[2], "--node", f"c{i}", "--peers", peers])
            started.append(child)
        self._wait_ready(started)

    def start(self) -> None:
        """Start the controllers, the nameserver, then the brokers (a fixed master before its replicas); each is
        waited for. On failure, whatever was started is stopped and ClusterError raised."""
        self.data.mkdir(parents=True, exist_ok=True)
        try:
            self._start_controllers()
            ns = Child("namesrv", "namesrv", self.namesrv, self.data / "namesrv.log", NAMESRV_READY)
            embedded = ["--controller-data", str(self.data / "controller")] if self.controllers == 1 else []
            self._spawn(ns, ["namesrv", "--host", self.host, "--port", str(self.namesrv_port), *embedded])
            self._wait_ready([ns])
            controller_addr = ";".join(self.controller_addrs) if self.controllers else None
            groups = [self.brokers] if self.controllers else [self.brokers[:1], self.brokers[1:]]
            for group in groups:
                started = []
                for broker_id, index, port in group:
                    folder = self.data / f"broker-{index}"
                    folder.mkdir(parents=True, exist_ok=True)
                    conf = folder / "broker.conf"
                    fixed_id = None if self.controllers else broker_id
                    conf.write_text(broker_conf(broker_id=fixed_id, host=self.host, port=port,
                                                namesrv=self.namesrv, data=folder, controller_addr=controller_addr))
                    role = "broker" if self.controllers else "master" if broker_id == 0 else "replica"
                    child = Child(role, f"broker-{index}", f"{self.host}:{port}", folder / "broker.log",
                                  BROKER_READY, fixed_id)
                    self._spawn(child, ["broker", "-c", str(conf), "--host", self.host, "--grpc-port", "0"])
                    started.append(child)
                self._wait_ready(started)
            if self.controllers:
                self._wait_master()
        except BaseException:
            self.stop()
            raise

    def _wait_master(self) -> None:
        """Wait until the controller has elected a master and knows every broker; note each broker's id and
        role. (Waiting for the master alone once printed "ready" with a broker the controller had not yet
        registered: its role and id unknown.)"""
        deadline = time.monotonic() + self.start_timeout
        error: Exception | None = None
        while True:
            try:
                state = asyncio.run(_group_state(self.controller_addrs))
            except Exception as exc:
                state, error = None, exc
            if state is not None:
                master, ids = state
                brokers = [c for c in self.children if c.role not in ("namesrv", "ctl")]
                if master is not None and all(c.addr in ids for c in brokers):
                    for c in self.children:
                        if c.addr in ids:
                            c.broker_id = ids[c.addr]
                            c.role = "master" if c.broker_id == master else "replica"
                    return
            if self.stop_signal is not None:
                raise ClusterError("stopped (SIGINT/SIGTERM) while waiting for an election")
            if time.monotonic() > deadline:
                brokers = [c for c in self.children if c.role == "broker"]
                why = f" (last error: {error})" if error is not None else ""
                raise ClusterError(f"no master elected after {self.start_timeout:g} s{why}:\n"
                                   f"{_tail(brokers[0].log_path) if brokers else ''}")
            time.sleep(0.2)

    def describe(self) -> list[str]:
        lines = []
        for c in self.children:
            if c.role in ("namesrv", "ctl"):
                where = c.addr + (" (with the controller)" if c.role == "namesrv" and self.controllers == 1 else "")
            else:
                bid = "?" if c.broker_id is None else c.broker_id
                where = f"{c.addr} (HA {_ha_addr(c.addr)}, brokerId {bid}, data {c.log_path.parent})"
            lines.append(f"{c.role:<8} {c.name:<12} pid {c.pid:<7} {where}")
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
        """SIGTERM the brokers (replicas first), then the nameserver, then the controllers; SIGKILL whoever
        outlives the timeout."""
        brokers = [c for c in reversed(self.children) if c.role not in ("namesrv", "ctl")]
        for phase in (brokers, [c for c in self.children if c.role == "namesrv"],
                      [c for c in self.children if c.role == "ctl"]):
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

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_signal = signum

    def run(self) -> None:
        """Start, print the processes, then wait for SIGINT/SIGTERM (or every child gone) and stop them."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            for line in self.describe():
                self.out(line)
            master = next(c for c in self.children if c.role == "master")
            replica = next((c for c in self.children if c.role == "replica"), None)
            brokers = sum(c.role in ("master", "replica") for c in self.children)
            where = f"controllers {';'.join(self.controller_addrs)}, " if self.controllers else ""
            self.out(f"cometmq cluster ready: {brokers} brokers of {BROKER_NAME}, {where}nameserver "
                     f"{self.namesrv}; Ctrl-C stops them all")
            if self.controllers:
                self.out(f"try a failover: kill -9 {master.pid}; cometmq admin sync-state -c "
                         f"{self.controller_addrs[0]} --broker-name {BROKER_NAME}")
            elif replica is not None:
                self.out(f"try a failover: kill -9 {master.pid}; cometmq admin promote -b {replica.addr}")
            while self.stop_signal is None:
                time.sleep(0.2)  # a signal's handler runs at once; the sleep then ends early or resumes its 0.2 s
                self.report_exits()
                if not self.alive():
                    self.out("every process has exited")
                    break
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def _group_state(controllers: Sequence[str]) -> tuple[int | None, dict[str, int]] | None:
    """The group's master id and each broker's (address -> id), from the first controller that answers."""
    from cometmq.client.admin import Admin

    async with Admin(namesrv=controllers[0], timeout=2.0) as admin:
        for addr in controllers:
            try:
                groups = await admin.get_sync_state_data(addr, [BROKER_NAME])
            except Exception:
                continue
            g = groups.get(BROKER_NAME)
            if g is None:
                return None
            return g.master_id, {r.address: r.broker_id for r in (*g.in_sync, *g.not_in_sync)}
    return None


def _ha_addr(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    return f"{host}:{int(port) + 1}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
