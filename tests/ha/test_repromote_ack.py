"""A broker promoted again in the same process acknowledges a send only once its SyncStateSet has it.

The waiter of acknowledged offsets (``OffsetWaiter``) keeps the highest confirm offset it was told. A master
alone confirms its whole log; demoted, it may be cut back below that offset by the handshake with a new master
(here an operator promotes a replica that lagged, §1.4: the lone master's tail is lost, as documented for
minInSyncReplicas 1). Promoted again, a new send whose end lies below the old mark must still wait for the
replicas now in the set: acknowledged at once, it is lost when that replica, which never got it, becomes master.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import ResponseCode
from tests.ha.cluster import Broker, Cluster

TOPIC = "HARepromote"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"slaveTimeout": "6000", "haMaxTimeSlaveNotCatchup": "2000"}) as c:
        yield c


async def send(cluster: Cluster, b: Broker, body: bytes) -> int:
    return await cluster.send(b, TOPIC, body)


async def test_a_send_below_an_old_confirm_mark_waits_for_the_new_set(cluster: Cluster) -> None:
    async with cluster.replica_behind_cutter(TOPIC) as (b0, b1, to_b0, shared_end):

        # b1 gets nothing more; once it left the set, b0 alone acknowledges (minInSyncReplicas 1) what waited.
        to_b0.cut_at = shared_end
        assert await send(cluster, b0, b"lagged-" * 300) == ResponseCode.SUCCESS
        assert (await cluster.status(b0))["syncStateSet"] == [0]
        for i in range(20):
            assert await send(cluster, b0, f"alone-{i}".encode() * 20) == ResponseCode.SUCCESS
        await cluster.try_status(b0)

        # The operator promotes the lagging b1; b0 follows it and its tail is cut.
        assert (await cluster.promote(b1, 2)).code == 0
        assert (await cluster.follow(b0, b1, 2, 2)).code == 0
        await cluster.wait_sync_set(b1, {0, 2})
        assert await cluster.wait_caught_up(b0, b1) == shared_end

        # b0 is master again; b1 follows it through a proxy that lets it join the set, then copies nothing more.
        assert (await cluster.promote(b0, 3)).code == 0
        assert (await cluster.follow(b1, b0, 3, 1, to_b0.addr)).code == 0
        await cluster.wait_sync_set(b0, {0, 1})
        code = await send(cluster, b0, b"after-repromote")
        st0, st1 = await cluster.status(b0), await cluster.status(b1)
        assert st1["maxOffset"] < st0["maxOffset"]  # b1 never got it
        # Acknowledged only by b0 alone: once b1 left the set (minInSyncReplicas 1), never while b1 was in it.
        assert code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT), code
        assert code != ResponseCode.SUCCESS or st0["syncStateSet"] == [0], \
            f"acknowledged while replica b1 of the set {st0['syncStateSet']} has the log to {st1['maxOffset']} only"
