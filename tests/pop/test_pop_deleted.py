"""POP state of a deleted topic: it goes with the topic (RocketMQ's deleteTopic cleans the topic's consumer offsets
and POP in-flight counts), so a topic created again under the same name starts afresh for its POP groups, and a
restart does not bring the old state back from the pop log."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cometmq.client import Message, Producer
from cometmq.client.admin import Admin
from cometmq.client.sync import SyncProducer, SyncSimpleConsumer
from cometmq.protocol.codes import RequestCode, ResponseCode
from tests.interop.cometmq_server import CometServer
from tests.pop.conftest import PopCluster
from tests.pop.test_pop import GROUP, TOPIC, consumer, drain
from tests.pop.test_pop_crash import receive_all

CRASH_TOPIC = "PopDeleted"


async def _recreated_topic_with_old_state(c: PopCluster) -> list[str]:
    """Pop 5 messages (3 acked, 2 left in flight), delete the topic, create it again and send 3: the new ids."""
    await c.create_topic(TOPIC, 1)
    async with Producer("pop-producer", namesrv=c.namesrv_addr) as p:
        await p.send_batch([Message(TOPIC, f"old{i}".encode()) for i in range(5)])
        async with consumer(c) as sc:
            got = []
            while len(got) < 5:
                got.extend(await sc.receive(8, invisible_duration=30, wait=1))
            await sc.ack_many(got[:3])
        async with Admin(namesrv=c.namesrv_addr) as admin:
            await admin.delete_topic(TOPIC)
        await asyncio.sleep(0.3)  # a snapshot tick passes
        await c.create_topic(TOPIC, 1)
    async with Producer("pop-producer-2", namesrv=c.namesrv_addr) as p:
        results = await p.send_batch([Message(TOPIC, f"new{i}".encode()) for i in range(3)])
    return [r.msg_id for r in results]


async def _only_new_messages(c: PopCluster, new: list[str]) -> None:
    async with consumer(c) as sc:
        got = await drain(sc, wait=0.5)
        assert sorted(m.msg_id for m in got) == sorted(new), [m.body for m in got]
        assert all(m.reconsume_times == 0 for m in got), [(m.body, m.reconsume_times) for m in got]
        c.clock.advance(31_000)  # the old deliveries' invisible time passes: nothing of the old topic comes back
        await asyncio.sleep(0.2)
        assert await drain(sc, wait=0.3) == []


async def test_a_topic_deleted_and_created_again_starts_afresh_for_pop(pop_cluster: PopCluster) -> None:
    new = await _recreated_topic_with_old_state(pop_cluster)
    await _only_new_messages(pop_cluster, new)


async def test_the_deleted_topic_s_pop_state_stays_gone_after_a_restart(pop_cluster: PopCluster) -> None:
    new = await _recreated_topic_with_old_state(pop_cluster)
    await pop_cluster.restart()
    await _only_new_messages(pop_cluster, new)


def test_a_deleted_topic_s_pop_state_stays_gone_after_kill9(tmp_path: Path) -> None:
    # No snapshot during the test: after kill -9 the state comes from replaying the pop log alone, so the topic's
    # deletion must be in the log.
    server = CometServer(tmp_path / "srv", {"popSnapshotIntervalMs": "600000"})
    server.start()
    try:
        server.create_topic(CRASH_TOPIC, 1)
        with SyncProducer("pg", namesrv=server.namesrv) as p:
            p.send_batch([Message(CRASH_TOPIC, f"old{i}".encode()) for i in range(5)])
        with SyncSimpleConsumer(GROUP, namesrv=server.namesrv, consume_from="first", invisible_duration=3) as sc:
            sc.subscribe(CRASH_TOPIC)
            got = []
            while len(got) < 5:
                msgs = sc.receive(8, wait=1)
                assert msgs, f"only {len(got)} of 5 received"
                got.extend(msgs)
            sc.ack_many(got[:3])  # two left in flight
        r = server.request(server.broker_addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": CRASH_TOPIC})
        assert r.code == ResponseCode.SUCCESS, r.remark
        server.create_topic(CRASH_TOPIC, 1)
        with SyncProducer("pg2", namesrv=server.namesrv) as p:
            new = [r.msg_id for r in p.send_batch([Message(CRASH_TOPIC, f"new{i}".encode()) for i in range(3)])]
        # Killed at once: the deletion's answer came after its offsets and the store's checkpoint were written (a
        # checkpoint its queues held back let recovery re-dispatch them from the log; their old offsets with it had
        # old3 and old4 delivered again under a machine's load, when no periodic pass had run in the meantime).
        server.kill()
        server.start()
        with SyncSimpleConsumer(GROUP, namesrv=server.namesrv, consume_from="first", invisible_duration=30) as sc:
            sc.subscribe(CRASH_TOPIC)
            again = receive_all(sc, quiet=5.0)  # the old deliveries' 3 s invisible time passes meanwhile
        assert sorted(m.msg_id for m in again) == sorted(new), [m.body for m in again]
        assert all(m.reconsume_times == 0 for m in again)
    finally:
        server.close()


async def test_a_group_deleted_with_its_offsets_starts_afresh_for_pop(pop_cluster: PopCluster) -> None:
    c = pop_cluster
    await c.create_topic(TOPIC, 1)
    async with Producer("pop-producer", namesrv=c.namesrv_addr) as p:
        results = await p.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(5)])
    ids = sorted(r.msg_id for r in results)
    async with consumer(c) as sc:
        got = await drain(sc, wait=0.5)
        assert sorted(m.msg_id for m in got) == ids
    async with Admin(namesrv=c.namesrv_addr) as admin:
        await admin.delete_subscription_group(GROUP, broker=c.broker.config.broker_name, clean_offset=True)
    await asyncio.sleep(0.3)  # a snapshot tick passes: it must not put the cleaned offsets back
    assert c.broker.offsets.query(GROUP, TOPIC, 0) < 0
    async with consumer(c) as sc:  # the group again (created on first use), from the first message
        again = await drain(sc, wait=0.5)
    assert sorted(m.msg_id for m in again) == ids
    assert all(m.reconsume_times == 0 for m in again)
