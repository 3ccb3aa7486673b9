"""A timer message due while the master's replica does not acknowledge (the HA link blackholed): its delivery is
stored but answered FLUSH_SLAVE_TIMEOUT, which is stored, not failed: it must not be put again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cometmq.protocol.codes import ResponseCode
from tests.broker.conftest import props, send_request
from tests.ha.cluster import Cluster
from tests.kit.faultproxy import Direction

TOPIC = "TimerHA"


async def test_a_delivery_stored_without_the_replicas_ack_is_not_put_again(tmp_path: Path) -> None:
    async with Cluster(tmp_path, {"slaveTimeout": "700"}) as cluster, \
            cluster.replica_behind_proxy(TOPIC) as (b0, _, proxy):
        due = time.time_ns() // 1_000_000 + 1500
        cmd = send_request(TOPIC, b"due", properties=props(UNIQ_KEY="timer-ha-1", TIMER_DELIVER_MS=str(due)))
        reply = await cluster.request(b0.addr, cmd.code, cmd.ext_fields, b"due")
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        proxy.blackhole(Direction.BOTH)  # the delivery at `due` is stored but not acknowledged by b1

        await cluster.wait_sync_set(b0, {0}, timeout=15)  # b1 left the set
        await asyncio.sleep(2.0)  # past any retry of the put; everything stored is visible once b1 left the set
        pulled = await cluster.pull_queue(b0.addr, TOPIC, 0)
        keys = [r.properties.get("UNIQ_KEY") for r in pulled.records]
        assert keys == ["timer-ha-1"], f"delivered {len(keys)} times: {keys}"
