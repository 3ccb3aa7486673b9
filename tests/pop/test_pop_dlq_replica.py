"""A move to the DLQ answered FLUSH_SLAVE_TIMEOUT (the master stored the copy; its replica did not acknowledge in
time, the HA link blackholed): the copy is in the DLQ, so the message is done, not moved again later."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.broker.conftest import props, send_request
from tests.ha.cluster import Broker, Cluster
from tests.kit.faultproxy import Direction

TOPIC = "PopHA"
GROUP = "pop-ha"


async def send(cluster: Cluster, b0: Broker, key: str) -> None:
    cmd = send_request(TOPIC, key.encode(), properties=props(UNIQ_KEY=key))
    reply = await cluster.request(b0.addr, cmd.code, cmd.ext_fields, key.encode())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def pop(cluster: Cluster, b0: Broker, invisible_ms: int = 1000) -> None:
    ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "maxMsgNums": "8",
           "invisibleTime": str(invisible_ms), "pollTime": "0", "bornTime": "0", "initMode": "0"}
    reply = await cluster.request(b0.addr, RequestCode.POP_MESSAGE, ext)
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)


async def test_a_dlq_copy_stored_without_the_replicas_ack_is_not_moved_again(tmp_path: Path) -> None:
    async with Cluster(tmp_path, {"slaveTimeout": "700", "maxReconsumeTimes": "0"}) as cluster, \
            cluster.replica_behind_proxy(TOPIC) as (b0, _, proxy):
        await send(cluster, b0, "first")
        await pop(cluster, b0)  # not acked: past its 0 retries once its 1 s is up
        proxy.blackhole(Direction.BOTH)  # its DLQ copy is stored, answered FLUSH_SLAVE_TIMEOUT

        await cluster.wait_sync_set(b0, {0}, timeout=15)  # b1 left the set
        await send(cluster, b0, "second")
        await pop(cluster, b0)  # a new delivery on the same queue: the revive looks at it again
        await asyncio.sleep(2.0)
        pulled = await cluster.pull_queue(b0.addr, f"%DLQ%{GROUP}", 0)
        keys = sorted(str(r.properties.get("UNIQ_KEY")) for r in pulled.records)
        assert keys == ["first", "second"], f"DLQ holds {keys}"


async def test_a_dlq_move_refused_for_too_few_replicas_is_tried_again(tmp_path: Path) -> None:
    conf = {"slaveTimeout": "700", "maxReconsumeTimes": "0", "minInSyncReplicas": "2"}
    async with Cluster(tmp_path, conf) as cluster, cluster.replica_behind_proxy(TOPIC) as (b0, _, proxy):
        await send(cluster, b0, "first")
        await pop(cluster, b0, invisible_ms=6000)  # not acked: past its 0 retries once its 6 s are up
        proxy.blackhole(Direction.BOTH)

        await cluster.wait_sync_set(b0, {0}, timeout=15)  # b1 left the set
        await asyncio.sleep(4.0)  # the revive's DLQ write is refused: IN_SYNC_REPLICAS_NOT_ENOUGH
        proxy.heal()
        await cluster.wait_sync_set(b0, {0, 1}, timeout=15)
        await asyncio.sleep(2.0)
        pulled = await cluster.pull_queue(b0.addr, f"%DLQ%{GROUP}", 0)
        keys = [str(r.properties.get("UNIQ_KEY")) for r in pulled.records]
        assert keys == ["first"], f"DLQ holds {keys}"
