"""The mqadmin options of ``cometmq admin`` verbs beyond the basics (clusterList -m/-i, consumerProgress -s,
queryMsgById -g -d/-s/-u/-f, deleteSubGroup -r, updateTopic -u/-s and the order conf, updateSubGroup -p and
--attributes, sendMessage -m), each run as a subprocess against one real ``cometmq serve``; every effect is read
back through another path (the nameserver's route, the broker's configs and offsets, the SDK), and bad input exits
2 with one ``error: …`` line (or typer's usage box)."""

from __future__ import annotations

import inspect
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cometmq.client import ConsumeStatus, MessageExt, MessageQueue
from cometmq.client.admin import Admin
from cometmq.client.sync import SyncAdmin, SyncPushConsumer
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until
from tests.test_cli_admin_verbs import cli, error, ok, sdk, send


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    s = CometServer(tmp_path_factory.mktemp("admin-options"))
    s.start()
    try:
        yield s
    finally:
        s.close()


# -- clusterList -m / -i ----------------------------------------------------------------------------------------
def test_cluster_list_more_stats(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "OCL", "-r", "1", "-w", "1")
    send(server, "OCL", 3)
    [row] = ok(server, "clusterList", "-m")
    stats = row["stats"]
    assert set(stats) == {"inTps", "outTps", "inTotalYest", "outTotalYest", "inTotalToday", "outTotalToday"}
    # the figures are the broker's runtime table's, as mqadmin computes them: today = now - this morning
    rt = ok(server, "brokerStatus", "-b", server.broker_addr)[server.broker_addr]
    assert stats["inTotalToday"] == int(rt["msgPutTotalTodayNow"]) - int(rt["msgPutTotalTodayMorning"])
    assert stats["inTotalYest"] == int(rt["msgPutTotalTodayMorning"]) - int(rt["msgPutTotalYesterdayMorning"])
    assert stats["outTotalToday"] == int(rt["msgGetTotalTodayNow"]) - int(rt["msgGetTotalTodayMorning"])
    assert stats["inTotalToday"] >= 3
    assert isinstance(stats["inTps"], float) and stats["inTps"] > 0  # the 3 sends are within its 10 s window
    assert "stats" not in ok(server, "clusterList")[0]
    table = cli(server, "clusterList", "-m")
    assert table.returncode == 0 and "#InTotalToday" in table.stdout and "#OutTPS" in table.stdout
    assert "#InTotalToday" not in cli(server, "clusterList").stdout


def test_cluster_list_interval(server: CometServer) -> None:
    out = cli(server, "clusterList", "-i", "0.2", "--times", "3", "--json")
    assert out.returncode == 0, out.stderr
    rounds = [json.loads(line) for line in out.stdout.splitlines()]  # JSON Lines: one round each
    assert len(rounds) == 3 and all(r[0]["addr"] == server.broker_addr for r in rounds)
    table = cli(server, "clusterList", "-i", "0.1", "--times", "2")
    assert table.returncode == 0 and table.stdout.count("#Cluster Name") == 2
    error(cli(server, "clusterList", "--times", "2"), 2, "--times needs -i")
    error(cli(server, "clusterList", "-i", "0"), 2, "-i")

    # no --times: it runs until Ctrl-C, which ends it cleanly with exit code 0
    proc = subprocess.Popen([sys.executable, "-m", "cometmq.cli", "admin", "clusterList", "-n", server.namesrv,
                             "-i", "0.2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert json.loads(first)[0]["addr"] == server.broker_addr
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- consumerProgress -s, queryMsgById -g -d: a push consumer online ---------------------------------------------
def diff_total(server: CometServer, group: str) -> int | None:
    """consumerProgress's diffTotal; None while the group has committed no offset yet (the command fails)."""
    out = cli(server, "consumerProgress", "-g", group, "--json")
    return int(json.loads(out.stdout)["diffTotal"]) if out.returncode == 0 else None


def test_consumer_progress_client_ip_and_consume_directly(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "OON", "-r", "2", "-w", "2")
    send(server, "OON", 2)
    sent = ok(server, "sendMessage", "-t", "OON", "-p", "direct me", "-c", "TagD")
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = SyncPushConsumer("OG_ON", namesrv=server.namesrv, listener=listener, consume_from="first",
                         auto_commit_interval=0.2)
    c.subscribe("OON", "*")
    with c:
        wait_until(lambda: len(got) >= 3, 20, "the three messages")
        wait_until(lambda: diff_total(server, "OG_ON") == 0, 20, "offsets committed")
        client_id = c.aio.instance.client_id
        progress = ok(server, "consumerProgress", "-g", "OG_ON", "-s", "true")
        ips = {(r["topic"], r["queueId"]): r["clientIp"] for r in progress["offsets"]}
        assert ips[("OON", 0)] == ips[("OON", 1)] == client_id.split("@")[0] == "127.0.0.1"
        assert "clientIp" not in ok(server, "consumerProgress", "-g", "OG_ON", "-s", "false")["offsets"][0]
        table = cli(server, "consumerProgress", "-g", "OG_ON", "-s", "true")
        assert table.returncode == 0 and "#Client IP" in table.stdout and "127.0.0.1" in table.stdout

        # the consumer runs its listener on the message once more; nothing is committed
        before = len(got)
        result = ok(server, "queryMsgById", "-i", sent["offsetMsgId"], "-g", "OG_ON", "-d", client_id)
        assert result["consumeResult"] == "CR_SUCCESS" and result["order"] is False
        assert got[before:] == [b"direct me"]
        by_key = ok(server, "queryMsgById", "-t", "OON", "-i", sent["msgId"], "-g", "OG_ON", "-d", client_id)
        assert by_key["consumeResult"] == "CR_SUCCESS" and got[before:] == [b"direct me"] * 2
        assert ok(server, "consumerProgress", "-g", "OG_ON")["diffTotal"] == 0
        info = SyncAdmin(namesrv=server.namesrv)
        with info:
            running = info.consumer_running_info("OG_ON", client_id)
        assert running.push and set(running.queues) == {MessageQueue("OON", "broker-a", 0),
                                                        MessageQueue("OON", "broker-a", 1),
                                                        MessageQueue("%RETRY%OG_ON", "broker-a", 0)}
        assert running.subscriptions["OON"] == "*"
        error(cli(server, "queryMsgById", "-i", sent["offsetMsgId"], "-g", "OG_ON", "-d", "10.9.9.9@nobody"), 1,
              "10.9.9.9@nobody")
    error(cli(server, "queryMsgById", "-i", sent["offsetMsgId"], "-g", "OG_ON"), 2, "go together")
    # no consumer online: the queues show no client
    offline = ok(server, "consumerProgress", "-g", "OG_ON", "-s", "true")
    assert {r["clientIp"] for r in offline["offsets"]} == {None}
    error(cli(server, "consumerProgress", "-s", "true"), 2, "-s needs -g")


# -- queryMsgById -s / -u / -f -----------------------------------------------------------------------------------
def test_query_msg_by_id_resend_and_body_format(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "ORESEND", "-r", "1", "-w", "1")
    first = ok(server, "sendMessage", "-t", "ORESEND", "-p", "héllo", "-k", "RK", "-c", "TagR")
    again = ok(server, "queryMsgById", "-i", first["offsetMsgId"], "-s", "true", "-u", "unit-x")
    assert again["sendStatus"] == "SEND_OK" and again["originalMsgId"] == first["offsetMsgId"]
    assert again["offsetMsgId"] != first["offsetMsgId"]
    copy = sdk(server, lambda a: a.view_message(again["offsetMsgId"]))
    assert (copy.topic, copy.body, copy.tags, copy.keys) == ("ORESEND", "héllo".encode(), "TagR", ["RK"])
    assert len(ok(server, "queryMsgByKey", "-t", "ORESEND", "-k", "RK")) == 2
    # -s false: nothing is sent (mqadmin's way), nothing printed
    out = cli(server, "queryMsgById", "-i", first["offsetMsgId"], "-s", "false", "--json")
    assert out.returncode == 0 and out.stdout == ""
    assert len(ok(server, "queryMsgByKey", "-t", "ORESEND", "-k", "RK")) == 2

    latin = ok(server, "queryMsgById", "-i", first["offsetMsgId"], "-f", "latin-1")
    assert latin["body"] == "héllo".encode().decode("latin-1")
    assert ok(server, "queryMsgById", "-i", first["offsetMsgId"])["body"] == "héllo"
    error(cli(server, "queryMsgById", "-i", first["offsetMsgId"], "-f", "no-such-charset"), 2, "charset")
    error(cli(server, "queryMsgById", "-i", first["offsetMsgId"], "-s", "perhaps"), 2, "true or false")
    help_text = cli(None, "queryMsgById", "--help").stdout
    assert "ignored" in help_text and "--unitName" in help_text


# -- deleteSubGroup -r --------------------------------------------------------------------------------------------
def test_delete_sub_group_remove_offset_and_retry_topics(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "ODEL", "-r", "1", "-w", "1")
    send(server, "ODEL", 2)
    q = MessageQueue("ODEL", "broker-a", 0)
    for g in ("OG_DEL", "OG_KEEP"):
        ok(server, "updateSubGroup", "-g", g)
        sdk(server, lambda a, g=g: a.update_consumer_offset(g, q, 2))  # type: ignore[misc]
    ok(server, "updateTopic", "-t", "%RETRY%OG_DEL", "-r", "1", "-w", "1")
    ok(server, "updateTopic", "-t", "%DLQ%OG_DEL", "-r", "1", "-w", "1")

    done = ok(server, "deleteSubGroup", "-g", "OG_DEL", "-r", "true")
    assert done == {"groupName": "OG_DEL", "brokers": ["broker-a"], "removeOffset": True,
                    "deletedTopics": ["%RETRY%OG_DEL", "%DLQ%OG_DEL"]}
    assert sdk(server, lambda a: a.committed_offset("OG_DEL", q)) is None
    assert "OG_DEL" not in sdk(server, lambda a: a.subscription_groups("broker-a"))
    assert server.route("%RETRY%OG_DEL") is None and server.route("%DLQ%OG_DEL") is None
    # without -r the offsets stay; from one broker (-b) the retry topic stays, as mqadmin does
    ok(server, "updateTopic", "-t", "%RETRY%OG_KEEP", "-r", "1", "-w", "1")
    kept = ok(server, "deleteSubGroup", "-g", "OG_KEEP", "-b", server.broker_addr)
    assert kept["removeOffset"] is False and kept["deletedTopics"] == []
    assert sdk(server, lambda a: a.committed_offset("OG_KEEP", q)) == 2
    assert server.route("%RETRY%OG_KEEP") is not None
    error(cli(server, "deleteSubGroup", "-g", "OG_KEEP", "-r", "sure"), 2, "true or false")


# -- updateTopic -u / -s / -o ---------------------------------------------------------------------------------------
def test_update_topic_unit_flags_and_order_conf(server: CometServer) -> None:
    made = ok(server, "updateTopic", "-t", "OUNIT", "-r", "2", "-w", "2", "-u", "true", "-s", "true")
    assert made["topicSysFlag"] == 3 and made["orderConf"] is None
    route = server.route("OUNIT")
    assert route is not None and route["queueDatas"][0]["topicSysFlag"] == 3 and "orderTopicConf" not in route
    assert sdk(server, lambda a: a.topic_configs("broker-a"))["OUNIT"]["topicSysFlag"] == 3
    ok(server, "updateTopic", "-t", "OUNIT", "-r", "2", "-w", "2", "-s", "true")
    route = server.route("OUNIT")
    assert route is not None and route["queueDatas"][0]["topicSysFlag"] == 2

    # -o true with -b: that broker's conf, merged into the topic's; the route carries it
    made = ok(server, "updateTopic", "-t", "OORD", "-b", server.broker_addr, "-w", "4", "-r", "4", "-o", "true")
    assert made["orderConf"] == "broker-a:4"
    route = server.route("OORD")
    assert route is not None and route["orderTopicConf"] == "broker-a:4"
    with SyncAdmin(namesrv=server.namesrv) as admin:
        assert admin.get_kv_config("ORDER_TOPIC_CONFIG", "OORD") == "broker-a:4"
        admin.put_kv_config("ORDER_TOPIC_CONFIG", "OORD", "broker-a:4;broker-b:2")
        assert admin.update_order_conf("OORD", "broker-a:6", replace=False) == "broker-a:6;broker-b:2"
        assert admin.kv_list("ORDER_TOPIC_CONFIG")["OORD"] == "broker-a:6;broker-b:2"
        assert admin.topic_route("OORD").order_topic_conf == "broker-a:6;broker-b:2"
        ok(server, "deleteTopic", "-t", "OORD")  # its order conf goes with it
        assert admin.get_kv_config("ORDER_TOPIC_CONFIG", "OORD") is None
    error(cli(server, "updateTopic", "-t", "OBAD", "-u", "maybe"), 2, "true or false")
    assert server.route("OBAD") is None


# -- updateSubGroup -p / --attributes ----------------------------------------------------------------------------------
def test_update_sub_group_retry_policy_and_attributes(server: CometServer) -> None:
    def config() -> dict[str, Any]:
        return sdk(server, lambda a: a.subscription_groups("broker-a"))["OG_ATTR"]

    policy = {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 5000, "max": 7200000, "multiplier": 2}}
    made = ok(server, "updateSubGroup", "-g", "OG_ATTR", "-p", json.dumps(policy), "--attributes", "+a=1,+b=2")
    assert made["groupRetryPolicy"] == policy and made["attributes"] == {"+a": "1", "+b": "2"}
    cfg = config()
    assert cfg["groupRetryPolicy"] == policy and cfg["attributes"] == {"a": "1", "b": "2"}
    # +key updates, -key deletes, the rest stays; an update without --attributes keeps them
    ok(server, "updateSubGroup", "-g", "OG_ATTR", "--attributes", "+a=3,-b,+c=x")
    assert config()["attributes"] == {"a": "3", "c": "x"}
    ok(server, "updateSubGroup", "-g", "OG_ATTR", "-r", "5")
    cfg = config()
    assert cfg["attributes"] == {"a": "3", "c": "x"} and cfg["retryMaxTimes"] == 5
    assert cfg["groupRetryPolicy"] == {"type": "CUSTOMIZED"}  # not given: RocketMQ's default policy
    custom = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 5000]}}
    ok(server, "updateSubGroup", "-g", "OG_ATTR", "-p", json.dumps(custom))
    assert config()["groupRetryPolicy"] == custom

    # refused: nothing changes
    error(cli(server, "updateSubGroup", "-g", "OG_ATTR", "--attributes", "-nope"), 1, "nonexistent")
    error(cli(server, "updateSubGroup", "-g", "OG_ATTR", "--attributes", "a=1"), 2, "+key=value")
    error(cli(server, "updateSubGroup", "-g", "OG_ATTR", "--attributes", "+a=1,+a=2"), 2, "twice")
    error(cli(server, "updateSubGroup", "-g", "OG_ATTR", "-p", "{not json"), 2, "retry policy")
    error(cli(server, "updateSubGroup", "-g", "OG_ATTR", "-p", '{"type": "LINEAR"}'), 2, "LINEAR")
    error(cli(server, "updateSubGroup", "-g", "OG_NEW", "--attributes", "-a"), 1, "creating")
    cfg = config()
    assert cfg["attributes"] == {"a": "3", "c": "x"} and cfg["groupRetryPolicy"] == custom
    assert "OG_NEW" not in sdk(server, lambda a: a.subscription_groups("broker-a"))


# -- sendMessage -m ---------------------------------------------------------------------------------------------------
def test_send_message_trace_flag(server: CometServer) -> None:
    ok(server, "updateTopic", "-t", "OTRACE", "-r", "1", "-w", "1")
    r = ok(server, "sendMessage", "-t", "OTRACE", "-p", "traced", "-m", "true")
    assert r["sendStatus"] == "SEND_OK"
    assert sdk(server, lambda a: a.view_message(r["offsetMsgId"])).body == b"traced"
    assert server.route("RMQ_SYS_TRACE_TOPIC") is None  # no trace is written
    error(cli(server, "sendMessage", "-t", "OTRACE", "-p", "x", "-m", "yes please"), 2, "true or false")
    assert "no trace" in cli(None, "sendMessage", "--help").stdout


# -- the blocking facade has every Admin method -------------------------------------------------------------------
def test_sync_admin_has_a_twin_of_every_admin_method(server: CometServer) -> None:
    for name, method in inspect.getmembers(Admin, inspect.iscoroutinefunction):
        if name.startswith("_") or name in ("start", "close"):  # the facade's own lifecycle
            continue
        twin = getattr(SyncAdmin, name, None)
        assert twin is not None and not inspect.iscoroutinefunction(twin), f"SyncAdmin lacks {name}"
        assert list(inspect.signature(twin).parameters) == list(inspect.signature(method).parameters), name
    with SyncAdmin(namesrv=server.namesrv) as admin:
        assert admin.broker_addrs() == {"broker-a": server.broker_addr}
        assert admin.broker_runtime_info(server.broker_addr)["brokerVersionDesc"].startswith("cometmq")
        admin.put_kv_config("NS_TEST", "k", "v")
        assert admin.get_kv_config("NS_TEST", "k") == "v"
        admin.delete_kv_config("NS_TEST", "k")
        assert admin.kv_list("NS_TEST") == {}
