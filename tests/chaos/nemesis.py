"""Seeded fault schedules for the chaos harness ([12]).

A scenario turns a seed into a schedule: a list of fault cycles, each ``gap`` seconds of calm, then one fault
held ``hold`` seconds, then healed (the process restarted, the partition removed). The schedule is drawn from
``random.Random(seed)`` alone, so a seed always gives the same schedule; the targets are roles ("the master", "a
replica"), resolved when the fault starts (which broker is master depends on the run). Every action is also
recorded in the cluster's event list with its time and the broker it hit.

Faults (``KINDS``):

- ``kill-master``: SIGKILL the master; restart it (same data folder) after ``hold``.
- ``pause-master``: SIGSTOP the master, SIGCONT after ``hold`` (shorter or longer than the heartbeat timeout).
- ``partition-master-controller``: the master and every controller, in ``direction`` (both, or one way).
- ``isolate-master``: the master from every other node and the clients, both ways.
- ``partition-replica``: one replica (``pick``) from the master, or from everyone (``direction`` "all").
- ``double-failover``: SIGKILL the master, wait (≤ 15 s) for a new master, SIGKILL it too; restart both.
- ``master-and-controller``: SIGKILL the master and the controller leader (the node answering GET_METADATA_INFO
  with isLeader; with 3 controllers: that controller and its etcd member) together (RocketMQ #7689); the
  controller comes back first (after ``hold`` / 2), then the broker. ``elected_s``: the fault -> the controller
  (leader) records another master.
- ``controller-leader``: the controller leader node only, SIGKILLed (restarted after ``hold``) or SIGSTOPped for
  ``hold`` (``direction`` "kill" / "pause"). ``elections_s``: the fault -> a running controller decides an
  ELECT_MASTER again (``ChaosCluster.elections_work``); must be ≤ ``ELECTIONS_LIMIT_S``.

- ``crash-promote``: the replicas are restarted armed with the failpoint ``ha.promote.epoch_written``
  (``COMETMQ_FAILPOINTS``, src/cometmq/common/failpoints.py), then the master is SIGKILLed: each replica the
  controller elects dies right after its new epoch entry is durable, before it takes a write. Healing restarts
  everyone unarmed.
- ``crash-truncate``: the master is SIGKILLed and restarted armed with ``ha.truncate.log_cut``: if its log holds
  a tail the new master does not have, it dies between cutting its log and its epoch file (RocketMQ #10666).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.chaos.cluster import ChaosBroker, ChaosCluster
from tests.ha.cluster import ProcessError

KINDS = ("kill-master", "pause-master", "partition-master-controller", "isolate-master", "partition-replica",
         "double-failover", "master-and-controller", "controller-leader", "crash-promote", "crash-truncate")
FAILPOINTS_ENV = "COMETMQ_FAILPOINTS"
#: a controller leader lost -> elections decided again within this (the runner fails the run otherwise)
ELECTIONS_LIMIT_S = 10.0

#: scenario name -> the kinds its cycles draw from
SCENARIOS: dict[str, tuple[str, ...]] = {
    **{k: (k,) for k in KINDS},
    "partitions": ("partition-master-controller", "isolate-master", "partition-replica"),
    "crash-points": ("crash-promote", "crash-truncate"),
    "mixed": KINDS,
}
#: the short set CI runs (test_chaos.py)
MAIN_SCENARIOS = ("kill-master", "pause-master", "partitions")


@dataclass(frozen=True)
class Fault:
    kind: str
    gap: float  # calm before the fault
    hold: float  # how long the fault lasts
    direction: str = "both"  # partitions: "both", "a->b" (the master's/replica's sends lost), "b->a";
    #                          controller-leader: "kill" or "pause"
    pick: int = 0  # partition-replica: which replica (index into the non-masters, modulo)

    def describe(self) -> str:
        extra = f" {self.direction}" if self.kind.startswith("partition") or self.kind == "controller-leader" \
            else ""
        return f"+{self.gap:.1f}s {self.kind}{extra} for {self.hold:.1f}s"


@dataclass
class Schedule:
    seed: int
    scenario: str
    faults: list[Fault] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "scenario": self.scenario, "faults": [asdict(f) for f in self.faults]}

    def describe(self) -> str:
        return "; ".join(f.describe() for f in self.faults)


def make_schedule(scenario: str, seed: int, duration: float) -> Schedule:
    """Fault cycles filling ``duration`` seconds (a cycle's recovery time is not counted: the runner stops
    starting faults once ``duration`` has passed)."""
    kinds = SCENARIOS[scenario]
    rng = random.Random(f"{scenario}/{seed}")
    out = Schedule(seed, scenario)
    t = 0.0
    while True:
        kind = rng.choice(kinds)
        gap = round(rng.uniform(2.0, 5.0), 2)
        if kind == "pause-master":
            hold = round(rng.uniform(1.0, 8.0), 2)  # below and above the 3 s heartbeat timeout
        elif kind in ("kill-master", "double-failover", "master-and-controller", "crash-promote", "crash-truncate"):
            hold = round(rng.uniform(1.0, 6.0), 2)
        elif kind == "controller-leader":
            hold = round(rng.uniform(1.0, 8.0), 2)  # below and above the 3 s etcd lease
        else:
            hold = round(rng.uniform(2.0, 8.0), 2)
        direction = rng.choice(("both", "a->b", "b->a")) if kind == "partition-master-controller" else \
            rng.choice(("both", "all")) if kind == "partition-replica" else \
            rng.choice(("kill", "pause")) if kind == "controller-leader" else "both"
        fault = Fault(kind, gap, hold, direction, rng.randrange(2))
        if out.faults and t + gap + hold > duration:
            break
        out.faults.append(fault)
        t += gap + hold + 4.0  # a cycle's recovery, roughly
        if t >= duration:
            break
    return out


class Nemesis:
    """Runs a schedule against a cluster; ``heal_all()`` undoes whatever is still in force."""

    def __init__(self, cluster: ChaosCluster, schedule: Schedule, *, recover_timeout: float = 20.0) -> None:
        self.cluster = cluster
        self.schedule = schedule
        self.recover_timeout = recover_timeout
        self.applied: list[dict[str, Any]] = []
        self._down: list[str] = []  # processes killed and not restarted yet (restarted by heal_all)

    async def run(self, deadline: float) -> None:
        """Each fault of the schedule until ``deadline`` (monotonic); every fault is healed before the next."""
        for fault in self.schedule.faults:
            if time.monotonic() + fault.gap >= deadline:
                break
            await asyncio.sleep(fault.gap)
            t = time.monotonic()
            info = await self.apply(fault)
            info.update(kind=fault.kind, t=round(t - self.cluster.t0, 3), hold=fault.hold)
            self.applied.append(info)
            await self.heal_all()
            # a bounded wait for the group to come back before the next fault (a fault on a group still
            # electing tests little more than the first)
            try:
                info["recovered_s"] = round(await self.cluster.wait_healthy(self.recover_timeout), 3)
            except AssertionError:
                info["recovered_s"] = None

    async def _master(self) -> ChaosBroker | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = await self.cluster.master()
            if m is not None:
                return m
            await asyncio.sleep(0.1)
        return None

    async def apply(self, f: Fault) -> dict[str, Any]:
        """Apply one fault, hold it; the caller heals."""
        c = self.cluster
        m = await self._master()
        if m is None:
            return {"skipped": "no master"}
        info: dict[str, Any] = {"master": m.name}
        hold: Callable[[], Awaitable[None]] = lambda: asyncio.sleep(f.hold)  # noqa: E731
        if f.kind == "kill-master":
            c.kill(m.name)
            self._down.append(m.name)
            await hold()
        elif f.kind == "pause-master":
            c.pause(m.name)
            await hold()
            c.resume(m.name)
        elif f.kind == "partition-master-controller":
            for ctl in c.controllers:
                await c.partition(m.name, ctl.name, f.direction)
            info["direction"] = f.direction
            await hold()
        elif f.kind == "isolate-master":
            await c.isolate(m.name)
            await hold()
        elif f.kind == "partition-replica":
            replicas = [b for b in c.brokers if b is not m]
            r = replicas[f.pick % len(replicas)]
            info["replica"] = r.name
            if f.direction == "all":
                await c.isolate(r.name)
            else:
                await c.partition(r.name, m.name)
            info["direction"] = f.direction
            await hold()
        elif f.kind == "double-failover":
            c.kill(m.name)
            self._down.append(m.name)
            try:
                second = await c.wait_master(15.0, not_=m)
            except AssertionError:
                info["second"] = None
            else:
                info["second"] = second.name
                c.kill(second.name)
                self._down.append(second.name)
            await hold()
        elif f.kind == "master-and-controller":
            leader = await self._controller_leader()
            if leader is None:
                return {"skipped": "no controller leader", "master": m.name}
            g = await c.controller_state()
            epoch = g.master_epoch if g is not None else 0
            c.kill(m.name)
            c.kill(leader)
            start = time.monotonic()
            info["controller"] = leader
            self._down += [m.name]
            watch = asyncio.ensure_future(self._elected(m, epoch, start))
            await asyncio.sleep(f.hold / 2)
            await c.restart(leader)
            await asyncio.sleep(f.hold / 2)
            info["elected_s"] = await watch
        elif f.kind == "controller-leader":
            leader = await self._controller_leader()
            if leader is None:
                return {"skipped": "no controller leader", "master": m.name}
            info.update(controller=leader, direction=f.direction)
            if f.direction == "pause":
                c.pause(leader)
            else:
                c.kill(leader)
            probe = asyncio.ensure_future(c.wait_elections_work(f.hold + 30.0))
            await hold()
            if f.direction == "pause":
                c.resume(leader)
            else:
                await c.restart(leader)
            elections = await probe
            info["elections_s"] = None if elections is None else round(elections, 3)
        elif f.kind == "crash-promote":
            replicas = [b for b in c.brokers if b is not m]
            for r in replicas:  # armed at their next start
                c.kill(r.name)
                r.env = {FAILPOINTS_ENV: "ha.promote.epoch_written"}
                await self._restart_armed(r.name)
            c.kill(m.name)
            self._down.append(m.name)
            await hold()
            info["crashed"] = [r.name for r in replicas if not r.running]
        elif f.kind == "crash-truncate":
            c.kill(m.name)
            m.env = {FAILPOINTS_ENV: "ha.truncate.log_cut"}
            await asyncio.sleep(f.hold / 2)
            await self._restart_armed(m.name)
            await asyncio.sleep(f.hold / 2)
            info["crashed"] = not m.running
        else:
            raise ValueError(f"unknown fault {f.kind}")
        return info

    async def _restart_armed(self, name: str) -> None:
        """Restart a broker armed with a failpoint; one that fires before the broker is ready is a crash too."""
        try:
            await self.cluster.restart(name)
        except ProcessError:
            self.cluster.note("failpoint fired while starting", node=name)

    async def _elected(self, old: ChaosBroker, epoch: int, start: float, timeout: float = 40.0) -> float | None:
        """Seconds from ``start`` until the controller leader records a master other than ``old`` above
        ``epoch``."""
        while time.monotonic() - start < timeout:
            g = await self.cluster.controller_state()
            if g is not None and g.master_epoch > epoch and g.master_id is not None \
                    and g.master_id != old.controller_id:
                return round(time.monotonic() - start, 3)
            await asyncio.sleep(0.1)
        return None

    async def _controller_leader(self, timeout: float = 10.0) -> str | None:
        """The controller that answers as leader (waits for one ≤ ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = await self.cluster.controller_leader()
            if leader is not None:
                return leader.name
            await asyncio.sleep(0.1)
        return None

    async def heal_all(self) -> None:
        """Partitions removed, paused processes resumed, killed ones restarted."""
        c = self.cluster
        await c.heal()
        for name in list(c.paused):
            c.resume(name)
        for ctl in c.controllers:
            if not ctl.running:
                await c.restart(ctl.name)
        while self._down:
            name = self._down.pop(0)
            c.node(name).env = {}
            await c.restart(name)
        for b in c.brokers:  # unarmed; a failpoint that fired left its broker down
            if b.env:
                b.env = {}
            if not b.running and b.name not in c.paused:
                await c.restart(b.name)
