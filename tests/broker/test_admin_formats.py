"""A real broker answers the admin requests of RocketMQ's Java tools in the shapes the Java classes serialize."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.admin_bodies import (
    BrokerStatsData,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    KVTable,
    OffsetWrapper,
    ProducerConnection,
    ResetOffsetBody,
    TopicOffset,
    TopicStatsTable,
    decode_consume_time_span,
    parse_fastjson,
)
from cometmq.protocol.client_bodies import ConsumerData, HeartbeatData, MessageQueue, SubscriptionData
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from cometmq.protocol.route import TopicList, TopicRouteData

from .conftest import StartBroker, send_request

MQ_KEY = re.compile(rb'\{"brokerName":"broker-a","queueId":\d+,"topic":"[^"]+"\}:')


async def ask(client: RemotingClient, b: BrokerController, code: int, fields: dict[str, object] | None = None,
              body: bytes = b"") -> RemotingCommand:
    return await client.invoke(b.addr, make_request(code, fields or {}, body))


async def setup(client: RemotingClient, b: BrokerController) -> None:
    for i in range(3):
        r = await client.invoke(b.addr, send_request("AT", b"m%d" % i, queue_id=i % 2))
        assert r.code == ResponseCode.SUCCESS
    await ask(client, b, RequestCode.UPDATE_CONSUMER_OFFSET,
              {"consumerGroup": "g", "topic": "AT", "queueId": 0, "commitOffset": 1})


def heartbeat(client_id: str, *, consumer: str | None = "g", producer: str | None = None) -> RemotingCommand:
    consumers = (ConsumerData(consumer, subscriptions=(SubscriptionData("AT", "a || b", 5, tags=("a", "b")),)),) \
        if consumer else ()
    return make_request(RequestCode.HEART_BEAT, {}, HeartbeatData(client_id, (producer,) if producer else (),
                                                                   consumers).encode())


async def test_topic_stats_is_a_topic_stats_table(start_broker: StartBroker, client: RemotingClient,
                                                  tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await setup(client, b)
    r = await ask(client, b, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "AT"})
    assert r.code == ResponseCode.SUCCESS
    assert r.body.startswith(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"AT"}:'
                             b'{"lastUpdateTimestamp":')
    assert r.body.endswith(b'},"topicPutTps":0.0}')
    assert len(MQ_KEY.findall(r.body)) == 4
    table = TopicStatsTable.decode(r.body).offset_table
    q0, q1 = MessageQueue("AT", "broker-a", 0), MessageQueue("AT", "broker-a", 1)
    assert (table[q0].min_offset, table[q0].max_offset, table[q1].max_offset) == (0, 2, 1)
    assert table[q0].last_update_timestamp > 0
    assert table[MessageQueue("AT", "broker-a", 3)] == TopicOffset(0, 0, 0)
    r = await ask(client, b, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Nope"})
    assert r.code == ResponseCode.TOPIC_NOT_EXIST


async def test_consume_stats_is_a_consume_stats(start_broker: StartBroker, client: RemotingClient,
                                                tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await setup(client, b)
    r = await ask(client, b, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "g", "topic": "AT"})
    assert r.code == ResponseCode.SUCCESS
    assert r.body.startswith(b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"AT"}:'
                             b'{"brokerOffset":2,"consumerOffset":1,"lastTimestamp":')
    stats = ConsumeStats.decode(r.body)
    w = stats.offset_table[MessageQueue("AT", "broker-a", 0)]
    assert (w.broker_offset, w.consumer_offset, w.pull_offset) == (2, 1, 1) and w.last_timestamp > 0
    assert stats.offset_table[MessageQueue("AT", "broker-a", 1)] == OffsetWrapper(1, 0, 0, 0)
    # without a topic: every topic the group committed offsets for; topicList names them outright
    assert ConsumeStats.decode((await ask(client, b, RequestCode.GET_CONSUME_STATS,
                                          {"consumerGroup": "g"})).body).offset_table == stats.offset_table
    listed = await ask(client, b, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "x", "topicList": "AT"})
    assert len(ConsumeStats.decode(listed.body).offset_table) == 4
    # broker-wide (317): a ConsumeStatsList
    r = await ask(client, b, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"})
    assert r.code == ResponseCode.SUCCESS and r.body.startswith(b'{"brokerAddr":"' + b.addr.encode())
    everything = ConsumeStatsList.decode(r.body)
    assert dict(everything.consume_stats_list)["g"][0].offset_table == stats.offset_table
    assert everything.total_diff == 2


async def test_connections_and_who_consumes(start_broker: StartBroker, client: RemotingClient,
                                            tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await setup(client, b)
    assert (await client.invoke(b.addr, heartbeat("c1@1", producer="pg"))).code == ResponseCode.SUCCESS
    r = await ask(client, b, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "g"})
    assert r.code == ResponseCode.SUCCESS
    assert r.body.startswith(b'{"connectionSet":[{"clientAddr":"127.0.0.1:')
    conn = ConsumerConnection.decode(r.body)
    assert [c.client_id for c in conn.connections] == ["c1@1"]
    assert conn.connections[0].language == "PYTHON" and conn.connections[0].version > 0
    assert (conn.consume_type, conn.message_model) == ("CONSUME_PASSIVELY", "CLUSTERING")
    assert conn.subscription_table["AT"].sub_string == "a || b"
    assert b'"subscriptionTable":{"AT":{"classFilterMode":false,"codeSet":[97,98],"expressionType":"TAG"' in r.body
    r = await ask(client, b, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "offline"})
    assert r.code == ResponseCode.CONSUMER_NOT_ONLINE and "offline" in (r.remark or "")

    r = await ask(client, b, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "pg"})
    assert r.code == ResponseCode.SUCCESS
    assert [c.client_id for c in ProducerConnection.decode(r.body).connections] == ["c1@1"]
    r = await ask(client, b, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "none"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "not exist" in (r.remark or "")
    r = await ask(client, b, RequestCode.GET_ALL_PRODUCER_INFO)
    assert r.code == ResponseCode.SUCCESS and parse_fastjson(r.body, "producers")["data"]["pg"][0]["clientId"] == "c1@1"

    r = await ask(client, b, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "AT"})
    assert r.body == b'{"groupList":["g"]}' and GroupList.decode(r.body).groups == ("g",)
    r = await ask(client, b, RequestCode.QUERY_TOPICS_BY_CONSUMER, {"group": "g"})
    assert r.body == b'{"brokerAddr":"' + b.addr.encode() + b'","topicList":["AT"]}'
    assert TopicList.decode(r.body).topics == ("AT",)
    r = await ask(client, b, RequestCode.QUERY_SUBSCRIPTION_BY_CONSUMER, {"group": "g", "topic": "AT"})
    assert r.body.startswith(b'{"group":"g","subscriptionData":{"classFilterMode":false')
    r = await ask(client, b, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "AT", "group": "g"})
    spans = decode_consume_time_span(r.body)
    assert len(spans) == 4 and spans[0].queue == MessageQueue("AT", "broker-a", 0) and spans[0].max_timestamp > 0
    assert b'"consumeTimeStampStr":"' in r.body
    r = await ask(client, b, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)
    assert "TBW102" in TopicList.decode(r.body).topics


async def test_runtime_info_has_the_keys_the_tools_read(start_broker: StartBroker, client: RemotingClient,
                                                        tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await setup(client, b)
    r = await ask(client, b, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert r.code == ResponseCode.SUCCESS and r.body.startswith(b'{"table":{"EndTransactionQueueSize":"0",')
    table = KVTable.decode(r.body).table
    # every key rocketmq-exporter parses (a missing one fails its whole scrape), the dashboard's and mqadmin's
    longs = ["msgPutTotalTodayNow", "msgGetTotalTodayNow", "msgPutTotalTodayMorning", "msgGetTotalTodayMorning",
             "msgPutTotalYesterdayMorning", "msgGetTotalYesterdayMorning", "sendThreadPoolQueueHeadWaitTimeMills",
             "queryThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
             "queryThreadPoolQueueSize", "pullThreadPoolQueueSize", "bootTimestamp", "commitLogMinOffset",
             "commitLogMaxOffset", "dispatchMaxBuffer", "brokerVersion", "pageCacheLockTimeMills",
             "getMessageEntireTimeMax", "putMessageTimesTotal", "sendThreadPoolQueueSize",
             "startAcceptSendRequestTimeStamp", "putMessageEntireTimeMax", "earliestMessageTimeStamp",
             "remainTransientStoreBufferNumbs", "queryThreadPoolQueueCapacity", "dispatchBehindBytes",
             "putMessageSizeTotal", "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity"]
    for key in longs:
        int(table[key])
    for key in ("consumeQueueDiskRatio", "commitLogDiskRatio", "putMessageAverageSize", "putLatency99",
                "putLatency999"):
        float(table[key])
    # TPS over 10 s, 1 min, 10 min: the 3 sends just made count (the broker is younger than every span)
    assert all(float(x) > 0 for x in table["putTps"].split(" ")) and len(table["putTps"].split(" ")) == 3
    for key in ("getMissTps", "getTransferedTps", "getTransferredTps", "getTotalTps", "getFoundTps"):
        assert [float(x) for x in table[key].split(" ")] == [0.0, 0.0, 0.0]  # nothing was pulled
    assert table["msgPutTotalTodayNow"] == "3" and table["msgPutTotalTodayMorning"] == "0"
    assert re.fullmatch(r"Total : [\d.]+ [KMGTPE]?i?B, Free : [\d.]+ [KMGTPE]?i?B\.", table["commitLogDirCapacity"])
    float(table["remainHowManyDataToFlush"].split(" ")[0])
    assert re.fullmatch(r"\[ \d+ days, \d+ hours, \d+ minutes, \d+ seconds \]", table["runtime"])
    assert all(":" in part for part in table["putMessageDistributeTime"].split(" "))
    assert table["brokerVersionDesc"].startswith("cometmq")
    assert int(table["earliestMessageTimeStamp"]) > 0 and int(table["commitLogMaxOffset"]) > 0
    assert table["heldPullRequests"] == "0"


async def test_topic_and_group_tables(start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    await setup(client, b)
    r = await ask(client, b, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert r.body.startswith(b'{"dataVersion":{"counter":')
    raw = parse_fastjson(r.body, "topics")
    assert raw["topicConfigTable"]["AT"]["readQueueNums"] == 4
    r = await ask(client, b, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert b'"forbiddenTable":{}' in r.body and "subscriptionGroupTable" in parse_fastjson(r.body, "groups")
    r = await ask(client, b, RequestCode.GET_TOPIC_CONFIG, {"topic": "AT"})
    assert parse_fastjson(r.body, "topic")["topicName"] == "AT"
    r = await ask(client, b, RequestCode.UPDATE_AND_CREATE_TOPIC_LIST, {},
                  b'{"topicConfigList":[{"topicName":"L1","readQueueNums":2,"writeQueueNums":2,"perm":6}]}')
    assert r.code == ResponseCode.SUCCESS and b.topics.get("L1") is not None
    r = await ask(client, b, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, {},
                  b'{"groupConfigList":[{"groupName":"G1","retryMaxTimes":3}]}')
    assert r.code == ResponseCode.SUCCESS and b.groups.groups["G1"].retryMaxTimes == 3
    r = await ask(client, b, RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": "G1"})
    assert parse_fastjson(r.body, "group")["retryMaxTimes"] == 3


async def test_stats_data_and_config(start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    r = await ask(client, b, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "AT"})
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "The stats <TOPIC_PUT_NUMS> <AT> not exist"
    await setup(client, b)  # 3 single sends to AT
    r = await ask(client, b, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "AT"})
    assert r.code == ResponseCode.SUCCESS
    assert re.fullmatch(rb'\{"statsDay":\{"avgpt":1\.0,"sum":3,"tps":[\d.E-]+\},"statsHour":\{"avgpt":1\.0,"sum":3,'
                        rb'"tps":[\d.E-]+\},"statsMinute":\{"avgpt":1\.0,"sum":3,"tps":[\d.E-]+\}\}', r.body), r.body
    data = BrokerStatsData.decode(r.body)
    assert data.stats_minute.tps > 0 and data.stats_minute.sum == data.stats_day.sum == 3
    size = BrokerStatsData.decode((await ask(client, b, RequestCode.VIEW_BROKER_STATS_DATA,
                                             {"statsName": "TOPIC_PUT_SIZE", "statsKey": "AT"})).body)
    assert size.stats_minute.sum > 3 * len(b"m0")  # stored records' bytes: body plus header, topic, properties
    r = await ask(client, b, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "BROKER_PUT_NUMS",
                                                                  "statsKey": b.config.broker_cluster_name})
    assert BrokerStatsData.decode(r.body).stats_minute.sum == 3
    for name, key in (("NOPE", "x"), ("GROUP_GET_NUMS", "AT@nobody"), ("COMMERCIAL_SEND_TIMES", "AT")):
        r = await ask(client, b, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})
        assert r.code == ResponseCode.SYSTEM_ERROR and "not exist" in (r.remark or ""), (name, key)

    r = await ask(client, b, RequestCode.GET_BROKER_CONFIG)
    assert r.code == ResponseCode.SUCCESS and "version" in r.ext_fields
    text = r.body.decode()
    assert "brokerName=broker-a\n" in text and f"listenPort={b.addr.rpartition(':')[2]}\n" in text
    r = await ask(client, b, RequestCode.UPDATE_BROKER_CONFIG, {}, b"channelExpiredTimeout=60000\n")
    assert r.code == ResponseCode.SUCCESS and b.consumers.channel_expired_ms == 60000
    r = await ask(client, b, RequestCode.UPDATE_BROKER_CONFIG, {}, b"brokerPermission=4\nlockMaxLiveTime=1000\n")
    assert r.code == ResponseCode.NO_PERMISSION and "brokerPermission" in (r.remark or "")
    assert b.locks.lock_max_live_ms != 1000  # all or nothing
    assert "channelExpiredTimeout=60000\n" in (await ask(client, b, RequestCode.GET_BROKER_CONFIG)).body.decode()

    for code in (RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, RequestCode.CLEAN_UNUSED_TOPIC,
                 RequestCode.DELETE_EXPIRED_COMMITLOG, RequestCode.QUERY_CONSUME_QUEUE):
        r = await ask(client, b, code)
        assert r.code == ResponseCode.SYSTEM_ERROR and "cometmq" in (r.remark or "")


async def test_offsets_reset_clone_and_correction(start_broker: StartBroker, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    notices: list[RemotingCommand] = []

    async def on_reset(conn: RemotingConnection, cmd: RemotingCommand) -> None:
        notices.append(cmd)

    async def on_running_info(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, ResponseCode.SUCCESS, None, {}, b'{"jstack":"' + cmd.ext_fields["clientId"].encode()
                             + b'"}')

    consumer = RemotingClient({RequestCode.RESET_CONSUMER_CLIENT_OFFSET: on_reset,
                               RequestCode.GET_CONSUMER_RUNNING_INFO: on_running_info})
    try:
        await setup(consumer, b)
        # no consumer online: tools fall back to writing offsets themselves
        r = await ask(consumer, b, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                      {"topic": "AT", "group": "g", "timestamp": -1, "isForce": "true"})
        assert r.code == ResponseCode.CONSUMER_NOT_ONLINE
        await consumer.invoke(b.addr, heartbeat("c1@1"))
        r = await ask(consumer, b, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                      {"topic": "AT", "group": "g", "timestamp": -1, "isForce": "true"})
        assert r.code == ResponseCode.SUCCESS
        offsets = ResetOffsetBody.decode(r.body).offset_table
        assert offsets[MessageQueue("AT", "broker-a", 0)] == 2 and b.offsets.query("g", "AT", 0) == 2
        for _ in range(100):
            if notices:
                break
            await asyncio.sleep(0.01)
        assert ResetOffsetBody.decode(notices[0].body).offset_table == offsets
        # one queue to an offset; out of range refused
        r = await ask(consumer, b, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                      {"topic": "AT", "group": "g", "timestamp": 0, "queueId": 0, "offset": 1})
        assert r.code == ResponseCode.SUCCESS and b.offsets.query("g", "AT", 0) == 1
        r = await ask(consumer, b, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                      {"topic": "AT", "group": "g", "timestamp": 0, "queueId": 0, "offset": 99})
        assert r.code == ResponseCode.SYSTEM_ERROR
        before = {q: dict(o) for q, o in b.offsets.table.items()}
        for queue_id in (b.topics.topics["AT"].write_queue_nums, 1_000_000):  # a queue the topic lacks: nothing written
            r = await ask(consumer, b, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                          {"topic": "AT", "group": "g", "timestamp": 0, "queueId": queue_id, "offset": 0})
            assert r.code == ResponseCode.SYSTEM_ERROR and f"queueId {queue_id}" in (r.remark or ""), r.remark
        assert b.offsets.table == before

        r = await ask(consumer, b, RequestCode.CLONE_GROUP_OFFSET, {"srcGroup": "g", "destGroup": "g2", "topic": "AT",
                                                                    "offline": "true"})
        assert r.code == ResponseCode.SUCCESS and b.offsets.query("g2", "AT", 0) == 1
        r = await ask(consumer, b, RequestCode.QUERY_CORRECTION_OFFSET, {"topic": "AT", "compareGroup": "g2",
                                                                        "filterGroups": ""})
        assert r.body.startswith(b'{"correctionOffsets":{0:')

        # forwarded to the consumer (307), and a clear error for a consumer not online
        r = await ask(consumer, b, RequestCode.GET_CONSUMER_RUNNING_INFO,
                      {"consumerGroup": "g", "clientId": "c1@1", "jstackEnable": "false"})
        assert r.code == ResponseCode.SUCCESS and r.body == b'{"jstack":"c1@1"}'
        r = await ask(consumer, b, RequestCode.GET_CONSUMER_RUNNING_INFO,
                      {"consumerGroup": "g", "clientId": "gone", "jstackEnable": "false"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "not online" in (r.remark or "")
    finally:
        await consumer.close()


async def test_nameserver_answers_the_tools() -> None:
    from cometmq.namesrv.processors import NamesrvProcessors
    from cometmq.namesrv.route_info import RouteInfoManager
    from cometmq.protocol.route import DataVersion, TopicConfig

    rim = RouteInfoManager()
    rim.register_broker("c1", "broker-a", "10.0.0.1:10911", 0, "", [TopicConfig("T", 4, 4)], DataVersion(1, 1))
    proc = NamesrvProcessors(rim)
    handlers = proc.dispatcher()
    conn: RemotingConnection = None  # type: ignore[assignment]  # the handlers below do not use it

    async def call(code: int, fields: dict[str, object] | None = None) -> RemotingCommand:
        reply = await handlers[code](conn, make_request(code, fields or {}))
        assert reply is not None
        return reply

    r = await call(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    assert r.body == b'{"brokerAddr":"10.0.0.1:10911","topicList":["broker-a","c1"]}'
    for code in (RequestCode.GET_UNIT_TOPIC_LIST, RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST,
                 RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST):
        assert (await call(code)).body == b'{"topicList":[]}'
    r = await call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert r.ext_fields["wipeTopicCount"] == "1"
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].perm == 4
    r = await call(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert r.ext_fields["addTopicCount"] == "1"
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].perm == 6
    r = await call(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert r.code == ResponseCode.QUERY_NOT_FOUND
    # KV configs: put, read, list, and the order conf carried by the route; deleted, all gone
    r = await call(RequestCode.PUT_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T", "value": "broker-a:4"})
    assert r.code == ResponseCode.SUCCESS
    r = await call(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})
    assert (r.code, r.ext_fields["value"]) == (ResponseCode.SUCCESS, "broker-a:4")
    r = await call(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert r.body == b'{"table":{"T":"broker-a:4"}}'
    r = await call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert TopicRouteData.decode(r.body).order_topic_conf == "broker-a:4"
    with pytest.raises(RemotingError) as bad:  # the dispatch answers it with this code and remark
        await call(RequestCode.PUT_KV_CONFIG, {"namespace": "N"})
    assert bad.value.code == ResponseCode.INVALID_PARAMETER and "'key'" in str(bad.value)
    assert (await call(RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "T"})).code == 0
    r = await call(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert r.code == ResponseCode.QUERY_NOT_FOUND
    r = await call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert TopicRouteData.decode(r.body).order_topic_conf == ""
    for code in (RequestCode.GET_NAMESRV_CONFIG, RequestCode.UPDATE_NAMESRV_CONFIG):
        r = await call(code)
        assert r.code == ResponseCode.SYSTEM_ERROR and "cometmq" in (r.remark or "")
