"""Moving messages past their retries to %DLQ%<group>: one message the DLQ refuses must not keep the others (of
the same revive pass, or later ones) in flight forever."""

from __future__ import annotations

import asyncio

from cometmq.client import Message, Producer
from cometmq.client.simple_consumer import SimpleConsumer
from cometmq.protocol.message import decode_record
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, encode_properties
from cometmq.timer.message import TIMER_SRC_PHY
from tests.pop.conftest import PopCluster
from tests.pop.test_pop import GROUP, TOPIC, consumer, send


async def test_a_message_the_dlq_refuses_does_not_hold_back_the_others(pop_cluster: PopCluster) -> None:
    b = pop_cluster.broker
    await b.stop()
    pop_cluster.brokers.clear()
    b = await pop_cluster.add_broker(max_reconsume_times=1)
    await pop_cluster.create_topic(TOPIC, 1)
    [first] = await send(pop_cluster, 1)
    got = b.store.get_messages(TOPIC, 0, 0, 1)
    stored = len(encode_properties(decode_record(got.buffers[0])[0].properties))
    # A message whose properties nearly fill the limit: its DLQ copy (RETRY_TOPIC, ORIGIN_MESSAGE_ID added) is
    # refused by the store (PROPERTIES_SIZE_EXCEEDED).
    big = "x" * (MAX_PROPERTIES_LENGTH - stored - len("big") - 2 - 8)
    async with Producer("pop-producer", namesrv=pop_cluster.namesrv_addr) as p:
        await p.send_batch([Message(TOPIC, b"big", properties={"big": big})])
    [last] = await send(pop_cluster, 1)
    async with consumer(pop_cluster) as sc:
        for _ in range(2):
            msgs = await sc.receive(8, invisible_duration=5, wait=2)
            assert len(msgs) == 3
            pop_cluster.clock.advance(6_000)
        await asyncio.sleep(0.5)  # the revive tick moves all three towards the DLQ
        assert await sc.receive(8, wait=0.3) == []
    dlq = SimpleConsumer("dlq-reader", namesrv=pop_cluster.namesrv_addr, consume_from="first")
    dlq.subscribe(f"%DLQ%{GROUP}")
    async with dlq:
        dead = await dlq.receive(8, wait=2)
    assert {m.msg_id for m in dead} >= {first, last}, "the DLQ's refusal of one message kept the others out"
    qs = b.pop.states[(GROUP, TOPIC, 0)]
    assert not qs.inflight and qs.committed == 3, (qs.inflight, qs.committed)


async def test_the_dlq_copy_of_a_delivered_timer_message_does_not_name_its_timer_record(
        pop_cluster: PopCluster) -> None:
    """A delivered timer message carries TIMER_SRC_PHY (the timer record it was put from). Its DLQ copy is no copy
    put by the timer: like a retry copy it must drop the name (crash recovery and a replica skip the record a copy
    names)."""
    b = pop_cluster.broker
    await b.stop()
    pop_cluster.brokers.clear()
    b = await pop_cluster.add_broker(max_reconsume_times=0)
    await pop_cluster.create_topic(TOPIC, 1)
    async with Producer("pop-producer", namesrv=pop_cluster.namesrv_addr) as p:
        await p.send(Message(TOPIC, b"later", delay=1.0))
    pop_cluster.clock.advance(2_000)
    deadline = asyncio.get_running_loop().time() + 10
    while b.store.max_offset(TOPIC, 0) < 1:
        assert asyncio.get_running_loop().time() < deadline, "the timer message was not delivered"
        await asyncio.sleep(0.05)
    delivered = decode_record(b.store.get_messages(TOPIC, 0, 0, 1).buffers[0])[0]
    assert TIMER_SRC_PHY in delivered.properties  # (what the DLQ copy must not keep)
    async with consumer(pop_cluster) as sc:
        assert len(await sc.receive(8, invisible_duration=5, wait=2)) == 1
        pop_cluster.clock.advance(6_000)
        dlq = f"%DLQ%{GROUP}"
        while b.store.max_offset(dlq, 0) < 1:
            assert asyncio.get_running_loop().time() < deadline + 10, "the message did not reach the DLQ"
            await asyncio.sleep(0.05)
    dead = decode_record(b.store.get_messages(dlq, 0, 0, 1).buffers[0])[0]
    assert dead.properties.get("RETRY_TOPIC") == TOPIC
    assert TIMER_SRC_PHY not in dead.properties, dead.properties
