"""POP consumption end to end: the SDK's SimpleConsumer against a real broker (sockets, files, fake clock)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from cometmq.client import Message, Producer
from cometmq.client.admin import Admin
from cometmq.client.errors import BrokerError, ClientConnectionError, InvalidArgumentError, NoRouteError
from cometmq.client.simple_consumer import ReceivedMessage, SimpleConsumer, StaleHandleError
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from tests.pop.conftest import PopCluster

TOPIC = "PopTopic"
GROUP = "pop-group"


async def send(c: PopCluster, n: int, topic: str = TOPIC, *, tags: str | None = None) -> list[str]:
    async with Producer("pop-producer", namesrv=c.namesrv_addr) as p:
        results = await p.send_batch([Message(topic, f"m{i}".encode(), tags=tags) for i in range(n)])
    return [r.msg_id for r in results]


def consumer(c: PopCluster, **kw: object) -> SimpleConsumer:
    sc = SimpleConsumer(kw.pop("group", GROUP), namesrv=c.namesrv_addr, consume_from="first", **kw)  # type: ignore[arg-type]
    sc.subscribe(TOPIC)
    return sc


async def drain(sc: SimpleConsumer, *, ack: bool = True, batch: int = 32, wait: float = 0.2) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    while True:
        msgs = await sc.receive(batch, wait=wait)
        if not msgs:
            return got
        got.extend(msgs)
        if ack:
            await sc.ack_many(msgs)


async def committed(c: PopCluster, group: str = GROUP, topic: str = TOPIC) -> dict[int, int | None]:
    c.broker.pop.snapshot()
    async with Admin(namesrv=c.namesrv_addr) as admin:
        route = await admin.topic_route(topic)
        out = {}
        for qd in route.queue_datas:
            for qid in range(qd.read_queue_nums):
                from cometmq.client.message import MessageQueue
                out[qid] = await admin.committed_offset(group, MessageQueue(topic, qd.broker_name, qid))
        return out


async def test_receive_ack_and_nothing_more(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    ids = await send(pop_cluster, 50)
    async with consumer(pop_cluster) as sc:
        got = await drain(sc)
        assert sorted(m.msg_id for m in got) == sorted(ids)
        assert all(m.reconsume_times == 0 and m.delivery_attempt == 1 for m in got)
        pop_cluster.clock.advance(120_000)  # far past the invisible time: acked messages stay acked
        await asyncio.sleep(0.1)
        assert await sc.receive(32, wait=0.2) == []
    offsets = await committed(pop_cluster)
    assert sum(o or 0 for o in offsets.values()) == 50


async def test_more_consumers_than_queues_share_the_load(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    ids = await send(pop_cluster, 400)
    consumers = [consumer(pop_cluster) for _ in range(5)]
    for sc in consumers:
        await sc.start()
    try:
        seen: dict[int, list[str]] = {i: [] for i in range(5)}

        async def run(i: int, sc: SimpleConsumer) -> None:
            while True:
                msgs = await sc.receive(4, wait=0.3)
                if not msgs:
                    return
                seen[i].extend(m.msg_id for m in msgs)
                await asyncio.sleep(0.005)  # "work": lets the others in
                await sc.ack_many(msgs)

        await asyncio.gather(*(run(i, sc) for i, sc in enumerate(consumers)))
    finally:
        for sc in consumers:
            await sc.close()
    everything = [m for ms in seen.values() for m in ms]
    assert sorted(everything) == sorted(ids)  # each message once: no duplicates, nothing missing
    assert all(len(ms) >= 20 for ms in seen.values()), {i: len(ms) for i, ms in seen.items()}


async def test_unacked_message_comes_back_after_invisible_time(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    [mid] = await send(pop_cluster, 1)
    async with consumer(pop_cluster) as sc:
        [first] = await sc.receive(1, invisible_duration=30, wait=1)
        assert first.msg_id == mid and first.reconsume_times == 0
        assert await sc.receive(1, wait=0.1) == []  # invisible
        pop_cluster.clock.advance(31_000)
        [again] = await sc.receive(1, wait=2)
        assert again.msg_id == mid and again.reconsume_times == 1
        with pytest.raises(StaleHandleError):
            await sc.ack(first)  # the first delivery's handle is stale now
        await sc.ack(again)
        pop_cluster.clock.advance(31_000)
        assert await sc.receive(1, wait=0.2) == []


async def test_change_invisible_extends_and_old_handle_is_stale(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    await send(pop_cluster, 1)
    async with consumer(pop_cluster) as sc:
        [m] = await sc.receive(1, invisible_duration=10, wait=1)
        old = m.handle
        await sc.change_invisible_duration(m, 60)
        assert m.handle.pop_time > old.pop_time and m.handle.invisible_time == 60_000
        pop_cluster.clock.advance(20_000)  # past the first invisible time, not the new one
        assert await sc.receive(1, wait=0.2) == []
        stale = ReceivedMessage(m.message, old, m.group, m.broker_addr)
        with pytest.raises(StaleHandleError):
            await sc.ack(stale)
        with pytest.raises(StaleHandleError):
            await sc.change_invisible_duration(stale, 5)
        await sc.ack(m)
        await sc.ack(m)  # a repeated ack of a done message is harmless
        pop_cluster.clock.advance(120_000)
        assert await sc.receive(1, wait=0.2) == []


async def test_dead_letter_after_max_reconsume_times(pop_cluster: PopCluster) -> None:
    b = pop_cluster.broker
    await b.stop()
    pop_cluster.brokers.clear()
    await pop_cluster.add_broker(max_reconsume_times=2)
    await pop_cluster.create_topic(TOPIC, 1)
    [mid] = await send(pop_cluster, 1)
    attempts = []
    async with consumer(pop_cluster) as sc:
        for _ in range(3):
            [m] = await sc.receive(1, invisible_duration=5, wait=2)
            attempts.append(m.reconsume_times)
            pop_cluster.clock.advance(6_000)
        await asyncio.sleep(0.3)  # the revive tick moves it to the DLQ
        assert await sc.receive(1, wait=0.3) == []
    assert attempts == [0, 1, 2]
    dlq = SimpleConsumer("dlq-reader", namesrv=pop_cluster.namesrv_addr, consume_from="first")
    dlq.subscribe(f"%DLQ%{GROUP}")
    async with dlq:
        [dead] = await dlq.receive(1, wait=2)
    assert dead.msg_id == mid and dead.body == b"m0"
    assert pop_cluster.brokers[0].pop.metrics.dlq == 1


async def test_revive_redelivers_exactly_the_unacked_ten_percent(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 4)
    ids = await send(pop_cluster, 10_000)
    rnd = random.Random(7)
    keep = set(rnd.sample(ids, 1000))
    async with consumer(pop_cluster, invisible_duration=60) as sc:
        got: list[ReceivedMessage] = []
        while len(got) < 10_000:
            msgs = await sc.receive(256, wait=1)
            assert msgs, f"only {len(got)} of 10000 received"
            got.extend(msgs)
            await sc.ack_many([m for m in msgs if m.msg_id not in keep])
        assert sorted(m.msg_id for m in got) == sorted(ids)
        pop_cluster.clock.advance(61_000)
        again = await drain(sc, batch=256, wait=0.5)
    assert sorted(m.msg_id for m in again) == sorted(keep)
    assert all(m.reconsume_times == 1 for m in again)


async def test_ordered_pop_keeps_queue_order_with_three_consumers(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 3)
    async with Producer("pop-producer", namesrv=pop_cluster.namesrv_addr) as p:
        for i in range(150):
            await p.send_orderly(Message(TOPIC, f"{i % 3}:{i}".encode()), sharding_key=i % 3)
    consumers = [consumer(pop_cluster, ordered=True, invisible_duration=2) for _ in range(3)]
    log: list[tuple[int, int]] = []  # (queue, offset) in the order they were processed and acked
    holding: dict[int, int] = {}  # queue -> consumer with unacked messages of it
    abandoned: set[int] = set()  # queues with a dropped message: blocked until its invisible time passes
    rnd = random.Random(3)
    dropped: set[tuple[int, int]] = set()

    async def run(i: int, sc: SimpleConsumer) -> None:
        idle = 0
        while idle < 3:
            msgs = await sc.receive(5, wait=0.3)
            if not msgs:
                idle += 1
                states = pop_cluster.broker.pop.states
                if abandoned and all(not qs.inflight or k[2] in abandoned for k, qs in states.items()):
                    # only dropped deliveries are out: let their invisible time pass so they come back
                    pop_cluster.clock.advance(3_000)
                    abandoned.clear()
                continue
            idle = 0
            by_queue: dict[int, list[ReceivedMessage]] = {}
            for m in msgs:
                by_queue.setdefault(m.queue.queue_id, []).append(m)
            for q in by_queue:
                assert q not in abandoned, f"queue {q} handed out while its dropped message is invisible"
                assert holding.get(q, i) == i, f"queue {q} handed to consumer {i} while {holding[q]} holds it"
                holding[q] = i
            for q, ms in by_queue.items():
                for n, m in enumerate(ms, start=1):
                    key = (q, m.queue_offset)
                    if key not in dropped and rnd.random() < 0.05:
                        dropped.add(key)  # "crash" before acking: the rest of this queue's batch must wait
                        abandoned.add(q)
                        break
                    log.append(key)
                    if n == len(ms):
                        # Done with the queue before its last ack goes out: the broker may hand the queue on as
                        # soon as that ack is in, before this consumer has the ack's answer.
                        holding.pop(q, None)
                    await sc.ack(m)
                holding.pop(q, None)
            await asyncio.sleep(0)

    for sc in consumers:
        await sc.start()
    try:
        await asyncio.gather(*(run(i, sc) for i, sc in enumerate(consumers)))
    finally:
        for sc in consumers:
            await sc.close()
    per_queue: dict[int, list[int]] = {}
    for q, off in log:
        per_queue.setdefault(q, []).append(off)
    assert sum(len(v) for v in per_queue.values()) == 150
    for q, offs in per_queue.items():
        assert offs == sorted(offs) == list(range(len(offs))), f"queue {q} out of order: {offs}"


async def test_long_polling_pop_wakes_on_arrival(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    async with consumer(pop_cluster) as sc:
        task = asyncio.create_task(sc.receive(8, wait=20))
        await asyncio.sleep(0.3)
        assert not task.done()
        assert pop_cluster.broker.pop.waiting() == 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await send(pop_cluster, 1)
        msgs = await asyncio.wait_for(task, 10)
        assert len(msgs) == 1
        assert loop.time() - t0 < 5  # woken by the arrival, not by the 20 s timeout


async def test_consumer_offset_advances_only_past_acked_messages(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    await send(pop_cluster, 10)
    async with consumer(pop_cluster) as sc:
        msgs = await sc.receive(10, wait=1)
        assert [m.queue_offset for m in msgs] == list(range(10))
        await sc.ack_many([m for m in msgs if m.queue_offset != 3])
        assert (await committed(pop_cluster))[0] == 3
        await sc.ack(msgs[3])
        assert (await committed(pop_cluster))[0] == 10


async def test_bad_requests_get_clear_errors(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    addr = pop_cluster.broker.addr
    inst = SimpleConsumer(GROUP, namesrv=pop_cluster.namesrv_addr)
    with pytest.raises(InvalidArgumentError):
        inst.subscribe("bad topic!")
    async with consumer(pop_cluster) as sc:
        with pytest.raises(InvalidArgumentError):
            await sc.receive(0)
        with pytest.raises(InvalidArgumentError):
            await sc.ack("not a message")  # type: ignore[arg-type]
        cases = [
            (RequestCode.POP_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC}, ResponseCode.MESSAGE_ILLEGAL),
            (RequestCode.POP_MESSAGE, {"consumerGroup": GROUP, "topic": "Nope", "queueId": "-1", "maxMsgNums": "1",
                                       "invisibleTime": "1000", "pollTime": "0", "bornTime": "0", "initMode": "0"},
             ResponseCode.TOPIC_NOT_EXIST),
            (RequestCode.POP_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "1",
                                       "invisibleTime": "0", "pollTime": "0", "bornTime": "0", "initMode": "0"},
             ResponseCode.MESSAGE_ILLEGAL),
            (RequestCode.ACK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "offset": "0",
                                       "extraInfo": "garbage"}, ResponseCode.MESSAGE_ILLEGAL),
            (RequestCode.ACK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "9", "offset": "0",
                                       "extraInfo": "0 1 2 0 0 broker-a 9 0"}, ResponseCode.MESSAGE_ILLEGAL),
            (RequestCode.ACK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "offset": "5",
                                       "extraInfo": "0 1 2 0 0 broker-a 0 5"}, ResponseCode.NO_MESSAGE),
        ]
        for code, ext, expected in cases:
            r = await sc.instance.invoke(addr, make_request(code, ext))
            assert r.code == expected, (ext, r.code, r.remark)
            assert r.remark
        r = await sc.instance.invoke(addr, make_request(RequestCode.BATCH_ACK_MESSAGE, {}, b"{not json"))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        # and the broker still works
        await send(pop_cluster, 1)
        assert len(await sc.receive(1, wait=1)) == 1
    with pytest.raises(NoRouteError):
        async with consumer(pop_cluster) as sc2:
            sc2.subscribe("NoSuchTopicHere")
            sc2.unsubscribe(TOPIC)
            await sc2.receive(1, wait=0)


async def test_acked_stay_acked_and_inflight_survive_a_clean_restart(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    ids = await send(pop_cluster, 100)
    async with consumer(pop_cluster, invisible_duration=30) as sc:
        got = []
        while len(got) < 100:
            got.extend(await sc.receive(32, wait=1))
        unacked = {m.msg_id for m in got[:10]}
        await sc.ack_many(got[10:])
    await pop_cluster.restart()
    assert pop_cluster.broker.pop.built  # the broker holds POP state: the service is built and loaded at the start
    async with consumer(pop_cluster) as sc:
        assert await sc.receive(32, wait=0.2) == []  # still invisible after the restart
        pop_cluster.clock.advance(31_000)
        again = await drain(sc, wait=0.5)
    assert {m.msg_id for m in again} == unacked
    assert len(ids) == 100


async def test_ordered_waiter_is_not_woken_by_arrivals_on_a_blocked_queue(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    await send(pop_cluster, 1)
    async with consumer(pop_cluster, ordered=True, invisible_duration=60) as holder, \
            consumer(pop_cluster, ordered=True) as waiter:
        [held] = await holder.receive(1, wait=1)
        task = asyncio.create_task(waiter.receive(8, wait=1.5))
        await asyncio.sleep(0.2)
        metrics = pop_cluster.broker.pop.metrics
        before = metrics.woken_by_arrival
        await send(pop_cluster, 20)  # arrivals on the blocked queue
        assert await task == []  # nothing may be handed out before `held` is acked
        assert metrics.woken_by_arrival == before  # and the waiter was not woken for nothing
        task = asyncio.create_task(waiter.receive(8, wait=5))
        await asyncio.sleep(0.2)
        await holder.ack(held)  # unblocks the queue: the waiter is woken at once
        msgs = await asyncio.wait_for(task, 4)
        assert [m.queue_offset for m in msgs] == list(range(1, 9))


async def test_peek_and_notification(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    addr = pop_cluster.broker.addr
    async with consumer(pop_cluster) as sc:
        note = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "pollTime": "3000", "bornTime": "0"}
        task = asyncio.create_task(sc.instance.invoke(addr, make_request(RequestCode.NOTIFICATION, note), timeout=6))
        await asyncio.sleep(0.2)
        await send(pop_cluster, 3)
        r = await asyncio.wait_for(task, 5)
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["hasMsg"] == "true"
        peek = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "maxMsgNums": "10"}
        r = await sc.instance.invoke(addr, make_request(RequestCode.PEEK_MESSAGE, peek))
        assert r.code == ResponseCode.SUCCESS and r.body.count(b"m0") == 1 and r.body.count(b"m2") == 1
        assert len(await sc.receive(10, wait=1)) == 3  # peeking took nothing
        r = await sc.instance.invoke(addr, make_request(RequestCode.NOTIFICATION, {**note, "pollTime": "200"}))
        assert r.ext_fields["hasMsg"] == "false"


async def test_the_service_is_built_by_the_first_pop_request_only(pop_cluster: PopCluster) -> None:
    """An idle broker does not build the POP service (broker/pop/front.py): sends, pulls and a metrics scrape leave
    it unbuilt; the first POP-family request builds it, started (its revive tick runs) and answering as ever."""
    from cometmq.client import ConsumeStatus, PushConsumer
    from cometmq.metrics.collector import BrokerCollector

    b = pop_cluster.broker
    await pop_cluster.create_topic(TOPIC, 2)
    await send(pop_cluster, 3)
    got = asyncio.Event()

    async def listener(msgs: list[object]) -> ConsumeStatus:
        got.set()
        return ConsumeStatus.CONSUME_SUCCESS

    push = PushConsumer("plain-pull", namesrv=pop_cluster.namesrv_addr, listener=listener, consume_from="first")
    push.subscribe(TOPIC)
    async with push:
        await asyncio.wait_for(got.wait(), 10)
    assert [m.name for m in BrokerCollector(b).collect()]  # a scrape reads the POP counters...
    assert not b.pop.built and b.pop.waiting() == 0 and b.pop.states == {}  # ...without building anything
    async with consumer(pop_cluster) as sc:
        msgs = await drain(sc, wait=0.5)
    assert len(msgs) == 3 and b.pop.built and b.pop.metrics.popped == 3
    assert b.pop.service._revive.running  # started: the broker's master services were running when it was built


async def test_closing_releases_a_shared_client_instance(pop_cluster: PopCluster) -> None:
    from cometmq.client.instance import ClientInstance

    await pop_cluster.create_topic(TOPIC, 1)
    inst = ClientInstance(pop_cluster.namesrv_addr)
    async with Producer("pop-producer", instance=inst) as p:
        await p.send(Message(TOPIC, b"x"))
        sc = SimpleConsumer(GROUP, instance=inst, consume_from="first")
        sc.subscribe(TOPIC)
        async with sc:
            [m] = await sc.receive(1, wait=2)
            await sc.ack(m)
    # every user closed: the instance stops its timers and closes its connections
    assert not inst.started


async def test_a_failed_start_leaves_nothing_running() -> None:
    from tests.kit.ports import free_port

    sc = SimpleConsumer(GROUP, namesrv=f"127.0.0.1:{free_port()}", request_timeout=0.5)  # nobody listens there
    sc.subscribe(TOPIC)
    with pytest.raises(ClientConnectionError):
        async with sc:
            pass
    assert not sc.started and not sc.instance.started  # no heartbeat or route timers left behind


def test_a_pop_answer_naming_a_queue_without_offsets_reads_as_nothing_from_it() -> None:
    from cometmq.protocol.pop import PopMessageResponseHeader

    rh = PopMessageResponseHeader(pop_time=1, invisible_time=1000, revive_qid=0, rest_num=0, start_offset_info="",
                                  msg_offset_info="0 3 ")
    assert SimpleConsumer._decode(b"", rh, TOPIC, "broker-a") == []


async def test_acks_behind_one_long_invisible_message_keep_the_bookkeeping_bounded(pop_cluster: PopCluster) -> None:
    """One message stays in flight for hours (its invisible time extended again and again) while thousands behind
    it are received and acked. The queue's bookkeeping kept every acked offset (and every superseded delivery)
    until the first one was done: it grew with each ack, without bound. It is now compacted to what is still in
    flight, and nothing is lost: the held message stays held, and its ack moves the offset past all of them."""
    n = 4000
    await pop_cluster.create_topic(TOPIC, 1)
    await send(pop_cluster, n)
    b = pop_cluster.broker
    async with consumer(pop_cluster, invisible_duration=3600) as sc:
        [held] = await sc.receive(1, wait=1)
        assert held.queue_offset == 0
        acked = 0
        while acked < n - 1:
            msgs = await sc.receive(32, wait=1)
            assert msgs, f"only {acked} of {n - 1} received"
            await sc.ack_many(msgs)
            acked += len(msgs)
            await sc.change_invisible_duration(held, 3600)  # the consumer keeps working on it
        qs = b.pop.states[(GROUP, TOPIC, 0)]
        assert list(qs.inflight) == [0] and qs.committed == 0
        assert qs.tracked() <= 150, f"{qs.tracked()} entries kept for 1 message in flight"
        assert len(b.pop.service._expiry) <= 100, f"{len(b.pop.service._expiry)} revive entries for 1 queue"
        assert await sc.receive(32, wait=0.2) == []  # nothing comes back: the acked stay acked, the held is held
        pop_cluster.clock.advance(3_601_000)  # past its last extension: it, and it alone, comes back
        [again] = await sc.receive(32, wait=2)
        assert again.queue_offset == 0 and again.reconsume_times == 1
        await sc.ack(again)
    assert (await committed(pop_cluster))[0] == n


async def test_out_of_range_invisible_and_poll_times(pop_cluster: PopCluster) -> None:
    """An invisibleTime over 12 hours (RocketMQ's maxInvisibleTimeMills) is refused with MESSAGE_ILLEGAL naming the
    limit, by POP and by CHANGE_MESSAGE_INVISIBLETIME, and changes nothing; a pollTime over popMaxPollTimeMs is cut
    to it (RocketMQ's proxy cuts the long polling to 20 s). Both had no upper bound: a message could be hidden for
    centuries, and a request held for as long (2^63-1 ms: forever)."""
    from cometmq.protocol.pop import MAX_INVISIBLE_MS

    await pop_cluster.create_topic(TOPIC, 1)
    b = await pop_cluster.restart(pop_max_poll_time_ms=300)
    [mid] = await send(pop_cluster, 1)
    pop = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "1", "bornTime": "0",
           "initMode": "0", "pollTime": "0"}
    async with consumer(pop_cluster) as sc:
        for too_long in (MAX_INVISIBLE_MS + 1, 2**63 - 1):
            r = await sc.instance.invoke(b.addr, make_request(RequestCode.POP_MESSAGE,
                                                              {**pop, "invisibleTime": str(too_long)}))
            assert r.code == ResponseCode.MESSAGE_ILLEGAL and f"{MAX_INVISIBLE_MS}" in (r.remark or ""), r.remark
        assert not any(qs.inflight for qs in b.pop.states.values())  # nothing was handed out
        [m] = await sc.receive(1, invisible_duration=30, wait=1)
        assert m.msg_id == mid and m.reconsume_times == 0
        with pytest.raises(BrokerError, match=str(MAX_INVISIBLE_MS)) as refused:
            await sc.change_invisible_duration(m, MAX_INVISIBLE_MS / 1000 + 1)
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        pop_cluster.clock.advance(31_000)  # the refused change did not extend it: it comes back
        [again] = await sc.receive(1, wait=2)
        assert again.msg_id == mid and again.reconsume_times == 1
        await sc.ack(again)
        loop = asyncio.get_running_loop()
        for poll in (86_400_000, 2**63 - 1):  # a day, and the largest a Java long holds
            t0 = loop.time()
            r = await sc.instance.invoke(b.addr, make_request(RequestCode.POP_MESSAGE, {
                **pop, "invisibleTime": "30000", "pollTime": str(poll)}), timeout=30)
            assert r.code == ResponseCode.POLLING_TIMEOUT, (r.code, r.remark)
            assert loop.time() - t0 < 10, "the poll was held past popMaxPollTimeMs"
            note = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "bornTime": "0", "pollTime": str(poll)}
            r = await sc.instance.invoke(b.addr, make_request(RequestCode.NOTIFICATION, note), timeout=30)
            assert r.code == ResponseCode.SUCCESS and r.ext_fields["hasMsg"] == "false"


@contextlib.asynccontextmanager
async def corrupting_proxy(target: str, old: bytes, new: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP proxy to ``target`` that replaces ``old`` with ``new`` (as long) in the first reply frame holding
    it, and passes everything else as it is; yields its address and the frames it changed."""
    assert len(old) == len(new)
    host, port = target.rsplit(":", 1)
    changed: list[bytes] = []
    handlers: set[asyncio.Task[None]] = set()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool) -> None:
        try:
            while True:
                if replies:  # frame by frame: a frame is changed whole
                    head = await reader.readexactly(4)
                    data = head + await reader.readexactly(int.from_bytes(head, "big"))
                    if not changed and old in data:
                        data = data.replace(old, new, 1)
                        changed.append(data)
                else:
                    data = await reader.read(1 << 16)
                    if not data:
                        return
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        to_reader, to_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pump(reader, to_writer, False), pump(to_reader, writer, True))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", changed
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def test_a_record_with_unreadable_properties_is_the_broker_s_error(pop_cluster: PopCluster) -> None:
    """A POP answer holding a record whose properties are not UTF-8 (corrupted on its way, or by the broker) is
    an unreadable answer: BrokerError(SYSTEM_ERROR), as every other. With a tag subscription, the tags of the
    messages (the check after the broker's tag-hash filter) were read after the block that maps protocol errors:
    receive() raised the bare ProtocolError, not an MQClientError (it ended a POP push consumer's receive loop)."""
    await pop_cluster.create_topic(TOPIC, 1)
    [mid] = await send(pop_cluster, 1, tags="TagA")
    sc = consumer(pop_cluster)
    sc.subscribe(TOPIC, "TagA")
    async with corrupting_proxy(pop_cluster.broker.addr, b"\x01TagA\x02", b"\x01Tag\xff\x02") as (addr, changed), sc:
        sc.instance.brokers["broker-a"] = {0: addr}  # the consumer's requests go through the proxy
        with pytest.raises(BrokerError, match=r"unreadable POP answer.*not valid UTF-8") as info:
            await sc.receive(32, invisible_duration=30, wait=1)
        assert info.value.code == ResponseCode.SYSTEM_ERROR and info.value.addr == addr and len(changed) == 1
        pop_cluster.clock.advance(31_000)  # the message was popped: it comes back, unharmed this time
        [again] = await sc.receive(32, wait=2)
        assert (again.msg_id, again.tags, again.reconsume_times) == (mid, "TagA", 1)
        await sc.ack(again)
