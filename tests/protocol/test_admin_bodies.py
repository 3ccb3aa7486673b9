"""Golden bytes of the admin bodies as fastjson 1.x writes the Java classes, round trips, and malformed input.

The expected strings are built by hand from the Java classes' fields under fastjson's default rules: bean
properties in alphabetical order, nulls left out, enums by name, doubles as Java's Double.toString, Integer map
keys bare, MessageQueue map keys as the serialized queue.
"""

from __future__ import annotations

import pytest

from cometmq.protocol.admin_bodies import (
    BrokerStatsData,
    BrokerStatsItem,
    Connection,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    KVTable,
    ObjectKey,
    OffsetWrapper,
    ProducerConnection,
    ResetOffsetBody,
    TopicOffset,
    TopicStatsTable,
    bean,
    encode_topic_list,
    fastjson_dumps,
    java_double,
    parse_fastjson,
)
from cometmq.protocol.client_bodies import MessageQueue, SubscriptionData
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.route import TopicList

Q0 = MessageQueue("T", "broker-a", 0)
Q1 = MessageQueue("T", "broker-a", 1)
MQ0 = '{"brokerName":"broker-a","queueId":0,"topic":"T"}'
MQ1 = '{"brokerName":"broker-a","queueId":1,"topic":"T"}'


def test_topic_stats_table_golden_and_round_trip() -> None:
    table = TopicStatsTable({Q1: TopicOffset(0, 5, 1700000000000), Q0: TopicOffset(2, 9, 1700000000001)})
    expected = ('{"offsetTable":{' + MQ0 + ':{"lastUpdateTimestamp":1700000000001,"maxOffset":9,"minOffset":2},'
                + MQ1 + ':{"lastUpdateTimestamp":1700000000000,"maxOffset":5,"minOffset":0}},"topicPutTps":0.0}')
    assert table.encode() == expected.encode()
    assert TopicStatsTable.decode(expected.encode()) == table
    assert list(TopicStatsTable.decode(expected.encode()).offset_table) == [Q0, Q1]


def test_consume_stats_golden_and_round_trip() -> None:
    stats = ConsumeStats({Q0: OffsetWrapper(8, 5, 7, 1), Q1: OffsetWrapper(3, 3, 3, 0)}, 1.5)
    expected = ('{"consumeTps":1.5,"offsetTable":{'
                + MQ0 + ':{"brokerOffset":8,"consumerOffset":5,"lastTimestamp":1,"pullOffset":7},'
                + MQ1 + ':{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0,"pullOffset":3}}}')
    assert stats.encode() == expected.encode()
    assert ConsumeStats.decode(expected.encode()) == stats
    assert stats.total_diff() == 3 and stats.inflight_total_diff() == 2


def test_consume_stats_reads_older_brokers_and_cometmqs_old_list() -> None:
    # RocketMQ 4.x's OffsetWrapper has no pullOffset; whitespace and key order do not matter
    old_java = ('{"consumeTps":0.0, "offsetTable": {' + MQ0 + ' : {"consumerOffset":5,"brokerOffset":8,'
                '"lastTimestamp":0}}}')
    assert ConsumeStats.decode(old_java.encode()) == ConsumeStats({Q0: OffsetWrapper(8, 5, 0, 0)})
    ours = (b'{"offsetTable":[{"topic":"T","brokerName":"broker-a","queueId":1,"brokerOffset":4,'
            b'"consumerOffset":2}],"consumeTps":0}')
    assert ConsumeStats.decode(ours) == ConsumeStats({Q1: OffsetWrapper(4, 2, 0, 0)})
    # fastjson2 with WriteNonStringKeyAsString: the queue as a string key
    as_string = '{"offsetTable":{"{\\"brokerName\\":\\"broker-a\\",\\"queueId\\":0,\\"topic\\":\\"T\\"}":{}}}'
    assert ConsumeStats.decode(as_string.encode()).offset_table == {Q0: OffsetWrapper()}
    # a list without brokerName takes the broker asked
    assert TopicStatsTable.decode(b'{"offsetTable":[{"topic":"T","queueId":0,"maxOffset":3}]}',
                                  default_broker="broker-a").offset_table == {Q0: TopicOffset(0, 3, 0)}


def test_consumer_connection_golden() -> None:
    conn = ConsumerConnection(
        (Connection("c2@1", "127.0.0.1:5002", "JAVA", 453), Connection("c1@1", "127.0.0.1:5001", "PYTHON", 401)),
        {"T": SubscriptionData("T", "a || b", 17, "TAG", ("b", "a"))},
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    expected = ('{"connectionSet":[{"clientAddr":"127.0.0.1:5001","clientId":"c1@1","language":"PYTHON","version":401},'
                '{"clientAddr":"127.0.0.1:5002","clientId":"c2@1","language":"JAVA","version":453}],'
                '"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY",'
                '"messageModel":"CLUSTERING","subscriptionTable":{"T":{"classFilterMode":false,"codeSet":[97,98],'
                '"expressionType":"TAG","subString":"a || b","subVersion":17,"tagsSet":["a","b"],"topic":"T"}}}')
    assert conn.encode() == expected.encode()
    back = ConsumerConnection.decode(expected.encode())
    assert back.connections == tuple(sorted(conn.connections))
    assert back.subscription_table["T"].sub_string == "a || b"
    assert back.subscription_table["T"].tags == ("a", "b")
    assert (back.consume_type, back.message_model, back.consume_from_where) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")


def test_producer_connection_golden() -> None:
    body = ProducerConnection((Connection("p@1", "10.0.0.1:4000", "GO", 317),))
    expected = b'{"connectionSet":[{"clientAddr":"10.0.0.1:4000","clientId":"p@1","language":"GO","version":317}]}'
    assert body.encode() == expected
    assert ProducerConnection.decode(expected) == body
    assert ProducerConnection().encode() == b'{"connectionSet":[]}'


def test_kv_table_group_list_topic_list_golden() -> None:
    kv = KVTable({"putTps": "0.0 0.0 0.0", "brokerVersionDesc": "V5_3_1", "msgPutTotalTodayNow": "7"})
    expected = b'{"table":{"brokerVersionDesc":"V5_3_1","msgPutTotalTodayNow":"7","putTps":"0.0 0.0 0.0"}}'
    assert kv.encode() == expected
    assert KVTable.decode(expected) == kv
    groups = GroupList(("g2", "g1", "g1"))
    assert groups.encode() == b'{"groupList":["g1","g2"]}'
    assert GroupList.decode(b'{"groupList":["g2","g1"]}') == GroupList(("g1", "g2"))
    body = encode_topic_list(["B", "A"], "127.0.0.1:10911")
    assert body == b'{"brokerAddr":"127.0.0.1:10911","topicList":["A","B"]}'
    assert TopicList.decode(body) == TopicList(("A", "B"), "127.0.0.1:10911")
    assert encode_topic_list([]) == b'{"topicList":[]}'  # a null brokerAddr is left out


def test_broker_stats_data_golden() -> None:
    data = BrokerStatsData(BrokerStatsItem(10, 0.5, 1.25), BrokerStatsItem(600, 0.16666666666666666, 2.0),
                           BrokerStatsItem(0, 0.0, 0.0))
    expected = (b'{"statsDay":{"avgpt":0.0,"sum":0,"tps":0.0},'
                b'"statsHour":{"avgpt":2.0,"sum":600,"tps":0.16666666666666666},'
                b'"statsMinute":{"avgpt":1.25,"sum":10,"tps":0.5}}')
    assert data.encode() == expected
    assert BrokerStatsData.decode(expected) == data


def test_reset_offset_body_golden_and_c_form() -> None:
    body = ResetOffsetBody({Q1: 20, Q0: 10})
    expected = '{"offsetTable":{' + MQ0 + ':10,' + MQ1 + ':20}}'
    assert body.encode() == expected.encode()
    assert ResetOffsetBody.decode(expected.encode()) == body
    # the C++ client's ResetOffsetBodyForC, and offsets written as strings
    c_form = b'{"offsetTable":[{"brokerName":"broker-a","offset":10,"queueId":0,"topic":"T"}]}'
    assert ResetOffsetBody.decode(c_form) == ResetOffsetBody({Q0: 10})
    as_text = ('{"offsetTable":{' + MQ0 + ':"10"}}').encode()
    assert ResetOffsetBody.decode(as_text) == ResetOffsetBody({Q0: 10})


def test_consume_stats_list_golden() -> None:
    stats = ConsumeStats({Q0: OffsetWrapper(4, 1, 1, 0)})
    body = ConsumeStatsList((("g", (stats,)), ("h", ())), "127.0.0.1:10911", 3, 0)
    expected = ('{"brokerAddr":"127.0.0.1:10911","consumeStatsList":[{"g":[{"consumeTps":0.0,"offsetTable":{'
                + MQ0 + ':{"brokerOffset":4,"consumerOffset":1,"lastTimestamp":0,"pullOffset":1}}}]},{"h":[]}],'
                '"totalDiff":3,"totalInflightDiff":0}')
    assert body.encode() == expected.encode()
    assert ConsumeStatsList.decode(expected.encode()) == body


def test_writer_rules() -> None:
    # bean properties sorted, nulls left out; maps keep their order; Integer keys bare
    assert fastjson_dumps(bean(b=1, a=None, c=[True, None])) == b'{"b":1,"c":[true,null]}'
    assert fastjson_dumps({"z": 1, "a": 2}) == b'{"z":1,"a":2}'
    assert fastjson_dumps(bean(offsetTable={0: 5, 1: -1})) == b'{"offsetTable":{0:5,1:-1}}'
    # strings: quote, backslash and control characters escaped; non-ASCII as UTF-8
    assert fastjson_dumps('a"b\\c\nd\x01é') == '"a\\"b\\\\c\\nd\\u0001é"'.encode()
    with pytest.raises(TypeError):
        fastjson_dumps({(1, 2): 3})


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (1.5, "1.5"), (100.0, "100.0"), (0.001, "0.001"),
    (0.0001, "1.0E-4"), (1.234e-5, "1.234E-5"), (9999999.0, "9999999.0"), (1e7, "1.0E7"),
    (12345678.9, "1.23456789E7"), (-2.5, "-2.5"), (1 / 3, "0.3333333333333333"), (1.5e300, "1.5E300"),
    (float("nan"), "null"), (float("inf"), "null"),
])
def test_java_double(value: float, text: str) -> None:
    assert java_double(value) == text


def test_parser_reads_fastjson_keys() -> None:
    raw = parse_fastjson(b'{"brokerAddrs":{0:"a:1",1:"b:2"},"t":{' + MQ0.encode() + b':1}}', "cluster info")
    assert raw["brokerAddrs"] == {"0": "a:1", "1": "b:2"}
    [(key, value)] = raw["t"].items()
    assert isinstance(key, ObjectKey) and dict(key) == {"brokerName": "broker-a", "queueId": 0, "topic": "T"}
    assert value == 1
    assert hash(key) == hash(ObjectKey({"topic": "T", "queueId": 0, "brokerName": "broker-a"}))
    assert parse_fastjson(b' [1, -2, 2.5e3, "x\\u0041", true, false, null] ', "list") == [
        1, -2, 2500.0, "xA", True, False, None]


@pytest.mark.parametrize(("body", "message"), [
    (b"", "the body is empty"),
    (b"\xff\xfe", "is not UTF-8"),
    (b'{"offsetTable":{{"brokerName":"b"', "the body ends inside an object"),
    (b'{"a" 1}', "expected ':' after a key"),
    (b'{"a":1 "b":2}', "expected ',' or '}' in an object"),
    (b"[1,2", "the body ends inside an array"),
    (b'{"a":tru}', "expected a value"),
    (b'{"a":"unterminated}', "bad string"),
    (b"{1.5:2}", "a number key must be an integer"),
    (b"{[1]:2}", "expected a key"),
    (b'{"a":1} x', "unexpected text after the body"),
    (b"{" * 70 + b"}" * 70, "nested deeper than 64 levels"),
    (b'{"x":{' + b'{"k":' * 70 + b"1" + b"}" * 70 + b":1}}", "nested deeper than 64 levels"),
])
def test_parser_rejects_malformed_bodies(body: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match="consume stats") as info:
        parse_fastjson(body, "consume stats")
    assert message in str(info.value)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"offsetTable":5}', "offsetTable must be an object"),
    (b'{"offsetTable":{{"queueId":0}:{}}}', "needs a topic and a brokerName"),
    (b'{"offsetTable":{' + MQ0.encode() + b':{"brokerOffset":"x"}}}', "brokerOffset must be an integer"),
    (b'{"offsetTable":{' + MQ0.encode() + b":[1]}}", "must be an object, got a list"),
    (b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":"q"}]}', "queueId must be an integer"),
    (b'{"consumeTps":"fast"}', "consumeTps must be a number"),
    (b"[]", "consume stats must be an object"),
])
def test_decoders_reject_bad_shapes(body: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        ConsumeStats.decode(body)
    assert message in str(info.value)
