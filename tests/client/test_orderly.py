"""Orderly push consumers (queue locks, one batch at a time per queue) against an in-process nameserver + broker."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest

from cometmq.client import (
    AllocateByConfig,
    ClientConnectionError,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    MQClientError,
    OrderlyPushConsumer,
    Producer,
    PushConsumer,
)
from cometmq.client.process_queue import ProcessQueue
from tests.kit import eventually

from .conftest import Cluster
from .test_push_consumer import committed, create_topic, stored


@dataclass(frozen=True)
class Seen:
    who: str
    queue: MessageQueue
    offset: int
    key: str
    seq: int
    reconsume_times: int
    t: float


class Recorder:
    """An orderly listener that records every delivery (one shared log for several consumers)."""

    def __init__(self, log: list[Seen], who: str, delay: float = 0.0) -> None:
        self.log = log
        self.who = who
        self.delay = delay

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        for m in msgs:
            key, seq = m.body.decode().split(":")
            self.log.append(Seen(self.who, m.queue, m.queue_offset, key, int(seq), m.reconsume_times,
                                 time.monotonic()))
        if self.delay:
            await asyncio.sleep(self.delay)
        return ConsumeOrderlyStatus.SUCCESS


async def send_keys(p: Producer, topic: str, keys: int, per_key: int, *, pause: float = 0.0) -> None:
    """``per_key`` messages "k<i>:<seq>" for each key, keys sent concurrently, each key's in sequence."""
    async def one(k: int) -> None:
        for seq in range(per_key):
            await p.send_orderly(Message(topic, f"k{k}:{seq}".encode(), keys=f"k{k}"), f"k{k}")
            if pause:
                await asyncio.sleep(pause)

    await asyncio.gather(*(one(k) for k in range(keys)))


def orderly(cluster: Cluster, group: str, listener: object, **kw: object) -> PushConsumer:
    return OrderlyPushConsumer(group, namesrv=cluster.namesrv_addr, listener=listener,  # type: ignore[arg-type]
                               consume_from="first", **kw)


def owner(cluster: Cluster, group: str, mq: MessageQueue) -> str | None:
    return cluster.brokers[0].locks.owner(group, mq)


# -- process queue ------------------------------------------------------------------------------------------
def ext(offset: int, reconsume_times: int = 0) -> MessageExt:
    return MessageExt(topic="T", body=b"ab", properties={}, msg_id=str(offset), offset_msg_id="",
                      queue=MessageQueue("T", "b", 0), queue_offset=offset, commit_log_offset=offset * 100,
                      born_timestamp=0, store_timestamp=0, born_host="", store_host="",
                      reconsume_times=reconsume_times, sys_flag=0, flag=0)


def test_process_queue_take_commit_rollback_and_consume_again() -> None:
    pq = ProcessQueue(0)
    pq.put([ext(o) for o in range(6)], 8)  # 6 and 7 filtered out
    assert [m.queue_offset for m in pq.take(2)] == [0, 1]
    assert pq.count == 6 and pq.taken == 2 and pq.committable == 0
    assert pq.commit() == 2 and pq.count == 4 and pq.size_bytes == 8
    assert [m.queue_offset for m in pq.take(3)] == [2, 3, 4]
    # 3 went to the DLQ, 2 and 4 are consumed again: the offset stays below 2 until they are done
    pq.make_again([ext(2, 1), ext(4, 1)])
    assert pq.taken == 1 and pq.committable == 2
    again = pq.take(10)
    assert [(m.queue_offset, m.reconsume_times) for m in again] == [(2, 1), (4, 1), (5, 0)]
    assert pq.rollback() == 4 and pq.taken == 0
    assert [m.queue_offset for m in pq.take(10)] == [2, 3, 4, 5]  # 3 is back too: a rollback undoes everything
    assert pq.max_span == 3
    assert pq.commit() == 8 and pq.count == 0 and pq.size_bytes == 0
    assert pq.take(1) == []


def test_orderly_arguments_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="orderly_give_up"):
        PushConsumer("g", namesrv="127.0.0.1:1", orderly=True, orderly_give_up="drop")
    with pytest.raises(InvalidArgumentError, match="suspend_time_ms"):
        PushConsumer("g", namesrv="127.0.0.1:1", orderly=True, suspend_time_ms=0)
    assert OrderlyPushConsumer("g", namesrv="127.0.0.1:1").orderly
    # A broadcasting consumer reads no retry topic (RocketMQ does not retry broadcast messages): giving a message
    # up to the group's retry topic put it where no consumer of the group would ever read it. Refused; "dlq" and
    # "never" still go, and "retry" with CLUSTERING.
    with pytest.raises(InvalidArgumentError, match=r"orderly_give_up='retry'.*BROADCASTING"):
        PushConsumer("g", namesrv="127.0.0.1:1", orderly=True, orderly_give_up="retry", message_model="BROADCASTING")
    for policy in ("dlq", "never"):
        PushConsumer("g", namesrv="127.0.0.1:1", orderly=True, orderly_give_up=policy, message_model="BROADCASTING")
    assert PushConsumer("g", namesrv="127.0.0.1:1", orderly=True, orderly_give_up="retry").orderly_give_up == "retry"


# -- order, rebalance, hand-over -----------------------------------------------------------------------------
def ord_queues(c: PushConsumer) -> set[MessageQueue]:
    return {mq for mq in c.locked_queues if mq.topic == "Ord"}  # not the retry queue


async def test_per_key_order_with_two_consumers_a_rebalance_and_a_clean_leave(cluster: Cluster) -> None:
    await create_topic(cluster, "Ord", 8)
    seen: list[Seen] = []
    keys, per_key = 40, 25
    total = keys * per_key
    a = orderly(cluster, "og", Recorder(seen, "A", 0.001), batch_max_size=4, rebalance_interval=60)
    b = orderly(cluster, "og", Recorder(seen, "B", 0.001), batch_max_size=4, rebalance_interval=60)
    for c in (a, b):
        c.subscribe("Ord")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await a.start()
        try:
            sending = asyncio.create_task(send_keys(p, "Ord", keys, per_key, pause=0.002))
            await eventually(lambda: len(seen) >= total // 4, what="a quarter consumed by A")
            await b.start()  # A gives half its queues up while consuming them
            await eventually(lambda: len(ord_queues(a)) == 4 and len(ord_queues(b)) == 4, timeout=5,
                             what="an even split")
            assert not a.locked_queues & b.locked_queues
            await eventually(lambda: len(seen) >= total * 2 // 3, what="two thirds consumed")
            t_leave = time.monotonic()
            await a.close()  # commits and unlocks at once: B need not wait for the lock to expire
            took = await eventually(lambda: len(ord_queues(b)) == 8, timeout=5, what="B takes all queues")
            assert took < 1.0, f"hand-over took {took:.2f}s"
            await sending
            await eventually(lambda: len(seen) >= total, timeout=20, what="everything consumed")
            await asyncio.sleep(0.2)
        finally:
            await a.close()
            await b.close()
    by_key: dict[str, list[int]] = defaultdict(list)
    for s in seen:
        by_key[s.key].append(s.seq)
    # Clean hand-overs: the last owner committed before unlocking, so every message exactly once, in order.
    assert by_key == {f"k{k}": list(range(per_key)) for k in range(keys)}
    switches: dict[MessageQueue, list[str]] = defaultdict(list)
    for s in seen:
        if not switches[s.queue] or switches[s.queue][-1] != s.who:
            switches[s.queue].append(s.who)
    assert all(len(w) <= 2 for w in switches.values()), switches  # A then B: never back and forth
    assert {s.who for s in seen} == {"A", "B"}
    assert any(s.who == "B" and s.t > t_leave for s in seen)
    assert committed(cluster, "og", "Ord") == total
    assert all(owner(cluster, "og", MessageQueue("Ord", "broker-a", q)) is None for q in range(8))  # B unlocked


async def test_lock_is_renewed_and_taken_over_only_after_it_expires(cluster: Cluster) -> None:
    await create_topic(cluster, "Exp", 2)
    cluster.brokers[0].locks.lock_max_live_ms = 1500
    queues = [MessageQueue("Exp", "broker-a", q) for q in range(2)]
    seen: list[Seen] = []
    # Both want both queues: only the lock decides who consumes.
    a = orderly(cluster, "eg", Recorder(seen, "A"), allocate=AllocateByConfig(queues))
    b = orderly(cluster, "eg", Recorder(seen, "B"), allocate=AllocateByConfig(queues))
    for c in (a, b):
        c.subscribe("Exp")
        svc = c.orderly_service
        assert svc is not None
        svc.lock_renew_interval = 0.3
        svc.lock_expiry = 1.0  # below the broker's 1.5 s
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await a.start()
        try:
            await eventually(lambda: a.locked_queues == set(queues), timeout=5, what="A locks both")
            await b.start()
            sending = asyncio.create_task(send_keys(p, "Exp", 4, 250, pause=0.02))
            await asyncio.sleep(2.0)  # longer than the lock lifetime: A renews, B keeps being refused
            assert a.locked_queues == set(queues) and not b.locked_queues
            assert {owner(cluster, "eg", mq) for mq in queues} == {a.instance.client_id}
            assert seen and {s.who for s in seen} == {"A"}
            # A hangs: its lock keeper stops. It stops consuming on its own after 1 s, the broker frees the locks
            # after 1.5 s, B (trying every 0.5 s at most) takes them.
            svc = a.orderly_service
            assert svc is not None and svc._keeper is not None
            svc._keeper.cancel()
            t_hang = time.monotonic()
            await eventually(lambda: b.locked_queues == set(queues), timeout=5, what="B takes over")
            assert time.monotonic() - t_hang < 1.5 + 1.0
            await eventually(lambda: any(s.who == "B" for s in seen), what="B consumes")
            await sending
            await eventually(lambda: len({(s.key, s.seq) for s in seen}) == 1000, timeout=15, what="all consumed")
        finally:
            await a.close()  # its unlock does not free B's locks: only the owner unlocks
            assert {owner(cluster, "eg", mq) for mq in queues} == {b.instance.client_id}
            await b.close()
    last_a = max(s.t for s in seen if s.who == "A")
    first_b = min(s.t for s in seen if s.who == "B")
    assert last_a < first_b  # never both at once
    # After the hand-over B replays (in order) at most what A consumed but had not committed.
    for k in range(4):
        a_seqs = [s.seq for s in seen if s.key == f"k{k}" and s.who == "A"]
        b_seqs = [s.seq for s in seen if s.key == f"k{k}" and s.who == "B"]
        assert a_seqs == list(range(len(a_seqs)))
        if b_seqs:
            assert b_seqs == list(range(b_seqs[0], b_seqs[0] + len(b_seqs))) and b_seqs[0] <= len(a_seqs)
            assert b_seqs[-1] == 249
    assert a.stats.locks_lost == 0  # A never learned (its keeper was gone); it only stopped consuming


async def test_a_queue_given_up_mid_batch_is_unlocked_only_after_the_batch(cluster: Cluster) -> None:
    await create_topic(cluster, "Slow", 1)
    mq = MessageQueue("Slow", "broker-a", 0)
    events: list[tuple[str, str, float]] = []

    async def slow_a(msgs: list[MessageExt]) -> None:
        events.append(("A", msgs[0].body.decode(), time.monotonic()))
        if msgs[0].body == b"slow":
            await asyncio.sleep(1.6)  # longer than the 1 s a hand-over waits inline
            events.append(("A", "slow done", time.monotonic()))

    async def fast_b(msgs: list[MessageExt]) -> None:
        events.append(("B", msgs[0].body.decode(), time.monotonic()))

    a = orderly(cluster, "slg", slow_a)
    b = orderly(cluster, "slg", fast_b, allocate=AllocateByConfig([mq]))  # wants the queue all along
    for c in (a, b):
        c.subscribe("Slow")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await a.start()
        try:
            await eventually(lambda: mq in a.locked_queues, what="A locks the queue")
            await b.start()
            for body in ("m0", "slow", "m1", "m2"):
                await p.send(Message("Slow", body.encode()))
            await eventually(lambda: any(e[1] == "slow" for e in events), what="the slow batch")
            await a.unsubscribe("Slow")  # gives the queue up while the batch is in the listener
            svc = a.orderly_service
            assert svc is not None and mq in svc._releasing  # the unlock waits for the batch
            assert owner(cluster, "slg", mq) == a.instance.client_id
            await eventually(lambda: any(e[0] == "B" for e in events), timeout=5, what="B takes over")
        finally:
            await a.close()
            await b.close()
    done = next(t for who, body, t in events if body == "slow done")
    first_b = min(t for who, _, t in events if who == "B")
    assert done < first_b  # never both in the queue at once
    assert [body for who, body, _ in events if who == "B"] == ["m1", "m2"]  # A committed the slow batch first
    assert [body for who, body, _ in events if who == "A"] == ["m0", "slow", "slow done"]


@pytest.mark.parametrize("how", ["refused", "connection"])
async def test_a_lost_lock_stops_the_queue_until_it_is_locked_again(cluster: Cluster, how: str) -> None:
    await create_topic(cluster, "Lost", 1)
    mq = MessageQueue("Lost", "broker-a", 0)
    locks = cluster.brokers[0].locks
    seen: list[Seen] = []
    c = orderly(cluster, "lg", Recorder(seen, "A"), auto_commit_interval=0.05)
    c.subscribe("Lost")
    svc = c.orderly_service
    assert svc is not None
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p, c:
        await eventually(lambda: mq in c.locked_queues, what="the lock")
        await send_keys(p, "Lost", 1, 5)
        await eventually(lambda: len(seen) == 5, what="5 messages")
        await eventually(lambda: committed(cluster, "lg", "Lost") == 5, what="the commit")
        if how == "refused":
            locks.unlock_batch("lg", [mq], c.instance.client_id)
            locks.try_lock_batch("lg", [mq], "intruder")  # someone else got it
            await svc.lock_all()  # the renewal is refused
        else:
            # the connection drops: the broker frees the client's locks (it may not get them back)
            locks.try_lock_batch("lg", [mq], "intruder")
            conns = c.instance.remoting.connections
            conns[cluster.brokers[0].addr].abort()
            await eventually(lambda: c.stats.locks_lost >= 1, what="the reset")  # (the retry queue too)
            locks.unlock_batch("lg", [mq], c.instance.client_id)  # in case it was quicker than the intruder
            locks.try_lock_batch("lg", [mq], "intruder")
        assert c.stats.locks_lost >= 1 and mq not in c.locked_queues
        await send_keys(p, "Lost", 1, 3)  # k0:0..2 again: not consumed while the lock is elsewhere
        await asyncio.sleep(0.6)
        assert len(seen) == 5
        locks.unlock_batch("lg", [mq], "intruder")
        took = await eventually(lambda: len(seen) == 8, timeout=5, what="consuming again")
        assert took < 1.5  # refused locks are tried again every 0.5 s at most
    assert [s.offset for s in seen] == list(range(8))  # started again from the committed offset: no gap, no replay

async def test_suspend_retries_the_batch_in_place_and_an_exception_counts_as_suspend(cluster: Cluster) -> None:
    await create_topic(cluster, "Sus", 1)
    got: list[tuple[str, int]] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:  # runs in a thread
        m = msgs[0]
        body = m.body.decode()
        got.append((body, m.reconsume_times))
        if body == "m2" and m.reconsume_times < 2:
            ctx.suspend_current_queue_time_ms = 30
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if body == "m4" and m.reconsume_times < 1:
            raise RuntimeError("boom")  # waits suspend_time_ms, then again
        return ConsumeOrderlyStatus.SUCCESS

    c = orderly(cluster, "sg", listener, suspend_time_ms=50)
    c.subscribe("Sus")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(6):
            await p.send(Message("Sus", f"m{i}".encode()))
        async with c:
            await eventually(lambda: len(got) == 9, what="9 deliveries")
            await asyncio.sleep(0.1)
    assert got == [("m0", 0), ("m1", 0), ("m2", 0), ("m2", 1), ("m2", 2), ("m3", 0), ("m4", 0), ("m4", 1), ("m5", 0)]
    assert c.stats.failed == 3 and c.stats.consumed == 6 and c.stats.given_up == 0
    assert committed(cluster, "sg", "Sus") == 6



async def test_a_listener_raising_cancelled_error_suspends_the_queue_and_it_goes_on(cluster: Cluster) -> None:
    """A CancelledError of the listener's own (it awaited something cancelled) is a failure like an exception: the
    batch is consumed again after suspend_time_ms. Taken as the consumer being cancelled, it ended the queue's
    consume task: the queue stayed locked and assigned, never consumed again."""
    await create_topic(cluster, "OCan", 1)
    got: list[tuple[str, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        m = msgs[0]
        got.append((m.body.decode(), m.reconsume_times))
        if m.body == b"m1" and m.reconsume_times == 0:
            cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            await cancelled  # raises CancelledError in the listener
        return ConsumeOrderlyStatus.SUCCESS

    c = orderly(cluster, "ocan", listener, suspend_time_ms=50)
    c.subscribe("OCan")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(3):
            await p.send(Message("OCan", f"m{i}".encode()))
        async with c:
            await eventually(lambda: len(got) == 4, what="4 deliveries")
    assert got == [("m0", 0), ("m1", 0), ("m1", 1), ("m2", 0)]
    assert c.stats.failed == 1 and c.stats.consumed == 3
    assert committed(cluster, "ocan", "OCan") == 3

async def test_commit_and_rollback_with_auto_commit_off(cluster: Cluster) -> None:
    await create_topic(cluster, "Man", 1)
    got: list[str] = []
    rolled = False

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        nonlocal rolled
        assert not ctx.auto_commit
        body = msgs[0].body.decode()
        got.append(body)
        if body == "m2" and not rolled:
            rolled = True
            ctx.suspend_current_queue_time_ms = 20
            return ConsumeOrderlyStatus.ROLLBACK  # m0, m1 and m2 again
        if body == "m3":
            return ConsumeOrderlyStatus.COMMIT  # m0..m3 committed
        return ConsumeOrderlyStatus.SUCCESS  # consumed, not committed

    c = orderly(cluster, "mg", listener, auto_commit=False, auto_commit_interval=0.05)
    c.subscribe("Man")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(8):
            await p.send(Message("Man", f"m{i}".encode()))
        async with c:
            await eventually(lambda: len(got) == 11, what="11 deliveries")
            await eventually(lambda: committed(cluster, "mg", "Man") == 4, what="the commit")
            await asyncio.sleep(0.2)
            assert committed(cluster, "mg", "Man") == 4  # m4..m7 were consumed but never committed
        assert got == ["m0", "m1", "m2", "m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"]
        assert c.stats.rolled_back == 3
        assert committed(cluster, "mg", "Man") == 4  # closing commits only what was committed
        again: list[str] = []

        async def second(msgs: list[MessageExt]) -> None:
            again.extend(m.body.decode() for m in msgs)

        c2 = orderly(cluster, "mg", second)
        c2.subscribe("Man")
        async with c2:
            await eventually(lambda: len(again) == 4, what="the uncommitted ones again")
            await asyncio.sleep(0.1)
        assert again == ["m4", "m5", "m6", "m7"]
        assert committed(cluster, "mg", "Man") == 8  # auto-commit (the default) commits each batch


async def test_a_bad_message_goes_to_the_dlq_after_the_maximum_and_the_queue_moves_on(cluster: Cluster) -> None:
    await create_topic(cluster, "Bad", 1)
    got: list[tuple[str, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        m = msgs[0]
        got.append((m.body.decode(), m.reconsume_times))
        if m.body == b"bad":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = orderly(cluster, "bg", listener, max_reconsume_times=2, suspend_time_ms=20)
    c.subscribe("Bad")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for body in ("m0", "bad", "m1", "m2"):
            await p.send(Message("Bad", body.encode()))
        async with c:
            await eventually(lambda: ("m2", 0) in got, what="the queue moves on")
            await asyncio.sleep(0.1)
    assert got == [("m0", 0), ("bad", 0), ("bad", 1), ("bad", 2), ("m1", 0), ("m2", 0)]
    assert c.stats.given_up == 1 and c.stats.failed == 3
    assert stored(cluster, "%DLQ%bg") == [b"bad"]
    assert committed(cluster, "bg", "Bad") == 4


async def test_give_up_never_keeps_retrying_in_place(cluster: Cluster) -> None:
    await create_topic(cluster, "Nev", 1)
    got: list[int] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        got.append(msgs[0].reconsume_times)
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    c = orderly(cluster, "ng", listener, max_reconsume_times=1, suspend_time_ms=10, orderly_give_up="never")
    c.subscribe("Nev")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await p.send(Message("Nev", b"x"))
        async with c:
            await eventually(lambda: len(got) >= 4, what="4 attempts")
    assert got[:4] == [0, 1, 2, 3] and c.stats.given_up == 0
    assert committed(cluster, "ng", "Nev") == 0


async def test_by_default_an_orderly_consumer_retries_a_failing_message_without_limit(cluster: Cluster) -> None:
    """As RocketMQ's DefaultMQPushConsumer, whose maxReconsumeTimes defaults to -1: for an orderly consumer that is
    Integer.MAX_VALUE (ConsumeMessageOrderlyService.getMaxReconsumeTimes), for a concurrent one 16. The orderly one
    gave a failing message up to the DLQ after 16 retries, breaking the queue's order where a Java consumer goes on
    retrying it in place. -1 may be given explicitly; a limit given still applies (the tests above)."""
    assert PushConsumer("g", namesrv="127.0.0.1:1").max_reconsume_times == 16
    assert PushConsumer("g", namesrv="127.0.0.1:1", max_reconsume_times=-1).max_reconsume_times == 16
    assert OrderlyPushConsumer("g", namesrv="127.0.0.1:1").max_reconsume_times == 2**31 - 1
    assert OrderlyPushConsumer("g", namesrv="127.0.0.1:1", max_reconsume_times=5).max_reconsume_times == 5
    with pytest.raises(InvalidArgumentError, match="max_reconsume_times"):
        PushConsumer("g", namesrv="127.0.0.1:1", max_reconsume_times=-2)
    await create_topic(cluster, "Inf", 1)
    got: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        got.append(msgs[0].reconsume_times)
        ctx.suspend_current_queue_time_ms = 1
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    c = orderly(cluster, "ig", listener)
    c.subscribe("Inf")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await p.send(Message("Inf", b"x"))
        async with c:
            await eventually(lambda: len(got) >= 20, what="20 attempts")
    assert got[:20] == list(range(20)) and c.stats.given_up == 0
    assert stored(cluster, "%DLQ%ig") == [] and committed(cluster, "ig", "Inf") == 0


# -- producer -----------------------------------------------------------------------------------------------
async def test_send_orderly_reports_a_failure_instead_of_using_another_queue(cluster: Cluster) -> None:
    b = await cluster.add_broker("broker-b")
    await create_topic(cluster, "Two", 2)
    async with Producer("pg", namesrv=cluster.namesrv_addr, retries=2) as p:
        queues = await p.queues("Two")
        assert [(q.broker_name, q.queue_id) for q in queues] == [("broker-a", 0), ("broker-a", 1),
                                                                  ("broker-b", 0), ("broker-b", 1)]
        ok = await p.send_orderly(Message("Two", b"first"), 2)
        assert ok.queue == MessageQueue("Two", "broker-b", 0)
        await b.stop()
        cluster.brokers.remove(b)
        with pytest.raises(MQClientError) as info:
            await p.send_orderly(Message("Two", b"second"), 2)  # key 2 -> broker-b queue 0, which is down
        assert isinstance(info.value, ClientConnectionError)
        assert stored(cluster, "Two", 0) == [] and stored(cluster, "Two", 1) == []  # not sent elsewhere
        assert (await p.send_orderly(Message("Two", b"third"), 4)).queue == MessageQueue("Two", "broker-a", 0)


async def test_an_offset_reset_is_taken_not_undone(cluster: Cluster) -> None:
    """mqadmin resetOffsetByTime with an orderly consumer online: the broker commits the new offsets and tells
    the consumer, which consumes again from them, in order; it does not commit its own old position over them."""
    from cometmq.client import Admin

    await create_topic(cluster, "OReset", 1)
    seen: list[Seen] = []
    async with Producer("orp", namesrv=cluster.namesrv_addr) as p:
        await send_keys(p, "OReset", 1, 6)
        c = orderly(cluster, "og-reset", Recorder(seen, "a"), auto_commit_interval=0.1)
        c.subscribe("OReset")
        async with c:
            await eventually(lambda: len(seen) == 6 and committed(cluster, "og-reset", "OReset") == 6,
                             what="six consumed and committed")
            async with Admin(namesrv=cluster.namesrv_addr) as admin:
                result = await admin.reset_offset("og-reset", "OReset", 0)
            assert result.online and list(result.offsets.values()) == [0]
            await eventually(lambda: len(seen) == 12, what="the six consumed again")
            await send_keys(p, "OReset", 1, 1)
            await eventually(lambda: len(seen) == 13 and committed(cluster, "og-reset", "OReset") == 7,
                             what="the next one consumed and committed")
    assert [s.seq for s in seen] == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0]
    assert [s.offset for s in seen] == [*range(6), *range(7)]


async def test_manual_commit_over_sparse_tag_matches_is_not_held_back_by_the_offset_span(cluster: Cluster) -> None:
    """auto_commit=False, COMMIT every 25 messages, the subscribed tag 1 message in 101: the 25 uncommitted ones
    span over 2,000 offsets. Only concurrent consumers hold pulls back on the span (RocketMQ checks
    consumeConcurrentlyMaxSpan for them alone): here it held every pull back before the 25th message came, and
    the queue stayed stuck for good, as the listener commits only on the 25th."""
    await create_topic(cluster, "Sparse", 1)
    got: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        got.extend(int(m.body) for m in msgs)
        return ConsumeOrderlyStatus.COMMIT if len(got) % 25 == 0 else ConsumeOrderlyStatus.SUCCESS

    c = orderly(cluster, "spg", listener, auto_commit=False, auto_commit_interval=0.1)
    c.subscribe("Sparse", "A")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(25):
            await p.send(Message("Sparse", str(i).encode(), tags="A"))
            await p.send_batch([Message("Sparse", b"x", tags="B") for _ in range(100)])
        async with c:
            await eventually(lambda: len(got) == 25, timeout=10, what="the 25 matching messages")
            await eventually(lambda: committed(cluster, "spg", "Sparse") == 25 * 101, what="the commit")
    assert got == list(range(25))


async def test_an_offset_reset_is_not_undone_by_a_commit_that_was_on_its_way(cluster: Cluster) -> None:
    """The consumer's own commit of its old position (a pull's piggy-backed offset, a periodic commit) sent just
    before the reset notice came reaches the broker after the reset. RocketMQ's client writes the reset offsets
    into its offset store and commits them; this one read the queue's start back from the broker, found its own
    stale commit there, and never consumed again what the operator reset it to replay."""
    from cometmq.client import Admin
    from cometmq.protocol.codes import RequestCode
    from cometmq.protocol.headers import UpdateConsumerOffsetRequestHeader
    from cometmq.protocol.remoting import make_request

    await create_topic(cluster, "OLate", 1)
    seen: list[Seen] = []
    async with Producer("olp", namesrv=cluster.namesrv_addr) as p:
        await send_keys(p, "OLate", 1, 6)
        c = orderly(cluster, "og-late", Recorder(seen, "a"), auto_commit_interval=0.1)
        c.subscribe("OLate")
        notice = c.reset_offsets

        async def stale_commit_first(offsets: dict[MessageQueue, int]) -> None:
            header = UpdateConsumerOffsetRequestHeader("og-late", "OLate", 0, 6)
            await c.instance.invoke_ok(cluster.brokers[0].addr,
                                       make_request(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext()))
            await notice(offsets)

        c.reset_offsets = stale_commit_first  # type: ignore[method-assign]
        async with c:
            await eventually(lambda: len(seen) == 6 and committed(cluster, "og-late", "OLate") == 6,
                             what="six consumed and committed")
            async with Admin(namesrv=cluster.namesrv_addr) as admin:
                await admin.reset_offset("og-late", "OLate", 0)
            await eventually(lambda: len(seen) == 12, timeout=5, what="the six consumed again")
            await eventually(lambda: committed(cluster, "og-late", "OLate") == 6, what="committed again")
    assert [s.offset for s in seen] == [*range(6), *range(6)]


async def test_an_order_conf_keeps_a_down_brokers_queues_in_the_publish_list(cluster: Cluster) -> None:
    """`updateTopic -o true` writes the topic's order conf to the nameservers, which hand it out with the route. As
    RocketMQ's producer, the SDK publishes to the queues it lists, whether their broker is up or not: a key whose
    broker is down fails, it does not move to another broker's queue (out of order). The SDK ignored the conf: once
    the route no longer named broker-b, key 2 went to broker-a, and a conf listing fewer queues was not followed."""
    from cometmq.client import Admin

    b = await cluster.add_broker("broker-b")
    await create_topic(cluster, "OConf", 2)
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.update_order_conf("OConf", "broker-a:2;broker-b:2")
    await b.stop()
    cluster.brokers.remove(b)  # (stopping unregisters it: the route names broker-a's queues only)
    async with Producer("pg", namesrv=cluster.namesrv_addr, retries=0) as p:
        queues = await p.queues("OConf")
        assert [(q.broker_name, q.queue_id) for q in queues] == [("broker-a", 0), ("broker-a", 1),
                                                                  ("broker-b", 0), ("broker-b", 1)]
        with pytest.raises(MQClientError):
            await p.send_orderly(Message("OConf", b"k2"), 2)  # key 2 -> broker-b queue 0, which is down
        assert (await p.send_orderly(Message("OConf", b"k5"), 5)).queue == MessageQueue("OConf", "broker-a", 1)
    assert stored(cluster, "OConf", 0) == []  # key 2 did not move to broker-a
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.update_order_conf("OConf", "broker-a:1")
    async with Producer("pg2", namesrv=cluster.namesrv_addr) as p:
        assert [(q.broker_name, q.queue_id) for q in await p.queues("OConf")] == [("broker-a", 0)]
