"""A replica named a stale master (one of an older epoch than its own log) keeps its log, as processes.

b0 is the master of epoch 1 with replicas b1 and b2. b1 is promoted at epoch 2 while b0 is not told (an old master
cut off from the rest, still serving its HA port at epoch 1); b2 follows b1, and sends to b1 are acknowledged by
both (minInSyncReplicas 2). Then b2 is named b0 as its master, as a stale address would name it (a nameserver that
still lists the old master, say). b0's epochs end at 1, b2's at 2: the handshake's common point is the end of
epoch 1, so b2 used to cut epoch 2 from its log there, the messages b1 acknowledged with b2's acks among them:
had b1 died then, electing b2 (in b1's SyncStateSet) would have lost them. A master whose last epoch is older
than the replica's own is not one to follow (Kafka fences a leader of an older epoch so too): the link is refused
and the log kept; once named the right master again, b2 goes on from where it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import ResponseCode
from tests.ha.cluster import Cluster
from tests.kit import eventually

TOPIC = "HAStaleMaster"
TRUNCATING = "truncating the log from"
REFUSED = "older than this replica's epoch"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"minInSyncReplicas": "2"}) as c:
        yield c


async def test_a_replica_named_a_stale_master_keeps_the_newer_epochs_log(cluster: Cluster) -> None:
    b0, b1, b2 = await cluster.start(1) + [cluster.add_broker(1), cluster.add_broker(2)]
    await cluster.create_topic(b0, TOPIC, 1)
    for r in (b1, b2):
        await r.start()
        assert (await cluster.follow(r, b0, 1, r.broker_id)).code == 0
    await cluster.wait_sync_set(b0, {0, 1, 2})
    for i in range(20):
        assert await cluster.send(b0, TOPIC, f"epoch1-{i}".encode()) == ResponseCode.SUCCESS
    await cluster.wait_caught_up(b1, b0)
    await cluster.wait_caught_up(b2, b0)

    # b1 becomes the master of epoch 2; b0 is not told
    assert (await cluster.promote(b1, 2)).code == 0
    assert (await cluster.follow(b2, b1, 2, 2)).code == 0
    await cluster.wait_sync_set(b1, {0, 2})
    for i in range(20):
        assert await cluster.send(b1, TOPIC, f"epoch2-{i}".encode()) == ResponseCode.SUCCESS
    end = await cluster.wait_caught_up(b2, b1)
    epochs = (await cluster.status(b2))["epochs"]
    assert epochs[-1][0] == 2, epochs
    assert (await cluster.status(b0))["epoch"] == 1

    # b2 is named the stale master
    assert (await cluster.follow(b2, b0, 2, 2)).code == 0
    await eventually(lambda: REFUSED in b2.log_text() or TRUNCATING in b2.log_text(), 20,
                     what="b2's handshake with the stale master", step=0.05)
    assert TRUNCATING not in b2.log_text(), b2.log_tail()
    status = await cluster.status(b2)
    assert status["maxOffset"] == end and status["epochs"] == epochs, status

    # named the master of epoch 2 again, it goes on from where it was
    assert (await cluster.follow(b2, b1, 2, 2)).code == 0
    await cluster.wait_sync_set(b1, {0, 2})
    assert await cluster.send(b1, TOPIC, b"after") == ResponseCode.SUCCESS
    await cluster.wait_caught_up(b2, b1)
    for b in (b2, b1, b0):
        await b.stop()
    new, replica = b1.log(), b2.log()
    assert replica.end == new.end and replica.data[:replica.end] == new.data[:new.end]
    assert {f"epoch2-{i}" for i in range(20)} | {"after"} <= {r.body.decode() for r in replica.records}
    assert TRUNCATING not in b2.all_logs()
