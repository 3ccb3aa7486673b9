"""PushConsumer(pop=True): POP-based push consumption with automatic renewal of invisible time."""

from __future__ import annotations

import asyncio
import collections
import logging

import pytest

from cometmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from cometmq.client.pop_push_consumer import PopPushConsumer
from cometmq.client.simple_consumer import ReceivedMessage
from tests.kit import eventually
from tests.pop.conftest import PopCluster

TOPIC = "PopPush"
GROUP = "pop-push"


async def send(c: PopCluster, n: int) -> list[str]:
    async with Producer("pp", namesrv=c.namesrv_addr) as p:
        return [r.msg_id for r in await p.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(n)])]


async def test_pop_push_consumers_share_a_topic(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    seen: collections.Counter[str] = collections.Counter()
    by_consumer: collections.Counter[int] = collections.Counter()

    def listener_for(i: int):  # type: ignore[no-untyped-def]
        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                seen[m.msg_id] += 1
                by_consumer[i] += 1
            await asyncio.sleep(0.002)
            return ConsumeStatus.CONSUME_SUCCESS
        return listener

    consumers = [PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=listener_for(i),
                              consume_from="first", max_concurrency=8, long_polling_timeout=1) for i in range(3)]
    assert all(isinstance(c, PopPushConsumer) for c in consumers)
    for c in consumers:
        c.subscribe(TOPIC)
        await c.start()
    try:
        ids = await send(pop_cluster, 300)
        await eventually(lambda: len(seen) == 300, 20.0, what="300 messages consumed")
        await asyncio.sleep(0.5)
    finally:
        for c in consumers:
            await c.close()
    assert set(seen) == set(ids) and max(seen.values()) == 1
    assert len(by_consumer) == 3  # three consumers on two queues all got work


async def test_slow_listener_is_renewed_not_redelivered(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    calls: list[int] = []

    async def slow(msgs: list[MessageExt]) -> None:
        calls.append(msgs[0].reconsume_times)
        await asyncio.sleep(1.5)  # longer than the invisible time

    c = PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=slow, consume_from="first",
                     invisible_duration=0.6, long_polling_timeout=1)
    c.subscribe(TOPIC)
    async with c:
        await send(pop_cluster, 1)
        await eventually(lambda: c.stats.consumed == 1, 20.0, what="one message consumed")  # type: ignore[union-attr]
        await asyncio.sleep(1.0)
    assert calls == [0]
    assert c.renewed >= 1  # type: ignore[union-attr]


async def test_reconsume_later_comes_back_with_a_higher_count(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 1)
    attempts: list[int] = []

    def flaky(msgs: list[MessageExt]) -> ConsumeStatus:
        attempts.append(msgs[0].reconsume_times)
        return ConsumeStatus.RECONSUME_LATER if len(attempts) == 1 else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=flaky, consume_from="first",
                     long_polling_timeout=1)
    c.subscribe(TOPIC)
    async with c:
        await send(pop_cluster, 1)
        await eventually(lambda: len(attempts) == 2, 20.0, what="the second attempt")
    assert attempts == [0, 1]


async def test_a_listener_raising_cancelled_error_is_a_failure(pop_cluster: PopCluster) -> None:
    """A listener that raises a CancelledError of its own (it awaited something cancelled) has failed, as with any
    exception: the message comes back after the back-off. It was taken as the consumer being cancelled: the message
    was neither acked nor made invisible for the back-off."""
    await pop_cluster.create_topic(TOPIC, 1)
    attempts: list[int] = []

    async def cancelled_once(msgs: list[MessageExt]) -> None:
        attempts.append(msgs[0].reconsume_times)
        if len(attempts) == 1:
            raise asyncio.CancelledError("the listener's own")

    c = PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=cancelled_once,
                     consume_from="first", long_polling_timeout=1)
    c.subscribe(TOPIC)
    async with c:
        await send(pop_cluster, 1)
        await eventually(lambda: len(attempts) == 2, 20.0, what="the second attempt")
    assert attempts == [0, 1]


async def test_ordered_pop_push_consumes_each_queue_in_order(pop_cluster: PopCluster) -> None:
    await pop_cluster.create_topic(TOPIC, 2)
    order: dict[int, list[int]] = collections.defaultdict(list)
    failed_once: set[int] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        m = msgs[0]
        if m.queue_offset % 17 == 5 and m.queue_offset not in failed_once:
            failed_once.add(m.queue_offset)
            return ConsumeStatus.RECONSUME_LATER
        order[m.queue.queue_id].append(m.queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    consumers = [PushConsumer(GROUP, pop=True, ordered=True, namesrv=pop_cluster.namesrv_addr, listener=listener,
                              consume_from="first", long_polling_timeout=1) for _ in range(2)]
    async with Producer("pp", namesrv=pop_cluster.namesrv_addr) as p:
        for i in range(60):
            await p.send_orderly(Message(TOPIC, f"{i}".encode()), sharding_key=i % 2)
    for c in consumers:
        c.subscribe(TOPIC)
        await c.start()
    try:
        await eventually(lambda: sum(len(v) for v in order.values()) == 60, 40, what="60 messages consumed")
    finally:
        for c in consumers:
            await c.close()
    for q, offs in order.items():
        assert offs == list(range(30)), (q, offs)


async def test_a_renewal_in_flight_when_the_listener_ends_is_not_lost(pop_cluster: PopCluster) -> None:
    """The broker answers a renewal with a new receipt handle and makes the old one stale: a renewal still on its
    way when the listener returns must be waited for, not cancelled, or the ack goes out with the stale handle,
    fails, and the message is consumed a second time."""
    from tests.kit.faultproxy import Direction, FaultProxy

    await pop_cluster.create_topic(TOPIC, 1)
    calls: list[int] = []

    async def listener(msgs: list[MessageExt]) -> None:
        calls.append(msgs[0].reconsume_times)
        await asyncio.sleep(0.7)  # returns while the renewal sent at 0.5 s waits for its answer (due at 0.9 s)

    host, port = pop_cluster.broker.addr.rsplit(":", 1)
    async with FaultProxy((host, int(port))) as proxy:
        c = PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=listener, consume_from="first",
                         invisible_duration=1.0, long_polling_timeout=1)
        assert isinstance(c, PopPushConsumer)
        c.subscribe(TOPIC)
        async with c:
            c.instance.brokers["broker-a"] = {0: proxy.addr}  # the consumer's requests go through the proxy
            proxy.delay(0.4, Direction.DOWN)
            await asyncio.sleep(1.5)  # (once the long poll sent before is over)
            await send(pop_cluster, 1)
            await eventually(lambda: c.stats.consumed == 1, 20.0, what="one message consumed")
            await asyncio.sleep(2.5)  # a stale ack would have it delivered again after its invisible time
    assert c.renewed >= 1 and calls == [0]


async def test_ordered_messages_waiting_behind_a_slow_one_stay_invisible(pop_cluster: PopCluster) -> None:
    """An ordered batch is consumed one message after the other: the ones waiting their turn are renewed too, so
    their invisible time does not pass meanwhile and the broker does not hand them out again (a second delivery,
    consumed alongside the first and out of order)."""
    await pop_cluster.create_topic(TOPIC, 1)
    seen: list[tuple[int, int]] = []

    async def listener(msgs: list[MessageExt]) -> None:
        seen.append((msgs[0].queue_offset, msgs[0].reconsume_times))
        await asyncio.sleep(0.6)

    await send(pop_cluster, 3)
    c = PushConsumer(GROUP, pop=True, ordered=True, namesrv=pop_cluster.namesrv_addr, listener=listener,
                     consume_from="first", invisible_duration=1.0, long_polling_timeout=1)
    c.subscribe(TOPIC)
    async with c:
        await eventually(lambda: c.stats.consumed == 3, 20.0, what="three consumed")  # type: ignore[union-attr]
        await asyncio.sleep(1.5)  # a second delivery would come within this
    assert seen == [(0, 0), (1, 0), (2, 0)]


async def test_the_receive_loop_survives_any_error_and_consumes_on(pop_cluster: PopCluster,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A receive that raises something other than an SDK error (an OSError the client instance did not map, a
    bug) is logged and retried after the back-off, as an SDK error is. The loop caught only MQClientError: anything
    else ended it, and the consumer, still started, consumed nothing for the rest of its life."""
    await pop_cluster.create_topic(TOPIC, 1)
    consumed: list[bytes] = []

    async def listener(msgs: list[MessageExt]) -> None:
        consumed.extend(m.body for m in msgs)

    c = PushConsumer(GROUP, pop=True, namesrv=pop_cluster.namesrv_addr, listener=listener, consume_from="first",
                     long_polling_timeout=1)
    assert isinstance(c, PopPushConsumer)
    c.subscribe(TOPIC)
    faults: list[Exception] = [ConnectionResetError(104, "Connection reset by peer"), RuntimeError("a bug")]
    receive = c.simple.receive

    async def receive_after_faults(max_messages: int = 16) -> list[ReceivedMessage]:
        if faults:  # the one thing made up here: the broker, the consumer and its loop are real
            raise faults.pop(0)
        return await receive(max_messages)

    c.simple.receive = receive_after_faults  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="cometmq.client.pop_push_consumer"):
        async with c:
            await eventually(lambda: not faults, 10.0, what="both faults raised")
            await send(pop_cluster, 3)
            await eventually(lambda: len(consumed) == 3, 10.0, what="three messages consumed after the faults")
    assert sorted(consumed) == [b"m0", b"m1", b"m2"] and c.stats.consumed == 3
    logged = [r for r in caplog.records if "POP receive of pop-push raised" in r.getMessage()]
    assert len(logged) == 2 and "ConnectionResetError" in logged[0].getMessage()
    assert logged[0].exc_info is not None and logged[1].exc_info is None  # the traceback once per run of failures
