from __future__ import annotations

import asyncio
import json
import socket
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cometmq.broker.registration import NamesrvRegistrar, parse_namesrv_addrs
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import (
    ClusterInfo,
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicList,
    TopicRouteData,
    body_crc32,
)
from tests.kit import FakeClock, eventually

pytestmark = pytest.mark.timeout(30)


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
async def client() -> AsyncIterator[RemotingClient]:
    async with RemotingClient() as c:
        yield c


def register_request(
    name: str,
    addr: str,
    topics: list[str],
    *,
    cluster: str = "DefaultCluster",
    broker_id: int = 0,
    version: DataVersion = DataVersion(1, 1),
    compress: bool = False,
) -> RemotingCommand:
    body = RegisterBrokerBody(tuple(TopicConfig(t) for t in topics), version).encode(compress)
    return make_request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": addr.replace(":10911", ":10912"),
            "brokerId": broker_id,
            "compressed": "true" if compress else "false",
            "bodyCrc32": body_crc32(body),
        },
        body,
    )


async def route(client: RemotingClient, ns: str, topic: str) -> RemotingCommand:
    return await client.invoke(ns, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))


async def test_register_two_brokers_and_query(namesrv: NamesrvController, client: RemotingClient) -> None:
    ns = namesrv.addr
    reply = await client.invoke(ns, register_request("broker-a", "127.0.0.1:10911", ["T", "OnlyA"]))
    assert reply.code == ResponseCode.SUCCESS
    assert "masterAddr" not in reply.ext_fields  # a master has none; "" would mislead it
    reply = await client.invoke(ns, register_request("broker-b", "127.0.0.2:10911", ["T"], cluster="other"))
    assert reply.code == ResponseCode.SUCCESS
    replica = await client.invoke(ns, register_request("broker-a", "127.0.0.3:10911", ["T"], broker_id=1))
    assert replica.ext_fields == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}

    reply = await route(client, ns, "T")
    assert reply.code == ResponseCode.SUCCESS
    raw = json.loads(reply.body)
    assert "orderTopicConf" not in raw
    assert raw["queueDatas"] == [
        {"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
        {"brokerName": "broker-b", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": 0},
    ]
    assert raw["brokerDatas"][0] == {
        "cluster": "DefaultCluster",
        "brokerName": "broker-a",
        "brokerAddrs": {"0": "127.0.0.1:10911", "1": "127.0.0.3:10911"},
    }
    assert [bd.broker_name for bd in TopicRouteData.decode(reply.body).broker_datas] == ["broker-a", "broker-b"]

    only_a = TopicRouteData.decode((await route(client, ns, "OnlyA")).body)
    assert [bd.broker_name for bd in only_a.broker_datas] == ["broker-a"]

    missing = await route(client, ns, "Nope")
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    assert missing.remark and "Nope" in missing.remark

    info = ClusterInfo.decode((await client.invoke(ns, make_request(RequestCode.GET_BROKER_CLUSTER_INFO))).body)
    assert info.cluster_addr_table == {"DefaultCluster": ("broker-a",), "other": ("broker-b",)}
    assert info.broker_addr_table["broker-b"].broker_addrs == {0: "127.0.0.2:10911"}

    all_topics = await client.invoke(ns, make_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert json.loads(all_topics.body) == {"topicList": ["OnlyA", "T"]}
    by_cluster = await client.invoke(ns, make_request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "other"}))
    assert TopicList.decode(by_cluster.body).topics == ("T",)


async def test_unregister_and_delete_topic(namesrv: NamesrvController, client: RemotingClient) -> None:
    ns = namesrv.addr
    await client.invoke(ns, register_request("broker-a", "127.0.0.1:10911", ["T", "U"]))
    deleted = await client.invoke(ns, make_request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "U"}))
    assert deleted.code == ResponseCode.SUCCESS
    assert (await route(client, ns, "U")).code == ResponseCode.TOPIC_NOT_EXIST
    fields = {"brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster", "brokerId": 0}
    reply = await client.invoke(ns, make_request(RequestCode.UNREGISTER_BROKER, fields))
    assert reply.code == ResponseCode.SUCCESS
    assert (await route(client, ns, "T")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_compressed_registration(namesrv: NamesrvController, client: RemotingClient) -> None:
    reply = await client.invoke(namesrv.addr, register_request("broker-z", "127.0.0.9:10911", ["Z"], compress=True))
    assert reply.code == ResponseCode.SUCCESS
    assert (await route(client, namesrv.addr, "Z")).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    ("mutate", "remark"),
    [
        (lambda f, b: ({**f, "bodyCrc32": "0"}, b"{not json"), "bad body"),
        (lambda f, b: ({**f, "compressed": "true"}, b), "bad body"),
        (lambda f, b: ({**f, "bodyCrc32": "12345"}, b), "bodyCrc32"),
        (lambda f, b: ({k: v for k, v in f.items() if k != "brokerName"}, b), "brokerName"),
        (lambda f, b: ({**f, "brokerId": "zero"}, b), "brokerId"),
        (lambda f, b: ({**f, "brokerId": "-1"}, b), "brokerId"),
        (lambda f, b: ({**f, "brokerAddr": "no-port"}, b), "brokerAddr"),
        (lambda f, b: ({**f, "bodyCrc32": "0"}, zlib.compress(b"x")), "bad body"),
    ],
)
async def test_bad_register_request_answers_an_error_and_server_stays_up(
    namesrv: NamesrvController,
    client: RemotingClient,
    mutate: Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]],
    remark: str,
) -> None:
    good = register_request("broker-a", "127.0.0.1:10911", ["T"])
    fields, body = mutate(dict(good.ext_fields), good.body)
    reply = await client.invoke(namesrv.addr, make_request(RequestCode.REGISTER_BROKER, fields, body))
    assert reply.code == ResponseCode.INVALID_PARAMETER
    assert reply.remark and remark in reply.remark
    assert namesrv.route_info.live_brokers() == {}
    # Same connection, same server: still serving.
    assert (await client.invoke(namesrv.addr, good)).code == ResponseCode.SUCCESS
    assert (await route(client, namesrv.addr, "T")).code == ResponseCode.SUCCESS


@pytest.mark.parametrize(
    ("code", "fields"),
    [
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}),
        (RequestCode.GET_TOPICS_BY_CLUSTER, {}),
        (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": ""}),
        (RequestCode.UNREGISTER_BROKER, {"brokerName": "b", "brokerAddr": "h:1", "clusterName": "c", "brokerId": "x"}),
    ],
)
async def test_missing_headers(
    namesrv: NamesrvController, client: RemotingClient, code: RequestCode, fields: dict[str, str]
) -> None:
    reply = await client.invoke(namesrv.addr, make_request(code, fields))
    assert reply.code == ResponseCode.INVALID_PARAMETER
    assert reply.remark and code.name in reply.remark


async def test_broker_connection_close_removes_it(namesrv: NamesrvController, client: RemotingClient) -> None:
    async with RemotingClient() as broker:
        await broker.invoke(namesrv.addr, register_request("broker-a", "127.0.0.1:10911", ["T"]))
    await eventually(lambda: not namesrv.route_info.live_brokers(), 5.0, what="the broker dropped")
    assert (await route(client, namesrv.addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST


async def test_scan_expires_silent_broker_and_closes_its_connection(
    namesrv: NamesrvController, client: RemotingClient, clock: FakeClock
) -> None:
    async with RemotingClient() as broker:
        await broker.invoke(namesrv.addr, register_request("broker-a", "127.0.0.1:10911", ["T"]))
        conn = next(iter(broker.connections.values()))
        clock.advance(119_000)
        await asyncio.sleep(0.05)  # several scan periods pass: nothing expires early
        assert namesrv.route_info.live_brokers()
        clock.advance(2_000)
        # the scan loop notices, drops the broker, closes its connection
        await eventually(lambda: conn.closed, 5.0, what="the silent broker's connection closed")
    assert (await route(client, namesrv.addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST


# -- the broker side ----------------------------------------------------------------------------------------


def test_parse_namesrv_addrs() -> None:
    assert parse_namesrv_addrs("a:9876;b:9876") == ["a:9876", "b:9876"]
    assert parse_namesrv_addrs(" a:1 ; ;a:1;[::1]:9876; ") == ["a:1", "[::1]:9876"]
    assert parse_namesrv_addrs("") == []
    for bad in ("a:9876;b", "a:9876;b:x", "a:0", ":9876", "a:70000"):
        with pytest.raises(ValueError, match="nameserver address"):
            parse_namesrv_addrs(bad)


def dead_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def topic_names(ns: NamesrvController) -> list[str]:
    return ns.route_info.all_topics()


async def test_registrar_registers_with_every_namesrv(
    two_namesrvs: list[NamesrvController], client: RemotingClient
) -> None:
    topics = [TopicConfig("T1")]
    dead = dead_addr()
    addrs = parse_namesrv_addrs(";".join([two_namesrvs[0].addr, dead, two_namesrvs[1].addr]))
    async with RemotingClient(connect_timeout=1.0) as broker_client:
        registrar = NamesrvRegistrar(
            broker_client,
            addrs,
            "DefaultCluster",
            "broker-a",
            0,
            "127.0.0.1:10911",
            "127.0.0.1:10912",
            lambda: list(topics),
            interval_s=3600,
        )
        await registrar.start()  # one nameserver is down: logged, not fatal
        for ns in two_namesrvs:
            assert topic_names(ns) == ["T1"]
            route_reply = await route(client, ns.addr, "T1")
            assert TopicRouteData.decode(route_reply.body).broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
        assert set(registrar.results) == {two_namesrvs[0].addr, two_namesrvs[1].addr}

        version = registrar.data_version
        topics.append(TopicConfig("T2"))
        results = await registrar.register_now()
        assert isinstance(results[dead], Exception)
        assert registrar.data_version.counter == version.counter + 1
        for ns in two_namesrvs:
            assert topic_names(ns) == ["T1", "T2"]

        await registrar.register_now()
        assert registrar.data_version.counter == version.counter + 1  # unchanged topics: same version

        await registrar.stop()
        for ns in two_namesrvs:
            assert ns.route_info.live_brokers() == {}
            assert topic_names(ns) == []


async def test_registrar_heartbeats_periodically(namesrv: NamesrvController) -> None:
    calls = 0

    def topics() -> list[TopicConfig]:
        nonlocal calls
        calls += 1
        return [TopicConfig("T")]

    async with RemotingClient() as broker_client:
        registrar = NamesrvRegistrar(
            broker_client, [namesrv.addr], "c", "broker-r", 1, "127.0.0.1:10921", "", topics, interval_s=0.01
        )
        await registrar.start()
        await eventually(lambda: calls >= 3, 5.0, what="three registrations")
        assert registrar.master_addr is None  # a replica without a master yet
        await registrar.stop()
        stopped_at = calls
        await asyncio.sleep(0.05)
        assert calls == stopped_at


async def test_registrar_replica_learns_master(namesrv: NamesrvController) -> None:
    async with RemotingClient() as broker_client:
        master = NamesrvRegistrar(
            broker_client,
            [namesrv.addr],
            "c",
            "broker-a",
            0,
            "127.0.0.1:10911",
            "127.0.0.1:10912",
            lambda: [TopicConfig("T")],
        )
        replica = NamesrvRegistrar(
            broker_client, [namesrv.addr], "c", "broker-a", 1, "127.0.0.1:10921", "127.0.0.1:10922", list
        )
        await master.register_now()
        await replica.register_now()
        assert replica.master_addr == "127.0.0.1:10911"
        assert replica.results[namesrv.addr].ha_server_addr == "127.0.0.1:10912"


async def test_registrar_stop_cancels_a_round_in_flight(namesrv: NamesrvController) -> None:
    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # accepts requests, never answers, until the client hangs up
        finally:
            writer.close()
            await writer.wait_closed()
            done.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with RemotingClient() as broker_client:
            registrar = NamesrvRegistrar(
                broker_client,
                [silent_addr, namesrv.addr],
                "c",
                "broker-a",
                0,
                "127.0.0.1:10911",
                "",
                lambda: [TopicConfig("T")],
                timeout_s=20,
            )
            round_task = asyncio.create_task(registrar.register_now())
            await eventually(lambda: bool(namesrv.route_info.live_brokers()), 5.0,
                             what="the live nameserver to answer a registration")
            async with asyncio.timeout(2):  # not the 20 s the silent nameserver would hold it
                await registrar.stop()
            assert round_task.cancelled()
            assert await registrar.register_now() == {}
        await asyncio.wait_for(done.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_nameserver_whose_port_is_taken_leaves_nothing_running(tmp_path: Path) -> None:
    """Its ACL file's watch starts once the port is bound: a failed start leaves no task behind."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: adminKey1\n    secretKey: adminSecret1\n    admin: true\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ns = NamesrvController(NamesrvConfig(port=port, acl_enable=True, acl_file=str(acl)))
        with pytest.raises(OSError, match="address already in use"):
            await ns.start()
    assert [t for t in asyncio.all_tasks() if not t.done() and t is not asyncio.current_task()] == []
