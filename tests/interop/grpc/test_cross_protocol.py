"""Messages cross protocols: sent with a 5.x gRPC client and received over remoting by the official C++ 4.x
client and by cometmq's SDK, and the reverse."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cometmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from tests.interop.grpc.conftest import ClientRunner, GrpcServer
from tests.interop.harness import CppClientRunner

Server = Callable[..., GrpcServer]


def test_py5_sends_cpp_receives(py5: ClientRunner, cpp_client: CppClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("X5toCpp")
    sent = py5.run("produce", endpoints=s.endpoints, topic="X5toCpp", count=8, tag="TagG", keys="gk")
    assert len(sent.events("sent")) == 8, sent.describe()
    res = cpp_client.run("push_consume", namesrv=s.server.namesrv, topic="X5toCpp", group="CG_x5_cpp",
                         expression="TagG", count=8, seconds=40, timeout=60)
    got = res.messages
    assert sorted(m["msg_id"] for m in got) == sorted(e["id"] for e in sent.events("sent")), res.describe()
    assert sorted(m["body"] for m in got) == sorted(f"msg-{i}" for i in range(8))
    assert all(m["tags"] == "TagG" for m in got)


def test_cpp_sends_py5_and_node_receive(py5: ClientRunner, node5: ClientRunner, cpp_client: CppClientRunner,
                                        grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("XCppto5")
    sent = cpp_client.run("produce", namesrv=s.server.namesrv, topic="XCppto5", count=6, tags="TagC",
                          keys="key-{i}", body="cpp-{i}").messages
    assert len(sent) == 6
    for runner, group in ((py5, "G_x_py5"), (node5, "G_x_node")):
        got = runner.run("simple", endpoints=s.endpoints, topic="XCppto5", group=group, count=6, timeout=30)
        received = got.events("received")
        assert sorted(m["body"] for m in received) == sorted(f"cpp-{i}" for i in range(6)), got.describe()
        assert {m["id"] for m in received} == {m["msg_id"] for m in sent}
        assert all(m["tag"] == "TagC" and len(m["keys"]) == 1 for m in received)


def test_sdk_and_5x_clients_exchange_messages(py5: ClientRunner, grpc_server: Server) -> None:
    s = grpc_server()
    s.server.create_topic("XSdk")
    sent = py5.run("produce", endpoints=s.endpoints, topic="XSdk", count=5, tag="From5", prefix="g5-")
    assert len(sent.events("sent")) == 5, sent.describe()

    async def sdk_side() -> list[MessageExt]:
        received: list[MessageExt] = []
        done = asyncio.Event()

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            received.extend(msgs)
            if len(received) >= 5:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer("CG_x_sdk", namesrv=s.server.namesrv, consume_from="first", listener=listener)
        consumer.subscribe("XSdk", "From5")
        async with consumer:
            await asyncio.wait_for(done.wait(), 30)
        async with Producer("PG_x_sdk", namesrv=s.server.namesrv) as p:
            for i in range(4):
                await p.send(Message("XSdk", f"sdk-{i}".encode(), tags="FromSdk", keys=f"sk{i}"))
        return received

    got = asyncio.run(sdk_side())
    assert sorted(m.body.decode() for m in got) == [f"g5-{i}" for i in range(5)]
    assert {m.properties.get("UNIQ_KEY") for m in got} == {e["id"] for e in sent.events("sent")}
    assert all(m.properties.get("index") is not None for m in got)  # user properties cross over
    back = py5.run("simple", endpoints=s.endpoints, topic="XSdk", group="G_x_back", count=4, tag_expr="FromSdk",
                   timeout=30)
    assert sorted(m["body"] for m in back.events("received")) == [f"sdk-{i}" for i in range(4)], back.describe()
    assert sorted(m["keys"][0] for m in back.events("received")) == [f"sk{i}" for i in range(4)]
