"""A replica whose log ends before the master's log start (retention deleted what it lacks), as processes.

It cannot catch up: the bytes it needs next are gone (RocketMQ's master idles on such a link; its slave never
copies again). The master must say so, once per link and naming the replica and both offsets, instead of ending
the link's send loop without a word (the link then died of silence four heartbeats later, logged with an empty
reason, and the replica reconnected to the same fate), and the replica must never count as caught up.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.ha.cluster import SEGMENT_SIZE, Cluster
from tests.kit import eventually

TOPIC = "HABehindRetention"
HOURS = ";".join(str(h) for h in range(24))
_CANNOT = re.compile(r"replica 1 .*log ends at (\d+), before this master's log start (\d+)")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"fileReservedTime": "0", "deleteWhen": HOURS, "cleanResourceInterval": "200",
                                  "allAckInSyncStateSet": "false"}) as c:
        yield c


async def test_a_replica_behind_the_masters_log_start_is_named_once_per_link(cluster: Cluster) -> None:
    b0 = (await cluster.start(1))[0]
    b1 = cluster.add_broker(1)
    await cluster.create_topic(b0, TOPIC, 1)
    await b1.start()
    assert (await cluster.follow(b1, b0, 1, 1)).code == 0
    await cluster.wait_sync_set(b0, {0, 1})
    assert await cluster.send(b0, TOPIC, b"first") == ResponseCode.SUCCESS
    replica_end = await cluster.wait_caught_up(b1, b0)
    await b1.stop()

    body = b"r" * (100 * 1024)
    for _ in range(2 * SEGMENT_SIZE // len(body) + 2):
        assert await cluster.send(b0, TOPIC, body) == ResponseCode.SUCCESS

    async def first_segment_gone() -> bool:
        return "retention: deleted" in b0.log_text()

    await eventually(first_segment_gone, 15, what="retention deleting the first segment", step=0.1)
    reply = await cluster.request(b0.addr, RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": 0})
    assert int(reply.ext_fields["offset"]) > 1

    await b1.start()
    assert (await cluster.follow(b1, b0, 1, 1)).code == 0

    async def named() -> bool:
        return _CANNOT.search(b0.log_text()) is not None

    # (well before four heartbeats of silence, 4 s here, would end the link)
    await eventually(named, 3, what=f"the master naming the replica it cannot feed\n{cluster.logs()}", step=0.1)
    m = _CANNOT.search(b0.log_text())
    assert m is not None and int(m.group(1)) == replica_end and int(m.group(2)) > replica_end
    status = await cluster.status(b0)
    assert set(status["syncStateSet"]) == {0}, status
    # once per link: no more lines than the links the replica opened
    links = b0.log_text().count("HA link from")
    assert len(_CANNOT.findall(b0.log_text())) <= max(links, 1), b0.log_tail()
    assert (await cluster.status(b1))["maxOffset"] == replica_end
