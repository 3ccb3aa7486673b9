"""The official C++ client (PyPI rocketmq==0.4.4) reads from a replica while the master is gone.

A master and one replica as processes; the C++ producer sends; the master is killed (SIGKILL). The replica
stays in the route under id 1, so C++ consumers started after the kill still get every message from it: a
PullConsumer (every queue from offset 0) and a PushConsumer of a new group. Skipped when the wheel cannot load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.ha.cluster import Cluster
from tests.interop.harness import ClientResult, CppClientRunner
from tests.kit import eventually

pytestmark = pytest.mark.interop

TOPIC = "HACppReplica"
QUEUES = 4
COUNT = 40


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        await c.close()


def ok(res: ClientResult) -> bool:
    return res.returncode == 0 or res.aborted_in_shutdown


def bodies(msgs: list[dict[str, Any]]) -> list[str]:
    return sorted(m["body"] for m in msgs)


async def test_cpp_consumers_read_from_the_replica_after_the_master_is_killed(
        cluster: Cluster, cpp_client: CppClientRunner) -> None:
    master, = await cluster.start(1)
    await cluster.create_topic(master, TOPIC, QUEUES)
    replica = cluster.add_broker(1)
    await replica.start()
    assert (await cluster.follow(replica, master, 1, 1)).code == 0
    await cluster.wait_sync_set(master, {0, 1})

    res = cpp_client.run("produce", namesrv=cluster.namesrv.addr, topic=TOPIC, count=COUNT, body="cpp-{i}")
    assert ok(res) and len(res.messages) == COUNT, res.describe()
    assert all(m["status"] == "OK" for m in res.messages), res.describe()
    await cluster.wait_caught_up(replica, master)

    master.kill()

    async def only_replica_routed() -> bool:
        route = await cluster.route(TOPIC)
        return route is not None and [bd["brokerAddrs"] for bd in route["brokerDatas"]] == [{"1": replica.addr}]

    await eventually(only_replica_routed, 10, what="the route with only the replica (id 1)", step=0.1)
    expected = sorted(f"cpp-{i}" for i in range(COUNT))

    pulled = cpp_client.run("pull_consume", namesrv=cluster.namesrv.addr, topic=TOPIC, timeout=60)
    assert ok(pulled), pulled.describe() + "\n" + replica.log_tail()
    assert bodies(pulled.messages) == expected, pulled.describe()

    push = cpp_client.start("push_consume", namesrv=cluster.namesrv.addr, topic=TOPIC, group="CG_ha_replica",
                            count=COUNT, seconds=60)
    try:
        push.wait_for("msg", COUNT, timeout=60)
    except TimeoutError as exc:
        push.stop()
        got = push.finish(timeout=20)
        raise AssertionError(f"{exc}\n{got.describe()}\n{replica.log_tail()}") from None
    got = push.finish(timeout=30)
    assert ok(got), got.describe()
    assert sorted(set(bodies(got.messages))) == expected, got.describe()
