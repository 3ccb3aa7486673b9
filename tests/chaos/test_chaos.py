"""The chaos harness's short set ([12]; marker ``chaos``): the cluster (3 controllers on etcd) comes up behind its
proxies, and a few seeds of the main scenarios and of the controller-leader faults run end to end with the
offline checker. The long run is the runner's CLI (docs/reliability.md, "Fault injection ([12])"). Skipped when
etcd is not installed (scripts/test installs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cometmq.client import Producer
from cometmq.client.message import Message, SendStatus
from tests.chaos.cluster import ChaosCluster, etcd_installed, pid_gone
from tests.chaos.nemesis import SCENARIOS, make_schedule
from tests.chaos.runner import one_line, run_once

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not etcd_installed(), reason="etcd-server is not installed (scripts/test installs "
                                                              "it): the chaos cluster runs 3 controllers on etcd")]

#: (scenario, seed): a kill of the master, the partitions, the master and the controller leader killed together, and
#: the crash points, in CI (~25-30 s each on 2 cores; the smoke test also kills a controller leader); the long run
#: (docs/reliability.md) covers every scenario over many seeds
SHORT_SET = [("kill-master", 1), ("partitions", 1), ("master-and-controller", 1), ("crash-points", 1)]
DURATION = 10.0  # seed 1 of each scenario schedules the same faults at 10 s as at 15 s; the long run uses 30


async def test_cluster_comes_up_behind_proxies_and_takes_a_send(tmp_path: Path) -> None:
    async with ChaosCluster(tmp_path) as c:
        await c.start()
        master = await c.master()
        assert master is not None
        assert sorted(b.controller_id for b in c.brokers if b.controller_id is not None) == [1, 2, 3]
        await c.create_topic("ChaosSmoke", 2)
        async with Producer(namesrv=c.namesrv_addr, retries=0) as p:
            r = await p.send(Message("ChaosSmoke", b"hello"))
        assert r.status is SendStatus.SEND_OK
        # the client went through the proxies: the nameserver's and the master's (the route names the proxy)
        assert "links=0" not in await c.hub.command("namesrv status")
        assert "links=0" not in await c.hub.command(f"{master.name} status")
        # a one-way partition of the master from the controller is one rule per proxy, by source address
        await c.partition(master.name, "c0", "a->b")
        status = await c.hub.command("c0 status")
        assert f"{master.ip}/up=blackhole" in status, status
        await c.heal()
        # a controller node is the controller and its etcd member: kill takes both (by PID)
        leader = await c.controller_leader()
        assert leader is not None and len(leader.etcd_pids()) == 1
        c.kill(leader.name)
        assert leader.etcd_killed and all(pid_gone(pid) for pid in leader.etcd_killed)
        assert await c.wait_elections_work(15) is not None
        await c.restart(leader.name)
        assert await c.stop_all() == []


def test_schedules_are_reproducible_from_the_seed() -> None:
    for scenario in SCENARIOS:
        a, b = make_schedule(scenario, 7, 60), make_schedule(scenario, 7, 60)
        assert a == b and a.faults
        assert make_schedule(scenario, 8, 60) != a


@pytest.mark.parametrize(("scenario", "seed"), SHORT_SET)
async def test_scenario(scenario: str, seed: int, tmp_path: Path) -> None:
    result = await run_once(scenario, seed, DURATION, tmp_path)
    print(one_line(result))
    assert result.get("ok"), json.dumps({k: v for k, v in result.items() if k != "traceback"}, indent=1,
                                        default=str) + "\n" + str(result.get("report") or result.get("traceback"))
    assert result["counts"]["ok"] > 0
