"""Replica metadata (broker/ha/metadata.py): the master serves its tables with RocketMQ's codes and shapes; a
replica's SlaveMetadataSync copies them into its own managers, and keeps them when the master is gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.broker.groups import SubscriptionGroupConfig
from cometmq.broker.ha.metadata import MetadataProcessor, SlaveMetadataSync
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import dumps
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import TopicConfig
from tests.kit import eventually

from .conftest import StartBroker

pytestmark = pytest.mark.timeout(30)


def serve_metadata(broker: BrokerController) -> None:
    """Every broker serves the metadata codes (broker/controller.py wires MetadataProcessor)."""
    served = MetadataProcessor(offsets=broker.offsets, schedule=broker.schedule, timer=broker.timer)
    assert set(served.handlers()) <= set(broker.dispatcher)


def forget_metadata(broker: BrokerController) -> None:
    """Make ``broker`` an older master that does not answer codes 43, 45 and 60."""
    for code in (43, 45, 60):
        del broker.dispatcher[code]


def sync_for(replica: BrokerController, client: RemotingClient, master: list[str | None]) -> SlaveMetadataSync:
    return SlaveMetadataSync(client, lambda: master[0], topics=replica.topics, groups=replica.groups,
                             offsets=replica.offsets, schedule=replica.schedule, timer=replica.timer)


async def follow_timer(client: RemotingClient, master: BrokerController, replica: BrokerController) -> None:
    """Both timers built (an operator's GET_TIMER_METRICS is a first use), the replica's delivering nothing: the
    replica then copies the master's timer checkpoint too."""
    replica.timer.set_deliver(False)
    for broker in (master, replica):
        await ok(client, broker.addr, make_request(RequestCode.GET_TIMER_METRICS, {}))
    assert master.timer.loaded and replica.timer.loaded


async def ok(client: RemotingClient, addr: str, cmd: RemotingCommand) -> RemotingCommand:
    reply = await client.invoke(addr, cmd)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return reply


async def fill_master(client: RemotingClient, addr: str) -> None:
    for topic, queues in (("Orders", 8), ("Audit", 2)):
        await ok(client, addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues, "writeQueueNums": queues,
            "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}))
    group = {"groupName": "billing", "retryMaxTimes": 3, "consumeBroadcastEnable": False}
    await ok(client, addr, make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, dumps(group)))
    for queue_id, offset in ((0, 12), (3, 40)):
        await ok(client, addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "billing", "topic": "Orders", "queueId": queue_id, "commitOffset": offset}))


async def test_replica_copies_the_masters_tables(start_broker: StartBroker, client: RemotingClient,
                                                 tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "master")
    replica = await start_broker(tmp_path / "replica")
    serve_metadata(master)
    await fill_master(client, master.addr)
    master.schedule.offsets = {1: 5, 3: 9}
    replica.topics.put(TopicConfig("OnlyOnReplica"))
    replica.offsets.commit("stale", "Gone", 0, 99)  # the replica's own leftovers go: the master's table wins

    sync = sync_for(replica, client, [master.addr])
    assert await sync.sync_once() == []
    assert replica.topics.topics == master.topics.topics and "OnlyOnReplica" not in replica.topics.topics
    assert replica.topics.data_version == master.topics.data_version
    assert replica.groups.groups == master.groups.groups
    assert replica.groups.groups["billing"] == SubscriptionGroupConfig("billing", retryMaxTimes=3,
                                                                       consumeBroadcastEnable=False)
    assert replica.offsets.table == master.offsets.table == {"Orders@billing": {0: 12, 3: 40}}
    assert replica.schedule.offsets == {1: 5, 3: 9}
    # Persisted as each manager persists: topics, groups and delay offsets at once, consumer offsets when dirty.
    cfg = replica.config.store.config_dir
    assert "Orders" in json.loads((cfg / "topics.json").read_bytes())["topicConfigTable"]
    assert "billing" in json.loads((cfg / "subscriptionGroup.json").read_bytes())["subscriptionGroupTable"]
    assert json.loads((cfg / "delayOffset.json").read_bytes()) == {"offsetTable": {"1": 5, "3": 9}}
    assert replica.offsets.dirty
    # The timer, built on first use: unbuilt, the master answers as RocketMQ does without a checkpoint, and a
    # replica whose timer is not built does not ask for one.
    assert master.timer.service is None and replica.timer.service is None
    reply = await client.invoke(master.addr, make_request(RequestCode.GET_TIMER_CHECK_POINT, {}))
    assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, "The checkpoint is null")
    replica.timer.set_deliver(False)
    assert await sync.sync_once() == [] and replica.timer.service is None
    # Built (an operator's GET_TIMER_METRICS is a first use), the master's checkpoint is served and the replica,
    # which delivers nothing, takes it.
    await follow_timer(client, master, replica)
    reply = await ok(client, master.addr, make_request(RequestCode.GET_TIMER_CHECK_POINT, {}))
    assert {"readSlot", "commitOffset", "enqueueOffset"} <= set(json.loads(reply.body))
    assert await sync.sync_once() == []
    service = replica.timer.service
    assert service is not None and service.master_commit_offset is not None

    # A second pass with nothing new changes nothing; a new group on the master arrives on the next one.
    await ok(client, master.addr, make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                               dumps({"groupName": "late"})))
    assert await sync.sync_once() == []
    assert set(replica.groups.groups) == {"billing", "late"}


async def test_a_failing_master_leaves_the_replicas_tables(start_broker: StartBroker, client: RemotingClient,
                                                           tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "master")
    replica = await start_broker(tmp_path / "replica")
    serve_metadata(master)
    await fill_master(client, master.addr)
    await follow_timer(client, master, replica)
    addr: list[str | None] = [master.addr]
    sync = sync_for(replica, client, addr)
    assert await sync.sync_once() == []
    before = (dict(replica.topics.topics), dict(replica.groups.groups), dict(replica.offsets.table))

    await master.stop()
    failed = await sync.sync_once()
    assert set(failed) == {"topics", "consumer offsets", "delay offsets", "subscription groups", "timer checkpoint"}
    assert (replica.topics.topics, replica.groups.groups, replica.offsets.table) == before
    addr[0] = None  # no master known: nothing is fetched, nothing fails
    assert await sync.sync_once() == []


async def test_one_failing_fetch_does_not_stop_the_others(start_broker: StartBroker, client: RemotingClient,
                                                          tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "master")
    replica = await start_broker(tmp_path / "replica")
    forget_metadata(master)
    await fill_master(client, master.addr)  # codes 43, 45 and 60 are not served: those fetches fail
    await follow_timer(client, master, replica)
    sync = sync_for(replica, client, [master.addr])
    failed = await sync.sync_once()
    assert set(failed) == {"consumer offsets", "delay offsets", "timer checkpoint"}
    assert "Orders" in replica.topics.topics and "billing" in replica.groups.groups
    assert sync.failures["consumer offsets"] == 1


async def test_periodic_sync_runs_and_stops(start_broker: StartBroker, client: RemotingClient,
                                            tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "master")
    replica = await start_broker(tmp_path / "replica")
    serve_metadata(master)
    await fill_master(client, master.addr)
    sync = SlaveMetadataSync(client, lambda: master.addr, topics=replica.topics, groups=replica.groups,
                             offsets=replica.offsets, schedule=replica.schedule, timer=None, interval_s=0.05)
    assert SlaveMetadataSync(client, lambda: None, topics=replica.topics, groups=replica.groups,
                             offsets=replica.offsets, schedule=replica.schedule, timer=None).interval_s == 10.0
    sync.start()
    try:
        await eventually(lambda: sync.passes >= 2, 5, what="two passes")
    finally:
        await sync.stop()
    assert replica.offsets.table == master.offsets.table


async def test_a_pass_that_outlives_the_replica_role_applies_nothing(start_broker: StartBroker,
                                                                      client: RemotingClient, tmp_path: Path) -> None:
    """A replica's pass asks its master for the tables one by one; an old master slow to answer (paused, or busy)
    may answer after the replica was promoted. What it answers then is the old master's past: the new master's
    topics, groups and consumer offsets of since the promotion must stay."""
    master = await start_broker(tmp_path / "master")
    replica = await start_broker(tmp_path / "replica", broker_id=1)
    serve_metadata(master)
    await fill_master(client, master.addr)
    sync = replica.metadata_sync
    assert sync is not None
    await sync.stop()  # (this test runs the pass itself)
    await replica.replication.demote(1, master.ha_addr, 1, master.addr)
    assert sync.master_addr() == master.addr

    asked, answer = asyncio.Event(), asyncio.Event()
    serve_topics = master.dispatcher[RequestCode.GET_ALL_TOPIC_CONFIG]

    async def slow_topics(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        asked.set()
        await answer.wait()
        return await serve_topics(conn, cmd)

    master.dispatcher[RequestCode.GET_ALL_TOPIC_CONFIG] = slow_topics
    sync.timeout_s = 30.0
    running = asyncio.create_task(sync.sync_once())
    await asyncio.wait_for(asked.wait(), 10)

    await replica.replication.promote(2)  # the old master is slow to answer: meanwhile the replica is promoted
    assert sync.master_addr() is None
    await ok(client, replica.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "NewOnReplica", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}))
    await ok(client, replica.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "billing", "topic": "NewOnReplica", "queueId": 0, "commitOffset": 50}))
    answer.set()
    await asyncio.wait_for(running, 30)
    assert "NewOnReplica" in replica.topics.topics
    assert replica.offsets.table.get("NewOnReplica@billing") == {0: 50}, replica.offsets.table
