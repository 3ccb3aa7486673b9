"""Offsets, heartbeats and membership, retries and dead letters, delay levels, locks, restarts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.client_bodies import (
    ConsumerData,
    HeartbeatData,
    LockBatchBody,
    MessageQueue,
    SubscriptionData,
    decode_consumer_list,
    decode_lock_ok,
)
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit import FakeClock

from .conftest import StartBroker, create_topics, props, pull_request, send_request


def heartbeat(client_id: str, group: str, topic: str) -> RemotingCommand:
    data = HeartbeatData(client_id, (), (ConsumerData(group, subscriptions=(SubscriptionData(topic, "*"),)),))
    return make_request(RequestCode.HEART_BEAT, {}, data.encode())


async def pull_all(client: RemotingClient, addr: str, topic: str, queue_id: int = 0, group: str = "cg") -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        r = await client.invoke(addr, pull_request(topic, offset, queue_id, group=group, sys_flag=4))
        if r.code != ResponseCode.SUCCESS:
            return out
        out.extend(x.body for x in iter_records(r.body))
        offset = int(r.ext_fields["nextBeginOffset"])


async def test_consumer_offsets_persist(start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await client.invoke(b.addr, send_request("O", b"x"))
    q = {"consumerGroup": "g", "topic": "O", "queueId": 0}
    r = await client.invoke(b.addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, q))
    assert r.code == ResponseCode.SUCCESS and r.ext_fields["offset"] == "0"  # a queue that starts at 0
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "1"}))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, q))
    assert r.ext_fields["offset"] == "1"
    # A pull with the commit flag commits too.
    await client.invoke(b.addr, pull_request("O", 1, group="g2", sys_flag=5, commitOffset="1"))
    assert b.offsets.query("g2", "O", 0) == 1
    await b.stop()
    b2 = await start_broker(tmp_path / "b")
    r = await client.invoke(b2.addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, q))
    assert r.ext_fields["offset"] == "1"
    assert await pull_all(client, b2.addr, "O") == [b"x"]
    for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
        r = await client.invoke(b2.addr, make_request(code, {"topic": "O", "queueId": 0}))
        assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b2.addr, make_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                                                  {"topic": "O", "queueId": 0, "timestamp": "0"}))
    assert r.ext_fields["offset"] == "0"


async def test_an_offset_commit_for_a_topic_or_queue_the_broker_lacks_is_refused(
        start_broker: StartBroker, client: RemotingClient) -> None:
    """As RocketMQ 5: UPDATE_CONSUMER_OFFSET names a topic that exists and one of its queues (and a group, made
    when groups are auto-created). Before, any client could add entries for made-up topics and queue ids, each kept
    and written to consumerOffset.json for good."""
    b = await start_broker()
    await client.invoke(b.addr, send_request("O", b"x"))
    nums = b.topics.topics["O"].read_queue_nums

    async def commit(topic: str, queue_id: int) -> RemotingCommand:
        return await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "g", "topic": topic, "queueId": str(queue_id), "commitOffset": "1"}))

    r = await commit("NoSuchTopic", 0)
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in (r.remark or "")
    for queue_id in (nums, 1_000_000, -1):
        r = await commit("O", queue_id)
        assert r.code == ResponseCode.SYSTEM_ERROR and "queue" in (r.remark or "").lower(), queue_id
    assert b.offsets.table == {}  # nothing kept
    r = await commit("O", nums - 1)
    assert r.code == ResponseCode.SUCCESS
    assert b.offsets.query("g", "O", nums - 1) == 1
    assert "g" in b.groups.groups  # a group the commit made (groups are auto-created by default)


async def test_an_offset_commit_past_a_java_long_is_refused(start_broker: StartBroker, client: RemotingClient) -> None:
    """RocketMQ parses commitOffset as a Java long. One past it was kept, answered to QUERY_CONSUMER_OFFSET (which a
    Java consumer cannot parse: its queue never started) and written to consumerOffset.json; now the commit is
    SYSTEM_ERROR naming the value, by UPDATE_CONSUMER_OFFSET or a pull's commit flag, and nothing is kept."""
    b = await start_broker()
    await client.invoke(b.addr, send_request("O", b"x"))
    q = {"consumerGroup": "g", "topic": "O", "queueId": "0"}
    for bad in (2**63, 10**30, -1):
        r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": bad}))
        assert r.code == ResponseCode.SYSTEM_ERROR and str(bad) in (r.remark or ""), (bad, r.code, r.remark)
    r = await client.invoke(b.addr, pull_request("O", 0, group="g", sys_flag=5, commitOffset=str(2**63)))
    assert r.code == ResponseCode.SYSTEM_ERROR and str(2**63) in (r.remark or ""), (r.code, r.remark)
    assert b.offsets.table == {}
    r = await client.invoke(b.addr, pull_request("O", 0, group="g", sys_flag=5, commitOffset="-1"))
    assert r.code == ResponseCode.SUCCESS and b.offsets.table == {}  # a negative one is not committed, as before
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 2**63 - 1}))
    assert r.code == ResponseCode.SUCCESS and b.offsets.query("g", "O", 0) == 2**63 - 1


async def test_an_offset_commit_for_an_unknown_group_is_refused_when_groups_are_not_auto_created(
        start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(auto_create_subscription_group=False)
    await client.invoke(b.addr, send_request("O", b"x"))
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "made-up", "topic": "O", "queueId": "0", "commitOffset": "1"}))
    assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "made-up" in (r.remark or "")
    assert b.offsets.table == {} and "made-up" not in b.groups.groups


async def test_groups_with_names_rocketmq_refuses_are_not_auto_created(start_broker: StartBroker,
                                                                       client: RemotingClient) -> None:
    """As RocketMQ 5 (TopicValidator.validateGroup): a group is auto-created only with a name of 1..120 letters,
    digits and %|-_. Before, a pull, an offset commit, a lock or a send-back naming any made-up name (blank, with
    spaces or slashes, 100,000 characters long) created it, written to subscriptionGroup.json and
    consumerOffset.json for good; a heartbeat naming a 121..248-character group was refused (its retry topic's
    name is too long) after creating the group. An admin's create of such a name is INVALID_PARAMETER."""
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("O", b"x"))
    offset = decode_offset_msg_id(r.ext_fields["msgId"]).offset
    await client.invoke(b.addr, heartbeat("c0", "ok", "O"))
    b.groups.persist_if_dirty()
    groups, topics, offsets = set(b.groups.groups), set(b.topics.topics), json.dumps(b.offsets.table)
    disk = b.groups.path.read_bytes()
    for name in ("a b", "", "   ", "../x", "x" * 121, "y" * 100_000, "g\n"):
        for cmd in (pull_request("O", 0, group=name, sys_flag=5, commitOffset="1"),
                    make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": name, "topic": "O",
                                                                      "queueId": "0", "commitOffset": "1"}),
                    make_request(RequestCode.LOCK_BATCH_MQ, {}, LockBatchBody(
                        name, "c1", frozenset({MessageQueue("O", b.config.broker_name, 0)})).encode()),
                    make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": name, "offset": offset,
                                                                      "delayLevel": 1})):
            r = await client.invoke(b.addr, cmd)
            assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, (cmd.code, name[:10], r.code, r.remark)
            assert "its name" in (r.remark or "") and len(r.remark or "") < 400
        r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                                     json.dumps({"groupName": name}).encode()))
        assert r.code == ResponseCode.INVALID_PARAMETER, (name[:10], r.code, r.remark)
    r = await client.invoke(b.addr, heartbeat("c2", "G" * 200, "O"))  # registered, as RocketMQ; nothing made
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.consumers.client_ids("G" * 200) == ["c2"]
    b.groups.persist_if_dirty()
    assert (set(b.groups.groups), set(b.topics.topics), json.dumps(b.offsets.table)) == (groups, topics, offsets)
    assert b.groups.path.read_bytes() == disk and b.store.max_offset("%RETRY%ok", 0) == 0
    longest = "z" * 120  # the longest name still made, with its retry topic
    r = await client.invoke(b.addr, heartbeat("c3", longest, "O"))
    assert r.code == ResponseCode.SUCCESS and longest in b.groups.groups and f"%RETRY%{longest}" in b.topics.topics


async def test_heartbeat_membership_and_notify(start_broker: StartBroker) -> None:
    b = await start_broker()
    notified: list[str] = []

    async def on_notify(conn: object, cmd: RemotingCommand) -> None:
        notified.append(cmd.ext_fields["consumerGroup"])

    c1 = RemotingClient({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: on_notify})
    c2 = RemotingClient()
    try:
        r = await c1.invoke(b.addr, heartbeat("client-1", "G", "T"))
        assert r.code == ResponseCode.SUCCESS
        assert b.topics.get("%RETRY%G") is not None
        await c2.invoke(b.addr, heartbeat("client-2", "G", "T"))
        for _ in range(100):
            if len(notified) >= 2:
                break
            await asyncio.sleep(0.01)
        assert "G" in notified
        r = await c1.invoke(b.addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}))
        assert decode_consumer_list(r.body) == ["client-1", "client-2"]
        before = len(notified)
        await c2.close()
        for _ in range(200):
            if b.consumers.client_ids("G") == ["client-1"] and len(notified) > before:
                break
            await asyncio.sleep(0.01)
        assert b.consumers.client_ids("G") == ["client-1"]
        assert len(notified) > before  # the leaving client made the broker notify the one that stayed
        bad = make_request(RequestCode.HEART_BEAT, {}, b"{not json")
        r = await c1.invoke(b.addr, bad)
        assert r.code == ResponseCode.SYSTEM_ERROR and "heartbeat" in (r.remark or "")
        r = await c1.invoke(b.addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "none"}))
        assert r.code == ResponseCode.SYSTEM_ERROR
    finally:
        await c1.close()


async def test_send_back_goes_to_retry_then_dlq(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("R", b"payload", 0, props(UNIQ_KEY="ORIG1", TAGS="t")))
    offset = 0
    for sent_back in range(1, 4):
        r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                                     {"offset": str(offset), "group": "cg", "delayLevel": "1",
                                                      "maxReconsumeTimes": "2"}))
        assert r.code == ResponseCode.SUCCESS, r.remark
        # The retry copy waits on delay level 1 (300 ms here), then lands in %RETRY%cg.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = await pull_all(client, b.addr, "%RETRY%cg")
            dlq = await pull_all(client, b.addr, "%DLQ%cg")
            if len(got) + len(dlq) >= sent_back:
                break
            await asyncio.sleep(0.05)
        r2 = await client.invoke(b.addr, pull_request("%RETRY%cg", sent_back - 1, sys_flag=4))
        if sent_back <= 2:
            [rec] = list(iter_records(r2.body))
            assert rec.body == b"payload" and rec.reconsume_times == sent_back
            assert rec.properties["RETRY_TOPIC"] == "R" and rec.properties["ORIGIN_MESSAGE_ID"] == "ORIG1"
            assert "REAL_TOPIC" not in rec.properties and "DELAY" not in rec.properties
            offset = rec.physical_offset
    dlq = await pull_all(client, b.addr, "%DLQ%cg")
    assert dlq == [b"payload"]
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                                 {"offset": "999999", "group": "cg", "delayLevel": "0"}))
    assert r.code == ResponseCode.SYSTEM_ERROR


async def test_delay_levels_deliver_on_time_and_survive_restart(start_broker: StartBroker, client: RemotingClient,
                                                                tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "d")
    t0 = time.monotonic()
    await client.invoke(b.addr, send_request("Delay", b"soon", 0, props(DELAY="1", UNIQ_KEY="D1")))
    await client.invoke(b.addr, send_request("Delay", b"later", 0, props(DELAY="3", UNIQ_KEY="D3")))
    assert await pull_all(client, b.addr, "Delay") == []
    while not await pull_all(client, b.addr, "Delay"):
        await asyncio.sleep(0.02)
        assert time.monotonic() - t0 < 5
    first = time.monotonic() - t0
    assert first >= 0.25  # level 1 is 300 ms here
    await b.stop()  # "later" (900 ms) is still waiting
    b2 = await start_broker(tmp_path / "d")
    while len(await pull_all(client, b2.addr, "Delay")) < 2:
        await asyncio.sleep(0.02)
        assert time.monotonic() - t0 < 10
    r = await client.invoke(b2.addr, pull_request("Delay", 0, sys_flag=4))
    recs = list(iter_records(r.body))
    assert [x.body for x in recs] == [b"soon", b"later"]
    assert [x.properties["UNIQ_KEY"] for x in recs] == ["D1", "D3"]
    await asyncio.sleep(0.5)
    assert len(await pull_all(client, b2.addr, "Delay")) == 2  # delivered once, not again after the restart


async def test_queue_locks(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    await create_topics(client, b.addr, "T")
    mqs = frozenset(MessageQueue("T", "broker-a", i) for i in range(4))
    r = await client.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                 LockBatchBody("G", "c1", mqs).encode()))
    assert decode_lock_ok(r.body) == mqs
    r = await client.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                 LockBatchBody("G", "c2", mqs).encode()))
    assert decode_lock_ok(r.body) == frozenset()
    half = frozenset(list(sorted(mqs))[:2])
    await client.invoke(b.addr, make_request(RequestCode.UNLOCK_BATCH_MQ, {}, LockBatchBody("G", "c1", half).encode()))
    r = await client.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                 LockBatchBody("G", "c2", mqs).encode()))
    assert decode_lock_ok(r.body) == half
    r = await client.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {}, b"[]"))
    assert r.code == ResponseCode.SYSTEM_ERROR


async def test_admin_topics_and_message_queries(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(auto_create_topic_enable=False)
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                 {"topic": "Made", "readQueueNums": 2, "writeQueueNums": 2,
                                                  "perm": 6}))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, send_request("Made", b"hi", 1, props(KEYS="order-7", UNIQ_KEY="UQ")))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, make_request(RequestCode.QUERY_MESSAGE, {"topic": "Made", "key": "order-7",
                                                                               "maxNum": 10, "beginTimestamp": 0,
                                                                               "endTimestamp": 2**62}))
    assert [x.body for x in iter_records(r.body)] == [b"hi"]
    r = await client.invoke(b.addr, make_request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"}))
    assert [x.body for x in iter_records(r.body)] == [b"hi"]
    r = await client.invoke(b.addr, make_request(RequestCode.GET_ALL_TOPIC_CONFIG, {}))
    assert b'"Made"' in r.body
    r = await client.invoke(b.addr, make_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Made"}))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, send_request("Made", b"again", 0))
    assert r.code == ResponseCode.TOPIC_NOT_EXIST


async def test_locks_of_a_departed_client_are_released(start_broker: StartBroker) -> None:
    b = await start_broker()
    mqs = frozenset(MessageQueue("T", "broker-a", i) for i in range(2))
    leaving = RemotingClient()
    staying = RemotingClient()
    try:
        await create_topics(staying, b.addr, "T")
        await leaving.invoke(b.addr, heartbeat("c-leaving", "OG", "T"))
        r = await leaving.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                      LockBatchBody("OG", "c-leaving", mqs).encode()))
        assert decode_lock_ok(r.body) == mqs
        await leaving.close()  # as a killed process would: no UNLOCK, no UNREGISTER
        for _ in range(200):
            if not b.locks.table:
                break
            await asyncio.sleep(0.01)
        r = await staying.invoke(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                      LockBatchBody("OG", "c-staying", mqs).encode()))
        assert decode_lock_ok(r.body) == mqs
    finally:
        await staying.close()


async def test_topic_permissions_are_enforced(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    for topic, perm in (("ReadOnly", 4), ("WriteOnly", 2)):
        r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                     {"topic": topic, "readQueueNums": 1, "writeQueueNums": 1,
                                                      "perm": perm}))
        assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, send_request("ReadOnly", b"x"))
    assert r.code == ResponseCode.NO_PERMISSION and "ReadOnly" in (r.remark or "")
    r = await client.invoke(b.addr, send_request("WriteOnly", b"x"))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, pull_request("WriteOnly", 0, sys_flag=4))
    assert r.code == ResponseCode.NO_PERMISSION and "WriteOnly" in (r.remark or "")


def test_silent_consumers_expire() -> None:
    from cometmq.broker.clients import ConsumerManager

    class FakeConn:
        closed = False

        def __init__(self) -> None:
            self.sent: list[RemotingCommand] = []
            self.closed_calls = 0

        def send_oneway(self, cmd: RemotingCommand) -> None:
            self.sent.append(cmd)

        def close(self) -> None:
            self.closed_calls += 1

    clock = FakeClock(0)
    mgr = ConsumerManager(clock, channel_expired_ms=120_000)
    a, c = FakeConn(), FakeConn()
    data = ConsumerData("G", subscriptions=(SubscriptionData("T"),))
    mgr.register(a, "A", "PYTHON", 1, data)  # type: ignore[arg-type]
    clock.now = 100_000
    mgr.register(c, "C", "PYTHON", 1, data)  # type: ignore[arg-type]
    clock.now = 150_000  # A silent for 150 s, C for 50 s
    mgr.scan_expired()
    assert mgr.client_ids("G") == ["C"]
    assert a.closed_calls == 1 and c.closed_calls == 0
    assert c.sent and c.sent[-1].ext_fields["consumerGroup"] == "G"  # the one left was told to rebalance


async def test_a_heartbeat_naming_many_new_groups_does_not_stall_the_broker(start_broker: StartBroker,
                                                                               tmp_path: Path) -> None:
    """Each auto-created subscription group rewrote (and fsynced) the whole group table on the event loop, so one
    heartbeat naming N new groups cost O(N^2): 1000 took ~10 s, 2000 more ~85 s, every client of the broker
    waiting meanwhile. The groups are now written by the housekeeping (and at stop), and survive a restart."""
    b = await start_broker(consumer_offset_persist_interval_ms=100)
    n = 1500
    hb = HeartbeatData("many", (), tuple(ConsumerData(f"g-{i}") for i in range(n))).encode()
    async with RemotingClient() as c:
        t0 = time.perf_counter()
        r = await c.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, hb), timeout=120)
        elapsed = time.perf_counter() - t0
    assert r.code == ResponseCode.SUCCESS and len([g for g in b.groups.groups if g.startswith("g-")]) == n
    assert elapsed < 5, f"a heartbeat naming {n} new groups took {elapsed:.1f} s"
    for _ in range(100):
        if not b.groups.dirty:
            break
        await asyncio.sleep(0.05)
    assert not b.groups.dirty and b"g-1499" in b.groups.path.read_bytes()  # written by the housekeeping
    b.groups.find("g-late")  # created just before the stop: written by the stop
    path = b.config.store.store_path
    await b.stop()
    again = await start_broker(path)
    assert "g-0" in again.groups.groups and "g-late" in again.groups.groups


async def test_a_message_query_answers_what_fits_in_a_frame(start_broker: StartBroker, client: RemotingClient) -> None:
    """QUERY_MESSAGE joined up to 64 records whatever their size (with the default 4 MiB messages, 256 MiB in one
    answer, copied twice): an answer past the 16 MiB frame limit that no client takes; ours closed the connection.
    It now holds the newest records that fit in a frame."""
    b = await start_broker(store_commitlog_segment_size=8 << 20, store_max_message_size=3 << 20)
    body = b"x" * (5 << 19)  # 2.5 MiB: seven make 17.5 MiB
    for i in range(7):
        r = await client.invoke(b.addr, send_request("Big", body, 0, props(KEYS="k", UNIQ_KEY=f"U{i}")), 30)
        assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, make_request(RequestCode.QUERY_MESSAGE, {"topic": "Big", "key": "k", "maxNum": 64,
                                                                               "beginTimestamp": 0,
                                                                               "endTimestamp": 2**62}), 30)
    assert r.code == ResponseCode.SUCCESS
    records = list(iter_records(r.body))
    assert len(records) == 6 and all(x.body == body for x in records)


def test_retry_topics_of_a_heartbeat_naming_many_new_groups_cost_one_sync_and_survive_a_kill(tmp_path: Path) -> None:
    """A heartbeat naming N new clustering groups creates N retry topics. Each was appended to the topic journal
    and fsynced on its own, on the event loop: 4000 took ~10 s here, every client waiting meanwhile. The topics one
    request creates now share one sync, made before the answer, so all survive a SIGKILL right after it."""
    import json

    from tests.interop.cometmq_server import CometServer

    server = CometServer(tmp_path / "srv")
    server.start()
    try:
        n = 4000
        hb = HeartbeatData("many", (), tuple(ConsumerData(f"rg-{i}") for i in range(n))).encode()
        t0 = time.perf_counter()
        r = server.request(server.broker_addr, RequestCode.HEART_BEAT, body=hb, timeout=120)
        elapsed = time.perf_counter() - t0
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert elapsed < 3, f"a heartbeat naming {n} new groups took {elapsed:.1f} s"  # ~10 s with a sync each
        server.kill()  # SIGKILL at once: no housekeeping pass, no shutdown code
        server.start()
        r = server.request(server.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        table = json.loads(r.body)["topicConfigTable"]
        missing = [i for i in range(n) if f"%RETRY%rg-{i}" not in table]
        assert not missing, f"{len(missing)} retry topics lost, e.g. rg-{missing[0]}"
    finally:
        server.close()


async def test_a_delay_level_that_is_not_an_integer_is_refused(start_broker: StartBroker,
                                                               client: RemotingClient) -> None:
    """RocketMQ reads DELAY with Integer.parseInt and fails the send when it is not one; it was taken as no delay,
    so a message meant to wait was delivered at once. Now MESSAGE_ILLEGAL, naming the property, and nothing
    stored; a signed integer is still a level (0 or less: no delay)."""
    b = await start_broker()
    b.topics.create_system_topic("Delay", 1)
    batch = encode_batch([(b"a", {"UNIQ_KEY": "A"}, 0), (b"b", {"UNIQ_KEY": "B", "DELAY": "2.5"}, 0)])
    for request in [send_request("Delay", b"x", 0, props(DELAY=bad)) for bad in ("abc", "2.5", "1_0", " 1", "", "٣")] \
            + [send_request("Delay", batch, 0, batch="1")]:
        r = await client.invoke(b.addr, request)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and "DELAY" in (r.remark or ""), (r.code, r.remark)
    assert b.store.commitlog.max_offset == 0
    for level in ("-1", "+0"):
        r = await client.invoke(b.addr, send_request("Delay", level.encode(), 0, props(DELAY=level)))
        assert r.code == ResponseCode.SUCCESS, r.remark
    assert await pull_all(client, b.addr, "Delay") == [b"-1", b"+0"]


async def test_send_back_to_a_broker_or_retry_topic_without_write_permission_is_refused(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """As RocketMQ's consumerSendMsgBack: a broker whose brokerPermission forbids writes, or a retry topic that is
    not writable, answers NO_PERMISSION and stores nothing (the consumer then sends the message to its retry topic
    through another broker). Both were stored anyway."""
    b = await start_broker(tmp_path / "p")
    r = await client.invoke(b.addr, send_request("R", b"payload", 0, props(UNIQ_KEY="O1")))
    assert r.code == ResponseCode.SUCCESS
    b.topics.create_system_topic("%RETRY%ro", 1, perm=4)  # read-only
    back = {"offset": "0", "delayLevel": "1", "originTopic": "R"}
    before = b.store.commitlog.max_offset
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "group": "ro"}))
    assert r.code == ResponseCode.NO_PERMISSION and "%RETRY%ro" in (r.remark or ""), (r.code, r.remark)
    assert b.store.commitlog.max_offset == before
    await b.stop()
    b = await start_broker(tmp_path / "p", broker_permission=4)
    before = b.store.commitlog.max_offset
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "group": "cg"}))
    assert r.code == ResponseCode.NO_PERMISSION and "not writable" in (r.remark or ""), (r.code, r.remark)
    assert b.store.commitlog.max_offset == before


async def test_a_group_without_retry_queues_heartbeats_and_takes_no_send_back(start_broker: StartBroker,
                                                                               client: RemotingClient) -> None:
    """A group with retryQueueNums 0 (``updateSubGroup -q 0``: no retries) could not heartbeat, its retry topic
    of 0 queues refused (SYSTEM_ERROR), so its consumers got no queues; its send-backs failed the same way. As
    RocketMQ, the heartbeat makes no retry topic for it, and a send-back is answered SUCCESS, storing nothing."""
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("R", b"payload", 0, props(UNIQ_KEY="O1")))
    assert r.code == ResponseCode.SUCCESS
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(
        {"groupName": "noretry", "retryQueueNums": 0}).encode()))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, heartbeat("client-1", "noretry", "R"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.consumers.client_ids("noretry") == ["client-1"]
    before = b.store.commitlog.max_offset
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                                 {"offset": "0", "group": "noretry", "delayLevel": "0"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.commitlog.max_offset == before


async def test_a_send_back_naming_another_topic_than_its_messages_is_refused_without_acl_too(
        start_broker: StartBroker, client: RemotingClient) -> None:
    """A gRPC endpoint with its own access control in front of brokers without one checks the receipt handle's
    topic, then sends back the handle's commit-log offset: both are client-written. The broker now checks that
    the offset names a message of the originTopic whether or not its own ACL is on."""
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("Secret", b"not for the group"))
    secret = decode_offset_msg_id(r.ext_fields["msgId"]).offset
    r = await client.invoke(b.addr, send_request("Mine", b"mine"))
    mine = decode_offset_msg_id(r.ext_fields["msgId"]).offset
    await client.invoke(b.addr, heartbeat("c1", "G", "Mine"))
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": "G", "offset": secret, "delayLevel": -1, "originTopic": "Mine"}))
    assert r.code == ResponseCode.NO_PERMISSION and "Mine" in (r.remark or "")
    assert b.store.max_offset("%DLQ%G", 0) == 0  # nothing copied
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": "G", "offset": mine, "delayLevel": -1, "originTopic": "Mine"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.max_offset("%DLQ%G", 0) == 1


async def test_a_deleted_topic_is_durable_when_its_deletion_is_answered(start_broker: StartBroker,
                                                                        client: RemotingClient) -> None:
    """Recovery after a crash re-dispatches the log from the checkpoint's dispatched offset, which the deleted
    topic's unflushed queue units held back; its consumers' offsets were flushed every few seconds. A crash soon
    after DELETE_TOPIC_IN_BROKER brought both back (its old messages redelivered under the name). The answer now
    comes after the offsets are written and a thorough pass moved the checkpoint past the log's end."""
    from cometmq.store.checkpoint import Checkpoint

    b = await start_broker(store_flush_interval_consume_queue_ms=3_600_000)  # no periodic pass meanwhile
    await create_topics(client, b.addr, "Gone")
    for i in range(5):
        assert (await client.invoke(b.addr, send_request("Gone", b"m%d" % i))).code == ResponseCode.SUCCESS
    b.offsets.commit("g", "Gone", 0, 3)
    end = b.store.commitlog.max_offset
    before = Checkpoint.load(b.store.checkpoint_file)
    assert before is None or before.dispatched_offset < end
    r = await client.invoke(b.addr, make_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Gone"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    after = Checkpoint.load(b.store.checkpoint_file)
    assert after is not None and after.dispatched_offset >= end
    assert "Gone@g" not in json.loads(b.offsets.path.read_bytes())["offsetTable"]
