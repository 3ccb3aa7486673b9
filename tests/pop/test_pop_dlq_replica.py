"""A move to the DLQ answered FLUSH_SLAVE_TIMEOUT (the master stored the copy; its replica did not acknowledge in
time, the HA link blackholed): the copy is in the DLQ, so the message is done, not moved again later."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.broker.conftest import props, send_request
from tests.ha.cluster import Broker, Cluster
from tests.kit import eventually
from tests.kit.faultproxy import Direction, FaultProxy

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
    cluster = Cluster(tmp_path, {"slaveTimeout": "700", "maxReconsumeTimes": "0"})
    try:
        b0, b1 = await cluster.start(1) + [cluster.add_broker(1)]
        async with FaultProxy(("127.0.0.1", b0.ha_port)) as proxy:
            await cluster.create_topic(b0, TOPIC, 1)
            await b1.start()
            reply = await cluster.request(b1.addr, RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                          {"masterEpoch": "1", "masterAddress": b0.addr,
                                           "masterHaAddress": proxy.addr, "brokerId": "1"})
            assert reply.code == 0, reply.remark
            await cluster.wait_sync_set(b0, {0, 1})
            await send(cluster, b0, "first")
            await pop(cluster, b0)  # not acked: past its 0 retries once its 1 s is up
            proxy.blackhole(Direction.BOTH)  # its DLQ copy is stored, answered FLUSH_SLAVE_TIMEOUT

            async def left() -> bool:
                return (await cluster.status(b0))["syncStateSet"] == [0]

            await eventually(left, 15, what="b1 leaving the set", step=0.1)
            await send(cluster, b0, "second")
            await pop(cluster, b0)  # a new delivery on the same queue: the revive looks at it again
            await asyncio.sleep(2.0)
            pulled = await cluster.pull_queue(b0.addr, f"%DLQ%{GROUP}", 0)
            keys = sorted(str(r.properties.get("UNIQ_KEY")) for r in pulled.records)
            assert keys == ["first", "second"], f"DLQ holds {keys}"
            await b1.stop()
        await b0.stop()
    finally:
        await cluster.close()


async def test_a_dlq_move_refused_for_too_few_replicas_is_tried_again(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"slaveTimeout": "700", "maxReconsumeTimes": "0", "minInSyncReplicas": "2"})
    try:
        b0, b1 = await cluster.start(1) + [cluster.add_broker(1)]
        async with FaultProxy(("127.0.0.1", b0.ha_port)) as proxy:
            await cluster.create_topic(b0, TOPIC, 1)
            await b1.start()
            reply = await cluster.request(b1.addr, RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                          {"masterEpoch": "1", "masterAddress": b0.addr,
                                           "masterHaAddress": proxy.addr, "brokerId": "1"})
            assert reply.code == 0, reply.remark
            await cluster.wait_sync_set(b0, {0, 1})
            await send(cluster, b0, "first")
            await pop(cluster, b0, invisible_ms=6000)  # not acked: past its 0 retries once its 6 s are up
            proxy.blackhole(Direction.BOTH)

            async def left() -> bool:
                return (await cluster.status(b0))["syncStateSet"] == [0]

            await eventually(left, 15, what="b1 leaving the set", step=0.1)
            await asyncio.sleep(4.0)  # the revive's DLQ write is refused: IN_SYNC_REPLICAS_NOT_ENOUGH
            proxy.heal()
            await cluster.wait_sync_set(b0, {0, 1}, timeout=15)
            await asyncio.sleep(2.0)
            pulled = await cluster.pull_queue(b0.addr, f"%DLQ%{GROUP}", 0)
            keys = [str(r.properties.get("UNIQ_KEY")) for r in pulled.records]
            assert keys == ["first"], f"DLQ holds {keys}"
            await b1.stop()
        await b0.stop()
    finally:
        await cluster.close()
