"""A COMPRESSED body (sysFlag 1, a zlib stream) is inflated by the consumers only up to a limit.

A stored body of a few KiB can inflate a thousandfold (4 MiB stored: ~4 GiB): every push, lite-pull, simple and
POP push consumer inflated it whole, in its memory. Now a body is inflated when it inflates to at most the
consumer's ``max_inflated_body_size`` (default 16 MiB); past it, or when it does not inflate, it is delivered as
stored with the COMPRESSED bit of ``sys_flag`` set. An inflated body has that bit cleared, as RocketMQ's
MessageDecoder does: the bit says whether ``body`` is still compressed. Nothing stops the consumer's loop.
"""

from __future__ import annotations

import asyncio
import gc
import zlib

import pytest

from cometmq.client import (
    Admin,
    ConsumeStatus,
    InvalidArgumentError,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from cometmq.client.pulled import decode_pulled, decode_pulled_within
from cometmq.client.simple_consumer import SimpleConsumer
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY, MessageRecord, encode_record, iter_records
from tests.kit import eventually

from .conftest import Cluster

LIMIT = 64 << 10
AT_LIMIT = b"a" * LIMIT
OVER = b"o" * (LIMIT + 1)
BOMB = bytes(64 << 20)  # 64 MiB of zeros: ~64 KiB stored


def _records(*bodies: bytes, sys_flag: int = 1) -> bytes:
    return b"".join(encode_record(MessageRecord("T", b, sys_flag=sys_flag, queue_offset=i, physical_offset=100 * i,
                                                properties={"UNIQ_KEY": f"U{i}"}))
                    for i, b in enumerate(bodies))


def test_decode_pulled_inflates_up_to_the_limit_and_clears_the_flag() -> None:
    q = MessageQueue("T", "b", 0)
    stored = [zlib.compress(b) for b in (AT_LIMIT, OVER, BOMB)] + [b"not zlib"]
    body = _records(*stored)
    got = decode_pulled(body, q, LIMIT)
    assert [m.body for m in got] == [AT_LIMIT, *stored[1:]]
    assert [m.sys_flag & 1 for m in got] == [0, 1, 1, 1]
    # the lazy messages are what the eager decoder makes of the same records, with the same limit
    assert got == [MessageExt.from_record(rec, "b", max_inflated_body_size=LIMIT) for rec in iter_records(body)]
    assert [m.msg_id for m in got] == ["U0", "U1", "U2", "U3"] and got[0].queue_offset == 0
    # the default: 16 MiB, four times the producers' default maxMessageSize
    assert DEFAULT_MAX_INFLATED_BODY == 16 << 20
    bomb, small = decode_pulled(_records(stored[2], zlib.compress(OVER)), q)
    assert (bomb.body, bomb.sys_flag) == (stored[2], 1) and (small.body, small.sys_flag) == (OVER, 0)
    [rec] = iter_records(_records(stored[2]))
    assert MessageExt.from_record(rec, "b").body == stored[2]


async def _send_bodies(cluster: Cluster, topic: str) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, read_queues=1, write_queues=1)
    # a producer whose max_message_size lets the 64 MiB body through: it goes compressed (64 KiB), as a 4.x one
    async with Producer("zip-pg", namesrv=cluster.namesrv_addr, max_message_size=128 << 20) as p:
        for body in (AT_LIMIT, BOMB, OVER, b"plain"):
            assert (await p.send(Message(topic, body))).ok


def _check(got: list[MessageExt]) -> None:
    assert [len(m.body) for m in got] == [LIMIT, len(zlib.compress(BOMB)), len(zlib.compress(OVER)), 5]
    assert [m.sys_flag & 1 for m in got] == [0, 1, 1, 0]
    assert got[0].body == AT_LIMIT and zlib.decompress(got[1].body) == BOMB and got[3].body == b"plain"


async def test_push_consumer_inflates_up_to_its_limit(cluster: Cluster) -> None:
    await _send_bodies(cluster, "ZipPush")
    got: list[MessageExt] = []
    done = asyncio.Event()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        if len(got) >= 4:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with pytest.raises(InvalidArgumentError, match="max_inflated_body_size"):
        PushConsumer("zip-g", namesrv=cluster.namesrv_addr, max_inflated_body_size=0)
    c = PushConsumer("zip-g", namesrv=cluster.namesrv_addr, listener=listener, consume_from="first",
                     max_concurrency=1, max_inflated_body_size=LIMIT)
    c.subscribe("ZipPush")
    async with c:
        await asyncio.wait_for(done.wait(), 15)
    _check(sorted(got, key=lambda m: m.queue_offset))


async def test_lite_pull_consumer_inflates_up_to_its_limit(cluster: Cluster) -> None:
    await _send_bodies(cluster, "ZipLite")
    with pytest.raises(InvalidArgumentError, match="max_inflated_body_size"):
        LitePullConsumer("zip-lite", namesrv=cluster.namesrv_addr, max_inflated_body_size=-1)
    got: list[MessageExt] = []
    async with LitePullConsumer("zip-lite", namesrv=cluster.namesrv_addr, consume_from="first",
                                long_poll_timeout=1.0, max_inflated_body_size=LIMIT) as c:
        await c.subscribe("ZipLite")
        for _ in range(40):
            got += await c.poll(0.5)
            if len(got) >= 4:
                break
    _check(sorted(got, key=lambda m: m.queue_offset))


async def test_simple_consumer_inflates_up_to_its_limit(cluster: Cluster) -> None:
    await _send_bodies(cluster, "ZipPop")
    with pytest.raises(InvalidArgumentError, match="max_inflated_body_size"):
        SimpleConsumer("zip-pop", namesrv=cluster.namesrv_addr, max_inflated_body_size=0)
    sc = SimpleConsumer("zip-pop", namesrv=cluster.namesrv_addr, consume_from="first", await_duration=1.0,
                        max_inflated_body_size=LIMIT)
    sc.subscribe("ZipPop")
    got: list[MessageExt] = []
    async with sc:
        for _ in range(20):
            msgs = await sc.receive(32, wait=1.0)
            got += [r.message for r in msgs]
            await sc.ack_many(msgs)
            if len(got) >= 4:
                break
    _check(sorted(got, key=lambda m: m.queue_offset))


# -- one pull answer inflates only as far as the consumer may hold ----------------------------------------------
# Each body is bounded, but the broker's limits on an answer count stored bytes: 32 bodies of 16 KiB stored
# inflated to 512 MiB at once (48 such bodies sent: a push consumer's queue held 304 MiB and its process peaked at
# +561 MiB traced; a lite-pull consumer buffered 720 MiB). An answer is now cut before the COMPRESSED body that
# does not fit what the queue may still hold (pullThresholdSizeForQueue, counted on inflated bodies as RocketMQ's
# ProcessQueue counts them); the rest is pulled again from there. Nothing is dropped or skipped.
PART = 256 << 10  # 256 KiB of zeros: a few hundred bytes stored


def _part(i: int) -> bytes:
    return bytes(PART - 1) + bytes((i,))


async def _send_parts(cluster: Cluster, topic: str, n: int) -> None:
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, read_queues=1, write_queues=1)
    async with Producer("part-pg", namesrv=cluster.namesrv_addr) as p:  # compressed: over its compress_over
        for i in range(n):
            assert (await p.send(Message(topic, _part(i)))).ok


def _check_parts(got: list[MessageExt], n: int) -> None:
    assert [m.queue_offset for m in got] == list(range(n))
    assert all(m.body == _part(i) and m.sys_flag & 1 == 0 for i, m in enumerate(got))


def test_decode_pulled_within_cuts_before_the_compressed_body_that_does_not_fit() -> None:
    q = MessageQueue("T", "b", 0)
    z = [zlib.compress(_part(i)) for i in range(4)]
    body = b"".join(encode_record(MessageRecord("T", b, sys_flag=f, queue_offset=i))
                    for i, (b, f) in enumerate(((z[0], 1), (z[1], 1), (b"plain", 0), (z[3], 1))))
    msgs, cut, held = decode_pulled_within(body, q, LIMIT << 4, 2 * PART)
    assert ([m.body for m in msgs], cut, held) == ([_part(0), _part(1), b"plain"], True, 2 * PART + 5)
    # the first body is inflated whatever the budget (up to the per-body limit): every pull makes progress
    msgs, cut, held = decode_pulled_within(body, q, LIMIT << 4, 0)
    assert ([m.body for m in msgs], cut, held) == ([_part(0)], True, PART)
    # a fractional MiB threshold makes a float budget: cut the same (zlib takes whole byte counts)
    msgs, cut, held = decode_pulled_within(body, q, LIMIT << 4, 2 * PART + 0.5)  # type: ignore[arg-type]
    assert ([m.body for m in msgs], cut) == ([_part(0), _part(1), b"plain"], True)
    assert decode_pulled_within(body, q, LIMIT << 4, None) == (decode_pulled(body, q, LIMIT << 4), False,
                                                                3 * PART + 5)
    # a body that does not inflate, after the first one: the answer is cut there; first of the next pull (which
    # starts at it), it is delivered as stored, the COMPRESSED bit set, as before
    rest = encode_record(MessageRecord("T", b"not zlib", sys_flag=1, queue_offset=1))
    msgs, cut, _ = decode_pulled_within(encode_record(MessageRecord("T", z[0], sys_flag=1)) + rest, q, LIMIT << 4,
                                        4 * PART)
    assert ([m.body for m in msgs], cut) == ([_part(0)], True)
    msgs, cut, _ = decode_pulled_within(rest, q, LIMIT << 4, 0)
    assert ([(m.body, m.sys_flag & 1) for m in msgs], cut) == ([(b"not zlib", 1)], False)


async def test_push_consumer_inflates_a_pull_answer_only_up_to_its_queues_size_threshold(cluster: Cluster) -> None:
    await _send_parts(cluster, "PartPush", 24)  # one answer: 24 bodies, ~10 KiB stored, 6 MiB inflated
    release = asyncio.Event()
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await release.wait()
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("part-g", namesrv=cluster.namesrv_addr, listener=listener, consume_from="first",
                     max_concurrency=1, pull_threshold_size_for_queue_mib=1)
    c.subscribe("PartPush")
    q = MessageQueue("PartPush", "broker-a", 0)
    async with c:
        await eventually(lambda: c.stats.flow_controlled > 0, what="flow control")
        # 1 MiB: four bodies pulled and held (it was all 24)
        assert (c.in_flight(q), c.stats.pulled) == (4, 4)
        release.set()
        await eventually(lambda: len(got) == 24, what="all 24 after release")
    _check_parts(sorted(got, key=lambda m: m.queue_offset), 24)
    assert cluster.brokers[0].offsets.query("part-g", "PartPush", 0) == 24


async def test_lite_pull_consumer_buffers_inflated_bodies_only_up_to_its_queues_size_threshold(
        cluster: Cluster) -> None:
    await _send_parts(cluster, "PartLite", 24)
    for bad in (0, -1, "1", True):
        with pytest.raises(InvalidArgumentError, match="pull_threshold_size_for_queue_mib"):
            LitePullConsumer("part-lite", namesrv=cluster.namesrv_addr, pull_threshold_size_for_queue_mib=bad)
    got: list[MessageExt] = []
    async with LitePullConsumer("part-lite", namesrv=cluster.namesrv_addr, consume_from="first",
                                long_poll_timeout=1.0, pull_threshold_size_for_queue_mib=1) as c:
        await c.subscribe("PartLite")
        st = c._states[MessageQueue("PartLite", "broker-a", 0)]
        await eventually(lambda: st.blocked, what="the queue's pulls waiting")
        assert (st.buffered, st.buffered_bytes) == (4, 4 * PART)  # (it was 24, and pulling on up to 1000)
        got += await c.poll(1.0, max_messages=1)
        assert st.buffered_bytes == 3 * PART and len(c._buffer[0].msgs) == 3  # (the taken one not kept)
        while len(got) < 24:
            got += await c.poll(1.0)
    _check_parts(got, 24)


async def test_a_pulls_consumed_messages_are_not_kept_alive_while_its_task_consumes_the_backlog(
        cluster: Cluster) -> None:
    """The pulling task that got the listener slot goes on with the backlog (the next pulls' messages); its list
    of the messages it pulled stayed alive meanwhile: consumed, out of the process queue and its byte count, but
    in memory for as long as the consumer lags (a whole answer of inflated bodies)."""
    await _send_parts(cluster, "Keep", 8)
    reached, gate = asyncio.Event(), asyncio.Event()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].queue_offset == 6:
            reached.set()
            await gate.wait()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("keep-g", namesrv=cluster.namesrv_addr, listener=listener, consume_from="first",
                     max_concurrency=1, pull_batch_size=4)
    c.subscribe("Keep")
    async with c:
        await asyncio.wait_for(reached.wait(), 10)
        gc.collect()
        alive = sorted(o.queue_offset for o in gc.get_objects()
                       if isinstance(o, MessageExt) and o.queue.topic == "Keep")
        gate.set()
        await eventually(lambda: c.stats.consumed == 8, what="all 8")
    assert alive == [6, 7]  # the one in the listener, the one waiting for it
