"""The official Node.js 5.x client (rocketmq-client-nodejs 1.0.8) against ``cometmq serve``'s gRPC endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.interop.grpc.conftest import ClientRunner, GrpcServer
from tests.interop.grpc.test_python_client import needs_transactions

Server = Callable[..., GrpcServer]


def test_produce_then_simple_consume_and_ack(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("NodeNormal")
    sent = node5.run("produce", endpoints=s.endpoints, topic="NodeNormal", count=10, tag="TagN", keys="nk")
    assert sent.rc == 0 and len(sent.events("sent")) == 10, sent.describe()
    got = node5.run("simple", endpoints=s.endpoints, topic="NodeNormal", group="NodeSimple", count=10, timeout=30)
    assert got.rc == 0, got.describe()
    received = got.events("received")
    assert sorted(m["body"] for m in received) == sorted(f"msg-{i}" for i in range(10))
    assert {m["id"] for m in received} == {m["id"] for m in sent.events("sent")}
    assert all(m["tag"] == "TagN" and m["keys"] == ["nk"] and m["attempt"] == 1 for m in received)
    assert len(got.events("acked")) == 10


def test_change_invisible_duration_redelivers(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("NodeChange", queues=1)
    assert node5.run("produce", endpoints=s.endpoints, topic="NodeChange", count=1).rc == 0
    got = node5.run("simple", endpoints=s.endpoints, topic="NodeChange", group="NodeChangeG", count=1,
                    change_invisible=1, invisible=20, timeout=30)
    assert [m["attempt"] for m in got.events("received")] == [1, 2], got.describe()


def test_push_consumer(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("NodePush")
    assert node5.run("produce", endpoints=s.endpoints, topic="NodePush", count=6).rc == 0
    res = node5.run("push", endpoints=s.endpoints, topic="NodePush", group="NodePushG", count=6, fail_first=1,
                    timeout=40)
    ok = [m for m in res.events("consumed") if m["ok"]]
    assert sorted(m["body"] for m in ok) == [f"msg-{i}" for i in range(6)], res.describe()


def test_fifo_messages_keep_order_per_group(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("NodeFifo", queues=4)
    for g in ("x", "y"):
        assert node5.run("produce", endpoints=s.endpoints, topic="NodeFifo", count=6, group=f"g-{g}",
                         prefix=f"{g}-").rc == 0
    got = node5.run("simple", endpoints=s.endpoints, topic="NodeFifo", group="NodeFifoG", count=12, timeout=30)
    received = got.events("received")
    for g in ("x", "y"):
        assert [m["body"] for m in received if m["group"] == f"g-{g}"] == [f"{g}-{i}" for i in range(6)]


def test_delay_and_recall(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("NodeDelay", queues=1)
    t0 = time.time()
    sent = node5.run("produce", endpoints=s.endpoints, topic="NodeDelay", count=2, delay_ms=4000, prefix="d-")
    assert sent.rc == 0 and all(e["recall_handle"] for e in sent.events("sent")), sent.describe()
    r = node5.run("recall", endpoints=s.endpoints, topic="NodeDelay", handle=sent.events("sent")[1]["recall_handle"])
    assert [e["id"] for e in r.events("recalled")] == [sent.events("sent")[1]["id"]], r.describe()
    got = node5.run("simple", endpoints=s.endpoints, topic="NodeDelay", group="NodeDelayG", count=1, timeout=25)
    assert [m["body"] for m in got.events("received")] == ["d-0"], got.describe()
    assert time.time() - t0 >= 4.0


def test_credentials_are_checked_when_auth_is_on(node5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server(access_keys="app:s3cret")
    s.server.create_topic("NodeAuth")
    bad = node5.run("produce", endpoints=s.endpoints, topic="NodeAuth", count=1, ak="app", sk="wrong", timeout=60)
    assert bad.events("sent") == [] and bad.events("error"), bad.describe()
    good = node5.run("produce", endpoints=s.endpoints, topic="NodeAuth", count=1, ak="app", sk="s3cret")
    assert len(good.events("sent")) == 1, good.describe()


@needs_transactions
@pytest.mark.parametrize(("decision", "check", "visible"), [
    ("commit", "rollback", True), ("rollback", "commit", False), ("unknown", "commit", True)])
def test_transactions(node5: ClientRunner, grpc_server: Server, decision: str, check: str, visible: bool) -> None:
    s = grpc_server({"transactionTimeOut": "1000", "transactionCheckInterval": "1000"})
    topic = f"NodeTx{decision.capitalize()}"
    s.server.create_topic(topic, queues=1)
    linger = 12 if decision == "unknown" else 0
    tx = node5.run("transaction", endpoints=s.endpoints, topic=topic, decision=decision, check=check, linger=linger,
                   timeout=60)
    assert tx.rc == 0 and tx.events("half-sent"), tx.describe()
    if decision == "unknown":
        assert tx.events("checked"), tx.describe()
    got = node5.run("simple", endpoints=s.endpoints, topic=topic, group=f"{topic}G", count=1, timeout=8, await_s=3)
    assert [m["body"] for m in got.events("received")] == (["msg-tx"] if visible else []), got.describe()
