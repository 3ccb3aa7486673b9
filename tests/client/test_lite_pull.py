"""The lite-pull consumer against an in-process nameserver + broker(s)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import pickle
import time
import zlib

import pytest

from cometmq.client import (
    Admin,
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageQueue,
    NoRouteError,
    Producer,
    SendResult,
)
from cometmq.client.lite_pull_consumer import decode_pulled
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MessageRecord, encode_record, iter_records
from cometmq.protocol.remoting import RemotingCommand
from tests.kit import eventually

from .conftest import Cluster


async def make_topic(cluster: Cluster, topic: str, queues: int = 2) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, read_queues=queues)


async def send(cluster: Cluster, topic: str, n: int, *, queue: MessageQueue | None = None, tags: str | None = None,
               prefix: str = "m") -> list[SendResult]:
    async with Producer("lite-pg", namesrv=cluster.namesrv_addr) as p:
        return [await p.send(Message(topic, f"{prefix}{i}".encode(), tags=tags, keys=f"k{i}"), queue=queue)
                for i in range(n)]


async def poll_n(c: LitePullConsumer, n: int, timeout: float = 10.0, **kw: int) -> list[MessageExt]:
    got: list[MessageExt] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < n:
        if loop.time() > deadline:
            raise AssertionError(f"got {len(got)} of {n} messages")
        got += await c.poll(0.5, **kw)
    return got


def consumer(cluster: Cluster, group: str = "lite-g", **kw: object) -> LitePullConsumer:
    kw.setdefault("long_poll_timeout", 2.0)
    kw.setdefault("error_backoff", 0.1)
    return LitePullConsumer(group, namesrv=cluster.namesrv_addr, **kw)  # type: ignore[arg-type]


# -- records ------------------------------------------------------------------------------------------------
async def test_subscribe_polls_everything_with_every_field_right(cluster: Cluster) -> None:
    await make_topic(cluster, "LT", 2)
    sent = await send(cluster, "LT", 10, tags="TagA")
    async with consumer(cluster, consume_from="first") as c:
        await c.subscribe("LT")
        assert c.assignment() == [MessageQueue("LT", "broker-a", 0), MessageQueue("LT", "broker-a", 1)]
        got = await poll_n(c, 10)
        assert await c.poll(0.05) == []
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(10))
    by_id = {r.msg_id: r for r in sent}
    store = cluster.brokers[0].store
    for m in got:
        r = by_id[m.msg_id]
        assert isinstance(m, MessageExt)
        assert (m.topic, m.queue, m.queue_offset, m.offset_msg_id) == ("LT", r.queue, r.queue_offset, r.offset_msg_id)
        assert m.tags == "TagA" and m.keys == [f"k{m.body.decode()[1:]}"]
        # Every lazily decoded field equals what the eager decoder makes of the same stored record.
        view = store.read_record(m.commit_log_offset)
        assert view is not None
        [rec] = list(iter_records(bytes(view)))
        assert m == MessageExt.from_record(rec, "broker-a")
        assert m.born_host.startswith("127.0.0.1:") and m.store_host == cluster.brokers[0].addr
        assert m.store_timestamp >= m.born_timestamp > 0 and m.reconsume_times == 0 and m.flag == 0
    # A pickled or copied message is a plain MessageExt with the same fields.
    plain = pickle.loads(pickle.dumps(got[0]))
    assert type(plain) is MessageExt and plain == got[0] and copy.copy(got[0]) == got[0]
    assert repr(got[0]).startswith("MessageExt(topic='LT'")


def test_decode_pulled_handles_compression_and_refuses_garbage() -> None:
    q = MessageQueue("T", "b", 0)
    recs = [MessageRecord("T", zlib.compress(b"big" * 100), sys_flag=1, queue_offset=7, physical_offset=99,
                          properties={"UNIQ_KEY": "A" * 32}),
            MessageRecord("T", b"", queue_offset=8, properties={})]
    body = b"".join(encode_record(r) for r in recs)
    a, b = decode_pulled(body, q)
    assert a.body == b"big" * 100 and a.sys_flag == 0 and a.queue_offset == 7 and a.msg_id == "A" * 32
    assert b.body == b"" and b.properties == {} and b.msg_id == b.offset_msg_id and b.queue_offset == 8
    assert decode_pulled(b"", q) == []
    # dataclasses.replace (the push consumer's local retry, a listener's own copy) gives a plain MessageExt
    again = dataclasses.replace(a, reconsume_times=a.reconsume_times + 1)
    assert type(again) is MessageExt and again.reconsume_times == 1 and again.body == a.body
    assert dataclasses.replace(again, reconsume_times=0) == a and again != a
    with pytest.raises(ProtocolError, match="truncated"):
        decode_pulled(body[:-5], q)
    with pytest.raises(ProtocolError, match="malformed"):
        decode_pulled(b"\x00" * 200, q)


@pytest.mark.parametrize(("born", "store"), [(("::1", 5), ("10.0.0.1", 9)), (("10.0.0.2", 5), ("2001:db8::1", 9)),
                                             (("fe80::7", 5), ("::1", 9))])
def test_decode_pulled_reads_records_with_ipv6_hosts(born: tuple[str, int], store: tuple[str, int]) -> None:
    """An IPv6 host moves the fields after it; mixed with IPv4 records, every lazy field is what the eager decoder
    makes of the same record, hosts as ``[ip]:port``."""
    q = MessageQueue("T", "b", 0)
    recs = [MessageRecord("T", zlib.compress(b"z" * 50), sys_flag=1, queue_offset=1, physical_offset=300,
                          born_host=born, store_host=store, born_timestamp=7, store_timestamp=8, reconsume_times=2,
                          flag=4, properties={"UNIQ_KEY": "A" * 32, "TAGS": "t"}),
            MessageRecord("T", b"plain", queue_offset=2, physical_offset=600, properties={}),
            MessageRecord("T", b"", queue_offset=3, physical_offset=900, born_host=born, store_host=store)]
    body = b"".join(encode_record(r) for r in recs)
    got = decode_pulled(body, q)
    assert [m.body for m in got] == [b"z" * 50, b"plain", b""]
    for m, rec in zip(got, iter_records(body), strict=True):
        assert m == MessageExt.from_record(rec, "b")
    a, _, c = got
    assert a.born_host == (f"[{born[0]}]:5" if ":" in born[0] else f"{born[0]}:5")
    assert a.store_host == (f"[{store[0]}]:9" if ":" in store[0] else f"{store[0]}:9")
    assert (a.store_timestamp, a.reconsume_times, a.flag, a.tags, a.msg_id) == (8, 2, 4, "t", "A" * 32)
    assert c.msg_id == c.offset_msg_id and len(c.offset_msg_id) == (56 if ":" in store[0] else 32)
    with pytest.raises(ProtocolError, match="malformed"):  # claims two IPv6 hosts it has no room for
        decode_pulled(encode_record(MessageRecord("T", b"", sys_flag=0))[:36] + b"\x00\x00\x00\x30"
                      + bytes(52), q)


async def test_tag_filter_and_max_messages_split_batches(cluster: Cluster) -> None:
    await make_topic(cluster, "LF", 1)
    q = MessageQueue("LF", "broker-a", 0)
    async with Producer("lite-pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(12):
            await p.send(Message("LF", f"{i}".encode(), tags="a" if i % 2 == 0 else "b"), queue=q)
    async with consumer(cluster, consume_from="first", auto_commit=False) as c:
        await c.subscribe("LF", "a")
        first = await c.poll(5.0, max_messages=2)
        assert [m.body for m in first] == [b"0", b"2"]
        assert c.position(q) == 3  # after the last message returned, not after the whole batch
        rest = await poll_n(c, 4)
        assert [m.body for m in rest] == [b"4", b"6", b"8", b"10"]
        assert all(m.tags == "a" for m in rest)
        assert c.position(q) == 12  # filtered messages at the end are skipped too
        with pytest.raises(InvalidArgumentError):
            await c.poll(0.1, max_messages=0)


async def test_tags_are_trimmed_as_java_trims_them(cluster: Cluster) -> None:
    # RocketMQ String.trim()s each tag of an expression: chars <= ' ' only; U+3000 and U+00A0 are part of the tag.
    await make_topic(cluster, "LJ", 1)
    q = MessageQueue("LJ", "broker-a", 0)
    async with Producer("lite-pg", namesrv=cluster.namesrv_addr) as p:
        for i, tag in enumerate(["a", "a\u3000", "a\xa0", "b"]):
            await p.send(Message("LJ", f"{i}".encode(), tags=tag), queue=q)
    async with consumer(cluster, consume_from="first", auto_commit=False) as c:
        await c.subscribe("LJ", "\ta\u3000 || a\xa0\x00")
        got = await poll_n(c, 2)
        assert [m.body for m in got] == [b"1", b"2"]


# -- where consumption starts ----------------------------------------------------------------------------------
async def test_consume_from_last_first_and_timestamp(cluster: Cluster) -> None:
    await make_topic(cluster, "LS", 1)
    await send(cluster, "LS", 3, prefix="old")
    await asyncio.sleep(0.02)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.02)
    await send(cluster, "LS", 2, prefix="mid")
    async with consumer(cluster, "g-last") as c:
        await c.subscribe("LS")
        assert await c.poll(0.3) == []
        await send(cluster, "LS", 1, prefix="new")
        assert [m.body for m in await poll_n(c, 1)] == [b"new0"]
    async with consumer(cluster, "g-first", consume_from="first") as c:
        await c.subscribe("LS")
        assert len(await poll_n(c, 6)) == 6
    async with consumer(cluster, "g-ts", consume_from=middle) as c:
        await c.subscribe("LS")
        assert [m.body for m in await poll_n(c, 3)] == [b"mid0", b"mid1", b"new0"]
    with pytest.raises(InvalidArgumentError):
        consumer(cluster, consume_from="yesterday")


async def test_long_poll_wakes_on_arrival(cluster: Cluster) -> None:
    await make_topic(cluster, "LW", 1)
    async with consumer(cluster, long_poll_timeout=10.0) as c:
        await c.subscribe("LW")
        assert await c.poll(0.2) == []  # the pull is now held by the broker
        loop = asyncio.get_running_loop()
        waiter = asyncio.ensure_future(c.poll(5.0))
        await asyncio.sleep(0.1)
        t0 = loop.time()
        await send(cluster, "LW", 1)
        got = await waiter
        assert [m.body for m in got] == [b"m0"] and loop.time() - t0 < 1.0


# -- assign, errors ------------------------------------------------------------------------------------------------
async def test_assign_reads_only_the_given_queues_and_rejects_bad_ones(cluster: Cluster) -> None:
    await make_topic(cluster, "LA", 4)
    q1, q3 = MessageQueue("LA", "broker-a", 1), MessageQueue("LA", "broker-a", 3)
    for q in (MessageQueue("LA", "broker-a", i) for i in range(4)):
        await send(cluster, "LA", 2, queue=q, prefix=f"q{q.queue_id}-")
    async with consumer(cluster, consume_from="first") as c:
        await c.assign([q1, q3])
        assert c.assignment() == [q1, q3]
        got = await poll_n(c, 4)
        assert {m.queue for m in got} == {q1, q3} and await c.poll(0.2) == []
        with pytest.raises(InvalidArgumentError, match="out of range: LA has 4 readable queues"):
            await c.assign([MessageQueue("LA", "broker-a", 9)])
        with pytest.raises(InvalidArgumentError, match="broker-x"):
            await c.assign([MessageQueue("LA", "broker-x", 0)])
        with pytest.raises(NoRouteError, match="Missing"):
            await c.assign([MessageQueue("Missing", "broker-a", 0)])
        assert c.assignment() == [q1, q3]  # a refused assignment changes nothing
        with pytest.raises(ClientStateError, match="cannot be mixed"):
            await c.subscribe("LA")
        with pytest.raises(InvalidArgumentError, match="not assigned"):
            await c.seek(MessageQueue("LA", "broker-a", 0), 0)
        with pytest.raises(InvalidArgumentError, match="MessageQueue"):
            await c.assign(["LA"])  # type: ignore[list-item]
        await c.assign([q1])  # re-assigning drops the others
        assert c.assignment() == [q1]


async def test_errors_before_start_and_for_unknown_topics(cluster: Cluster) -> None:
    c = consumer(cluster)
    with pytest.raises(ClientStateError, match="not started"):
        await c.poll(0.1)
    with pytest.raises(ClientStateError, match="not started"):
        await c.commit()
    with pytest.raises(InvalidArgumentError, match="topic"):
        await c.subscribe("bad topic")
    with pytest.raises(InvalidArgumentError):
        LitePullConsumer("g")  # no nameserver
    with pytest.raises(InvalidArgumentError, match="group"):
        LitePullConsumer("bad group", namesrv=cluster.namesrv_addr)
    with pytest.raises(InvalidArgumentError, match="pull_batch_size"):
        LitePullConsumer("g", namesrv=cluster.namesrv_addr, pull_batch_size=0)
    await c.subscribe("NoSuchTopic")
    with pytest.raises(NoRouteError, match="NoSuchTopic"):
        await c.start()
    assert not c.started
    await make_topic(cluster, "LE", 1)
    async with consumer(cluster, "g-e2") as c2:
        await c2.subscribe("LE")
        with pytest.raises(NoRouteError, match="NoSuchTopic"):
            await c2.subscribe("NoSuchTopic")
        assert c2.assignment() == [MessageQueue("LE", "broker-a", 0)]


async def test_a_refused_pull_is_raised_by_poll_once(cluster: Cluster) -> None:
    await make_topic(cluster, "LR", 1)
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_subscription_group("g-off", consume_enable=False)
    async with consumer(cluster, "g-off") as c:
        await c.subscribe("LR")
        with pytest.raises(BrokerError, match="may not consume") as info:
            await c.poll(5.0)
        assert info.value.addr == cluster.brokers[0].addr and "LR/broker-a/0" in str(info.value)
        assert await c.poll(0.3) == []  # the same refusal is not raised again
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            await admin.create_subscription_group("g-off", consume_enable=True)
        await send(cluster, "LR", 1)
        assert len(await poll_n(c, 1)) == 1  # the pull was retried all along



async def test_a_pull_that_raises_anything_is_retried(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """A pull that raises something other than an SDK or protocol error (an OSError the client instance did not
    map, a bug) is logged and retried after ``error_backoff``. The pull loop caught only MQClientError,
    ProtocolError, KeyError and ValueError: anything else ended the queue's pull task, and the queue was never
    read again while the consumer went on as if it were."""
    await make_topic(cluster, "LX", 1)
    async with consumer(cluster, "g-x", consume_from="first") as c:
        faults: list[Exception] = [ConnectionResetError(104, "Connection reset by peer"), RuntimeError("a bug")]
        invoke = c.instance.invoke

        async def invoke_after_faults(addr: str, cmd: RemotingCommand, timeout: float | None = None,
                                      context: str = "") -> RemotingCommand:
            if cmd.code == RequestCode.PULL_MESSAGE and faults:  # the one thing made up: broker and consumer are real
                raise faults.pop(0)
            return await invoke(addr, cmd, timeout, context)

        c.instance.invoke = invoke_after_faults  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="cometmq.client.lite_pull_consumer"):
            await c.subscribe("LX")
            await eventually(lambda: not faults, 10.0, what="both faults raised")
            await send(cluster, "LX", 3)
            got = await poll_n(c, 3)
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
    logged = [r for r in caplog.records if "pull of LX/broker-a/0 raised" in r.getMessage()]
    assert len(logged) == 2 and "ConnectionResetError" in logged[0].getMessage()
    assert all(r.exc_info is not None for r in logged)  # two different errors: each with its traceback

# -- seek ---------------------------------------------------------------------------------------------------
async def test_seek_to_offsets_beginning_end_and_time(cluster: Cluster) -> None:
    await make_topic(cluster, "LK", 1)
    q = MessageQueue("LK", "broker-a", 0)
    await send(cluster, "LK", 5, prefix="a")
    await asyncio.sleep(0.02)
    ts = int(time.time() * 1000)
    await asyncio.sleep(0.02)
    await send(cluster, "LK", 3, prefix="b")
    async with consumer(cluster, consume_from="first", auto_commit=False) as c:
        await c.subscribe("LK")
        assert len(await poll_n(c, 8)) == 8
        await c.seek(q, 2)
        assert c.position(q) == 2
        assert [m.queue_offset for m in await poll_n(c, 6)] == [2, 3, 4, 5, 6, 7]
        await c.seek_to_beginning(q)
        assert (await poll_n(c, 8))[0].body == b"a0"
        await c.seek_to_timestamp(None, ts)
        assert [m.body for m in await poll_n(c, 3)] == [b"b0", b"b1", b"b2"]
        assert await c.offset_for_timestamp(q, ts) == 5
        await c.seek_to_end()
        assert await c.poll(0.2) == [] and c.position(q) == 8
        with pytest.raises(InvalidArgumentError, match=r"outside \[0, 8\]"):
            await c.seek(q, 9)
        with pytest.raises(InvalidArgumentError):
            await c.seek(q, "3")  # type: ignore[arg-type]
        # A seek while messages sit in the buffer drops them: poll returns what follows the seek.
        await c.seek(q, 0)
        await eventually(lambda: c._buffered > 0, what="buffered messages")
        await c.seek(q, 6)
        assert [m.queue_offset for m in await poll_n(c, 2)] == [6, 7]


async def test_seek_interrupts_a_held_long_poll(cluster: Cluster) -> None:
    await make_topic(cluster, "LH", 1)
    q = MessageQueue("LH", "broker-a", 0)
    await send(cluster, "LH", 2)
    async with consumer(cluster, consume_from="last", long_poll_timeout=30.0) as c:
        await c.subscribe("LH")
        assert await c.poll(0.3) == []  # at the end, held by the broker for up to 30 s
        await c.seek(q, 0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert len(await poll_n(c, 2)) == 2 and loop.time() - t0 < 2.0


# -- commits ----------------------------------------------------------------------------------------------------
async def test_commit_sync_async_explicit_and_resume(cluster: Cluster) -> None:
    await make_topic(cluster, "LC", 1)
    q = MessageQueue("LC", "broker-a", 0)
    await send(cluster, "LC", 6)
    async with consumer(cluster, "g-c", consume_from="first", auto_commit=False) as c:
        await c.subscribe("LC")
        assert await c.committed(q) is None
        await poll_n(c, 4, max_messages=4)
        assert c.position(q) == 4 and await c.committed(q) is None  # polled, not yet committed
        await c.commit()
        assert await c.committed(q) == 4
        await poll_n(c, 2)
        seen: list[BaseException | None] = []
        await c.commit_async(seen.append)
        assert seen == [None] and await c.committed(q) == 6
        await c.commit({q: 1})
        assert await c.committed(q) == 1
        with pytest.raises(InvalidArgumentError):
            await c.commit({q: -1})
    # Without auto-commit, close commits nothing: a new consumer of the group resumes at the committed 1.
    async with consumer(cluster, "g-c", consume_from="first", auto_commit=False) as c:
        await c.subscribe("LC")
        assert [m.queue_offset for m in await poll_n(c, 5)] == [1, 2, 3, 4, 5]
        assert c.position(q) == 6
    assert (await LitePullConsumer_committed(cluster, "g-c", q)) == 1


async def LitePullConsumer_committed(cluster: Cluster, group: str, q: MessageQueue) -> int | None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        return await admin.committed_offset(group, q)


async def test_auto_commit_every_interval_and_on_close(cluster: Cluster) -> None:
    await make_topic(cluster, "LU", 1)
    q = MessageQueue("LU", "broker-a", 0)
    await send(cluster, "LU", 5)
    async with consumer(cluster, "g-u", consume_from="first", auto_commit_interval=0.1) as c:
        await c.subscribe("LU")
        await poll_n(c, 3, max_messages=3)
        committed: list[int | None] = []

        async def check() -> bool:
            committed.append(await c.committed(q))
            return committed[-1] == 3

        for _ in range(100):
            if await check():
                break
            await asyncio.sleep(0.05)
        assert committed[-1] == 3
        await poll_n(c, 2)
    assert await LitePullConsumer_committed(cluster, "g-u", q) == 5  # the last two were committed on close
    async with consumer(cluster, "g-u", consume_from="first") as c:
        await c.subscribe("LU")
        assert await c.poll(0.3) == []


# -- flow control, pause, routes ------------------------------------------------------------------------------------
async def test_the_buffer_is_bounded_and_pause_stops_pulling(cluster: Cluster) -> None:
    await make_topic(cluster, "LB", 2)
    q0, q1 = MessageQueue("LB", "broker-a", 0), MessageQueue("LB", "broker-a", 1)
    await send(cluster, "LB", 100, queue=q0)
    await send(cluster, "LB", 100, queue=q1)
    async with consumer(cluster, consume_from="first", pull_batch_size=10, pull_threshold_for_queue=20,
                        pull_threshold_for_all=30) as c:
        await c.subscribe("LB")
        await eventually(lambda: c._buffered >= 30, what="a full buffer")
        await asyncio.sleep(0.2)
        assert c._buffered <= 40 and all(st.buffered <= 30 for st in c._states.values())
        c.pause([q1])
        got: list[MessageExt] = []
        while sum(m.queue == q0 for m in got) < 100:
            got += await c.poll(1.0)
        paused_seen = sum(m.queue == q1 for m in got)
        assert paused_seen <= 30  # what was buffered or in flight when the queue was paused
        assert await c.poll(0.3) == []
        c.resume([q1])
        rest = await poll_n(c, 100 - paused_seen, timeout=10)
        assert len({(m.queue, m.queue_offset) for m in got + rest}) == 200


async def test_subscription_follows_route_changes(cluster: Cluster) -> None:
    await make_topic(cluster, "LQ", 1)
    async with consumer(cluster, consume_from="first", route_refresh_interval=0.1) as c:
        await c.subscribe("LQ")
        assert len(c.assignment()) == 1
        await make_topic(cluster, "LQ", 3)
        await eventually(lambda: len(c.assignment()) == 3, what="three queues")
        await send(cluster, "LQ", 1, queue=MessageQueue("LQ", "broker-a", 2))
        [m] = await poll_n(c, 1)
        assert m.queue.queue_id == 2
        await c.unsubscribe("LQ")
        assert c.assignment() == []


async def test_two_brokers_and_a_changed_expression(cluster: Cluster) -> None:
    await cluster.add_broker("broker-b")
    await make_topic(cluster, "L2", 2)
    await send(cluster, "L2", 8, tags="x")
    async with consumer(cluster, consume_from="first") as c:
        await c.subscribe("L2")
        assert {q.broker_name for q in c.assignment()} == {"broker-a", "broker-b"}
        got = await poll_n(c, 8)
        assert {m.queue.broker_name for m in got} == {"broker-a", "broker-b"}
        await c.subscribe("L2", "y")  # only tag y from now on, from where the old expression stopped
        await send(cluster, "L2", 2, tags="x")
        await send(cluster, "L2", 1, tags="y", prefix="y")
        assert [m.body for m in await poll_n(c, 1)] == [b"y0"]
        assert await c.poll(0.2) == []


async def test_allocate_shares_the_queues_of_a_group(cluster: Cluster) -> None:
    from cometmq.client import AllocateAverage

    await make_topic(cluster, "LG", 4)
    a = consumer(cluster, "g-share", consume_from="first", allocate=AllocateAverage())
    b = consumer(cluster, "g-share", consume_from="first", allocate=AllocateAverage())
    async with a:
        await a.subscribe("LG")
        assert len(a.assignment()) == 4  # alone in the group
        async with b:
            await b.subscribe("LG")
            await eventually(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, what="a 2+2 split")
            assert set(a.assignment()).isdisjoint(b.assignment())
            await send(cluster, "LG", 40)
            got: list[MessageExt] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while len({m.msg_id for m in got}) < 40 and loop.time() < deadline:
                got += await a.poll(0.1) + await b.poll(0.1)
            assert len({m.msg_id for m in got}) == 40
        # b left: a gets every queue back
        await eventually(lambda: len(a.assignment()) == 4, what="a taking all queues back")


async def test_a_tag_whose_hash_collides_is_not_returned(cluster: Cluster) -> None:
    # "Aa" and "BB" have the same Java hash code: the broker filters by hash, the client re-checks the text.
    await make_topic(cluster, "LH", 1)
    q = MessageQueue("LH", "broker-a", 0)
    async with Producer("lite-pg", namesrv=cluster.namesrv_addr) as p:
        for i, tag in enumerate(["BB", "Aa", "BB", "Aa", "BB"]):
            await p.send(Message("LH", f"{tag}{i}".encode(), tags=tag), queue=q)
    async with consumer(cluster, consume_from="first", auto_commit=False) as c:
        await c.subscribe("LH", "Aa")
        got = await poll_n(c, 2)
        got += await c.poll(0.3)
        assert [m.body for m in got] == [b"Aa1", b"Aa3"]
    async with consumer(cluster, "lite-g2", consume_from="first", auto_commit=False) as c:
        await c.assign([q], "Aa")
        got = await poll_n(c, 2)
        got += await c.poll(0.3)
        assert [m.body for m in got] == [b"Aa1", b"Aa3"]


def test_a_pulled_record_whose_properties_run_past_its_end_is_a_protocol_error() -> None:
    """The body is checked when the record is cut out; the topic and properties after it are read lazily, and a
    record that claims more of them than it holds gives a ProtocolError there (no struct.error, no IndexError, no
    properties cut short), which the pull loops report and survive."""
    q = MessageQueue("T", "b", 0)
    good = encode_record(MessageRecord("T", b"body", queue_offset=1, properties={"TAGS": "a", "UNIQ_KEY": "K"}))
    props_len_at = len(good) - len("TAGS\x01a\x02UNIQ_KEY\x01K\x02") - 2
    for bad in (good[:props_len_at - 2] + b"\xff" + good[props_len_at - 1:],  # a topic length past the end
                good[:props_len_at] + b"\x00\x7f" + good[props_len_at + 2:]):  # a properties length past the end
        [m] = decode_pulled(bad, q)
        assert m.body == b"body"
        with pytest.raises(ProtocolError, match="properties"):
            _ = m.tags
