"""The admin client against an in-process nameserver + broker(s)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cometmq.client import (
    Admin,
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageQueue,
    NoRouteError,
    Producer,
    SendResult,
)
from cometmq.protocol.codes import ResponseCode

from .conftest import Cluster


async def send(cluster: Cluster, topic: str, n: int, *, queue: MessageQueue | None = None, prefix: str = "m",
               keys: str | None = None) -> list[SendResult]:
    async with Producer("admin-pg", namesrv=cluster.namesrv_addr) as p:
        return [await p.send(Message(topic, f"{prefix}{i}".encode(), keys=keys or f"{prefix}-k{i}"), queue=queue)
                for i in range(n)]


async def test_create_update_list_route_and_delete_topics(cluster: Cluster) -> None:
    b = await cluster.add_broker("broker-b")
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        info = await admin.cluster_info()
        assert set(info.broker_addr_table) == {"broker-a", "broker-b"}
        assert set(info.cluster_addr_table["DefaultCluster"]) == {"broker-a", "broker-b"}

        assert await admin.create_topic("AT", read_queues=3) == ["broker-a", "broker-b"]
        route = await admin.topic_route("AT")
        assert sorted((qd.broker_name, qd.read_queue_nums, qd.write_queue_nums) for qd in route.queue_datas) == [
            ("broker-a", 3, 3), ("broker-b", 3, 3)]
        assert "AT" in await admin.list_topics()
        assert b.topics.get("AT") is not None

        # update: more write queues, read-only perm, on one broker given by address
        await admin.update_topic("AT", read_queues=3, write_queues=5, perm=4, broker=b.addr)
        qd = {q.broker_name: q for q in (await admin.topic_route("AT")).queue_datas}
        assert (qd["broker-b"].write_queue_nums, qd["broker-b"].perm) == (5, 4)
        assert (qd["broker-a"].write_queue_nums, qd["broker-a"].perm) == (3, 6)

        # a topic on one broker given by name
        assert await admin.create_topic("AOne", broker="broker-a", order=True) == ["broker-a"]
        assert {bd.broker_name for bd in (await admin.topic_route("AOne")).broker_datas} == {"broker-a"}

        assert await admin.delete_topic("AT") == ["broker-a", "broker-b"]
        assert "AT" not in await admin.list_topics()
        assert cluster.brokers[0].topics.get("AT") is None and b.topics.get("AT") is None
        with pytest.raises(NoRouteError, match="AT"):
            await admin.topic_route("AT")
        with pytest.raises(NoRouteError, match="AT"):
            await admin.delete_topic("AT")


async def test_bad_arguments_are_refused_before_any_request(cluster: Cluster) -> None:
    admin = Admin(namesrv=cluster.namesrv_addr)
    with pytest.raises(ClientStateError, match="not started"):
        await admin.list_topics()
    with pytest.raises(InvalidArgumentError):
        Admin()
    async with admin:
        with pytest.raises(InvalidArgumentError, match="topic"):
            await admin.create_topic("bad topic")
        with pytest.raises(InvalidArgumentError, match="read_queues"):
            await admin.create_topic("T", read_queues=0)
        with pytest.raises(InvalidArgumentError, match="perm"):
            await admin.create_topic("T", perm=8)
        with pytest.raises(NoRouteError, match="nowhere"):
            await admin.create_topic("T", broker="nowhere")
        with pytest.raises(NoRouteError, match="cluster Other is unknown"):
            await admin.create_topic("T", cluster="Other")
        with pytest.raises(InvalidArgumentError, match="group"):
            await admin.consumer_progress("bad group")
        with pytest.raises(InvalidArgumentError, match="offset message id"):
            await admin.view_message("nothex")
        with pytest.raises(InvalidArgumentError, match="timestamp"):
            await admin.reset_offset_by_timestamp("g", "T", "yesterday")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="MessageQueue"):
            await admin.max_offset(("T", "broker-a", 0))  # type: ignore[arg-type]
        with pytest.raises(NoRouteError, match="Unknown"):
            await admin.topic_stats("Unknown")


async def test_topic_stats_and_consumer_progress(cluster: Cluster) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("AS", read_queues=2)
        q0, q1 = MessageQueue("AS", "broker-a", 0), MessageQueue("AS", "broker-a", 1)
        await send(cluster, "AS", 5, queue=q0)
        await send(cluster, "AS", 3, queue=q1)
        stats = await admin.topic_stats("AS")
        assert list(stats) == [q0, q1]
        assert [(s.min_offset, s.max_offset, s.messages) for s in stats.values()] == [(0, 5, 5), (0, 3, 3)]
        assert all(s.last_update_timestamp > 0 for s in stats.values())

        async with LitePullConsumer("ag", namesrv=cluster.namesrv_addr, consume_from="first",
                                    auto_commit=False) as c:
            await c.assign([q0])
            got: list[MessageExt] = []
            while len(got) < 4:
                got += await c.poll(1.0, max_messages=4 - len(got))
            await c.commit()
        progress = await admin.consumer_progress("ag", "AS")
        assert progress.offsets[q0].consumer_offset == 4 and progress.offsets[q0].lag == 1
        assert progress.offsets[q1].lag == 3  # never committed: the whole queue is behind
        assert (progress.total_lag, progress.total_broker_offset, progress.total_consumer_offset) == (4, 8, 4)
        assert progress.lag_by_topic() == {"AS": 4}
        everything = await admin.consumer_progress("ag")  # every topic the group committed offsets for
        assert everything.offsets == progress.offsets
        await admin.update_consumer_offset("ag", q1, 3)
        assert (await admin.consumer_progress("ag", "AS")).total_lag == 1
        assert await admin.committed_offset("ag", q1) == 3
        assert await admin.committed_offset("nobody", q1) is None
        assert (await admin.min_offset(q0), await admin.max_offset(q0)) == (0, 5)


async def test_messages_by_offset_id_key_and_unique_key(cluster: Cluster) -> None:
    await cluster.add_broker("broker-b")
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("AQ", read_queues=1)
        a = await send(cluster, "AQ", 3, queue=MessageQueue("AQ", "broker-a", 0), keys="order-1")
        b = await send(cluster, "AQ", 2, queue=MessageQueue("AQ", "broker-b", 0), prefix="b", keys="order-1 other")
        await send(cluster, "AQ", 1, prefix="z", keys="order-2")

        m = await admin.view_message(b[1].offset_msg_id)
        assert (m.body, m.queue.broker_name, m.msg_id, m.offset_msg_id) == (b"b1", "broker-b", b[1].msg_id,
                                                                             b[1].offset_msg_id)
        found = await admin.query_messages_by_key("AQ", "order-1")
        assert sorted(x.body for x in found) == [b"b0", b"b1", b"m0", b"m1", b"m2"]  # from both brokers
        assert [x.store_timestamp for x in found] == sorted(x.store_timestamp for x in found)
        assert len(await admin.query_messages_by_key("AQ", "order-1", max_num=2)) == 2
        assert [x.body for x in await admin.query_messages_by_key("AQ", "other")] == [b"b0", b"b1"]
        assert await admin.query_messages_by_key("AQ", "nothing") == []

        u = await admin.query_message_by_unique_key("AQ", a[2].msg_id)
        assert u.body == b"m2" and u.offset_msg_id == a[2].offset_msg_id
        assert (await admin.query_message("AQ", a[0].msg_id)).body == b"m0"
        assert (await admin.query_message("AQ", a[1].offset_msg_id)).body == b"m1"
        with pytest.raises(BrokerError) as info:
            await admin.query_message_by_unique_key("AQ", "0" * 32)
        assert info.value.code == ResponseCode.QUERY_NOT_FOUND
        with pytest.raises(BrokerError) as info:
            await admin.query_message("AQ", "7F000001" + "0" * 24)  # an offset id naming no broker
        assert info.value.code == ResponseCode.QUERY_NOT_FOUND


async def test_reset_offsets_by_timestamp(cluster: Cluster) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("AR", read_queues=2)
        q0, q1 = MessageQueue("AR", "broker-a", 0), MessageQueue("AR", "broker-a", 1)
        for q in (q0, q1):
            await send(cluster, "AR", 3, queue=q, prefix="old")
        await asyncio.sleep(0.02)
        ts = int(time.time() * 1000)
        await asyncio.sleep(0.02)
        for q in (q0, q1):
            await send(cluster, "AR", 2, queue=q, prefix="new")
        await admin.update_consumer_offset("rg", q0, 5)
        await admin.update_consumer_offset("rg", q1, 1)

        # not forced: only moves back (q0 5 -> 3), never forward (q1 stays at 1)
        resets = {r.queue: r for r in await admin.reset_offset_by_timestamp("rg", "AR", ts, force=False)}
        assert (resets[q0].timestamp_offset, resets[q0].rollback_offset, resets[q0].consumer_offset) == (3, 3, 5)
        assert (resets[q1].timestamp_offset, resets[q1].rollback_offset) == (3, 1)
        assert resets[q0].broker_offset == 5
        assert (await admin.committed_offset("rg", q0), await admin.committed_offset("rg", q1)) == (3, 1)

        await admin.reset_offset_by_timestamp("rg", "AR", ts)
        assert (await admin.committed_offset("rg", q0), await admin.committed_offset("rg", q1)) == (3, 3)
        await admin.reset_offset_by_timestamp("rg", "AR", 0)
        assert (await admin.committed_offset("rg", q0), await admin.committed_offset("rg", q1)) == (0, 0)
        await admin.reset_offset_by_timestamp("rg", "AR", -1)  # -1: the end of each queue
        assert (await admin.committed_offset("rg", q0), await admin.committed_offset("rg", q1)) == (5, 5)
        assert await admin.search_offset(q0, ts) == 3

    # A consumer of the group started after the reset reads from the reset offsets.
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.reset_offset_by_timestamp("rg", "AR", ts)
    async with LitePullConsumer("rg", namesrv=cluster.namesrv_addr) as c:
        await c.subscribe("AR")
        got: list[MessageExt] = []
        while len(got) < 4:
            got += await c.poll(1.0)
        assert sorted(m.body for m in got) == [b"new0", b"new0", b"new1", b"new1"]


async def test_subscription_groups(cluster: Cluster) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        assert await admin.create_subscription_group("sg", retry_max_times=3, retry_queue_nums=2) == ["broker-a"]
        groups = await admin.subscription_groups("broker-a")
        assert groups["sg"]["retryMaxTimes"] == 3 and groups["sg"]["retryQueueNums"] == 2
        assert cluster.brokers[0].groups.groups["sg"].retryMaxTimes == 3
        assert await admin.delete_subscription_group("sg") == ["broker-a"]
        assert "sg" not in await admin.subscription_groups(cluster.brokers[0].addr)
        with pytest.raises(InvalidArgumentError):
            await admin.create_subscription_group("sg", retry_queue_nums=-1)
