"""A former master rejoins as a replica, as processes, and its divergent tail is cut (durably).

The scenario: master b0 and replica b1 in sync; b1 is killed; b0 takes sends it cannot get acknowledged (stored,
answered FLUSH_SLAVE_TIMEOUT: a tail no replica has); b0 is killed. b1 restarts and is promoted at epoch 2 and
takes new sends, at the offsets where b0's unacknowledged tail lies. b0 restarts as replica id 2: its handshake
finds the last point the two logs share (the end of epoch 1 on b1), cuts its tail there and copies epoch 2.

- ``test_old_master_rejoins_...``: afterwards b0's log is byte-identical to b1's, the unacknowledged bodies are
  gone, and the two epoch files agree.
- ``test_a_crash_right_after_truncation_...`` (RocketMQ #10666): b0 is killed as soon as it logs that the cut
  is done (the link-up line that follows the cut; the "truncating" line comes before it, so a kill there can
  land before the cut, which is no test of it);
  restarted with no master to follow, its recovered log ends at the cut or continues with b1's bytes, never with
  the old tail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cometmq.protocol.codes import ResponseCode
from tests.broker.conftest import send_request
from tests.ha.cluster import Broker, BrokerLog, Cluster
from tests.kit import eventually

TOPIC = "HARejoin"
TRUNCATING = "truncating the log from"
#: logged once the cut is durable and the replica has reported its new end (replica.py)
LINKED = "HA link to master"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    # The replica stays in the set while it is away (30 s), so the master's sends wait for it and time out.
    # syncFlushTimeout 2 s: a send with its replica gone answers FLUSH_SLAVE_TIMEOUT well inside the client's 15 s
    # (at RocketMQ's 5 s both timed out together, and a loaded machine made the client's expire first)
    c = Cluster(tmp_path, {"haMaxTimeSlaveNotCatchup": "30000", "slaveTimeout": "500", "syncFlushTimeout": "2000"})
    try:
        yield c
    finally:
        await c.close()


async def send(cluster: Cluster, b: Broker, body: str) -> int:
    reply = await cluster.request(b.addr, send_request(TOPIC, body.encode(), queue_id=0).code,
                                  send_request(TOPIC, body.encode(), queue_id=0).ext_fields, body.encode(), timeout=15)
    return reply.code


@dataclass
class Diverged:
    old: Broker  # the former master, killed, with an unacknowledged tail
    new: Broker  # the promoted replica, master at epoch 2 with its own tail
    shared_end: int  # where the logs stop agreeing: the end of epoch 1 on the new master
    old_end: int
    unacked: set[str]
    new_bodies: set[str]


async def diverge(cluster: Cluster, new_messages: int = 30, new_size: int = 100) -> Diverged:
    b0, b1 = await cluster.start(1) + [cluster.add_broker(1)]
    await cluster.create_topic(b0, TOPIC, 1)
    await b1.start()
    assert (await cluster.follow(b1, b0, 1, 1)).code == 0
    await cluster.wait_sync_set(b0, {0, 1})
    for i in range(50):
        assert await send(cluster, b0, f"acked-{i}") == ResponseCode.SUCCESS
    shared_end = await cluster.wait_caught_up(b1, b0)

    b1.kill()
    unacked = {f"unacked-{i}" for i in range(20)}
    codes = await asyncio.gather(*(send(cluster, b0, body) for body in sorted(unacked)))
    assert set(codes) == {ResponseCode.FLUSH_SLAVE_TIMEOUT}, codes
    old_end = int((await cluster.status(b0))["maxOffset"])
    assert old_end > shared_end
    b0.kill()

    await b1.start()
    reply = await cluster.promote(b1, 2)
    assert reply.code == 0, reply.remark
    status = await cluster.status(b1)
    assert status["role"] == "MASTER" and status["epochs"] == [[1, 0], [2, shared_end]], status
    new_bodies = {f"new-{i}-".ljust(new_size, "n") for i in range(new_messages)}
    codes = await asyncio.gather(*(send(cluster, b1, body) for body in sorted(new_bodies)))
    assert set(codes) == {ResponseCode.SUCCESS}, codes
    b0.broker_id = 2  # it rejoins under a replica id
    return Diverged(b0, b1, shared_end, old_end, unacked, new_bodies)


def bodies(log: BrokerLog) -> set[str]:
    return {r.body.decode() for r in log.records}


async def test_old_master_rejoins_as_replica_and_its_divergent_tail_is_truncated(cluster: Cluster) -> None:
    d = await diverge(cluster)
    await d.old.start()
    await cluster.wait_sync_set(d.new, {0, 2})
    end = await cluster.wait_caught_up(d.old, d.new)
    assert f"{TRUNCATING} {d.old_end} to {d.shared_end}" in d.old.log_text(), d.old.log_tail()

    await d.old.stop()
    await d.new.stop()
    old, new = d.old.log(), d.new.log()
    assert new.end == end
    assert old.end == new.end and old.data[:old.end] == new.data[:new.end]
    assert old.tail_is_zero()
    assert not bodies(old) & d.unacked
    assert d.new_bodies <= bodies(old)
    assert old.epochs == new.epochs == [(1, 0), (2, d.shared_end)]


async def test_a_crash_right_after_truncation_resurrects_nothing(cluster: Cluster) -> None:
    # Enough new bytes on the new master that copying them takes a while after the cut.
    d = await diverge(cluster, new_messages=3000, new_size=1000)
    await d.old.start()
    await eventually(lambda: LINKED in d.old.log_text(), 20, what="the truncation", step=0.002)
    d.old.kill()
    assert f"{TRUNCATING} {d.old_end} to {d.shared_end}" in d.old.log_text()
    await d.new.stop()  # nothing for the restarted replica to follow
    new = d.new.log()

    await d.old.start()
    status = await cluster.status(d.old)
    await d.old.stop()
    old = d.old.log()
    print(f"\nkilled after the cut at {d.shared_end}: recovered end {old.end} (new master's end {new.end}, "
          f"the old tail ended at {d.old_end})")
    assert status["maxOffset"] == old.end
    assert d.shared_end <= old.end <= new.end
    assert old.data[:old.end] == new.data[:old.end], "the recovered log is not a prefix of the new master's"
    assert old.tail_is_zero()
    assert not bodies(old) & d.unacked
    # the epoch file never claims more than the log: epoch 1 up to the cut, then (if copied) epoch 2
    assert old.epochs in ([(1, 0)], [(1, 0), (2, d.shared_end)])
    if old.end > d.shared_end:
        assert old.epochs == [(1, 0), (2, d.shared_end)]


async def test_a_crash_at_the_truncation_failpoint_resurrects_nothing(cluster: Cluster) -> None:
    """The same crash at the exact point (COMETMQ_FAILPOINTS=ha.truncate.log_cut: the log is cut back, the epoch
    file not yet): the restarted broker's log ends at the cut, and it then follows the new master to the same
    bytes."""
    d = await diverge(cluster)
    d.old.env = {"COMETMQ_FAILPOINTS": "ha.truncate.log_cut"}
    await d.old.start()
    assert d.old.proc is not None
    assert await asyncio.to_thread(d.old.proc.wait, 20) == 137
    assert "failpoint ha.truncate.log_cut: exiting" in d.old.log_text()
    await d.new.stop()  # nothing to follow: what it recovered is what it had
    d.old.env = {}
    await d.old.start()
    status = await cluster.status(d.old)
    await d.old.stop()
    old = d.old.log()
    assert status["maxOffset"] == old.end == d.shared_end
    assert old.tail_is_zero() and not bodies(old) & d.unacked
    assert old.epochs == [(1, 0)]

    await d.new.start()
    assert (await cluster.promote(d.new, 3)).code == 0
    await d.old.start()
    # one message in epoch 3 (an epoch with no bytes is not copied into a replica's epoch file)
    assert (await cluster.follow(d.old, d.new, 3, 2)).code == 0
    await cluster.wait_sync_set(d.new, {0, 2})
    assert await send(cluster, d.new, "epoch-3") == ResponseCode.SUCCESS
    end = await cluster.wait_caught_up(d.old, d.new)
    await d.old.stop()
    await d.new.stop()
    old, new = d.old.log(), d.new.log()
    assert old.end == new.end == end and old.data[:end] == new.data[:end]
    assert old.epochs == new.epochs
