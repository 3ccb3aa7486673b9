from __future__ import annotations

import asyncio
import contextlib
import os
import time
import zlib
from collections.abc import AsyncIterator

import pytest

from cometmq.client import (
    Admin,
    BrokerError,
    ClientStateError,
    ClientTimeoutError,
    InvalidArgumentError,
    Message,
    MessageQueue,
    NoRouteError,
    Producer,
    SendResult,
)
from cometmq.client.instance import ClientInstance
from cometmq.client.message import SendStatus
from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch_raw
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.message import iter_records
from cometmq.protocol.remoting import decode, make_request
from cometmq.protocol.route import DataVersion, RegisterBrokerBody, TopicConfig, body_crc32
from tests.kit.faultproxy import Direction, FaultProxy
from tests.kit.wait import eventually

from .conftest import Cluster


def stored(cluster: Cluster, topic: str, queue_id: int, broker: int = 0) -> list[object]:
    store = cluster.brokers[broker].store
    r = store.get_messages(topic, queue_id, 0, 1000, max_bytes=1 << 24)
    return list(iter_records(b"".join(bytes(v) for v in r.buffers)))


async def test_send_sets_tags_keys_and_unique_id(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        r = await p.send(Message("T", b"hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}))
    assert r.ok and len(r.msg_id) == 32 and len(r.offset_msg_id) == 32
    [rec] = stored(cluster, "T", r.queue.queue_id)
    assert rec.body == b"hello"  # type: ignore[attr-defined]
    assert rec.properties["TAGS"] == "TagA" and rec.properties["KEYS"] == "k1 k2"  # type: ignore[attr-defined]
    assert rec.properties["UNIQ_KEY"] == r.msg_id and rec.properties["color"] == "red"  # type: ignore[attr-defined]


async def test_queues_round_robin_and_selectors(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        results = [await p.send(Message("RR", f"{i}".encode())) for i in range(8)]
        assert sorted({r.queue.queue_id for r in results}) == [0, 1, 2, 3]
        ordered = [await p.send_orderly(Message("RR", f"o{i}".encode()), "order-7") for i in range(5)]
        assert len({r.queue for r in ordered}) == 1
        assert [r.queue_offset for r in ordered] == sorted(r.queue_offset for r in ordered)
        chosen = MessageQueue("RR", "broker-a", 3)
        r = await p.send(Message("RR", b"chosen"), queue=chosen)
        assert r.queue == chosen
        r = await p.send(Message("RR", b"picked"), selector=lambda qs, m, arg: qs[arg], arg=2)
        assert r.queue.queue_id == 2


async def test_send_batch_body_stores_a_body_encoded_outside(cluster: Cluster) -> None:
    """The columnar writers' path: ids from reserve_msg_ids, a body in encode_batch_raw's layout, one status."""
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        prefix, first = p.reserve_msg_ids(3)
        ids = [f"{prefix}{first + i:012X}" for i in range(3)]
        # reserved values are not handed out twice (the next is first + 3, or later once the clock's ms moved on)
        assert p.reserve_msg_ids(1)[1] >= first + 3
        body = encode_batch_raw([(f"e{i}".encode(), f"TAGS\x01t\x02UNIQ_KEY\x01{k}\x02WAIT\x01true\x02".encode(), 0)
                                 for i, k in enumerate(ids)])
        q = MessageQueue("E", "broker-a", 1)
        assert await p.send_batch_body(q, body) is SendStatus.SEND_OK
        with pytest.raises(InvalidArgumentError, match="empty"):
            await p.send_batch_body(q, b"")
        with pytest.raises(InvalidArgumentError, match="not a valid topic"):
            await p.send_batch_body(MessageQueue("bad topic", "broker-a", 0), body)
    recs = stored(cluster, "E", 1)
    assert [(r.body, r.properties["UNIQ_KEY"], r.properties["TAGS"]) for r in recs] == \
        [(f"e{i}".encode(), k, "t") for i, k in enumerate(ids)]  # type: ignore[attr-defined]


async def test_batch_async_oneway_and_compression(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr, max_batch_bytes=2000) as p:
        q = MessageQueue("B", "broker-a", 0)
        results = await p.send_batch([Message("B", f"m{i}".encode() * 50) for i in range(20)], queue=q)
        assert len(results) == 20 and [r.queue_offset for r in results] == list(range(20))
        assert len({r.msg_id for r in results}) == 20
        done: list[SendResult | None] = []
        event = asyncio.Event()

        def callback(result: SendResult | None, error: BaseException | None) -> None:
            done.append(result)
            event.set()

        p.send_async(Message("B", b"async"), callback, queue=q)
        await asyncio.wait_for(event.wait(), 10)
        assert done[0] is not None and done[0].ok
        await p.send_oneway(Message("B", b"oneway"))
        big = b"0123456789" * 1000
        assert (await p.send(Message("B", big), queue=q)).ok
    recs = stored(cluster, "B", 0)
    last = recs[-1]
    assert last.sys_flag & 1 and zlib.decompress(last.body) == big  # type: ignore[attr-defined]
    assert [x.body for x in recs[:20]] == [f"m{i}".encode() * 50 for i in range(20)]  # type: ignore[attr-defined]


async def test_a_body_compression_does_not_shrink_goes_as_it_is(cluster: Cluster) -> None:
    """A body of maxMessageSize (4 MiB) that does not compress (random bytes) was sent compressed, zlib's framing
    making it 1286 bytes longer, and the broker refused it (MESSAGE_ILLEGAL) though the producer's own check let it
    pass. Now a body goes compressed only when that makes it shorter; one that compresses still does."""
    noise, text = os.urandom(4 << 20), b"0123456789" * 1000
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        q = MessageQueue("Noise", "broker-a", 0)
        assert (await p.send(Message("Noise", noise), queue=q)).ok
        assert (await p.send(Message("Noise", text), queue=q)).ok
    recs = stored(cluster, "Noise", 0)
    assert [r.sys_flag & 1 for r in recs] == [0, 1]
    assert recs[0].body == noise and zlib.decompress(recs[1].body) == text


async def test_errors_are_clear_and_early(cluster: Cluster) -> None:
    p = Producer("pg", namesrv=cluster.namesrv_addr)
    with pytest.raises(ClientStateError):
        await p.send(Message("T", b"x"))
    async with p:
        with pytest.raises(InvalidArgumentError, match="topic"):
            await p.send(Message("bad topic", b"x"))
        with pytest.raises(InvalidArgumentError, match="empty"):
            await p.send(Message("T", b""))
        with pytest.raises(InvalidArgumentError, match="reserved"):
            await p.send(Message("T", b"x", properties={"UNIQ_KEY": "mine"}))
        for bad in ({"a\x01b": "x"}, {"k": "v\x02w"}, {"": "x"}, {1: "x"}):  # (the wire's separators; a key)
            with pytest.raises(InvalidArgumentError, match="property"):
                await p.send(Message("T", b"x", properties=bad))  # type: ignore[arg-type]
        for tags, keys in (("t\x01", None), (None, "k\x02")):
            with pytest.raises(InvalidArgumentError, match="property"):
                await p.send(Message("T", b"x", tags=tags, keys=keys))
        for level in (2.5, True, "3"):  # (the broker refuses a DELAY that is not an integer: MESSAGE_ILLEGAL)
            with pytest.raises(InvalidArgumentError, match="delay_level"):
                await p.send(Message("T", b"x", delay_level=level))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="one topic"):
            await p.send_batch([Message("T", b"x"), Message("U", b"y")])
        with pytest.raises(BrokerError) as info:
            await p.send(Message("T", b"x"), queue=MessageQueue("T", "broker-a", 99))
        assert "queueId 99" in str(info.value) and info.value.addr == cluster.brokers[0].addr
    with pytest.raises(InvalidArgumentError):
        Producer("pg")
    for bad in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:0065536"):  # (no port for TCP to connect to)
        with pytest.raises(InvalidArgumentError, match="not host:port"):
            Producer("pg", namesrv=f"{cluster.namesrv_addr};{bad}")


async def test_no_route_without_auto_create(cluster: Cluster) -> None:
    for b in cluster.brokers:
        await b.stop()
    cluster.brokers.clear()
    await cluster.add_broker("strict", auto_create_topic_enable=False)
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        with pytest.raises(NoRouteError, match="Nowhere"):
            await p.send(Message("Nowhere", b"x"))


@pytest.mark.parametrize("auto_batch", [False, True])
async def test_a_send_retried_after_a_lost_answer_keeps_its_message_id(cluster: Cluster, auto_batch: bool) -> None:
    """As RocketMQ sets a message's UNIQ_KEY once per send: when the answer to a stored send is lost and the send
    is retried, the broker holds the message twice under one id, which a consumer can drop as a duplicate. (The
    answer is lost with its connection: a send that timed out has spent its timeout, and is not retried.)"""
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("Dup")  # known to the nameserver: no route lookup after the first send
    host, port = cluster.brokers[0].addr.rsplit(":", 1)
    async with FaultProxy((host, int(port))) as proxy, \
            Producer("pg", namesrv=cluster.namesrv_addr, retries=1, auto_batch=auto_batch) as p:
        await p.send(Message("Dup", b"warm-up"))  # the route is known
        p.instance.brokers["broker-a"] = {0: proxy.addr}  # the sends go through the proxy
        proxy.blackhole(Direction.DOWN)  # the first attempt is stored, its answer held back

        def copies() -> list[object]:
            return [r for q in range(4) for r in stored(cluster, "Dup", q) if r.body == b"twice"]  # type: ignore

        sending = asyncio.ensure_future(p.send(Message("Dup", b"twice"), timeout=10))
        await eventually(lambda: len(copies()) == 1, what="the first attempt stored")
        proxy.reset()  # the connection goes, with the answer: the retry (to the broker the route names) is answered
        proxy.heal()
        result = await sending
        assert len(copies()) == 2
    ids = {r.properties["UNIQ_KEY"] for r in copies()}  # type: ignore[attr-defined]
    assert ids == {result.msg_id}


@contextlib.asynccontextmanager
async def silent_broker(cluster: Cluster, topic: str) -> AsyncIterator[list[int]]:
    """A real TCP server that takes requests and never answers, registered at the nameserver (as a broker does)
    as the master of ``topic``'s only broker; yields the codes of the requests it got."""
    codes: list[int] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readexactly(4)
                codes.append(decode(head + await reader.readexactly(int.from_bytes(head, "big"))).code)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    body = RegisterBrokerBody((TopicConfig(topic, 4, 4),), DataVersion(1, 1)).encode(False)
    try:
        async with RemotingClient() as client:  # (open while registered: the nameserver drops a broker whose
            r = await client.invoke(cluster.namesrv_addr, make_request(RequestCode.REGISTER_BROKER, {  # link closed)
                "brokerName": "broker-silent", "brokerAddr": addr, "clusterName": "DefaultCluster",
                "haServerAddr": addr, "brokerId": 0, "compressed": "false", "bodyCrc32": body_crc32(body)}, body))
            assert r.code == 0, r.remark
            yield codes
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("auto_batch", [False, True])
async def test_the_send_timeout_is_a_budget_for_the_whole_send(cluster: Cluster, auto_batch: bool) -> None:
    """As RocketMQ's sendDefaultImpl: each attempt gets what is left of the send's timeout, and none is made once
    it ran out ("sendDefaultImpl call timeout"). Each attempt had the whole timeout: with retries=2, a send to a
    broker that never answers took three timeouts. With auto_batch, three concurrent sends go as one batch, and
    that batch's attempts share its timeout the same way."""
    timeout, sends = 2.0, 3 if auto_batch else 1
    async with silent_broker(cluster, "Silent") as codes, \
            Producer("pg", instance=ClientInstance(cluster.namesrv_addr, request_timeout=0.5), retries=2,
                     auto_batch=auto_batch) as p:  # (request_timeout: its unregistering at close is not answered)
        begin = time.monotonic()
        outcomes = await asyncio.gather(*(p.send(Message("Silent", f"m{i}".encode()), timeout=timeout)
                                          for i in range(sends)), return_exceptions=True)
        took = time.monotonic() - begin
    assert all(isinstance(o, ClientTimeoutError) and "Silent" in str(o) for o in outcomes), outcomes
    assert timeout <= took < 2 * timeout, took  # three attempts took three timeouts (a generous bound: no hang)
    sent = [c for c in codes if c in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)]
    assert len(sent) < 3 and (not auto_batch or RequestCode.SEND_BATCH_MESSAGE in sent), codes


async def test_the_send_timeout_is_one_budget_for_a_whole_send_batch(cluster: Cluster) -> None:
    """send_batch cuts a batch past max_batch_bytes into requests sent one after the other; each request had the
    whole timeout, so three slow answers (0.4 s each) made a 1 s send_batch take 1.2 s and succeed. As send's, the
    timeout is now one budget for the whole call: the third request gets what is left (0.2 s) and the call ends
    with ClientTimeoutError at its timeout, saying how many messages went before."""
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("Slow")
    host, port = cluster.brokers[0].addr.rsplit(":", 1)
    msgs = [Message("Slow", bytes(300)) for _ in range(6)]  # (500 bytes each by batch_chunks' estimate)
    async with FaultProxy((host, int(port))) as proxy, \
            Producer("pg", namesrv=cluster.namesrv_addr, max_batch_bytes=1000) as p:
        q = MessageQueue("Slow", "broker-a", 0)
        await p.send(Message("Slow", b"warm-up"), queue=q)  # the route is known
        p.instance.brokers["broker-a"] = {0: proxy.addr}  # the sends go through the proxy
        proxy.delay(0.2, Direction.BOTH)  # 0.4 s a request
        begin = time.monotonic()
        with pytest.raises(ClientTimeoutError, match=r"send_batch to Slow ran out of its 1s: 4 of its 6 messages"):
            await p.send_batch(msgs, queue=q, timeout=1.0)
        took = time.monotonic() - begin
        assert 1.0 <= took < 1.15, took
        # a batch within its budget goes whole
        proxy.heal()
        assert len(await p.send_batch(msgs, queue=q, timeout=1.0)) == 6


async def test_send_batch_counts_what_messages_give_besides_their_bodies(cluster: Cluster) -> None:
    """send_batch cuts a batch into requests of max_batch_bytes; it counted each message as its body and 200 bytes,
    so 300 small messages carrying 16 KiB of properties each (4.8 MiB in all) went as one request, which the broker
    refused (over its 4 MiB max message size). Tags, keys and user properties are counted now."""
    msgs = [Message("Heavy", f"m{i}".encode(), tags="t", keys=["k", f"key-{i}"], properties={"blob": "ü" * 8192})
            for i in range(300)]
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        q = MessageQueue("Heavy", "broker-a", 0)
        results = await p.send_batch(msgs, queue=q)
        assert [r.queue_offset for r in results] == list(range(300))
    recs = stored(cluster, "Heavy", 0)
    assert [r.body for r in recs] == [m.body for m in msgs]  # type: ignore[attr-defined]
