"""The official Python 5.x client (rocketmq-python-client 5.1.2) against ``cometmq serve``'s gRPC endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.grpc.conftest import ClientRunner, GrpcServer

Server = Callable[..., GrpcServer]
SRC = Path(__file__).resolve().parents[3] / "src" / "cometmq" / "broker"
needs_transactions = pytest.mark.skipif(not list(SRC.glob("transaction*")),
                                        reason="the broker side of transactional messages is not in this tree yet")


def test_produce_then_simple_consume_and_ack(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PyNormal")
    sent = py5.run("produce", endpoints=s.endpoints, topic="PyNormal", count=10, tag="TagA", keys="k1")
    assert sent.rc == 0 and len(sent.events("sent")) == 10, sent.describe()
    got = py5.run("simple", endpoints=s.endpoints, topic="PyNormal", group="PySimple", count=10, timeout=30)
    assert got.rc == 0, got.describe()
    received = got.events("received")
    assert sorted(m["body"] for m in received) == sorted(f"msg-{i}" for i in range(10))
    assert {m["id"] for m in received} == {m["id"] for m in sent.events("sent")}
    assert all(m["tag"] == "TagA" and m["keys"] == ["k1"] and m["attempt"] == 1 for m in received)
    assert {m["properties"]["index"] for m in received} == {str(i) for i in range(10)}
    assert len(got.events("acked")) == 10
    # all acknowledged: the group has nothing left
    again = py5.run("simple", endpoints=s.endpoints, topic="PyNormal", group="PySimple", count=1, timeout=3,
                    await_s=1)
    assert again.events("received") == [], again.describe()


def test_unacked_message_is_redelivered_and_change_invisible_duration(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PyRedeliver", queues=1)
    assert py5.run("produce", endpoints=s.endpoints, topic="PyRedeliver", count=1).rc == 0
    # first delivery: the invisible time is changed to 1 s instead of acking, so it comes back as attempt 2
    got = py5.run("simple", endpoints=s.endpoints, topic="PyRedeliver", group="PyRe", count=1, change_invisible=1,
                  invisible=20, timeout=30)
    received = got.events("received")
    assert [m["attempt"] for m in received] == [1, 2], got.describe()
    assert received[0]["id"] == received[1]["id"] and len(got.events("acked")) == 1
    # a message not acked within its invisible time is delivered again (10 s: the shortest a receive may ask for,
    # RocketMQ's minInvisibleTimeMillsForRecv)
    assert py5.run("produce", endpoints=s.endpoints, topic="PyRedeliver", count=1, prefix="late-").rc == 0
    first = py5.run("simple", endpoints=s.endpoints, topic="PyRedeliver", group="PyRe", count=1, invisible=10,
                    no_ack=True, timeout=10)
    assert [m["body"] for m in first.events("received")] == ["late-0"], first.describe()
    second = py5.run("simple", endpoints=s.endpoints, topic="PyRedeliver", group="PyRe", count=1, timeout=20)
    assert [(m["body"], m["attempt"]) for m in second.events("received")] == [("late-0", 2)], second.describe()


def test_push_consumer_retries_a_failed_message(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PyPush")
    assert py5.run("produce", endpoints=s.endpoints, topic="PyPush", count=5).rc == 0
    res = py5.run("push", endpoints=s.endpoints, topic="PyPush", group="PyPushG", count=5, fail_first=1, timeout=40)
    assert res.rc == 0, res.describe()
    ok = [m for m in res.events("consumed") if m["ok"]]
    failed = [m for m in res.events("consumed") if not m["ok"]]
    assert sorted(m["body"] for m in ok) == [f"msg-{i}" for i in range(5)], res.describe()
    assert len(failed) == 1
    retried = [m for m in ok if m["id"] == failed[0]["id"]]
    assert [m["attempt"] for m in retried] == [2]


def test_fifo_producer_and_push_consumer_keep_group_order(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PyFifo", queues=4)
    s.server.create_group("PyFifoG", consumeMessageOrderly=True)
    for g in ("a", "b"):
        r = py5.run("produce", endpoints=s.endpoints, topic="PyFifo", count=8, group=f"order-{g}", prefix=f"{g}-")
        assert r.rc == 0, r.describe()
    res = py5.run("push", endpoints=s.endpoints, topic="PyFifo", group="PyFifoG", count=16, timeout=40, threads=4)
    assert res.rc == 0, res.describe()
    consumed = [m for m in res.events("consumed") if m["ok"]]
    for g in ("a", "b"):
        bodies = [m["body"] for m in consumed if m["group"] == f"order-{g}"]
        assert bodies == [f"{g}-{i}" for i in range(8)], res.describe()


def test_delay_message_and_recall(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PyDelay", queues=1)
    t0 = time.time()
    sent = py5.run("produce", endpoints=s.endpoints, topic="PyDelay", count=2, delay_ms=4000, prefix="d-")
    assert sent.rc == 0 and all(e["recall_handle"] for e in sent.events("sent")), sent.describe()
    recalled = py5.run("recall", endpoints=s.endpoints, topic="PyDelay", handle=sent.events("sent")[0]["recall_handle"])
    assert recalled.events("recalled") == [{"event": "recalled", "id": sent.events("sent")[0]["id"]}], \
        recalled.describe()
    got = py5.run("simple", endpoints=s.endpoints, topic="PyDelay", group="PyDelayG", count=1, timeout=25)
    assert [m["body"] for m in got.events("received")] == ["d-1"], got.describe()
    assert time.time() - t0 >= 4.0
    late = py5.run("simple", endpoints=s.endpoints, topic="PyDelay", group="PyDelayG", count=1, timeout=4, await_s=2)
    assert late.events("received") == [], late.describe()  # the recalled one never arrives


def test_sql_filter(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("PySql", queues=1)
    assert py5.run("produce", endpoints=s.endpoints, topic="PySql", count=6).rc == 0
    got = py5.run("simple", endpoints=s.endpoints, topic="PySql", group="PySqlG", count=2,
                  sql="index IN ('1', '4')", timeout=20)
    assert sorted(m["body"] for m in got.events("received")) == ["msg-1", "msg-4"], got.describe()


def test_credentials_are_checked_when_auth_is_on(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server(access_keys="app:s3cret")
    s.server.create_topic("PyAuth")
    bad = py5.run("produce", endpoints=s.endpoints, topic="PyAuth", count=1, ak="app", sk="wrong", timeout=60)
    assert bad.events("sent") == [] and bad.events("error"), bad.describe()
    none = py5.run("produce", endpoints=s.endpoints, topic="PyAuth", count=1, timeout=60)
    assert none.events("sent") == [] and none.events("error"), none.describe()
    good = py5.run("produce", endpoints=s.endpoints, topic="PyAuth", count=1, ak="app", sk="s3cret")
    assert len(good.events("sent")) == 1, good.describe()


@needs_transactions
@pytest.mark.parametrize(("decision", "check", "visible"), [
    ("commit", "rollback", True), ("rollback", "commit", False), ("unknown", "commit", True)])
def test_transactions(py5: ClientRunner, grpc_server: Server, decision: str, check: str, visible: bool) -> None:
    s = grpc_server({"transactionTimeOut": "1000", "transactionCheckInterval": "1000"})
    topic = f"PyTx{decision.capitalize()}"
    s.server.create_topic(topic, queues=1)
    linger = 12 if decision == "unknown" else 0
    tx = py5.run("transaction", endpoints=s.endpoints, topic=topic, decision=decision, check=check, linger=linger,
                 timeout=60)
    assert tx.rc == 0 and tx.events("half-sent"), tx.describe()
    if decision == "unknown":
        assert tx.events("checked"), tx.describe()  # the broker asked, through the endpoint's Telemetry stream
    got = py5.run("simple", endpoints=s.endpoints, topic=topic, group=f"{topic}G", count=1, timeout=8, await_s=3)
    assert [m["body"] for m in got.events("received")] == (["msg-tx"] if visible else []), got.describe()
