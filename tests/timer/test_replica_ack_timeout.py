"""A timer message due while the master's replica does not acknowledge (the HA link blackholed): its delivery is
stored but answered FLUSH_SLAVE_TIMEOUT, which is stored, not failed: it must not be put again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.broker.conftest import props, send_request
from tests.ha.cluster import Cluster
from tests.kit import eventually
from tests.kit.faultproxy import Direction, FaultProxy

TOPIC = "TimerHA"


async def test_a_delivery_stored_without_the_replicas_ack_is_not_put_again(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"slaveTimeout": "700"})
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
            due = time.time_ns() // 1_000_000 + 1500
            cmd = send_request(TOPIC, b"due", properties=props(UNIQ_KEY="timer-ha-1", TIMER_DELIVER_MS=str(due)))
            reply = await cluster.request(b0.addr, cmd.code, cmd.ext_fields, b"due")
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            proxy.blackhole(Direction.BOTH)  # the delivery at `due` is stored but not acknowledged by b1

            async def left() -> bool:
                return (await cluster.status(b0))["syncStateSet"] == [0]

            await eventually(left, 15, what="b1 leaving the set", step=0.1)
            await asyncio.sleep(2.0)  # past any retry of the put; everything stored is visible once b1 left the set
            pulled = await cluster.pull_queue(b0.addr, TOPIC, 0)
            keys = [r.properties.get("UNIQ_KEY") for r in pulled.records]
            assert keys == ["timer-ha-1"], f"delivered {len(keys)} times: {keys}"
            await b1.stop()
        await b0.stop()
    finally:
        await cluster.close()
