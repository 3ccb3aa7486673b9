"""A replica catches up with its master, as processes: from an empty log, and from behind after a restart.

Afterwards the replica's commit log is byte-identical to the master's (read from both data folders once
stopped), its epoch file is the master's, and its consume queues serve the same messages (raw pulls to its
address).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.client import Message, Producer, SendStatus
from tests.ha.cluster import Broker, BrokerLog, Cluster

TOPIC = "HACatchUp"
QUEUES = 4


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def produce(cluster: Cluster, prefix: str, n: int, size: int = 300) -> list[str]:
    bodies = [f"{prefix}-{i}-".ljust(size, "x") for i in range(n)]
    async with Producer("ha-catchup-pg", namesrv=cluster.namesrv.addr) as p:
        for body in bodies:
            r = await p.send(Message(TOPIC, body.encode()))
            assert r.status is SendStatus.SEND_OK, r
    return bodies


async def assert_same_queues(cluster: Cluster, master: Broker, replica: Broker, expected: int) -> None:
    on_master = await cluster.pull_topic(master.addr, TOPIC, QUEUES)
    on_replica = await cluster.pull_topic(replica.addr, TOPIC, QUEUES)
    total = 0
    for q in range(QUEUES):
        m = [(r.queue_offset, r.body, r.physical_offset) for r in on_master[q].records]
        r = [(r.queue_offset, r.body, r.physical_offset) for r in on_replica[q].records]
        assert r == m, f"queue {q}: the replica serves {len(r)} messages, the master {len(m)}"
        assert [o for o, _, _ in m] == list(range(len(m)))
        assert on_replica[q].max_offset == on_master[q].max_offset == len(m)
        total += len(m)
    assert total == expected


def assert_identical(master: BrokerLog, replica: BrokerLog) -> None:
    assert replica.end == master.end
    assert replica.data[:replica.end] == master.data[:master.end]
    assert replica.tail_is_zero()
    assert replica.epochs == master.epochs


async def test_replica_catches_up_from_empty_and_from_behind(cluster: Cluster) -> None:
    master, = await cluster.start(1)
    await cluster.create_topic(master, TOPIC, QUEUES)
    sent = await produce(cluster, "early", 1500)  # ~600 KiB: more than one transfer frame
    replica = cluster.add_broker(1)
    await replica.start()
    # The follow request also makes the replica copy the master's topics at once (else: 10 s later).
    reply = await cluster.follow(replica, master, 1, 1)
    assert reply.code == 0, reply.remark
    await cluster.wait_sync_set(master, {0, 1})
    await cluster.wait_caught_up(replica, master)
    await assert_same_queues(cluster, master, replica, len(sent))

    # from behind: the replica is away while the master takes more (crossing into a second segment)
    replica.kill()
    await cluster.wait_sync_set(master, {0}, timeout=10)  # haMaxTimeSlaveNotCatchup 3 s
    sent += await produce(cluster, "late", 1800)
    await replica.start()
    await cluster.wait_sync_set(master, {0, 1})
    end = await cluster.wait_caught_up(replica, master)
    assert end > 1 << 20
    await assert_same_queues(cluster, master, replica, len(sent))

    await replica.stop()
    await master.stop()
    m_log, r_log = master.log(), replica.log()
    assert m_log.end == end
    assert_identical(m_log, r_log)
    assert [e.epoch for e in m_log.epochs] == [1]
