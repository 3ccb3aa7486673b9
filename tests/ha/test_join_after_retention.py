"""A new, empty replica joins a master whose first commit-log segments retention has deleted (as processes).

The master starts the transfer of a replica that reports 0 at its log's start (controller-ha.md §1.2 step 3), and
an empty replica takes the first frame wherever it starts (step 5: only a non-zero log end must equal the frame's
start). A replica that insisted on offset 0 would never copy anything: it would reconnect forever, and the master
would never get a second in-sync replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.ha.cluster import SEGMENT_SIZE, Broker, Cluster
from tests.kit import eventually

TOPIC = "HARetention"
HOURS = ";".join(str(h) for h in range(24))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"fileReservedTime": "0", "deleteWhen": HOURS, "cleanResourceInterval": "200"}) as c:
        yield c


async def send(cluster: Cluster, b: Broker, body: bytes) -> int:
    return await cluster.send(b, TOPIC, body)


async def test_an_empty_replica_joins_a_master_whose_log_no_longer_starts_at_zero(cluster: Cluster) -> None:
    b0 = (await cluster.start(1))[0]
    await cluster.create_topic(b0, TOPIC, 1)
    body = b"r" * (100 * 1024)
    for _ in range(SEGMENT_SIZE // len(body) + 2):
        assert await send(cluster, b0, body) == ResponseCode.SUCCESS

    async def first_segment_gone() -> bool:
        return "retention: deleted" in b0.log_text()

    await eventually(first_segment_gone, 15, what="retention deleting the first segment", step=0.1)

    b1 = cluster.add_broker(1)
    await b1.start()
    assert (await cluster.follow(b1, b0, 1, 1)).code == 0
    await cluster.wait_sync_set(b0, {0, 1}, timeout=15)
    assert await send(cluster, b0, b"after-join") == ResponseCode.SUCCESS
    end = await cluster.wait_caught_up(b1, b0)
    assert end > SEGMENT_SIZE
    reply = await cluster.request(b0.addr, RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": 0})
    first = int(reply.ext_fields["offset"])
    assert first > 0
    on_master = [(r.queue_offset, r.body) for r in (await cluster.pull_queue(b0.addr, TOPIC, 0, offset=first)).records]
    assert on_master[-1][1] == b"after-join"

    async def replica_serves_the_same() -> bool:
        # (the replica shows a record once a frame of the master confirms it: the next one after the bytes)
        pulled = await cluster.pull_queue(b1.addr, TOPIC, 0, offset=first)
        return [(r.queue_offset, r.body) for r in pulled.records] == on_master

    await eventually(replica_serves_the_same, 15, what="the replica serving the master's queue", step=0.1)

    await b1.stop()  # its log starts past 0 too: a restart recovers it as it is
    await b1.start()
    assert (await cluster.status(b1))["maxOffset"] == end
    again = await cluster.pull_queue(b1.addr, TOPIC, 0, offset=first)
    assert [(r.queue_offset, r.body) for r in again.records] == on_master
