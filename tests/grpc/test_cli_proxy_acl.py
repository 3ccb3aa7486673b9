"""`cometmq proxy --acl-file`: the standalone gRPC proxy checks every call against a plain_acl.yml as the embedded
endpoint does (docs/security.md), and signs its remoting requests to brokers with aclEnable=true with
--inner-credentials (here from $COMETMQ_INNER_CREDENTIALS)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

from cometmq.client.admin import Admin
from cometmq.grpc.auth import authorization_header, date_time_now
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.grpc.v2 import service_pb2_grpc
from tests.grpc.kit import new_message_id
from tests.grpc.test_cli_grpc import Proc, cometmq, free_port, procs  # noqa: F401 - procs is a fixture
from tests.kit.acl import admin_and_user

pytestmark = pytest.mark.timeout(120)

ADMIN = ("proxyAdmin1", "proxyAdminSecret1")
USER = ("proxyUser01", "proxyUserSecret1")
ACL = admin_and_user(ADMIN, USER, topic_perms={"ProxyAcl": "PUB|SUB"})


async def _calls(port: int, creds: tuple[str, str] | None) -> tuple[Any, Any, Any]:
    """QueryRoute of ProxyAcl and of a topic the user may not touch, a SendMessage to ProxyAcl."""
    now = date_time_now()
    md = [("x-mq-client-id", "proxy-acl-test"), ("x-mq-date-time", now), ("x-mq-language", "PYTHON"),
          ("x-mq-protocol", "v2")]
    if creds is not None:
        md.append(("authorization", authorization_header(creds[0], creds[1], now)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]
        route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="ProxyAcl")), metadata=md,
                                      timeout=10)
        other = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="Other")), metadata=md,
                                      timeout=10)
        sp = pb.SystemProperties(message_id=new_message_id(), message_type=pb.NORMAL, body_encoding=pb.IDENTITY)
        msg = pb.Message(topic=pb.Resource(name="ProxyAcl"), body=b"through the proxy", system_properties=sp)
        sent = await stub.SendMessage(spb.SendMessageRequest(messages=[msg]), metadata=md, timeout=10)
        return route, other, sent


def test_standalone_proxy_checks_its_acl_file(tmp_path: Path, procs: list[Proc],  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    conf = tmp_path / "broker.conf"
    conf.write_text(f"aclEnable=true\naclFile={acl}\ninnerClientAuthenticationCredentials="
                    + json.dumps({"accessKey": ADMIN[0], "secretKey": ADMIN[1]}) + "\n")
    ns, bp, pp = free_port(), free_port(), free_port()
    procs.append(Proc(cometmq("serve", "-c", str(conf), "--data", str(tmp_path / "data"), "--namesrv-port", str(ns),
                              "--broker-port", str(bp), "--grpc-port", "0"), "cometmq serving"))

    async def create_topic() -> None:
        async with Admin(namesrv=f"127.0.0.1:{ns}", credentials=ADMIN) as admin:
            await admin.create_topic("ProxyAcl", read_queues=1)

    asyncio.run(create_topic())
    monkeypatch.setenv("COMETMQ_INNER_CREDENTIALS", f"{ADMIN[0]}:{ADMIN[1]}")
    proxy = Proc(cometmq("proxy", "--namesrv", f"127.0.0.1:{ns}", "--grpc-port", str(pp), "--acl-file", str(acl)),
                 "cometmq proxy listening")
    procs.append(proxy)
    assert f"ACL {acl}" in proxy.lines[-1]

    route, other, sent = asyncio.run(_calls(pp, None))
    for r in (route, other):
        assert r.status.code == pb.Code.UNAUTHORIZED and r.status.message == "No accessKey is configured"
    assert sent.status.code == pb.Code.UNAUTHORIZED
    route, other, sent = asyncio.run(_calls(pp, (USER[0], "notTheSecret")))
    assert route.status.code == pb.Code.UNAUTHORIZED and "Check signature failed" in route.status.message

    route, other, sent = asyncio.run(_calls(pp, USER))
    assert route.status.code == pb.Code.OK and {q.broker.name for q in route.message_queues} == {"broker-a"}
    assert other.status.code == pb.Code.FORBIDDEN and "topic=Other" in other.status.message
    # the broker (aclEnable=true) takes the proxy's send: the proxy signs with its inner credentials
    assert sent.status.code == pb.Code.OK, sent.status
    assert proxy.stop() == 0


def test_bad_acl_options_stop_the_proxy(tmp_path: Path) -> None:
    def refused(*args: str) -> str:
        out = subprocess.run(cometmq("proxy", "--grpc-port", str(free_port()), *args), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        return " ".join(w for w in out.stderr.replace("│", " ").split() if w.strip("╭╮╰╯─"))

    missing = tmp_path / "nowhere.yml"
    assert f"{missing} does not exist" in refused("--acl-file", str(missing))
    bad = tmp_path / "bad.yml"
    bad.write_text("accounts:\n  - accessKey: someUser1\n    secretKey: someSecret1\n    admin: perhaps\n")
    assert "bad.yml line 4" in refused("--acl-file", str(bad))
    good = tmp_path / "plain_acl.yml"
    good.write_text(ACL)
    assert "not both" in refused("--acl-file", str(good), "--access-keys", "a:b")
    assert "--inner-credentials" in refused("--acl-file", str(good), "--inner-credentials", "nocolon")
