from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.protocol import route
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.route import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicList,
    TopicRouteData,
    body_crc32,
    decode_json,
)

ROUTE = TopicRouteData(
    queue_datas=(QueueData("broker-a", 4, 4, 6, 0),),
    broker_datas=(BrokerData("DefaultCluster", "broker-a", {1: "127.0.0.1:10921", 0: "127.0.0.1:10911"}),),
)


def test_route_known_answer() -> None:
    # The exact bytes the C++ client parses: brokerAddrs keyed by the string "0", no orderTopicConf.
    assert ROUTE.encode() == (
        b'{"queueDatas":[{"brokerName":"broker-a","readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0}],'
        b'"brokerDatas":[{"cluster":"DefaultCluster","brokerName":"broker-a",'
        b'"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"}}],"filterServerTable":{}}'
    )


def test_route_round_trip() -> None:
    full = TopicRouteData(
        (*ROUTE.queue_datas, QueueData("broker-b", 8, 2, 4, 1)),
        (*ROUTE.broker_datas, BrokerData("c2", "broker-b", {0: "10.0.0.2:10911"})),
        order_topic_conf="broker-a:4",
        filter_server_table={"127.0.0.1:10911": ("127.0.0.1:30000",)},
    )
    assert TopicRouteData.decode(full.encode()) == full
    assert json.loads(full.encode())["orderTopicConf"] == "broker-a:4"
    assert TopicRouteData.decode(ROUTE.encode()) == ROUTE


def test_broker_data_master_and_order() -> None:
    bd = ROUTE.broker_datas[0]
    assert bd.master_addr == "127.0.0.1:10911"
    assert list(bd.broker_addrs) == [0, 1]
    assert BrokerData("c", "b", {2: "x:1"}).master_addr is None


def test_route_decodes_java_forms() -> None:
    # fastjson writes Map<Long, String> keys bare and 4.x spells the flag topicSynFlag; orderTopicConf null.
    java = (
        b'{"orderTopicConf":null,"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":2,"topicSynFlag":3,'
        b'"writeQueueNums":2}],"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},'
        b'"brokerName":"b","cluster":"c"}],"filterServerTable":{}}'
    )
    got = TopicRouteData.decode(java)
    assert got.order_topic_conf == ""
    assert got.queue_datas == (QueueData("b", 2, 2, 6, 3),)
    assert got.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"queueDatas":{}}',
        b'{"queueDatas":[{"readQueueNums":4}]}',
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":"x","writeQueueNums":1}]}',
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":-1,"writeQueueNums":1}]}',
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":1.5,"writeQueueNums":1}]}',
        # a made-up queue count: a client enumerating the queues hung (2**31 - 1) or ran out of memory
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":2147483647,"writeQueueNums":1}]}',
        b'{"queueDatas":[{"brokerName":"b","readQueueNums":1,"writeQueueNums":"99999999999999999999999"}]}',
        b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"zero":"x:1"}}]}',
        b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"0":7}}]}',
        b'{"orderTopicConf":5}',
        b'{"filterServerTable":{"a:1":[1]}}',
        b"[" * 100_000,
    ],
)
def test_route_rejects_malformed(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        TopicRouteData.decode(body)


@pytest.mark.parametrize("compress", [False, True])
def test_a_registration_with_a_made_up_queue_count_is_refused(compress: bool) -> None:
    """The nameserver reads registrations with these: a topic of 2**31 - 1 queues was taken and routed."""
    body = RegisterBrokerBody((TopicConfig("T", 2**31 - 1, 4),), DataVersion(), ()).encode(compress)
    with pytest.raises(ProtocolError, match="readQueueNums"):
        RegisterBrokerBody.decode(body, compress)
    ok = RegisterBrokerBody((TopicConfig("T", route.WIRE_QUEUE_NUMS_MAX, 4),), DataVersion(), ()).encode(compress)
    assert RegisterBrokerBody.decode(ok, compress).topic_configs[0].read_queue_nums == route.WIRE_QUEUE_NUMS_MAX


def test_cluster_info_round_trip_and_shape() -> None:
    info = ClusterInfo(
        {"broker-a": BrokerData("c1", "broker-a", {0: "h:1"}), "broker-b": BrokerData("c2", "broker-b", {0: "h:2"})},
        {"c1": ("broker-a",), "c2": ("broker-b",)},
    )
    raw = json.loads(info.encode())
    expected = {"cluster": "c1", "brokerName": "broker-a", "brokerAddrs": {"0": "h:1"}}
    assert raw["brokerAddrTable"]["broker-a"] == expected
    assert raw["clusterAddrTable"] == {"c1": ["broker-a"], "c2": ["broker-b"]}
    assert ClusterInfo.decode(info.encode()) == info
    with pytest.raises(ProtocolError):
        ClusterInfo.decode(b'{"clusterAddrTable":{"c":"broker-a"}}')


def test_topic_list() -> None:
    topics = TopicList(("a", "b"))
    assert json.loads(topics.encode()) == {"topicList": ["a", "b"]}
    assert TopicList.decode(topics.encode()) == topics
    with_addr = TopicList(("x",), "h:1")
    assert TopicList.decode(with_addr.encode()) == with_addr
    with pytest.raises(ProtocolError):
        TopicList.decode(b'{"topicList":[1]}')


def test_decode_json_names_the_body() -> None:
    with pytest.raises(ProtocolError, match="widget is not valid JSON"):
        decode_json(b"{", "widget")


# -- register body ---------------------------------------------------------------------------------------------

TOPICS = (
    TopicConfig("TopicA", 8, 8, 6),
    TopicConfig("TopicB", 1, 2, 4, topic_sys_flag=2, order=True),
    TopicConfig("FifoTopic", 4, 4, 6, message_type="FIFO"),
)
BODY = RegisterBrokerBody(TOPICS, DataVersion(1_700_000_000_000, 7), ("127.0.0.1:30000",))


def test_register_body_json_shape() -> None:
    raw = json.loads(BODY.encode())
    wrapper = raw["topicConfigSerializeWrapper"]
    assert wrapper["dataVersion"] == {"timestamp": 1_700_000_000_000, "counter": 7}
    assert wrapper["topicConfigTable"]["TopicA"] == TOPICS[0].to_json()
    assert raw["filterServerList"] == ["127.0.0.1:30000"]


def test_register_body_json_round_trip() -> None:
    assert RegisterBrokerBody.decode(BODY.encode()) == BODY


def test_register_body_compressed_round_trip() -> None:
    got = RegisterBrokerBody.decode(BODY.encode(compress=True), compressed=True)
    # Java's compact layout has no topicSysFlag or order: those come back as defaults.
    assert got.data_version == BODY.data_version
    assert got.filter_server_list == BODY.filter_server_list
    assert got.topic_configs == (
        TopicConfig("TopicA", 8, 8, 6),
        TopicConfig("TopicB", 1, 2, 4),
        TopicConfig("FifoTopic", 4, 4, 6, message_type="FIFO"),
    )


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def test_register_body_compressed_known_answer() -> None:
    # Built by hand the way a Java 4.9 broker writes it (no static-topic mapping count at the end).
    raw = (
        _framed(b'{"counter":3,"timestamp":1650000000000}')
        + struct.pack(">i", 2)
        + _framed(b"T1 4 4 6 SINGLE_TAG")
        + _framed(b'T2 16 16 2 MULTI_TAG {"+message.type":"DELAY"}')
        + _framed(b"[]")
    )
    got = RegisterBrokerBody.decode(zlib.compress(raw), compressed=True)
    assert got.data_version == DataVersion(1_650_000_000_000, 3)
    assert got.topic_configs == (
        TopicConfig("T1", 4, 4, 6),
        TopicConfig("T2", 16, 16, 2, topic_filter_type="MULTI_TAG", message_type="DELAY"),
    )
    assert got.filter_server_list == ()


def test_register_body_zlib_json_accepted() -> None:
    assert RegisterBrokerBody.decode(zlib.compress(BODY.encode()), compressed=True) == BODY


def test_register_body_empty_and_key_named_topic() -> None:
    assert RegisterBrokerBody.decode(b"") == RegisterBrokerBody()
    body = b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"K":{"readQueueNums":2,"writeQueueNums":2}}}}'
    got = RegisterBrokerBody.decode(body)
    assert got.topic_configs == (TopicConfig("K", 2, 2),)
    assert got.data_version == DataVersion()


@pytest.mark.parametrize(
    ("body", "compressed"),
    [
        (b"{", False),
        (b'{"topicConfigSerializeWrapper":[]}', False),
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":5}}}', False),
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":-4}}}}', False),
        (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":1e999}}}}', False),
        (b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":"many"}}}', False),
        (b'{"filterServerList":"a:1"}', False),
        (b"not zlib", True),
        (zlib.compress(_framed(b"{}")), True),  # stops before the topic count
        (zlib.compress(_framed(b"{}") + struct.pack(">i", 1_000_000)), True),
        (zlib.compress(_framed(b"{}") + struct.pack(">i", 1) + _framed(b"T 4 4")), True),
        (zlib.compress(_framed(b"{}") + struct.pack(">i", 1) + _framed(b"T x 4 6 SINGLE_TAG")), True),
        (zlib.compress(struct.pack(">i", -5)), True),
    ],
)
def test_register_body_rejects_malformed(body: bytes, compressed: bool) -> None:
    with pytest.raises(ProtocolError):
        RegisterBrokerBody.decode(body, compressed=compressed)


def test_register_body_inflate_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route, "MAX_INFLATED_SIZE", 1000)
    with pytest.raises(ProtocolError, match="beyond"):
        RegisterBrokerBody.decode(zlib.compress(b"\0" * 5000), compressed=True)


def test_body_crc32_is_a_non_negative_java_int() -> None:
    assert body_crc32(b"hello") == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert all(0 <= body_crc32(bytes([i]) * 7) < 2**31 for i in range(256))


def test_data_version_next() -> None:
    v = DataVersion(5, 1)
    assert v.next_version(9) == DataVersion(9, 2)
    assert DataVersion.from_json({"timestamp": 1, "counter": 2, "stateVersion": 3}) == DataVersion(1, 2, 3)
    assert DataVersion.from_json(DataVersion(1, 2).to_json()) == DataVersion(1, 2)


@given(st.binary(max_size=300), st.booleans())
def test_fuzz_register_body(data: bytes, compressed: bool) -> None:
    try:
        RegisterBrokerBody.decode(data, compressed=compressed)
    except ProtocolError:
        pass


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
_shapes = st.fixed_dictionaries(
    {},
    optional={
        "queueDatas": _json_values,
        "brokerDatas": st.lists(
            st.fixed_dictionaries({}, optional={"brokerName": _json_values, "brokerAddrs": _json_values})
        ),
        "orderTopicConf": _json_values,
        "filterServerTable": _json_values,
        "topicConfigSerializeWrapper": st.fixed_dictionaries(
            {},
            optional={
                "topicConfigTable": st.dictionaries(st.text(max_size=3), _json_values, max_size=2),
                "dataVersion": _json_values,
            },
        ),
        "filterServerList": _json_values,
    },
)


@given(_shapes)
def test_fuzz_json_shapes(shape: dict[str, object]) -> None:
    data = json.dumps(shape).encode()
    for decode in (TopicRouteData.decode, RegisterBrokerBody.decode, ClusterInfo.decode, TopicList.decode):
        try:
            decode(data)
        except ProtocolError:
            pass
