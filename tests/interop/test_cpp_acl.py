"""ACL with the official C++ client (rocketmq 0.4.4 wheel, ``set_session_credentials``): a broker with
aclEnable=true takes its signed requests with the right keys and refuses wrong or missing ones, and a topic denied
to the user is refused for sending and pulling (docs/security.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.client.admin import Admin
from tests.interop.cometmq_server import CometServer
from tests.interop.harness import ClientResult, CppClientRunner
from tests.kit.acl import admin_and_user

pytestmark = pytest.mark.interop

Server = Callable[..., CometServer]

ADMIN = ("cppAdmin01", "cppAdminSecret")
USER = ("cppUser001", "cppUserSecret")
ACL = admin_and_user(ADMIN, USER, topic_perms={"AclOk": "PUB|SUB", "AclDenied": "DENY"})


@pytest.fixture
def acl_server(cometmq_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CometServer:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    server = cometmq_server(conf={"aclEnable": "true", "aclFile": str(acl),
                                  "innerClientAuthenticationCredentials": json.dumps(
                                      {"accessKey": ADMIN[0], "secretKey": ADMIN[1]})})
    with pytest.raises(Exception, match=r"No accessKey|refused"):
        server.admin("updateTopic", "-b", server.broker_addr, "-t", "AclOk", "-r", "2", "-w", "2")
    monkeypatch.setenv("COMETMQ_ACCESS_KEY", ADMIN[0])  # server.admin runs `cometmq admin` with this env
    monkeypatch.setenv("COMETMQ_SECRET_KEY", ADMIN[1])
    for topic in ("AclOk", "AclDenied"):
        server.create_topic(topic, queues=2)
    return server


def _produce(cpp: CppClientRunner, server: CometServer, topic: str, creds: tuple[str, str] | None,
             count: int = 3) -> ClientResult:
    keys = {"access_key": creds[0], "secret_key": creds[1]} if creds else {}
    return cpp.run("produce", namesrv=server.namesrv, topic=topic, count=count, timeout_ms=2000, timeout=90,
                   **keys)


def test_cpp_client_with_credentials(cpp_client: CppClientRunner, acl_server: CometServer) -> None:
    server = acl_server
    ok = _produce(cpp_client, server, "AclOk", USER)
    assert ok.returncode == 0 or (ok.aborted_in_shutdown and not ok.errors), ok.describe() + server.log_tail()
    assert len(ok.messages) == 3 and all(m["status"] == "OK" for m in ok.messages), ok.describe()

    pulled = cpp_client.run("pull_consume", namesrv=server.namesrv, topic="AclOk", group="CG_acl",
                            access_key=USER[0], secret_key=USER[1], timeout=90)
    assert pulled.summary is not None and not pulled.summary["failed_queues"], pulled.describe()
    assert sorted(m["body"] for m in pulled.messages) == ["msg-0", "msg-1", "msg-2"], pulled.describe()

    # wrong secret, and no credentials at all: every send refused, nothing stored
    for creds in ((USER[0], "notTheSecret"), None):
        bad = _produce(cpp_client, server, "AclOk", creds, count=1)
        assert not [m for m in bad.messages if m.get("status") == "OK"], bad.describe()
        assert bad.errors, bad.describe()
    log = server.log_text()
    assert "Check signature failed for accessKey=cppUser001" in log
    assert "No accessKey is configured" in log

    # the denied topic: refused for sending and pulling
    denied = _produce(cpp_client, server, "AclDenied", USER, count=1)
    assert not [m for m in denied.messages if m.get("status") == "OK"], denied.describe()
    assert "topic=AclDenied" in server.log_text()
    pull_denied = cpp_client.run("pull_consume", namesrv=server.namesrv, topic="AclDenied", group="CG_acl",
                                 access_key=USER[0], secret_key=USER[1], max_errors=1, timeout=90)
    assert not pull_denied.messages, pull_denied.describe()
    assert pull_denied.summary is not None and pull_denied.summary["failed_queues"], pull_denied.describe()

    # nothing reached the denied topic, and the allowed one holds the three good sends only
    async def stats() -> tuple[int, int]:
        async with Admin(namesrv=server.namesrv, credentials=ADMIN) as admin:
            denied, ok = await admin.topic_stats("AclDenied"), await admin.topic_stats("AclOk")
        return sum(o.max_offset for o in denied.values()), sum(o.max_offset for o in ok.values())

    assert asyncio.run(stats()) == (0, 3)


def test_cpp_push_consumer_under_acl_gets_its_failed_messages_again(cpp_client: CppClientRunner,
                                                                    acl_server: CometServer) -> None:
    """The 4.x C++ client's send-back (CONSUMER_SEND_MSG_BACK) names no originTopic: only the group, the delay level
    and the message's commit-log offset. RocketMQ's ACL asks SUB on the group's retry topic for it; cometmq refused
    it (it asked for an originTopic), so a C++ consumer under ACL never got a failed message from the broker again."""
    server = acl_server
    ok = _produce(cpp_client, server, "AclOk", USER, count=2)
    assert len([m for m in ok.messages if m["status"] == "OK"]) == 2, ok.describe()
    res = cpp_client.run("push_consume", namesrv=server.namesrv, topic="AclOk", group="CG_acl_retry",
                         access_key=USER[0], secret_key=USER[1], reconsume_later_until=1, count=2, seconds=60,
                         timeout=80)
    log = server.log_text()
    assert "request code 36" not in log, log[-3000:]
    retried = [m for m in res.messages if m["reconsume_times"] == 1 and m["status"] == "CONSUME_SUCCESS"]
    assert sorted(m["body"] for m in retried) == ["msg-0", "msg-1"], res.describe() + server.log_tail()
    for m in retried:  # redelivered by the broker, from the group's retry topic (not a local retry)
        assert m["props"]["retry_topic"] == "AclOk", m
