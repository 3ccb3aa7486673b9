"""This SDK and the official C++ client on one broker: each consumes what the other produced."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from cometmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer

from .cometmq_server import CometServer
from .harness import CppClientRunner

Server = Callable[..., CometServer]


def test_sdk_produces_cpp_consumes(cpp_client: CppClientRunner, cometmq_server: Server) -> None:
    server = cometmq_server()
    server.create_topic("MixA")

    async def produce() -> list[str]:
        async with Producer("PG_mix", namesrv=server.namesrv) as p:
            ids = [(await p.send(Message("MixA", f"sdk-{i}".encode(), tags="TagA" if i % 2 else "TagB",
                                         keys=f"k{i}"))).msg_id for i in range(20)]
            ids += [r.msg_id for r in await p.send_batch([Message("MixA", f"sdk-b{i}".encode(), tags="TagA")
                                                           for i in range(10)])]
            return ids

    ids = asyncio.run(produce())
    res = cpp_client.run("push_consume", namesrv=server.namesrv, topic="MixA", group="CG_mix_cpp",
                         expression="TagA", count=20, seconds=40, timeout=60)
    got = res.messages
    want = {ids[i] for i in range(20) if i % 2} | set(ids[20:])
    assert Counter(m["msg_id"] for m in got) == Counter(want), res.describe()
    assert all(m["tags"] == "TagA" for m in got)
    assert {m["body"] for m in got} >= {f"sdk-{i}" for i in range(1, 20, 2)}


def test_cpp_produces_sdk_consumes(cpp_client: CppClientRunner, cometmq_server: Server) -> None:
    server = cometmq_server()
    server.create_topic("MixB")
    sent = cpp_client.run("produce", namesrv=server.namesrv, topic="MixB", count=30, tags="TagX,TagY",
                          keys="key-{i}", body="cpp-{i}").messages
    assert len(sent) == 30

    async def consume() -> list[MessageExt]:
        received: list[MessageExt] = []
        done = asyncio.Event()

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            received.extend(msgs)
            if len(received) >= 15:
                done.set()
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer("CG_mix_sdk", namesrv=server.namesrv, consume_from="first", listener=listener)
        consumer.subscribe("MixB", "TagX")
        async with consumer:
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(0.5)  # nothing else should arrive
        return received

    got = asyncio.run(consume())
    want = [s for s in sent if s["tags"] == "TagX"]
    assert len(want) == 15
    assert Counter(m.msg_id for m in got) == Counter(s["msg_id"] for s in want)
    assert {m.body.decode() for m in got} == {f"cpp-{s['index']}" for s in want}
    assert all(m.tags == "TagX" and m.keys == [f"key-{int(m.body[4:])}"] for m in got)
