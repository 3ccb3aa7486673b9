"""The push consumer against an in-process nameserver + broker(s)."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.client import (
    ClientInstance,
    ClientStateError,
    ConsumeStatus,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from cometmq.protocol.message import iter_records
from cometmq.protocol.route import TopicConfig
from tests.kit import eventually

from .conftest import Cluster


class Collector:
    """An async listener that records what it got (and may be told to fail some messages)."""

    def __init__(self, fail: Callable[[MessageExt], bool] | None = None) -> None:
        self.got: list[MessageExt] = []
        self.fail = fail

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        self.got.extend(msgs)
        if self.fail is not None and any(self.fail(m) for m in msgs):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    @property
    def bodies(self) -> list[bytes]:
        return [m.body for m in self.got]


async def create_topic(cluster: Cluster, topic: str, queues: int) -> None:
    """Create ``topic`` on every broker and wait until the nameserver routes it to all of them."""
    for b in cluster.brokers:
        b.topics.put(TopicConfig(topic, queues, queues))
    inst = ClientInstance(cluster.namesrv_addr)
    try:
        for _ in range(200):
            route = await inst.route(topic, refresh=True)
            if route is not None and len(route.queue_datas) == len(cluster.brokers):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no route for {topic}")
    finally:
        await inst.close()


def stored(cluster: Cluster, topic: str, queue_id: int = 0) -> list[bytes]:
    r = cluster.brokers[0].store.get_messages(topic, queue_id, 0, 1000, max_bytes=1 << 24)
    return [rec.body for rec in iter_records(b"".join(bytes(v) for v in r.buffers))]


def committed(cluster: Cluster, group: str, topic: str) -> int:
    """The sum of the group's committed offsets over the topic's queues on every broker."""
    return sum(max(0, b.offsets.query(group, topic, q)) for b in cluster.brokers for q in range(8))


def consumer(cluster: Cluster, group: str, listener: object, **kw: object) -> PushConsumer:
    return PushConsumer(group, namesrv=cluster.namesrv_addr, listener=listener, **kw)  # type: ignore[arg-type]


# -- basics ---------------------------------------------------------------------------------------------------
async def test_consumes_what_a_producer_sent_with_tag_filtering(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        sent = [await p.send(Message("Tags", f"m{i}".encode(), tags="ABC"[i % 3], keys=f"k{i}",
                                     properties={"n": str(i)})) for i in range(12)]
        listener = Collector()
        c = consumer(cluster, "tags", listener, consume_from="first")
        c.subscribe("Tags", "A || C")
        async with c:
            # long polling: messages sent now reach the waiting pulls at once
            sent += [await p.send(Message("Tags", f"late{t}".encode(), tags=t)) for t in "ABC"]
            await eventually(lambda: len(listener.got) == 10, what="10 messages")
            await asyncio.sleep(0.1)
    assert len(listener.got) == 10
    assert sorted(listener.bodies) == sorted([f"m{i}".encode() for i in range(12) if i % 3 != 1] +
                                             [b"lateA", b"lateC"])
    by_id = {r.msg_id: r for r in sent}
    for m in listener.got:
        assert m.topic == "Tags" and m.tags in ("A", "C") and m.reconsume_times == 0
        r = by_id[m.msg_id]
        assert (m.queue, m.queue_offset) == (r.queue, r.queue_offset)
        if m.body.startswith(b"m"):
            assert m.keys == [f"k{m.body[1:].decode()}"] and m.properties["n"] == m.body[1:].decode()
    assert c.stats.consumed == 10 and c.stats.pulled == 10  # the broker already filtered by tag


async def test_tags_are_trimmed_as_java_trims_them(cluster: Cluster) -> None:
    # RocketMQ String.trim()s each tag of an expression: chars <= ' ' only; U+3000 and U+00A0 are part of the tag.
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i, tag in enumerate(["A", "A\u3000", "A\xa0", "B"]):
            await p.send(Message("TrimTags", f"{i}".encode(), tags=tag))
        listener = Collector()
        c = consumer(cluster, "trim-tags", listener, consume_from="first")
        c.subscribe("TrimTags", "A\u3000 ||\x0bB\x00")
        async with c:
            await eventually(lambda: len(listener.got) == 2, what="2 messages")
            await asyncio.sleep(0.1)
    assert sorted(listener.bodies) == [b"1", b"3"]


async def test_sync_listener_runs_in_a_bounded_thread_pool_with_batches(cluster: Cluster) -> None:
    lock = threading.Lock()
    running = peak = 0
    batches: list[int] = []
    threads: set[str] = set()

    def listener(msgs: list[MessageExt]) -> None:  # None counts as success
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            batches.append(len(msgs))
            threads.add(threading.current_thread().name)
        time.sleep(0.03)
        with lock:
            running -= 1

    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(40):
            await p.send(Message("Pool", f"{i}".encode()))
        c = consumer(cluster, "pool", listener, consume_from="first", max_concurrency=3, batch_max_size=4)
        c.subscribe("Pool")
        async with c:
            await eventually(lambda: sum(batches) == 40, what="40 messages")
    assert peak <= 3 and peak >= 2
    assert max(batches) <= 4 and max(batches) > 1
    assert threading.main_thread().name not in threads
    assert c.stats.consumed == 40


async def test_bad_arguments_are_rejected_before_any_request(cluster: Cluster) -> None:
    ns = cluster.namesrv_addr
    with pytest.raises(InvalidArgumentError):
        PushConsumer("g")
    with pytest.raises(InvalidArgumentError, match="message_model"):
        PushConsumer("g", namesrv=ns, message_model="FANOUT")
    with pytest.raises(InvalidArgumentError, match="consume_from"):
        PushConsumer("g", namesrv=ns, consume_from="middle")
    with pytest.raises(InvalidArgumentError, match="group"):
        PushConsumer("bad group", namesrv=ns)
    with pytest.raises(InvalidArgumentError, match="batch_max_size"):
        PushConsumer("g", namesrv=ns, batch_max_size=0)
    c = PushConsumer("g", namesrv=ns)
    with pytest.raises(InvalidArgumentError, match="topic"):
        c.subscribe("bad topic")
    with pytest.raises(InvalidArgumentError, match="names no tag"):
        c.subscribe("T", "||")
    with pytest.raises(InvalidArgumentError, match="expression_type"):
        c.subscribe("T", "a > 1", expression_type="XPATH")
    with pytest.raises(InvalidArgumentError, match="callable"):
        c.register_listener("nope")  # type: ignore[arg-type]
    with pytest.raises(ClientStateError, match="listener"):
        await c.start()
    c.register_listener(Collector())
    with pytest.raises(ClientStateError, match="subscribe"):
        await c.start()
    assert not c.started


async def test_sql92_subscription_is_registered_with_the_broker(cluster: Cluster) -> None:
    await create_topic(cluster, "Props", 1)
    c = consumer(cluster, "sql", Collector())
    c.subscribe("Props", "a > 5 AND b = 'x'", expression_type="SQL92")
    data = c.consumer_data()
    assert [(s.topic, s.expression_type) for s in data.subscriptions] == [("Props", "SQL92")]
    async with c:
        sub = cluster.brokers[0].consumers.subscription("sql", "Props")
        assert sub is not None and sub.expression_type == "SQL92" and sub.sub_string == "a > 5 AND b = 'x'"
        retry = cluster.brokers[0].consumers.subscription("sql", "%RETRY%sql")
        assert retry is not None and retry.sub_string == "*"


async def test_consumers_of_two_groups_share_one_client_instance(cluster: Cluster) -> None:
    inst = ClientInstance(cluster.namesrv_addr)
    a, b = Collector(), Collector()
    async with Producer("pg", instance=inst) as p:
        await p.send(Message("Shared", b"0"))
        ca = PushConsumer("ga", instance=inst, listener=a, consume_from="first")
        cb = PushConsumer("gb", instance=inst, listener=b, consume_from="first")
        ca.subscribe("Shared")
        cb.subscribe("Shared")
        async with ca, cb:
            for i in range(1, 6):
                await p.send(Message("Shared", f"{i}".encode()))
            await eventually(lambda: len(a.got) == 6 and len(b.got) == 6, what="both groups")
    assert sorted(a.bodies) == sorted(b.bodies) == [f"{i}".encode() for i in range(6)]
    assert not inst.started


# -- offsets ----------------------------------------------------------------------------------------------------
async def test_success_commits_offsets_and_a_new_consumer_resumes(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(10):
            await p.send(Message("Resume", f"a{i}".encode()))
        first = Collector()
        c1 = consumer(cluster, "resume", first, consume_from="first", auto_commit_interval=0.1)
        c1.subscribe("Resume")
        async with c1:
            await eventually(lambda: len(first.got) == 10, what="first batch")
            # committed by the auto-commit timer, before any close
            await eventually(lambda: committed(cluster, "resume", "Resume") == 10, what="auto commit")
        for i in range(5):
            await p.send(Message("Resume", f"b{i}".encode()))
        second = Collector()
        c2 = consumer(cluster, "resume", second, consume_from="first")  # committed offsets win over "first"
        c2.subscribe("Resume")
        async with c2:
            await eventually(lambda: len(second.got) == 5, what="second batch")
            await asyncio.sleep(0.2)
        assert sorted(second.bodies) == [f"b{i}".encode() for i in range(5)]
        assert committed(cluster, "resume", "Resume") == 15  # committed on close


async def test_consume_from_first_last_and_timestamp(cluster: Cluster) -> None:
    await create_topic(cluster, "From", 1)
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(3):
            await p.send(Message("From", f"old{i}".encode()))
        await asyncio.sleep(0.02)
        middle = datetime.datetime.now()
        await asyncio.sleep(0.02)
        for i in range(3):
            await p.send(Message("From", f"mid{i}".encode()))
        listeners = {"first": Collector(), "last": Collector(), "timestamp": Collector()}
        consumers = [consumer(cluster, "from-first", listeners["first"], consume_from="first"),
                     consumer(cluster, "from-last", listeners["last"], consume_from="last"),
                     consumer(cluster, "from-time", listeners["timestamp"], consume_from=middle)]
        for c in consumers:
            c.subscribe("From")
            await c.start()
        try:
            for i in range(2):
                await p.send(Message("From", f"new{i}".encode()))
            # one queue, read in order: once the new messages are in, nothing older can still come
            await eventually(lambda: all(any(m.body == b"new1" for m in x.got) for x in listeners.values()),
                             what="new messages everywhere")
        finally:
            for c in consumers:
                await c.close()
    assert listeners["first"].bodies == [b"old0", b"old1", b"old2", b"mid0", b"mid1", b"mid2", b"new0", b"new1"]
    assert listeners["last"].bodies == [b"new0", b"new1"]
    assert listeners["timestamp"].bodies == [b"mid0", b"mid1", b"mid2", b"new0", b"new1"]


# -- retries ----------------------------------------------------------------------------------------------------
async def test_reconsume_later_redelivers_through_the_retry_topic_then_dead_letters(cluster: Cluster) -> None:
    seen: dict[bytes, list[MessageExt]] = {}

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        [m] = msgs
        seen.setdefault(m.body, []).append(m)
        if m.body == b"boom-once" and m.reconsume_times == 0:
            raise RuntimeError("an exception counts as RECONSUME_LATER")
        if m.body == b"always" or (m.body == b"fail-once" and m.reconsume_times == 0):
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        c = consumer(cluster, "retrying", listener, max_reconsume_times=2)
        c.subscribe("Retry")
        await p.send(Message("Retry", b"warm-up"))  # creates the topic
        async with c:
            sent = {body: await p.send(Message("Retry", body, tags="T"))
                    for body in (b"ok", b"fail-once", b"boom-once", b"always")}
            await eventually(lambda: len(seen.get(b"always", [])) == 3 and len(seen.get(b"fail-once", [])) == 2
                             and len(seen.get(b"boom-once", [])) == 2, timeout=15, what="redeliveries")
            await eventually(lambda: stored(cluster, "%DLQ%retrying") == [b"always"], what="dead letter")
            await asyncio.sleep(0.3)
    assert len(seen[b"ok"]) == 1
    assert [m.reconsume_times for m in seen[b"always"]] == [0, 1, 2]
    assert len(seen[b"always"]) == 3  # the third failure sent it to %DLQ%retrying, not back
    again = seen[b"fail-once"][1]
    assert again.reconsume_times == 1 and again.topic == "Retry" and again.tags == "T"
    assert again.msg_id == sent[b"fail-once"].msg_id and again.queue.topic == "%RETRY%retrying"
    assert c.stats.retried == 5 and c.stats.failed == 5  # the last send-back went to the DLQ


async def test_failed_send_back_is_consumed_again_locally_without_skipping_the_offset(cluster: Cluster) -> None:
    listener = Collector(fail=lambda m: m.reconsume_times == 0)
    c = consumer(cluster, "local-retry", listener, auto_commit_interval=0.05)
    c.local_retry_delay = 0.2

    async def broken_send_back(msg: MessageExt) -> bool:
        return False

    c._send_back = broken_send_back  # type: ignore[method-assign]
    await create_topic(cluster, "Local", 1)
    c.subscribe("Local")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p, c:
        await p.send(Message("Local", b"x"))
        await eventually(lambda: len(listener.got) == 1, what="first delivery")
        await asyncio.sleep(0.1)
        assert committed(cluster, "local-retry", "Local") == 0  # held: it is still to be consumed
        await eventually(lambda: len(listener.got) == 2, what="local redelivery")
        await eventually(lambda: committed(cluster, "local-retry", "Local") == 1, what="commit after success")
    assert [m.reconsume_times for m in listener.got] == [0, 1]
    assert listener.got[1].queue.topic == "Local"  # not through the retry topic
    assert c.stats.send_back_failed == 1 and c.stats.retried == 0


# -- clustering and broadcasting ----------------------------------------------------------------------------------
async def test_two_consumers_split_the_queues_and_one_takes_over_when_the_other_leaves(cluster: Cluster) -> None:
    await cluster.add_broker("broker-b")
    await create_topic(cluster, "Split", 4)
    all_queues = {MessageQueue("Split", b, q) for b in ("broker-a", "broker-b") for q in range(4)}
    a, b = Collector(), Collector()
    # A 60 s period: any quick takeover below is driven by NOTIFY_CONSUMER_IDS_CHANGED.
    c1 = consumer(cluster, "split", a, rebalance_interval=60)
    c2 = consumer(cluster, "split", b, rebalance_interval=60)
    for c in (c1, c2):
        c.subscribe("Split")

    def split_queues(c: PushConsumer) -> set[MessageQueue]:
        return {mq for mq in c.assignment if mq.topic == "Split"}

    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await c1.start()
        try:
            assert split_queues(c1) == all_queues
            await c2.start()
            await eventually(lambda: len(split_queues(c1)) == 4 and split_queues(c1) | split_queues(c2) == all_queues,
                             timeout=5, what="an even split")
            assert not split_queues(c1) & split_queues(c2)
            for i in range(40):
                await p.send(Message("Split", f"x{i}".encode()))
            await eventually(lambda: len(a.got) + len(b.got) == 40, what="40 messages")
            assert a.got and b.got
            assert sorted(a.bodies + b.bodies) == sorted(f"x{i}".encode() for i in range(40))  # each once
            assert {m.queue for m in a.got} <= split_queues(c1) and {m.queue for m in b.got} <= split_queues(c2)

            await c1.close()
            took = await eventually(lambda: split_queues(c2) == all_queues, timeout=5, what="takeover")
            assert took < 2.0  # well under the rebalance period
            for i in range(20):
                await p.send(Message("Split", f"y{i}".encode()))
            await eventually(lambda: sum(m.body.startswith(b"y") for m in b.got) == 20, what="20 more")
            await asyncio.sleep(0.2)
        finally:
            await c1.close()
            await c2.close()
    everything = a.bodies + b.bodies
    assert sorted(everything) == sorted([f"x{i}".encode() for i in range(40)] + [f"y{i}".encode() for i in range(20)])


async def test_broadcasting_gives_every_consumer_every_message(cluster: Cluster, tmp_path: Path) -> None:
    await create_topic(cluster, "Bcast", 4)
    a, b = Collector(), Collector()
    ca = consumer(cluster, "bc", a, message_model="BROADCASTING", offset_store_dir=tmp_path / "a")
    cb = consumer(cluster, "bc", b, message_model="BROADCASTING", offset_store_dir=tmp_path / "b")
    for c in (ca, cb):
        c.subscribe("Bcast")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        async with ca, cb:
            assert len(ca.assignment) == len(cb.assignment) == 4  # all queues, no retry topic
            for i in range(10):
                await p.send(Message("Bcast", f"{i}".encode()))
            await eventually(lambda: len(a.got) == 10 and len(b.got) == 10, what="10 messages each")
        assert sorted(a.bodies) == sorted(b.bodies) == sorted(f"{i}".encode() for i in range(10))
        assert (tmp_path / "a" / "bc" / "offsets.json").exists()
        assert committed(cluster, "bc", "Bcast") == 0  # nothing on the broker
        # a restarted broadcasting consumer resumes from its own file
        for i in range(10, 13):
            await p.send(Message("Bcast", f"{i}".encode()))
        again = Collector()
        c = consumer(cluster, "bc", again, message_model="BROADCASTING", offset_store_dir=tmp_path / "a",
                     consume_from="first")
        c.subscribe("Bcast")
        async with c:
            await eventually(lambda: len(again.got) == 3, what="the 3 new messages")
            await asyncio.sleep(0.2)
    assert sorted(again.bodies) == [b"10", b"11", b"12"]


# -- flow control -------------------------------------------------------------------------------------------------
async def test_flow_control_holds_pulls_back_while_a_queue_is_full(cluster: Cluster) -> None:
    await create_topic(cluster, "Slow", 1)
    release = asyncio.Event()
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await release.wait()
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = consumer(cluster, "slow", listener, consume_from="first", pull_threshold_for_queue=5, pull_batch_size=4,
                 max_concurrency=2)
    c.subscribe("Slow")
    q = MessageQueue("Slow", "broker-a", 0)
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        await p.send_batch([Message("Slow", f"{i}".encode()) for i in range(30)])
        async with c:
            await eventually(lambda: c.stats.flow_controlled > 2, what="flow control")
            assert 5 <= c.in_flight(q) <= 8 and c.stats.pulled <= 8
            release.set()
            await eventually(lambda: len(got) == 30, what="all 30 after release")
    assert sorted(int(m.body) for m in got) == list(range(30))


async def test_offset_moved_jumps_to_the_brokers_next_offset_and_persists_it(cluster: Cluster) -> None:
    await create_topic(cluster, "Moved", 1)
    broker = cluster.brokers[0]
    listener = Collector()
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        for i in range(3):
            await p.send(Message("Moved", f"m{i}".encode()))
        broker.offsets.commit("moved", "Moved", 0, 100)  # past the end (say, the broker's data was replaced)
        c = consumer(cluster, "moved", listener)
        c.subscribe("Moved")
        async with c:
            # the queue starts at 0, so the broker moves the consumer back to 0 (as RocketMQ does)
            await eventually(lambda: len(listener.got) == 3, what="messages after the move")
            await p.send(Message("Moved", b"after"))
            await eventually(lambda: len(listener.got) == 4, what="the next message")
    assert listener.bodies == [b"m0", b"m1", b"m2", b"after"]
    assert broker.offsets.query("moved", "Moved", 0) == 4


async def test_a_new_subscription_is_not_skipped_by_a_pull_held_with_the_old_one(cluster: Cluster) -> None:
    """A pull held by the broker carries the filter it was sent with. Re-subscribing while it was held, its answer
    (woken by the broker's periodic check, or at its timeout) was read as if for the new subscription: the broker
    had filtered by the old one, and its next offset passed the messages that match only the new one. Lost for
    this consumer. The answer of a pull sent with a subscription no longer in force is dropped now."""
    await create_topic(cluster, "Resub", 1)
    listener = Collector()
    c = consumer(cluster, "resub", listener)
    c.subscribe("Resub", "A")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p, c:
        held = cluster.brokers[0].hold._table  # (topic, queue id) -> the pulls held there
        await eventually(lambda: ("Resub", 0) in held, what="the pull held with tag A")
        c.subscribe("Resub", "B")
        await p.send(Message("Resub", b"b", tags="B"))
        await eventually(lambda: listener.bodies == [b"b"], timeout=30, what="the B message")


async def test_subscribe_and_unsubscribe_while_running(cluster: Cluster) -> None:
    await create_topic(cluster, "Early", 2)
    await create_topic(cluster, "Later", 2)
    listener = Collector()
    c = consumer(cluster, "dyn", listener)
    c.subscribe("Early")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p, c:
        c.subscribe("Later", "x")
        await eventually(lambda: any(mq.topic == "Later" for mq in c.assignment), what="queues of Later")
        sub = cluster.brokers[0].consumers.subscription("dyn", "Later")
        assert sub is not None and sub.sub_string == "x"
        await p.send(Message("Later", b"later-x", tags="x"))
        await p.send(Message("Later", b"later-y", tags="y"))
        await p.send(Message("Early", b"early"))
        await eventually(lambda: len(listener.got) == 2, what="two messages")
        await c.unsubscribe("Early")
        assert not any(mq.topic == "Early" for mq in c.assignment)
        assert set(c.subscriptions) == {"Later"}
        await p.send(Message("Early", b"unheard"))
        await p.send(Message("Later", b"later-x2", tags="x"))
        await eventually(lambda: len(listener.got) == 3, what="the third message")
        await asyncio.sleep(0.1)
    assert sorted(listener.bodies) == [b"early", b"later-x", b"later-x2"]
    assert committed(cluster, "dyn", "Early") == 1  # committed when its queues were given up


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_listener_raising_cancelled_error_is_a_failure_not_a_stuck_queue(cluster: Cluster, kind: str) -> None:
    """A listener that raises CancelledError of its own (it awaited something cancelled; a plain one called result()
    on a cancelled concurrent future) has failed, as any exception: the message is sent back and the queue's offset
    moves on (RocketMQ's listener calls catch every Throwable). Not taken as the consumer being cancelled, which
    left the message in flight for good: its offset never committed, the queue held back by flow control."""
    seen: list[tuple[bytes, int]] = []

    def check(m: MessageExt) -> None:
        seen.append((m.body, m.reconsume_times))
        if m.body == b"x1" and m.reconsume_times == 0:
            if kind == "sync":
                import concurrent.futures

                f: concurrent.futures.Future[None] = concurrent.futures.Future()
                f.cancel()
                f.result()  # raises concurrent.futures.CancelledError
            raise asyncio.CancelledError("the listener's own")

    async def async_listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            check(m)

    def sync_listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            check(m)

    await create_topic(cluster, "Cancelled", 1)
    c = consumer(cluster, "cancelled-" + kind, async_listener if kind == "async" else sync_listener,
                 consume_from="first", auto_commit_interval=0.05)
    c.subscribe("Cancelled")
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p, c:
        for i in range(3):
            await p.send(Message("Cancelled", f"x{i}".encode()))
        await eventually(lambda: (b"x1", 1) in seen, timeout=10, what="x1 sent back and consumed again")
        await eventually(lambda: committed(cluster, "cancelled-" + kind, "Cancelled") == 3, what="offset past x1")
    assert sorted(b for b, _ in seen) == [b"x0", b"x1", b"x1", b"x2"]
    assert c.stats.failed == 1 and c.stats.retried == 1
