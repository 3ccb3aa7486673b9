"""``cometmq admin`` mqadmin verbs, each run as a subprocess against one real ``cometmq serve``, checking the
output (``--json``) and the broker's resulting state; bad input exits 2 (1 for a broker or network error) with
one ``error: …`` line and changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from cometmq.client import ConsumeStatus, Message, MessageExt, MessageQueue
from cometmq.client.admin import Admin
from cometmq.client.sync import SyncProducer, SyncPushConsumer
from tests.interop.cometmq_server import CometServer, free_port
from tests.kit import wait_until

T = TypeVar("T")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    s = CometServer(tmp_path_factory.mktemp("admin-verbs"))
    s.start()
    try:
        yield s
    finally:
        s.close()


def cli(server: CometServer | None, *args: str, env_namesrv: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m cometmq.cli admin ARGS`` with ``-n`` (or ``$NAMESRV_ADDR`` when ``env_namesrv``)."""
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    argv = list(args)
    if server is not None:
        if env_namesrv:
            env["NAMESRV_ADDR"] = server.namesrv
        else:
            argv[1:1] = ["-n", server.namesrv]
    return subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", *argv], capture_output=True, text=True,
                          timeout=90, env=env)


def ok(server: CometServer, *args: str) -> Any:
    """Run a verb with ``--json``; exit code 0; the parsed output."""
    out = cli(server, *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def error(out: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """Exit ``code`` with one ``error: …`` line (typer's own usage errors: its usage box) naming ``words``."""
    assert out.returncode == code, (out.stdout, out.stderr)
    text = out.stderr
    if text.startswith("error:"):
        assert len(text.strip().splitlines()) == 1, text
    for w in words:
        assert w in text, text


def sdk(server: CometServer, call: Callable[[Admin], Awaitable[T]]) -> T:
    async def main() -> T:
        async with Admin(namesrv=server.namesrv) as admin:
            return await call(admin)

    return asyncio.run(main())


def send(server: CometServer, topic: str, n: int, *, tags: str | None = None, keys: str | None = None) -> None:
    with SyncProducer("verbs-pg", namesrv=server.namesrv) as p:
        for i in range(n):
            p.send(Message(topic, f"m{i}".encode(), tags=tags, keys=keys))


# -- topics -----------------------------------------------------------------------------------------------------
def test_update_topic_route_list_and_status(server: CometServer) -> None:
    made = ok(server, "updateTopic", "-c", "DefaultCluster", "-t", "VT", "-r", "8", "-w", "8", "-o", "true")
    assert made == {"topic": "VT", "brokers": ["broker-a"], "readQueueNums": 8, "writeQueueNums": 8, "perm": 6,
                    "order": True, "messageType": "NORMAL", "topicSysFlag": 0, "orderConf": "broker-a:8"}
    route = server.route("VT")  # the nameserver itself
    assert route is not None
    assert route["orderTopicConf"] == "broker-a:8"  # -o true -c: the cluster's order conf, in the KV namespace
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]] \
        == [("broker-a", 8, 8, 6)]
    assert sdk(server, lambda a: a.topic_configs("broker-a"))["VT"]["order"] is True

    shown = ok(server, "topicRoute", "-t", "VT")
    assert shown["queueDatas"][0]["readQueueNums"] == 8
    assert shown["brokerDatas"][0]["brokerAddrs"] == {"0": server.broker_addr}
    table = cli(server, "topicRoute", "-t", "VT", "-l")
    assert table.returncode == 0 and "broker-a" in table.stdout and server.broker_addr in table.stdout
    assert "VT" in ok(server, "topicList")
    assert "VT" in cli(server, "topicList").stdout.split()
    clusters = {r["topic"]: r["clusters"] for r in ok(server, "topicList", "-c")}
    assert clusters["VT"] == ["DefaultCluster"]

    send(server, "VT", 3)
    status = ok(server, "topicStatus", "-t", "VT")
    assert len(status) == 8 and {r["brokerName"] for r in status} == {"broker-a"}
    assert sum(r["maxOffset"] - r["minOffset"] for r in status) == 3
    assert max(r["lastUpdateTimestamp"] for r in status) > 0
    assert "#Max Offset" in cli(server, "topicStatus", "-t", "VT").stdout


def test_namesrv_addr_from_the_environment(server: CometServer) -> None:
    out = cli(server, "updateTopic", "-t", "VENV", "-r", "2", "-w", "2", env_namesrv=True)
    assert out.returncode == 0, out.stderr
    assert "VENV on broker-a" in out.stdout
    assert server.route("VENV") is not None
    # neither -n nor $NAMESRV_ADDR: 127.0.0.1:9876, which nothing here listens on
    error(cli(None, "topicList", "--timeout", "1"), 1, "127.0.0.1:9876")


def test_update_topic_perm_and_message_type(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VFIFO", "-r", "2", "-w", "2", "-p", "4", "-a", "+message.type=FIFO")
    route = server.route("VFIFO")
    assert route is not None and route["queueDatas"][0]["perm"] == 4
    cfg = sdk(server, lambda a: a.topic_configs(server.broker_addr))["VFIFO"]
    assert cfg["attributes"] == {"+message.type": "FIFO"}


def test_update_topic_bad_input_changes_nothing(server: CometServer) -> None:
    error(cli(server, "updateTopic", "-t", "VBAD", "-r", "0"), 2, "error:", "read_queues")
    error(cli(server, "updateTopic", "-t", "VBAD", "-o", "maybe"), 2, "true or false")
    error(cli(server, "updateTopic", "-t", "VBAD", "-a", "+foo=bar"), 2, "unsupported attribute")
    error(cli(server, "updateTopic", "-t", "VBAD", "-b", server.broker_addr, "-c", "DefaultCluster"), 2,
          "not both")
    error(cli(server, "updateTopic", "-t", "bad topic!"), 2, "not a valid topic name")
    error(cli(server, "updateTopic", "-t", "VBAD", "-c", "NoSuchCluster"), 1, "NoSuchCluster")
    error(cli(server, "updateTopic", "-r", "8"), 2, "--topic")  # -t is required
    assert server.route("VBAD") is None
    assert "VBAD" not in ok(server, "topicList")


def test_unreachable_nameserver_is_a_clear_error() -> None:
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", "topicList", "-n",
                          f"127.0.0.1:{free_port()}", "--timeout", "1"], capture_output=True, text=True, timeout=60)
    error(out, 1, "error:")


def test_delete_topic(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VDEL", "-r", "2", "-w", "2")
    assert ok(server, "deleteTopic", "-t", "VDEL") == {"topic": "VDEL", "brokers": ["broker-a"]}
    assert server.route("VDEL") is None
    assert "VDEL" not in sdk(server, lambda a: a.topic_configs("broker-a"))
    error(cli(server, "topicRoute", "-t", "VDEL"), 1, "VDEL", "does not exist")
    error(cli(server, "deleteTopic", "-t", "VDEL"), 1, "VDEL")


# -- subscription groups ----------------------------------------------------------------------------------------
def test_update_sub_group_orderly_and_delete(server: CometServer) -> None:
    made = ok(server, "updateSubGroup", "-c", "DefaultCluster", "-g", "VG_ORDER", "-o", "true", "-r", "3", "-q", "2",
              "-d", "false")
    assert made["brokers"] == ["broker-a"] and made["consumeMessageOrderly"] is True
    cfg = sdk(server, lambda a: a.subscription_groups("broker-a"))["VG_ORDER"]
    assert (cfg["consumeMessageOrderly"], cfg["retryMaxTimes"], cfg["retryQueueNums"],
            cfg["consumeBroadcastEnable"], cfg["consumeEnable"]) == (True, 3, 2, False, True)
    # updating sets the group's config as given (unset options take their defaults)
    ok(server, "updateSubGroup", "-b", server.broker_addr, "-g", "VG_ORDER", "-s", "false")
    cfg = sdk(server, lambda a: a.subscription_groups("broker-a"))["VG_ORDER"]
    assert (cfg["consumeMessageOrderly"], cfg["consumeEnable"], cfg["retryMaxTimes"]) == (False, False, 16)

    assert ok(server, "deleteSubGroup", "-g", "VG_ORDER") == {"groupName": "VG_ORDER", "brokers": ["broker-a"],
                                                             "removeOffset": False, "deletedTopics": []}
    assert "VG_ORDER" not in sdk(server, lambda a: a.subscription_groups("broker-a"))


def test_update_sub_group_bad_input_changes_nothing(server: CometServer) -> None:
    error(cli(server, "updateSubGroup", "-g", "VG_BAD", "-o", "yes please"), 2, "true or false")
    error(cli(server, "updateSubGroup", "-g", "VG_BAD", "-q", "-1"), 2)
    error(cli(server, "updateSubGroup", "-g", "bad group!"), 2, "not a valid group name")
    error(cli(server, "updateSubGroup", "-g", "VG_BAD", "-b", "no-such-broker"), 1, "no-such-broker")
    assert "VG_BAD" not in sdk(server, lambda a: a.subscription_groups("broker-a"))


# -- messages ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sent(server: CometServer) -> dict[str, Any]:
    ok(server, "updateTopic", "-t", "VMSG", "-r", "2", "-w", "2")
    first = ok(server, "sendMessage", "-t", "VMSG", "-p", "hello 1", "-k", "K1 KX", "-c", "TagA")
    second = ok(server, "sendMessage", "-t", "VMSG", "-p", "hello 2", "-k", "K2", "-c", "TagB", "-b", "broker-a",
                "-i", "1")
    return {"first": first, "second": second}


def test_send_message(server: CometServer, sent: dict[str, Any]) -> None:
    first, second = sent["first"], sent["second"]
    assert first["sendStatus"] == "SEND_OK" and first["brokerName"] == "broker-a"
    assert (second["brokerName"], second["queueId"], second["sendStatus"]) == ("broker-a", 1, "SEND_OK")
    stored = sdk(server, lambda a: a.view_message(first["offsetMsgId"]))
    assert (stored.body, stored.tags, stored.keys) == (b"hello 1", "TagA", ["K1", "KX"])
    table = cli(server, "sendMessage", "-t", "VMSG", "-p", "table")
    assert table.returncode == 0 and "SEND_OK" in table.stdout
    error(cli(server, "sendMessage", "-t", "VMSG", "-p", "x", "-i", "1"), 2, "go together")


def test_query_messages_by_id_key_unique_key_and_offset(server: CometServer, sent: dict[str, Any]) -> None:
    first = sent["first"]
    by_id = ok(server, "queryMsgById", "-i", first["offsetMsgId"])
    assert (by_id["body"], by_id["tags"], by_id["keys"], by_id["msgId"]) == ("hello 1", "TagA", ["K1", "KX"],
                                                                             first["msgId"])
    assert ok(server, "queryMsgById", "-t", "VMSG", "-i", first["msgId"])["offsetMsgId"] == first["offsetMsgId"]
    table = cli(server, "queryMsgById", "-i", first["offsetMsgId"])
    assert table.returncode == 0 and "hello 1" in table.stdout and "TagA" in table.stdout

    by_key = ok(server, "queryMsgByKey", "-t", "VMSG", "-k", "KX")
    assert [m["msgId"] for m in by_key] == [first["msgId"]]
    assert ok(server, "queryMsgByKey", "-t", "VMSG", "-k", "NOKEY") == []

    unique = ok(server, "queryMsgByUniqueKey", "-t", "VMSG", "-i", first["msgId"])
    assert unique["body"] == "hello 1"
    assert [m["body"] for m in ok(server, "queryMsgByUniqueKey", "-t", "VMSG", "-i", first["msgId"], "-a")] \
        == ["hello 1"]

    by_offset = ok(server, "queryMsgByOffset", "-t", "VMSG", "-b", "broker-a", "-i", str(first["queueId"]), "-o",
                   str(first["queueOffset"]))
    assert by_offset["msgId"] == first["msgId"]
    error(cli(server, "queryMsgByOffset", "-t", "VMSG", "-b", "broker-a", "-i", "0", "-o", "999"), 1,
          "no message at offset 999")
    error(cli(server, "queryMsgByUniqueKey", "-t", "VMSG", "-i", "0" * 32), 1, "QUERY_NOT_FOUND")
    error(cli(server, "queryMsgById", "-i", "not-an-id"), 2, "not an offset message id")


def test_print_and_consume_messages(server: CometServer, sent: dict[str, Any]) -> None:
    bodies = sorted(m["body"] for m in ok(server, "printMsg", "-t", "VMSG"))
    assert bodies[:2] == ["hello 1", "hello 2"]
    assert [m["body"] for m in ok(server, "printMsg", "-t", "VMSG", "-s", "TagB")] == ["hello 2"]
    assert "body" not in ok(server, "printMsg", "-t", "VMSG", "-s", "TagA", "-d", "false")[0]
    assert ok(server, "printMsg", "-t", "VMSG", "-b", str(int(time.time() * 1000) + 60_000)) == []
    out = cli(server, "printMsg", "-t", "VMSG", "-s", "TagA")
    assert out.returncode == 0 and "hello 1" in out.stdout and "hello 2" not in out.stdout

    second = sent["second"]
    one = ok(server, "consumeMessage", "-t", "VMSG", "-b", "broker-a", "-i", "1", "-o", str(second["queueOffset"]),
             "-c", "1")
    assert [m["msgId"] for m in one] == [second["msgId"]]
    assert len(ok(server, "consumeMessage", "-t", "VMSG", "-c", "2")) == 2
    error(cli(server, "consumeMessage", "-t", "VMSG", "-o", "3"), 2, "-o needs")
    error(cli(server, "printMsg", "-t", "VMSG", "-b", "yesterday"), 2, "yyyy-MM-dd")


# -- consumer progress and offsets ------------------------------------------------------------------------------
def _lag(server: CometServer, group: str, topic: str) -> dict[int, int]:
    progress = ok(server, "consumerProgress", "-g", group, "-t", topic)
    return {r["queueId"]: r["diff"] for r in progress["offsets"]}


@pytest.fixture(scope="module")
def offsets_topic(server: CometServer) -> str:
    ok(server, "updateTopic", "-t", "VOFF", "-r", "2", "-w", "2")
    ok(server, "updateSubGroup", "-g", "VG_OFF")
    send(server, "VOFF", 6)

    async def commit_all(admin: Admin) -> None:
        for q in await admin.topic_queues("VOFF"):
            await admin.update_consumer_offset("VG_OFF", q, await admin.max_offset(q))

    sdk(server, commit_all)
    return "VOFF"


def test_consumer_progress(server: CometServer, offsets_topic: str) -> None:
    progress = ok(server, "consumerProgress", "-g", "VG_OFF")
    assert progress["diffTotal"] == 0
    assert sum(r["brokerOffset"] for r in progress["offsets"]) == 6
    table = cli(server, "consumerProgress", "-g", "VG_OFF")
    assert table.returncode == 0 and "Consume Diff Total: 0" in table.stdout
    groups = {r["group"]: r for r in ok(server, "consumerProgress")}
    assert groups["VG_OFF"]["diffTotal"] == 0
    error(cli(server, "consumerProgress", "-g", "VG_NEVER"), 1, "VG_NEVER", "no consume stats")


def test_reset_offset_by_time_offline_and_skip(server: CometServer, offsets_topic: str) -> None:
    reset = ok(server, "resetOffsetByTime", "-g", "VG_OFF", "-t", offsets_topic, "-s", "0")
    assert reset["online"] is False  # no consumer of VG_OFF is online: the committed offsets are written
    assert sorted(r["offset"] for r in reset["offsets"]) == [0, 0]
    assert sum(_lag(server, "VG_OFF", offsets_topic).values()) == 6

    skipped = ok(server, "skipAccumulatedMessage", "-g", "VG_OFF", "-t", offsets_topic)
    assert skipped["timestamp"] == -1 and sum(r["offset"] for r in skipped["offsets"]) == 6
    assert sum(_lag(server, "VG_OFF", offsets_topic).values()) == 0

    one = ok(server, "resetOffsetByTime", "-g", "VG_OFF", "-t", offsets_topic, "-s", "now", "-b", "broker-a",
             "-q", "0", "-o", "1")
    assert one["offsets"] == [{"brokerName": "broker-a", "queueId": 0, "offset": 1}]
    q0 = MessageQueue(offsets_topic, "broker-a", 0)
    assert sdk(server, lambda a: a.committed_offset("VG_OFF", q0)) == 1

    before = _lag(server, "VG_OFF", offsets_topic)
    error(cli(server, "resetOffsetByTime", "-g", "VG_OFF", "-t", offsets_topic, "-s", "someday"), 2, "-s")
    error(cli(server, "resetOffsetByTime", "-g", "VG_OFF", "-t", offsets_topic, "-s", "0", "-q", "1"), 2,
          "go together")
    error(cli(server, "resetOffsetByTime", "-g", "VG_OFF", "-t", "VNOPE", "-s", "0"), 1, "VNOPE")
    assert _lag(server, "VG_OFF", offsets_topic) == before


# -- online consumers: connections and a reset they are told of -------------------------------------------------
def test_consumer_connection_and_online_reset(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VON", "-r", "2", "-w", "2")
    error(cli(server, "consumerConnection", "-g", "VG_ON"), 1, "CONSUMER_NOT_ONLINE")
    send(server, "VON", 4)
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = SyncPushConsumer("VG_ON", namesrv=server.namesrv, listener=listener, consume_from="first",
                         auto_commit_interval=0.2)
    c.subscribe("VON", "*")
    with c:
        wait_until(lambda: len(got) >= 4, 20, "the four messages")
        conn = ok(server, "consumerConnection", "-g", "VG_ON")
        assert [x["clientId"] for x in conn["connectionSet"]] == [c.aio.instance.client_id]
        assert conn["subscriptionTable"] == {"VON": "*", "%RETRY%VG_ON": "*"}
        assert conn["messageModel"] == "CLUSTERING"
        assert conn["consumeType"] == "CONSUME_PASSIVELY"
        table = cli(server, "consumerConnection", "-g", "VG_ON")
        assert table.returncode == 0 and c.aio.instance.client_id in table.stdout

        wait_until(lambda: sum(_lag(server, "VG_ON", "VON").values()) == 0, 20, "the offsets committed")
        reset = ok(server, "resetOffsetByTime", "-g", "VG_ON", "-t", "VON", "-s", "0")
        assert reset["online"] is True  # the broker reset the group and told its consumer
        assert sorted(r["offset"] for r in reset["offsets"]) == [0, 0]
        # the consumer takes the reset: it reads the four messages again, and commits past them
        wait_until(lambda: len(got) >= 8, 20, "the four messages again")
        assert sorted(got) == sorted([f"m{i}".encode() for i in range(4)] * 2)
        wait_until(lambda: sum(_lag(server, "VG_ON", "VON").values()) == 0, 20, "the offsets committed again")


async def test_producer_connection(server: CometServer) -> None:
    from cometmq.client import Producer

    ok(server, "updateTopic", "-t", "VPROD", "-r", "1", "-w", "1")
    async with Producer("VPG_ONLINE", namesrv=server.namesrv) as p:
        await p.send(Message("VPROD", b"x"))
        await p.instance.heartbeat()  # the broker hears of the group now, not at the next 30 s heartbeat
        conns = await asyncio.to_thread(ok, server, "producerConnection", "-g", "VPG_ONLINE", "-t", "VPROD")
        assert [x["clientId"] for x in conns] == [p.instance.client_id]
        assert conns[0]["clientAddr"].startswith("127.0.0.1:")
        table = await asyncio.to_thread(cli, server, "producerConnection", "-g", "VPG_ONLINE", "-t", "VPROD")
        assert table.returncode == 0 and p.instance.client_id in table.stdout
    error(cli(server, "producerConnection", "-g", "VPG_NEVER", "-t", "VPROD"), 1, "VPG_NEVER")


# -- clusters and brokers ---------------------------------------------------------------------------------------
def test_cluster_list_and_broker_status(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VCLUSTER", "-r", "1", "-w", "1")
    send(server, "VCLUSTER", 1)  # the commit log holds something whichever tests ran before
    [row] = ok(server, "clusterList")
    assert (row["cluster"], row["brokerName"], row["brokerId"], row["addr"]) == ("DefaultCluster", "broker-a", 0,
                                                                                 server.broker_addr)
    assert row["runtime"]["brokerVersionDesc"].startswith("cometmq")
    table = cli(server, "clusterList")
    assert table.returncode == 0 and "DefaultCluster" in table.stdout and server.broker_addr in table.stdout
    error(cli(server, "clusterList", "-c", "NoSuchCluster"), 1, "NoSuchCluster")

    status = ok(server, "brokerStatus", "-b", server.broker_addr)
    assert list(status) == [server.broker_addr]
    assert int(status[server.broker_addr]["commitLogMaxOffset"]) > 0
    assert ok(server, "brokerStatus", "-c", "DefaultCluster") .keys() == status.keys()
    error(cli(server, "brokerStatus", "-b", f"127.0.0.1:{free_port()}", "--timeout", "1"), 1, "error:")


def test_get_and_update_broker_config(server: CometServer) -> None:
    config = ok(server, "getBrokerConfig", "-b", "broker-a")[server.broker_addr]
    assert config["brokerName"] == "broker-a" and config["brokerClusterName"] == "DefaultCluster"
    key = "channelExpiredTimeout"  # one of the keys a running cometmq broker lets change
    done = ok(server, "updateBrokerConfig", "-b", server.broker_addr, "-k", key, "-v", "123456")
    assert done == {"key": key, "value": "123456", "brokers": [server.broker_addr]}
    assert ok(server, "getBrokerConfig", "-c", "DefaultCluster")[server.broker_addr][key] == "123456"
    # a key that cannot change at runtime: refused, nothing changed
    error(cli(server, "updateBrokerConfig", "-b", server.broker_addr, "-k", "brokerName", "-v", "x"), 1,
          "NO_PERMISSION")
    assert ok(server, "getBrokerConfig", "-b", server.broker_addr)[server.broker_addr]["brokerName"] == "broker-a"
    error(cli(server, "updateBrokerConfig", "-k", "a"), 2, "--value")


def test_stats_all(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VSTAT", "-r", "1", "-w", "1")
    send(server, "VSTAT", 5)
    q = MessageQueue("VSTAT", "broker-a", 0)
    sdk(server, lambda a: a.update_consumer_offset("VG_STAT", q, 2))
    ok(server, "consumeMessage", "-t", "VSTAT", "-g", "VG_STAT", "-c", "4")  # 4 messages pulled as VG_STAT
    rows = ok(server, "statsAll", "-t", "VSTAT")
    assert len(rows) == 1 and rows[0]["inTps"] > 0 and rows[0]["outTps"] > 0, rows
    assert rows[0] | {"inTps": 0, "outTps": 0} == {
        "topic": "VSTAT", "consumerGroup": "VG_STAT", "accumulation": 3, "messages": 5, "inMsg24Hour": 5,
        "outMsg24Hour": 4, "inTps": 0, "outTps": 0}
    assert all(r["messages"] > 0 for r in ok(server, "statsAll", "-a"))
    table = cli(server, "statsAll", "-t", "VSTAT")
    assert table.returncode == 0 and "VG_STAT" in table.stdout


def test_wipe_and_add_write_perm(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "VPERM", "-r", "1", "-w", "1")
    out = cli(server, "wipeWritePerm", "-b", "broker-a", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[server.namesrv] >= 1
    route = server.route("VPERM")
    assert route is not None and route["queueDatas"][0]["perm"] == 4  # read only
    assert ok(server, "addWritePerm", "-b", "broker-a")[server.namesrv] >= 1
    route = server.route("VPERM")
    assert route is not None and route["queueDatas"][0]["perm"] == 6


def test_usage_errors(server: CometServer) -> None:
    error(cli(server, "noSuchVerb"), 2, "noSuchVerb")
    error(cli(server, "queryMsgByOffset", "-t", "VMSG", "-b", "broker-a", "-i", "x", "-o", "0"), 2, "-i")
    error(cli(server, "wipeWritePerm"), 2, "--brokerName")
    out = cli(None, "--help")
    assert out.returncode == 0
    for verb in ("updateTopic", "deleteTopic", "topicList", "topicRoute", "topicStatus", "updateSubGroup",
                 "deleteSubGroup", "consumerProgress", "consumerConnection", "producerConnection", "queryMsgById",
                 "queryMsgByKey", "queryMsgByOffset", "queryMsgByUniqueKey", "printMsg", "resetOffsetByTime",
                 "skipAccumulatedMessage", "clusterList", "brokerStatus", "getBrokerConfig", "updateBrokerConfig",
                 "sendMessage", "consumeMessage", "statsAll", "wipeWritePerm", "addWritePerm", "timer-status"):
        assert verb in out.stdout, verb

