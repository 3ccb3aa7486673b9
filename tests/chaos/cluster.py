"""The chaos harness's process topology ([12]): a nameserver, a controller (or 3), and one broker group of 3
brokers in controller mode, every link behind a fault proxy, every process started (and stopped) by PID.

Addresses. Each node has its own loopback address ``127.A.B.n`` (A, B random per cluster, so runs side by side
do not collide): brokers n = 1..3, controllers 11..13, the nameserver 20. Its servers listen on 127.0.0.1 on free
ports; the proxy hub (proxyhub.py, one process) listens on ``<node ip>:<same port>`` and forwards to 127.0.0.1.
Every address a node *advertises* is the proxy's: brokers get ``brokerIP1=<node ip>`` (so the nameserver, the
controller and the replicas see ``<ip>:listenPort`` and ``<ip>:haListenPort``), brokers are given the
controllers' and the nameserver's proxy addresses. Every process dials from its own address (srcbind.py patches
the loops' ``create_connection``; cometmq has no source-address option), so a proxy tells its clients apart by
source address: a fault on one link and one direction is one proxy rule ``src=<ip of the dialer>``. Clients (the
workload, in the test process) dial from 127.0.0.1 and are the node ``client``. The harness's own observers talk
to the real ports on 127.0.0.1 and are never faulted.

Links (dialer -> server proxy): broker -> controller (heartbeats, register, ALTER_SYNC_STATE_SET, polls),
controller -> broker remoting (NOTIFY_BROKER_ROLE_CHANGED), replica -> master remoting (metadata copy) and HA
port, broker -> nameserver (registration), client -> nameserver / brokers.

Controllers (``controllers=``): 3 by default, ``cometmq controller --node ci --peers c0=127.0.0.1:P0,… --advertise
<ci's proxy>``, each running its etcd member beside it (peers on P+1, clients on P+2, on 127.0.0.1: the consensus
engine's own links are not proxied); the leader key and CONTROLLER_NOT_LEADER answers name the proxy address, so
brokers stay behind the proxies. ``controllers=1`` is the single node on a durable LocalLog. A controller *node*
is the controller process and its etcd member: ``kill`` SIGKILLs both (by PID), ``pause`` SIGSTOPs both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cometmq.client.admin_controller import GroupSyncState
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from tests.chaos.proxyhub import ProxyHub
from tests.ha.cluster import CLUSTER_NAME, DEFAULT_CONF, Broker, BrokerLog, Namesrv, ProcessError, _Proc, read_log
from tests.kit.ports import port_slice

BROKER_NAME = "broker-chaos"
SRCBIND = str(Path(__file__).with_name("srcbind.py"))
CLIENT_IP = "127.0.0.1"

#: controller-mode timers: short (the tests) or RocketMQ's defaults (the failover benchmark's comparison)
TIMEOUTS: dict[str, dict[str, str]] = {
    "test": {
        "brokerHeartbeatInterval": "500",
        "controllerHeartBeatTimeoutMills": "3000",
        "syncBrokerMetadataPeriod": "1000",
        "syncControllerMetadataPeriod": "2000",
        "haMaxTimeSlaveNotCatchup": "3000",
        "haSendHeartbeatInterval": "1000",
        "haHousekeepingInterval": "500",
        "slaveTimeout": "3000",
    },
    "default": {
        "brokerHeartbeatInterval": "1000",
        "controllerHeartBeatTimeoutMills": "10000",
        "syncBrokerMetadataPeriod": "5000",
        "syncControllerMetadataPeriod": "5000",
        "haMaxTimeSlaveNotCatchup": "15000",
        "haSendHeartbeatInterval": "5000",
        "haHousekeepingInterval": "5000",
        "slaveTimeout": "3000",
    },
}

CHAOS_CONF: dict[str, str] = {
    **DEFAULT_CONF,
    "brokerName": BROKER_NAME,
    "enableControllerMode": "true",
    "allAckInSyncStateSet": "true",
    "minInSyncReplicas": "2",
    "registerBrokerInterval": "5000",
}


#: the controller nodes of a chaos cluster unless told otherwise (3: on etcd, the HA deployment)
DEFAULT_CONTROLLERS = 3

#: ``cometmq controller`` timers per profile: the heartbeat timeout (and so the startup grace) of a broker that
#: states none, and the scan for lost masters; "default" is the product's (10 s, 1 s)
CONTROLLER_ARGS: dict[str, list[str]] = {
    "test": ["--heartbeat-timeout-ms", "3000", "--scan-interval", "0.5"],
    "default": [],
}

_taken: set[int] = set()


def pick_port(*hosts: str, span: int = 1) -> int:
    """A free port below the kernel's ephemeral range (32768+ on Linux), bindable on every host given (and, with
    ``span`` > 1, the next ``span - 1`` ports on 127.0.0.1 too: a controller's etcd member). Ports from
    ``free_port()`` are ephemeral: an outgoing connection (a client, a proxy dialing) can take one between the
    pick and the server's bind, and a restarted broker must bind its old ports again."""
    rnd = random.Random(os.urandom(8))
    low, high = port_slice()  # this pytest-xdist worker's ports: another worker never picks them
    for _ in range(1000):
        port = rnd.randrange(low, high - span)
        wanted = [(host, port) for host in hosts or ("127.0.0.1",)] + \
            [("127.0.0.1", port + i) for i in range(1, span)]
        if any(p in _taken for _, p in wanted):
            continue
        try:
            for host, p in wanted:
                with socket.socket() as sock:
                    sock.bind((host, p))
        except OSError:
            continue
        _taken.update(p for _, p in wanted)
        return port
    raise RuntimeError(f"no free port in {low}-{high}")


def etcd_installed() -> bool:
    return shutil.which("etcd") is not None


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) children of ``pid``, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def pid_gone(pid: int) -> bool:
    """No such process, or only its zombie left."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _srcbind(ip: str, command: list[str]) -> list[str]:
    """``[python, -m, module, ...]`` run with its outgoing loopback connections bound to ``ip``."""
    assert command[1] == "-m", command
    return [command[0], SRCBIND, ip, *command[1:]]


class ControllerNode(_Proc):
    """One controller node. With ``peers`` (``c0=127.0.0.1:P0,…``) it runs an etcd member beside it on P+1 and
    P+2 (127.0.0.1, not proxied) and advertises its proxy address; a *node* fault hits both processes."""

    def __init__(self, workdir: Path, name: str, ip: str, extra: list[str] | None = None, *,
                 etcd_member: bool = False) -> None:
        super().__init__(name, workdir, "cometmq controller listening")
        self.ip = ip
        self.port = pick_port("127.0.0.1", ip, span=3 if etcd_member else 1)
        self.data_dir = workdir / "data"
        self.extra = list(extra or [])
        self.peers: str | None = None  # set by the cluster once every node's port is known
        self.etcd_killed: list[int] = []  # etcd member PIDs this harness SIGKILLed (checked gone)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def public_addr(self) -> str:
        return f"{self.ip}:{self.port}"

    def _command(self) -> list[str]:
        group = ["--node", self.name, "--peers", self.peers] if self.peers else []
        return _srcbind(self.ip, [sys.executable, "-m", "cometmq.cli", "controller", "--port", str(self.port),
                                  "--host", "127.0.0.1", "--data", str(self.data_dir), "--log-level", "INFO",
                                  "--advertise", self.public_addr, *group, *self.extra])

    async def start(self, timeout: float = 60.0) -> None:
        await super().start(timeout)  # with etcd: its members must find each other first

    def etcd_pids(self) -> list[int]:
        """The etcd member(s) this controller process runs (its children)."""
        if not self.running or self.pid is None:
            return []
        pids = []
        for pid in child_pids(self.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "etcd":
                    pids.append(pid)
        return pids

    def kill(self) -> None:
        """SIGKILL the node: its etcd member (by PID, found as the controller's child) and the controller. The
        member would otherwise get SIGTERM from PR_SET_PDEATHSIG and stop cleanly (handing its etcd leadership
        over): a node crash kills both. Waits (≤ 5 s) until the member is gone."""
        members = self.etcd_pids()
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        super().kill()
        self.etcd_killed += members
        deadline = time.monotonic() + 5
        while not all(pid_gone(pid) for pid in members):
            if time.monotonic() > deadline:
                raise ProcessError(f"{self.name}: etcd member(s) {members} still running after SIGKILL")
            time.sleep(0.02)


class ChaosBroker(Broker):
    """A broker in controller mode: no id of its own (the controller assigns it), advertised at its proxy."""

    def __init__(self, workdir: Path, name: str, ip: str, namesrv: str, conf: Mapping[str, str]) -> None:
        super().__init__(workdir, name, -1, namesrv, {**conf, "brokerIP1": ip})
        self.ip = ip
        self.port = pick_port("127.0.0.1", ip)
        self.ha_port = pick_port("127.0.0.1", ip)
        #: the id the controller gave it (read from its status once known; persistent across restarts)
        self.controller_id: int | None = None

    @property
    def public_addr(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def public_ha_addr(self) -> str:
        return f"{self.ip}:{self.ha_port}"

    def _command(self) -> list[str]:
        command = super()._command()
        text = self.conf_path.read_text(encoding="utf-8")
        self.conf_path.write_text("".join(line + "\n" for line in text.splitlines()
                                          if not line.startswith("brokerId=")), encoding="utf-8")
        return _srcbind(self.ip, command)


@dataclass(frozen=True)
class Observation:
    """What one observer saw at one time: the controller's record or one broker's own view."""

    t: float
    source: str  # "controller" or a broker's name
    epoch: int | None
    master: int | None  # the controller's master id; for a broker: its own id if it says it is master
    role: str | None = None
    sync_state_set: tuple[int, ...] = ()
    broker_id: int | None = None
    confirmed: bool | None = None
    lease_expired: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.t, 4), "source": self.source, "epoch": self.epoch, "master": self.master,
                "role": self.role, "sync_state_set": list(self.sync_state_set), "broker_id": self.broker_id,
                "confirmed": self.confirmed, "lease_expired": self.lease_expired}


class ChaosCluster:
    """``async with ChaosCluster(workdir) as c: await c.start()``; ``close()`` kills whatever still runs."""

    def __init__(self, workdir: Path, *, brokers: int = 3, controllers: int = DEFAULT_CONTROLLERS,
                 timeouts: str = "test", conf: Mapping[str, str] | None = None,
                 etcd_endpoints: str | None = None) -> None:
        if controllers not in (1, 3, 5):
            raise ValueError(f"controllers: 1, 3 or 5, not {controllers}")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        rnd = random.Random(os.urandom(8))
        self.prefix = f"127.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}"
        self.conf = {**CHAOS_CONF, **TIMEOUTS[timeouts], **(conf or {})}
        self.namesrv = Namesrv(workdir / "namesrv")
        self.namesrv.port = pick_port("127.0.0.1", self.ip(20))
        self.hub = ProxyHub(workdir / "proxyhub")
        self.ips: dict[str, str] = {"client": CLIENT_IP, "namesrv": self.ip(20)}
        self.proxies: dict[str, list[str]] = {"namesrv": ["namesrv"], "client": []}
        self.hub.add("namesrv", f"{self.ips['namesrv']}:{self.namesrv.port}", self.namesrv.addr)
        extra = ["--etcd-endpoints", etcd_endpoints] if etcd_endpoints else []
        members = controllers > 1 and not etcd_endpoints
        self.controllers = [ControllerNode(workdir / f"c{i}", f"c{i}", self.ip(11 + i),
                                           [*extra, *CONTROLLER_ARGS[timeouts]], etcd_member=members)
                            for i in range(controllers)]
        if members:
            peers = ",".join(f"{c.name}={c.addr}" for c in self.controllers)
            for c in self.controllers:
                c.peers = peers
        self.paused_members: dict[str, list[int]] = {}  # a paused controller node's etcd member PIDs
        for c in self.controllers:
            self.ips[c.name] = c.ip
            self.proxies[c.name] = [c.name]
            self.hub.add(c.name, c.public_addr, c.addr)
        controller_addr = ";".join(c.public_addr for c in self.controllers)
        ns_public = f"{self.ips['namesrv']}:{self.namesrv.port}"
        self.brokers: list[ChaosBroker] = []
        for i in range(brokers):
            name = f"b{i}"
            b = ChaosBroker(workdir / name, name, self.ip(1 + i), ns_public,
                            {**self.conf, "controllerAddr": controller_addr})
            self.brokers.append(b)
            self.ips[name] = b.ip
            self.proxies[name] = [name, f"{name}-ha"]
            self.hub.add(name, b.public_addr, b.addr)
            self.hub.add(f"{name}-ha", b.public_ha_addr, b.ha_addr)
        self.client = RemotingClient()
        self.observations: list[Observation] = []
        self.events: list[dict[str, Any]] = []  # what the harness did (faults, kills, restarts), with times
        self.paused: set[str] = set()
        self._observer: asyncio.Task[None] | None = None
        self.t0 = time.monotonic()

    def ip(self, n: int) -> str:
        return f"{self.prefix}.{n}"

    @property
    def namesrv_addr(self) -> str:
        """The nameserver as clients reach it (through its proxy)."""
        return f"{self.ips['namesrv']}:{self.namesrv.port}"

    @property
    def controller_addr(self) -> str:
        return ";".join(c.public_addr for c in self.controllers)

    def node(self, name: str) -> _Proc:
        for p in [self.namesrv, *self.controllers, *self.brokers]:
            if p.name == name:
                return p
        raise KeyError(name)

    def broker(self, name: str) -> ChaosBroker:
        p = self.node(name)
        assert isinstance(p, ChaosBroker)
        return p

    def note(self, what: str, **fields: Any) -> None:
        self.events.append({"t": round(time.monotonic() - self.t0, 4), "event": what, **fields})

    # -- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self, *, wait: float = 40.0) -> None:
        """Every process, then one master with a full SyncStateSet (``wait`` bounds it)."""
        self.t0 = time.monotonic()
        await self.hub.start()
        await asyncio.gather(self.namesrv.start(), *(c.start() for c in self.controllers))
        await asyncio.gather(*(b.start() for b in self.brokers))
        self.note("started")
        self._observer = asyncio.ensure_future(self._observe())
        await self.wait_healthy(wait)
        self.note("healthy")

    async def close(self) -> None:
        """Kill everything still running (a test's ``finally``)."""
        if self._observer is not None:
            self._observer.cancel()
            await asyncio.gather(self._observer, return_exceptions=True)
            self._observer = None
        for name in list(self.paused):
            self.resume(name)
        for p in [*self.brokers, *self.controllers, self.namesrv]:
            p.kill()
        self.hub.kill()
        await self.client.close()

    async def stop_all(self, timeout: float = 20.0) -> list[str]:
        """SIGTERM every process (SIGCONT first if paused), SIGKILL on timeout; returns the names that had to be
        killed. The observer stops first."""
        if self._observer is not None:
            self._observer.cancel()
            await asyncio.gather(self._observer, return_exceptions=True)
            self._observer = None
        for name in list(self.paused):
            self.resume(name)
        killed: list[str] = []

        async def stop(p: _Proc) -> None:
            try:
                await p.stop(timeout)
            except ProcessError:
                killed.append(p.name)

        await asyncio.gather(*(stop(b) for b in self.brokers))
        await asyncio.gather(*(stop(c) for c in self.controllers))
        await stop(self.namesrv)
        self.hub.kill()
        return killed

    async def __aenter__(self) -> ChaosCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.log_tail(chars)}"
                         for p in [self.namesrv, *self.controllers, *self.brokers])

    # -- process faults -----------------------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        p = self.node(name)
        self.paused.discard(name)
        self.paused_members.pop(name, None)
        members = p.etcd_pids() if isinstance(p, ControllerNode) else []
        self.note("kill", node=name, pid=p.pid, **({"etcd": members} if members else {}))
        p.kill()

    async def restart(self, name: str) -> None:
        p = self.node(name)
        if p.running:
            return
        self.note("restart", node=name)
        await p.start()

    def pause(self, name: str) -> None:
        """SIGSTOP a process; a controller node: its etcd member too."""
        p = self.node(name)
        if p.pid is not None and p.running:
            members = p.etcd_pids() if isinstance(p, ControllerNode) else []
            for pid in members:
                os.kill(pid, signal.SIGSTOP)
            os.kill(p.pid, signal.SIGSTOP)
            self.paused.add(name)
            self.paused_members[name] = members
            self.note("pause", node=name, pid=p.pid, **({"etcd": members} if members else {}))

    def resume(self, name: str) -> None:
        p = self.node(name)
        if name in self.paused and p.pid is not None:
            for pid in [*self.paused_members.pop(name, []), p.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.paused.discard(name)
            self.note("resume", node=name, pid=p.pid)

    def dump_stacks(self) -> None:
        """SIGUSR2 to every running broker and controller: srcbind.py prints its asyncio tasks' stacks to its
        log."""
        for p in [*self.brokers, *self.controllers]:
            if p.running and p.pid is not None and p.name not in self.paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGUSR2)

    # -- network faults -----------------------------------------------------------------------------------------
    async def drop(self, src: str, dst: str, mode: str = "blackhole") -> None:
        """Drop the bytes ``src`` sends to ``dst`` (one direction): requests src makes to dst's servers, and
        replies src gives to requests dst makes. ``mode``: blackhole (sockets stay open) or reset."""
        src_ip, dst_ip = self.ips[src], self.ips[dst]
        for proxy in self.proxies[dst]:
            await self.hub.command(f"{proxy} {mode} up src={src_ip}" if mode == "blackhole"
                                   else f"{proxy} reset src={src_ip}")
        for proxy in self.proxies[src]:
            if mode == "blackhole":
                await self.hub.command(f"{proxy} blackhole down src={dst_ip}")
        self.note("drop", src=src, dst=dst, mode=mode)

    async def partition(self, a: str, b: str, direction: str = "both") -> None:
        """``direction``: "both", "a->b" (only what a sends to b is lost) or "b->a"."""
        if direction in ("both", "a->b"):
            await self.drop(a, b)
        if direction in ("both", "b->a"):
            await self.drop(b, a)

    async def isolate(self, name: str) -> None:
        """``name`` hears from no one and no one from it (clients included)."""
        for other in self.ips:
            if other != name and self.ips[other] != self.ips[name]:
                await self.partition(name, other)

    async def heal(self) -> None:
        await self.hub.command("* heal")
        self.note("heal")

    # -- observation --------------------------------------------------------------------------------------------
    async def request(self, addr: str, code: int, ext: Mapping[str, object] | None = None, body: bytes = b"",
                      timeout: float = 2.0) -> Any:
        return await self.client.invoke(addr, make_request(code, dict(ext or {}), body), timeout)

    async def controller_state(self) -> GroupSyncState | None:
        """The group as the controller leader records it (asked on the real ports, never faulted)."""
        for c in self.controllers:
            if not c.running or c.name in self.paused:
                continue
            try:
                r = await self.request(c.addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, {},
                                       json.dumps([BROKER_NAME]).encode(), timeout=1.5)
            except Exception:
                continue
            if r.code != ResponseCode.SUCCESS or not r.body:
                continue
            raw = json.loads(r.body).get("replicasInfoTable") or {}
            if BROKER_NAME in raw:
                return GroupSyncState.from_json(BROKER_NAME, raw[BROKER_NAME])
        return None

    async def controller_leader(self) -> ControllerNode | None:
        """The controller that answers GET_METADATA_INFO with isLeader=true (real ports; running, not paused)."""
        async def ask(c: ControllerNode) -> bool:
            try:
                r = await self.request(c.addr, RequestCode.CONTROLLER_GET_METADATA_INFO, timeout=1.0)
            except Exception:
                return False
            return r.code == ResponseCode.SUCCESS and str(r.ext_fields.get("isLeader", "")).lower() == "true"

        live = [c for c in self.controllers if c.running and c.name not in self.paused]
        answers = await asyncio.gather(*(ask(c) for c in live))
        return next((c for c, yes in zip(live, answers, strict=True) if yes), None)

    async def elections_work(self, timeout: float = 1.0) -> str | None:
        """Whether a controller leader decides an election now: ELECT_MASTER for the group without a broker id
        (an operator's electMaster; with the master alive: MASTER_STILL_EXIST, no change) answered by a running
        node with anything but CONTROLLER_NOT_LEADER or a log/transport error. Returns the node's name."""
        decided = {ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                   ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE, ResponseCode.CONTROLLER_ELECT_MASTER_FAILED}

        async def ask(c: ControllerNode) -> bool:
            try:
                r = await self.request(c.addr, RequestCode.CONTROLLER_ELECT_MASTER, {"brokerName": BROKER_NAME},
                                       timeout=timeout)
            except Exception:
                return False
            return r.code in decided

        live = [c for c in self.controllers if c.running and c.name not in self.paused]
        answers = await asyncio.gather(*(ask(c) for c in live))
        return next((c.name for c, yes in zip(live, answers, strict=True) if yes), None)

    async def wait_elections_work(self, timeout: float = 30.0, period: float = 0.1) -> float | None:
        """Seconds until ``elections_work`` (None: not within ``timeout``)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if await self.elections_work():
                return time.monotonic() - start
            await asyncio.sleep(period)
        return None

    async def broker_status(self, b: ChaosBroker, timeout: float = 1.5) -> dict[str, Any] | None:
        if not b.running or b.name in self.paused:
            return None
        try:
            r = await self.request(b.addr, RequestCode.GET_BROKER_HA_STATUS, timeout=timeout)
        except Exception:
            return None
        if r.code != ResponseCode.SUCCESS:
            return None
        status: dict[str, Any] = json.loads(r.body or b"{}")
        if status.get("controllerId") is not None and int(status["controllerId"]) >= 0:
            b.controller_id = int(status["controllerId"])
        return status

    async def observe_once(self) -> None:
        now = time.monotonic() - self.t0
        g = await self.controller_state()
        if g is not None:
            self.observations.append(Observation(now, "controller", g.master_epoch, g.master_id, None,
                                                 tuple(sorted(r.broker_id for r in g.in_sync))))
        statuses = await asyncio.gather(*(self.broker_status(b) for b in self.brokers))
        for b, s in zip(self.brokers, statuses, strict=True):
            if s is None:
                continue
            role = str(s.get("role"))
            bid = b.controller_id
            members = self.members(b, s)
            self.observations.append(Observation(
                now, b.name, int(s.get("epoch", 0)), bid if role.upper() == "MASTER" and s.get("confirmed") else None,
                role, tuple(sorted(members)), bid, s.get("confirmed"),
                s.get("leaseExpired")))

    async def _observe(self, period: float = 0.25) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.observe_once()
            await asyncio.sleep(period)

    @staticmethod
    def members(b: ChaosBroker, status: dict[str, Any]) -> set[int]:
        """A master's SyncStateSet in controller ids (its status names itself 0, its nameserver id)."""
        return {b.controller_id if int(i) == 0 and b.controller_id is not None else int(i)
                for i in status.get("syncStateSet", ())}

    def by_controller_id(self, broker_id: int | None) -> ChaosBroker | None:
        return next((b for b in self.brokers if broker_id is not None and b.controller_id == broker_id), None)

    async def master(self) -> ChaosBroker | None:
        """The controller's master, if that broker also says it is the confirmed master at that epoch."""
        g = await self.controller_state()
        if g is None or g.master_id is None:
            return None
        b = self.by_controller_id(g.master_id)
        if b is None:
            await asyncio.gather(*(self.broker_status(x) for x in self.brokers))
            b = self.by_controller_id(g.master_id)
        if b is None:
            return None
        s = await self.broker_status(b)
        if s is None or str(s.get("role")).upper() != "MASTER" or not s.get("confirmed") \
                or int(s.get("epoch", -1)) != g.master_epoch:
            return None
        return b

    async def wait_master(self, timeout: float = 30.0, *, not_: ChaosBroker | None = None) -> ChaosBroker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = await self.master()
            if m is not None and m is not not_:
                return m
            await asyncio.sleep(0.1)
        raise AssertionError(f"no master (other than {not_ and not_.name}) within {timeout}s\n{self.logs()}")

    async def healthy(self) -> bool:
        """One master, every broker running and in the SyncStateSet (controller and master agree)."""
        m = await self.master()
        if m is None:
            return False
        g = await self.controller_state()
        s = await self.broker_status(m)
        want = {b.controller_id for b in self.brokers}
        if g is None or s is None or None in want or {r.broker_id for r in g.in_sync} != want \
                or self.members(m, s) != want:
            return False
        # a restarted master takes the controller's set as it was: its replicas must also be linked again
        replicas = await asyncio.gather(*(self.broker_status(b) for b in self.brokers if b is not m))
        return all(r is not None and r.get("connected") and r.get("epoch") == g.master_epoch for r in replicas)

    async def wait_healthy(self, timeout: float = 40.0) -> float:
        """Seconds until healthy; AssertionError after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if await self.healthy():
                return time.monotonic() - start
            await asyncio.sleep(0.2)
        raise AssertionError(f"not healthy within {timeout}s: controller {await self.controller_state()}, "
                             f"statuses {[await self.broker_status(b) for b in self.brokers]}\n{self.logs()}")

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """The topic on every broker (a replica promoted before its metadata copy still has it), then routed."""
        for b in self.brokers:
            r = await self.request(b.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                                   {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6},
                                   timeout=5)
            if r.code != ResponseCode.SUCCESS:
                self.note("create_topic_refused", node=b.name, code=r.code, remark=r.remark)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = await self.request(self.namesrv.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            if r.code == ResponseCode.SUCCESS and r.body:
                self.note("topic_routed", topic=topic)
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no route for {topic}")

    def read_logs(self) -> dict[str, BrokerLog]:
        """Each broker's commit log and epoch file (call after stop_all)."""
        return {b.name: read_log(b.data_dir) for b in self.brokers}

    def topology(self) -> dict[str, Any]:
        return {"namesrv": self.namesrv_addr, "controllers": [c.public_addr for c in self.controllers],
                "brokers": {b.name: {"ip": b.ip, "addr": b.public_addr, "ha": b.public_ha_addr,
                                     "real": b.addr, "data": str(b.data_dir), "controller_id": b.controller_id}
                            for b in self.brokers},
                "cluster": CLUSTER_NAME, "broker_name": BROKER_NAME}
