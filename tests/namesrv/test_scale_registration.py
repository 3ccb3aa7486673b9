"""[18] registration whose cost follows what changed: incremental topic registration, the data-version query
before a periodic re-registration, compressed and split full registrations, and the nameserver's side of each
(golden bytes in RocketMQ's formats: BrokerOuterAPI, RegisterBrokerBody, DefaultRequestProcessor)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker import topics as topics_module
from cometmq.broker.registration import NamesrvRegistrar
from cometmq.broker.topics import TopicConfigManager
from cometmq.namesrv import processors as processors_module
from cometmq.namesrv.route_info import RouteInfoManager
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import (
    PERM_READ,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicRouteData,
    body_crc32,
)
from tests.kit import FakeClock

pytestmark = pytest.mark.timeout(30)

BROKER = "127.0.0.1:10911"


class RecordingClient(RemotingClient):
    """A RemotingClient that keeps every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[RemotingCommand] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        self.sent.append(cmd)
        return await super().invoke(addr, cmd, timeout)

    def codes(self) -> list[int]:
        return [cmd.code for cmd in self.sent]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0)


@pytest.fixture
async def namesrv(clock: FakeClock) -> AsyncIterator[NamesrvController]:
    ctl = NamesrvController(NamesrvConfig(port=0, scan_interval_s=0.01), clock=clock.seconds)
    await ctl.start()
    yield ctl
    await ctl.stop()


@pytest.fixture
async def client() -> AsyncIterator[RecordingClient]:
    async with RecordingClient() as c:
        yield c


def make_registrar(client: RemotingClient, ns: NamesrvController, table: dict[str, TopicConfig],
                   **kw: Any) -> NamesrvRegistrar:
    return NamesrvRegistrar(client, [ns.addr], "c", "broker-a", 0, BROKER, "127.0.0.1:10912",
                            lambda: list(table.values()), interval_s=3600, **kw)


def table_of(*names: str, queues: int = 8) -> dict[str, TopicConfig]:
    return {n: TopicConfig(n, queues, queues) for n in names}


def java_inflate(body: bytes) -> dict[str, Any]:
    """RocketMQ's RegisterBrokerBody.decode(data, compressed=true) for a 5.x broker, step by step."""
    raw = zlib.decompress(body)
    pos = 0

    def read_int() -> int:
        nonlocal pos
        (value,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        return int(value)

    def read_bytes() -> bytes:
        nonlocal pos
        n = read_int()
        chunk = raw[pos:pos + n]
        pos += n
        return chunk

    version = json.loads(read_bytes())
    topics = [read_bytes().decode() for _ in range(read_int())]
    filters = json.loads(read_bytes())
    mappings = read_int()
    assert pos == len(raw)
    return {"dataVersion": version, "topics": topics, "filterServerList": filters, "mappings": mappings}


# -- the broker's registrar -------------------------------------------------------------------------------------


async def test_created_topic_is_registered_alone(namesrv: NamesrvController, client: RecordingClient) -> None:
    table = table_of("T1", "T2", "T3")
    registrar = make_registrar(client, namesrv, table)
    await registrar.start()
    assert registrar.frames["full"] == 1
    assert namesrv.route_info.all_topics() == ["T1", "T2", "T3"]
    client.sent.clear()

    table["New"] = TopicConfig("New", 8, 8)
    version = registrar.data_version
    await registrar.topics_changed([table["New"]])
    assert registrar.frames["full"] == 1 and registrar.frames["increment"] == 1
    assert client.codes() == [RequestCode.REGISTER_BROKER]
    sent = RegisterBrokerBody.decode(client.sent[0].body)
    assert [tc.topic_name for tc in sent.topic_configs] == ["New"]  # only what changed
    assert sent.data_version == registrar.data_version != version
    route = namesrv.route_info.pick_route("New")
    assert route is not None and route.queue_datas == (QueueData("broker-a", 8, 8),)
    assert namesrv.route_info.all_topics() == ["New", "T1", "T2", "T3"]

    # The next round finds the nameserver at the broker's version: a query, no body.
    client.sent.clear()
    await registrar.register_now()
    assert client.codes() == [RequestCode.QUERY_DATA_VERSION]
    assert registrar.frames["full"] == 1
    await registrar.stop()


async def test_unchanged_round_sends_no_full_body(namesrv: NamesrvController, client: RecordingClient,
                                                  clock: FakeClock) -> None:
    registrar = make_registrar(client, namesrv, table_of(*(f"T{i}" for i in range(100))))
    await registrar.start()
    client.sent.clear()
    for _ in range(3):
        clock.advance(60_000)
        await registrar.register_now()
    assert client.codes() == [RequestCode.QUERY_DATA_VERSION] * 3
    assert registrar.frames["full"] == 1
    # The query keeps the broker alive: 180 s after its only registration it is not expired.
    assert namesrv.route_info.scan_inactive() == []
    assert BROKER in namesrv.route_info.live_brokers()
    await registrar.stop()


async def test_changed_table_between_rounds_registers_in_full(namesrv: NamesrvController,
                                                              client: RecordingClient) -> None:
    table = table_of("T1")
    registrar = make_registrar(client, namesrv, table)
    await registrar.start()
    table["T2"] = TopicConfig("T2")  # not told: found at the round
    client.sent.clear()
    await registrar.register_now()
    assert client.codes() == [RequestCode.REGISTER_BROKER]
    assert namesrv.route_info.all_topics() == ["T1", "T2"]
    await registrar.stop()


async def test_new_connection_gets_the_full_table_first(namesrv: NamesrvController, client: RecordingClient) -> None:
    # A nameserver that restarted (or dropped us) must not hold a partial table under the current version.
    table = table_of("T1", "T2")
    registrar = make_registrar(client, namesrv, table)
    await registrar.start()
    client.close_connection(namesrv.addr)
    namesrv.route_info.unregister_broker("c", "broker-a", BROKER, 0)
    assert namesrv.route_info.all_topics() == []
    table["T3"] = TopicConfig("T3")
    await registrar.topics_changed([table["T3"]])
    assert registrar.frames["increment"] == 0 and registrar.frames["full"] == 2
    assert namesrv.route_info.all_topics() == ["T1", "T2", "T3"]
    await registrar.stop()


async def test_deletion_sends_nothing_then_the_next_round_is_full(namesrv: NamesrvController,
                                                                  client: RecordingClient) -> None:
    table = table_of("T1", "T2")
    registrar = make_registrar(client, namesrv, table)
    await registrar.start()
    client.sent.clear()
    del table["T2"]
    await registrar.topics_changed(deleted=["T2"])
    assert client.sent == []
    await registrar.register_now()
    assert client.codes() == [RequestCode.REGISTER_BROKER]  # forced: no query first
    assert [tc.topic_name for tc in RegisterBrokerBody.decode(client.sent[0].body, True).topic_configs] == ["T1"]
    await registrar.stop()


async def test_full_registration_is_compressed_in_javas_layout(namesrv: NamesrvController,
                                                               client: RecordingClient) -> None:
    table = table_of("A", "B")
    table["F"] = TopicConfig("F", 2, 2, message_type="FIFO")
    table["Unit"] = TopicConfig("Unit", 1, 1, topic_sys_flag=1)  # the compact layout has no sysflag: JSON
    registrar = make_registrar(client, namesrv, table)
    await registrar.start()
    packed, plain = client.sent
    assert packed.ext_fields["compressed"] == "true" and plain.ext_fields["compressed"] == "false"
    assert int(packed.ext_fields["bodyCrc32"]) == body_crc32(packed.body)
    assert {k: packed.ext_fields[k] for k in ("brokerAddr", "brokerId", "brokerName", "clusterName")} == {
        "brokerAddr": BROKER, "brokerId": "0", "brokerName": "broker-a", "clusterName": "c"}
    java = java_inflate(packed.body)
    assert java["topics"] == ["A 8 8 6 SINGLE_TAG {}", "B 8 8 6 SINGLE_TAG {}",
                              'F 2 2 6 SINGLE_TAG {"+message.type":"FIFO"}']
    assert java["filterServerList"] == [] and java["mappings"] == 0
    assert DataVersion.from_json(java["dataVersion"]) == registrar.data_version
    assert [tc.topic_name for tc in RegisterBrokerBody.decode(plain.body).topic_configs] == ["Unit"]
    route = namesrv.route_info.pick_route("Unit")
    assert route is not None and route.queue_datas[0].topic_sys_flag == 1
    assert namesrv.route_info.all_topics() == ["A", "B", "F", "Unit"]
    await registrar.stop()


async def test_split_registration(namesrv: NamesrvController, client: RecordingClient) -> None:
    table = table_of(*(f"T{i:02d}" for i in range(7)))
    registrar = make_registrar(client, namesrv, table, split_registration=True, split_size=3)
    await registrar.start()
    assert registrar.frames["full"] == 3  # 3 + 3 + 1, one data version
    versions = {RegisterBrokerBody.decode(c.body, True).data_version for c in client.sent}
    assert versions == {registrar.data_version}
    assert namesrv.route_info.all_topics() == sorted(table)
    await registrar.stop()


async def test_split_when_a_body_outgrows_a_frame(namesrv: NamesrvController, client: RecordingClient) -> None:
    table = {f"Topic{i:04d}-{'x' * 60}": TopicConfig(f"Topic{i:04d}-{'x' * 60}") for i in range(200)}
    registrar = make_registrar(client, namesrv, table, compressed=False, max_body_bytes=8_000)
    await registrar.start()
    assert registrar.frames["full"] > 1
    assert all(len(c.body) <= 8_000 for c in client.sent)
    assert namesrv.route_info.all_topics() == sorted(table)
    await registrar.stop()


async def test_single_topic_register(namesrv: NamesrvController, client: RecordingClient) -> None:
    table = table_of("T1")
    registrar = make_registrar(client, namesrv, table, single_topic_register=True)
    await registrar.start()
    client.sent.clear()
    table["T2"] = TopicConfig("T2", 2, 3, topic_sys_flag=2)
    await registrar.topics_changed([table["T2"]])
    (cmd,) = client.sent
    assert cmd.code == RequestCode.REGISTER_TOPIC_IN_NAMESRV and cmd.ext_fields["topic"] == "T2"
    # RocketMQ's registerSingleTopicAll body: a TopicRouteData with this broker's QueueData
    assert json.loads(cmd.body)["queueDatas"] == [
        {"brokerName": "broker-a", "readQueueNums": 2, "writeQueueNums": 3, "perm": 6, "topicSysFlag": 2}]
    route = namesrv.route_info.pick_route("T2")
    assert route is not None and route.queue_datas == (QueueData("broker-a", 2, 3, 6, 2),)
    await registrar.stop()


async def test_read_only_broker_registers_read_only_queues(namesrv: NamesrvController,
                                                           client: RecordingClient) -> None:
    table = table_of("T1")
    registrar = make_registrar(client, namesrv, table, broker_perm=PERM_READ)
    await registrar.start()
    table["T2"] = TopicConfig("T2")
    await registrar.topics_changed([table["T2"]])
    for topic in ("T1", "T2"):
        route = namesrv.route_info.pick_route(topic)
        assert route is not None and route.queue_datas[0].perm == PERM_READ
    await registrar.stop()


async def test_replica_always_registers_to_learn_its_master(namesrv: NamesrvController,
                                                            client: RecordingClient) -> None:
    master = make_registrar(client, namesrv, table_of("T"))
    await master.start()
    replica = NamesrvRegistrar(client, [namesrv.addr], "c", "broker-a", 1, "127.0.0.1:10921", "127.0.0.1:10922",
                               lambda: [TopicConfig("T")], interval_s=3600)
    await replica.start()
    client.sent.clear()
    await replica.register_now()
    assert client.codes() == [RequestCode.REGISTER_BROKER]
    assert replica.master_addr == BROKER
    await replica.stop()
    await master.stop()


async def test_role_change_registers_in_full_under_the_new_state_version(namesrv: NamesrvController,
                                                                         client: RecordingClient) -> None:
    registrar = make_registrar(client, namesrv, table_of("T"))
    await registrar.start()
    client.sent.clear()
    await registrar.set_identity(0, 5)
    assert client.codes() == [RequestCode.REGISTER_BROKER]
    assert namesrv.route_info.live_brokers()[BROKER].data_version.state_version == 5
    await registrar.stop()


async def test_role_change_keeps_the_group_s_queues_routed(namesrv: NamesrvController, client: RecordingClient) -> None:
    """A role change registers under the new id without unregistering the old one first (as RocketMQ's
    ReplicasManager): the unregister dropped the whole group, queues included, when this address was its last
    member, and a replica's registration does not bring queues back."""
    master = make_registrar(client, namesrv, table_of("T"))
    await master.start()
    client.sent.clear()
    await master.set_identity(1, 5)  # demoted; the new master has not registered yet
    route = namesrv.route_info.pick_route("T")
    assert route is not None and [bd.broker_addrs for bd in route.broker_datas] == [{1: BROKER}]
    assert RequestCode.UNREGISTER_BROKER not in client.codes()
    await master.set_identity(0, 6)  # promoted again, the group's last member all along
    assert RequestCode.UNREGISTER_BROKER not in client.codes()
    route = namesrv.route_info.pick_route("T")
    assert route is not None and [bd.broker_addrs for bd in route.broker_datas] == [{0: BROKER}]
    await master.stop()


# -- the nameserver ------------------------------------------------------------------------------------------------


def register_cmd(body: bytes, *, compressed: bool, name: str = "broker-j", addr: str = "10.0.0.9:10911",
                 crc: bool = True) -> RemotingCommand:
    return make_request(RequestCode.REGISTER_BROKER, {
        "brokerName": name, "brokerAddr": addr, "clusterName": "c", "haServerAddr": "", "brokerId": 0,
        "compressed": "true" if compressed else "false", "bodyCrc32": body_crc32(body) if crc else 0}, body)


def java5_body(topics: list[str], counter: int = 1) -> bytes:
    """What a RocketMQ 5.x broker with compressedRegister writes (fastjson DataVersion, mapping count)."""
    raw = b""
    version = json.dumps({"counter": counter, "stateVersion": 0, "timestamp": 1700000000000},
                         separators=(",", ":")).encode()
    raw += struct.pack(">i", len(version)) + version + struct.pack(">i", len(topics))
    for line in topics:
        raw += struct.pack(">i", len(line)) + line.encode()
    return zlib.compress(raw + struct.pack(">i", 2) + b"[]" + struct.pack(">i", 0), 9)


@pytest.mark.parametrize("header_says_compressed", [True, False])
async def test_java5_compressed_registration(namesrv: NamesrvController, client: RecordingClient,
                                            header_says_compressed: bool) -> None:
    # 5.x brokers send the deflated body under compressed=false (BrokerOuterAPI since RIP-32): both work.
    body = java5_body(["J1 8 8 6 SINGLE_TAG {}", 'J2 4 4 6 SINGLE_TAG {"+message.type":"FIFO"}'])
    reply = await client.invoke(namesrv.addr, register_cmd(body, compressed=header_says_compressed))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    route = namesrv.route_info.pick_route("J2")
    assert route is not None and route.queue_datas == (QueueData("broker-j", 4, 4),)
    assert namesrv.route_info.live_brokers()["10.0.0.9:10911"].data_version == DataVersion(1700000000000, 1)


@pytest.mark.parametrize(("body", "remark"), [
    (b"x\x9c not deflate at all", "does not inflate"),
    (java5_body(["J1 8 8 6 SINGLE_TAG {}"])[:-6], "truncated"),
    (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 5000) + b"J1 8"),
     "overruns"),  # a lying length
    (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 99_999)), "does not fit"),
])
async def test_corrupt_compressed_body_is_refused(namesrv: NamesrvController, client: RecordingClient,
                                                  body: bytes, remark: str) -> None:
    reply = await client.invoke(namesrv.addr, register_cmd(body, compressed=True))
    assert reply.code == ResponseCode.INVALID_PARAMETER
    assert reply.remark is not None and "REGISTER_BROKER: bad body" in reply.remark and remark in reply.remark
    assert namesrv.route_info.live_brokers() == {} and namesrv.route_info.all_topics() == []


async def test_query_data_version(namesrv: NamesrvController, client: RecordingClient, clock: FakeClock) -> None:
    def query(version: bytes) -> RemotingCommand:
        return make_request(RequestCode.QUERY_DATA_VERSION, {
            "brokerAddr": "10.0.0.9:10911", "brokerName": "broker-j", "clusterName": "c", "brokerId": 0}, version)

    java_version = b'{"counter":1,"stateVersion":0,"timestamp":1700000000000}'  # Java's DataVersion.encode()
    reply = await client.invoke(namesrv.addr, query(java_version))
    assert reply.code == ResponseCode.SUCCESS and reply.ext_fields["changed"] == "true" and reply.body == b""
    await client.invoke(namesrv.addr, register_cmd(java5_body(["J1 8 8 6 SINGLE_TAG {}"]), compressed=True))
    clock.advance(100_000)
    reply = await client.invoke(namesrv.addr, query(java_version))
    assert reply.ext_fields["changed"] == "false"
    assert DataVersion.decode(reply.body) == DataVersion(1700000000000, 1)
    clock.advance(100_000)  # 200 s after the registration, 100 s after the query: alive
    assert namesrv.route_info.scan_inactive() == []
    reply = await client.invoke(namesrv.addr, query(b'{"counter":2,"timestamp":1700000000000}'))
    assert reply.ext_fields["changed"] == "true"
    reply = await client.invoke(namesrv.addr, query(b"nope"))
    assert reply.code == ResponseCode.INVALID_PARAMETER and "QUERY_DATA_VERSION: bad body" in (reply.remark or "")


async def test_same_body_again_is_not_decoded(namesrv: NamesrvController, client: RecordingClient,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = 0
    real = processors_module.RegisterBrokerBody.decode

    def counting(data: bytes, compressed: bool = False) -> RegisterBrokerBody:
        nonlocal decoded
        decoded += 1
        return real(data, compressed)

    monkeypatch.setattr(processors_module.RegisterBrokerBody, "decode", counting)
    body = java5_body([f"J{i} 8 8 6 SINGLE_TAG {{}}" for i in range(50)])
    for _ in range(3):  # a Java broker's forceRegister=true rounds
        reply = await client.invoke(namesrv.addr, register_cmd(body, compressed=True))
        assert reply.code == ResponseCode.SUCCESS
    assert decoded == 1
    namesrv.route_info.delete_topic("J3")  # deleted here for good: the same table again does not bring it back
    await client.invoke(namesrv.addr, register_cmd(body, compressed=True))
    assert "J3" not in namesrv.route_info.all_topics() and len(namesrv.route_info.all_topics()) == 49
    # a new version is read
    await client.invoke(namesrv.addr, register_cmd(java5_body(["J1 2 2 6 SINGLE_TAG {}"], counter=2),
                                                   compressed=True))
    assert decoded == 2
    route = namesrv.route_info.pick_route("J1")
    assert route is not None and route.queue_datas[0].write_queue_nums == 2


def test_split_batches_of_one_version_are_all_read() -> None:
    # RocketMQ #10425: later bodies of a split registration carry the same version; their topics count.
    rim = RouteInfoManager(FakeClock(0).seconds)
    v = DataVersion(1, 1)
    rim.register_broker("c", "b", BROKER, 0, "", [TopicConfig("A"), TopicConfig("B")], v)
    rim.register_broker("c", "b", BROKER, 0, "", [TopicConfig("C", 2, 2)], v)
    assert rim.all_topics() == ["A", "B", "C"]
    rim.register_broker("c", "b", BROKER, 0, "", [TopicConfig("C", 9, 9)], v)  # seen under v: not re-read
    route = rim.pick_route("C")
    assert route is not None and route.queue_datas[0].write_queue_nums == 2


def test_register_topic_needs_a_registered_broker() -> None:
    rim = RouteInfoManager(FakeClock(0).seconds)
    assert not rim.register_topic("T", [QueueData("nobody", 4, 4)])
    rim.register_broker("c", "b", BROKER, 0, "", [], DataVersion(1, 1))
    assert rim.register_topic("T", [QueueData("b", 4, 4)])
    assert rim.pick_route("T") == TopicRouteData((QueueData("b", 4, 4),), rim.pick_route("T").broker_datas)  # type: ignore[union-attr]


# -- the broker's topic table on disk ---------------------------------------------------------------------------------


def test_topic_journal_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics_module, "JOURNAL_MIN_LINES", 4)
    path = tmp_path / "topics.json"
    mgr = TopicConfigManager(path)
    mgr.load()
    mgr.persist()
    for i in range(3):
        mgr.put(TopicConfig(f"T{i}", 8, 8))
    mgr.delete("T1")
    assert mgr.journal_path.exists()
    assert "T0" not in json.loads(path.read_bytes())["topicConfigTable"]  # in the journal only
    again = TopicConfigManager(path)
    again.load()
    assert again.topics == mgr.topics and again.data_version == mgr.data_version
    # a torn last line (a crash while appending) is dropped
    with mgr.journal_path.open("ab") as f:
        f.write(b'{"v":99,"put":{"topicName":"Torn"')
    torn = TopicConfigManager(path)
    torn.load()
    assert "Torn" not in torn.topics and torn.topics == mgr.topics
    # the journal is folded into the table once it grows to half of it (here: JOURNAL_MIN_LINES)
    mgr.put(TopicConfig("T9"))
    assert not mgr.journal_path.exists()
    assert "T9" in json.loads(path.read_bytes())["topicConfigTable"]
