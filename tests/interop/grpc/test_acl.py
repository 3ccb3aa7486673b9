"""ACL on the gRPC endpoint with the official Python 5.x client: ``cometmq serve`` with aclEnable=true checks the
5.x ``authorization`` signature against the same plain_acl.yml as the remoting port, and the topic and group
permissions per RPC (plain gRPC here; TLS is a separate switch, ``--tls`` on the client script)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.grpc.conftest import ClientRunner, GrpcServer
from tests.kit.acl import admin_and_user

Server = Callable[..., GrpcServer]

ADMIN = ("grpcAdmin1", "grpcAdminSecret")
USER = ("grpcUser01", "grpcUserSecret")
ACL = admin_and_user(ADMIN, USER, topic_perms={"GrpcOk": "PUB|SUB", "GrpcDenied": "DENY"})


def test_python_5x_client_with_and_without_credentials(py5: ClientRunner, grpc_server: Server, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    s = grpc_server({"aclEnable": "true", "aclFile": str(acl), "innerClientAuthenticationCredentials": json.dumps(
        {"accessKey": ADMIN[0], "secretKey": ADMIN[1]})})
    monkeypatch.setenv("COMETMQ_ACCESS_KEY", ADMIN[0])
    monkeypatch.setenv("COMETMQ_SECRET_KEY", ADMIN[1])
    for topic in ("GrpcOk", "GrpcDenied"):
        s.server.create_topic(topic, queues=2)

    good = py5.run("produce", endpoints=s.endpoints, topic="GrpcOk", count=3, ak=USER[0], sk=USER[1])
    assert good.rc == 0 and len(good.events("sent")) == 3, good.describe()
    got = py5.run("simple", endpoints=s.endpoints, topic="GrpcOk", group="GrpcAclGroup", count=3, ak=USER[0],
                  sk=USER[1], timeout=30)
    assert sorted(m["body"] for m in got.events("received")) == ["msg-0", "msg-1", "msg-2"], got.describe()

    for creds in ({"ak": USER[0], "sk": "notTheSecret"}, {}):
        bad = py5.run("produce", endpoints=s.endpoints, topic="GrpcOk", count=1, run_timeout=60, **creds)
        assert bad.rc != 0 and not bad.events("sent"), bad.describe()
    denied = py5.run("produce", endpoints=s.endpoints, topic="GrpcDenied", count=1, ak=USER[0], sk=USER[1],
                     run_timeout=60)
    assert denied.rc != 0 and not denied.events("sent"), denied.describe()
    log = s.server.log_text()
    assert "Check signature failed for accessKey=grpcUser01" in log
    # the client without keys sends an authorization header naming no access key
    assert "No accessKey is configured" in log or "names no access key" in log
    assert "topic=GrpcDenied" in log
