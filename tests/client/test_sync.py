"""The synchronous facade, used from plain (non-async) test functions.

The nameserver and broker run on an event loop in a thread of their own (a blocking facade call must never
wait on the loop that serves it), and the facade runs its clients on its shared background loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cometmq.client import (
    BrokerError,
    ClientStateError,
    ClientTimeoutError,
    ConsumeStatus,
    InvalidArgumentError,
    Message,
    MessageExt,
    MessageQueue,
    SendResult,
)
from cometmq.client.sync import SyncAdmin, SyncLitePullConsumer, SyncProducer, SyncPushConsumer, loop_thread_running
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from tests.kit import wait_until

from .conftest import Cluster

T = TypeVar("T")


class ThreadCluster:
    """An in-process nameserver + broker served by an event loop in its own thread."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-cluster", daemon=True)
        self.thread.start()
        self.cluster: Cluster = self.run(self._start(tmp))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @staticmethod
    async def _start(tmp: Path) -> Cluster:
        ns = NamesrvController(NamesrvConfig(port=0))
        await ns.start()
        cluster = Cluster(ns, [], tmp)
        await cluster.add_broker("broker-a")
        return cluster

    async def _stop(self) -> None:
        for b in self.cluster.brokers:
            await b.stop()
        await self.cluster.namesrv.stop()

    @property
    def namesrv_addr(self) -> str:
        return self.cluster.namesrv_addr

    def close(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def tc(tmp_path: Path) -> Iterator[ThreadCluster]:
    c = ThreadCluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
    # every test closes what it opened, so the facade's loop thread is gone again
    assert not loop_thread_running()


def make_topic(tc: ThreadCluster, topic: str, queues: int = 1) -> None:
    with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
        admin.create_topic(topic, read_queues=queues)


def poll_n(c: SyncLitePullConsumer, n: int, timeout: float = 10.0) -> list[MessageExt]:
    got: list[MessageExt] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"got {len(got)} of {n}"
        got += c.poll(0.5)
    return got


def test_produce_and_lite_pull_without_an_event_loop(tc: ThreadCluster) -> None:
    assert not loop_thread_running()
    make_topic(tc, "ST", 2)
    q0 = MessageQueue("ST", "broker-a", 0)
    with SyncProducer("spg", namesrv=tc.namesrv_addr) as p:
        assert loop_thread_running()  # started lazily by the first facade object
        r = p.send(Message("ST", b"one"), queue=q0)
        assert r.ok and r.queue == q0
        assert len(p.send_batch([Message("ST", f"b{i}".encode()) for i in range(5)], queue=q0)) == 5
        assert p.send_orderly(Message("ST", b"ordered"), "key-1").ok
        p.send_oneway(Message("ST", b"oneway"))
        results: list[SendResult | None] = []
        done = threading.Event()

        def callback(result: SendResult | None, error: BaseException | None) -> None:
            results.append(result)
            done.set()

        future = p.send_async(Message("ST", b"async"), callback, queue=q0)
        assert future.result(10).ok and done.wait(10) and results[0] is not None
        assert len(p.queues("ST")) == 2
    with SyncLitePullConsumer("scg", namesrv=tc.namesrv_addr, consume_from="first", auto_commit=False,
                              long_poll_timeout=2.0) as c:
        c.subscribe("ST")
        assert set(c.assignment()) == {q0, MessageQueue("ST", "broker-a", 1)}
        got = poll_n(c, 9)
        assert {m.body for m in got} >= {b"one", b"b4", b"ordered", b"oneway", b"async"}
        assert c.poll(0.05) == []
        c.seek(q0, 1)
        assert c.position(q0) == 1
        assert poll_n(c, 1)[0].body == b"b0"
        c.seek_to_end(q0)
        c.seek_to_beginning()
        c.seek_to_timestamp(None, 0)
        assert c.offset_for_timestamp(q0, 0) == 0
        assert c.committed(q0) is None
        c.commit({q0: 3})
        assert c.committed(q0) == 3
        seen: list[BaseException | None] = []
        c.commit_async(seen.append).result(10)
        assert seen == [None]
        c.pause([q0])
        c.resume([q0])
        with pytest.raises(InvalidArgumentError, match="outside"):
            c.seek(q0, 1000)
        c.unsubscribe("ST")
        assert c.assignment() == []
    with SyncLitePullConsumer("scg2", namesrv=tc.namesrv_addr, consume_from="first", long_poll_timeout=2.0) as c:
        c.assign([q0])
        assert len(poll_n(c, 7)) >= 7
    assert not loop_thread_running()  # stopped when the last user closed


def test_admin_facade(tc: ThreadCluster) -> None:
    with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
        assert admin.create_topic("SA", read_queues=2) == ["broker-a"]
        assert "SA" in admin.list_topics()
        assert "broker-a" in admin.cluster_info().broker_addr_table
        assert len(admin.topic_route("SA").queue_datas) == 1
        q = MessageQueue("SA", "broker-a", 0)
        with SyncProducer(namesrv=tc.namesrv_addr) as p:
            r = p.send(Message("SA", b"x", keys="key-x"), queue=q)
        assert admin.topic_stats("SA")[q].max_offset == 1
        assert (admin.min_offset(q), admin.max_offset(q), admin.search_offset(q, 0)) == (0, 1, 0)
        assert admin.view_message(r.offset_msg_id).body == b"x"
        assert [m.body for m in admin.query_messages_by_key("SA", "key-x")] == [b"x"]
        assert admin.query_message_by_unique_key("SA", r.msg_id).body == b"x"
        assert admin.query_message("SA", r.msg_id).body == b"x"
        admin.update_consumer_offset("sg", q, 1)
        assert admin.committed_offset("sg", q) == 1
        assert admin.consumer_progress("sg", "SA").offsets[q].lag == 0
        assert [x.rollback_offset for x in admin.reset_offset_by_timestamp("sg", "SA", 0)] == [0, 0]
        assert admin.create_subscription_group("sg2", broker="broker-a", retryMaxTimes=2) == ["broker-a"]
        assert admin.subscription_groups("broker-a")["sg2"]["retryMaxTimes"] == 2
        admin.delete_subscription_group("sg2")
        with pytest.raises(BrokerError, match="QUERY_NOT_FOUND"):
            admin.query_message_by_unique_key("SA", "0" * 32)
        assert admin.delete_topic("SA") == ["broker-a"]
        assert "SA" not in admin.list_topics()


def test_errors_timeouts_and_state(tc: ThreadCluster) -> None:
    p = SyncProducer("spg", namesrv=tc.namesrv_addr)
    with pytest.raises(ClientStateError, match="not started"):
        p.send(Message("T", b"x"))
    p.start()
    with pytest.raises(InvalidArgumentError, match="topic"):
        p.send(Message("bad topic", b"x"))
    # A call that does not finish in time is cancelled and raises ClientTimeoutError.
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(ClientTimeoutError, match=r"within 0\.1s"):
        p._run(slow, timeout=0.1)
    assert cancelled.wait(5)
    p.close()
    p.close()  # twice is fine
    with pytest.raises(ClientStateError, match="closed"):
        p.send(Message("T", b"x"))
    with pytest.raises(InvalidArgumentError):
        SyncLitePullConsumer("bad group", namesrv=tc.namesrv_addr)
    with pytest.raises(InvalidArgumentError, match="max_inflated_body_size"):  # the other options reach it
        SyncLitePullConsumer("g", namesrv=tc.namesrv_addr, max_inflated_body_size=0)
    with SyncLitePullConsumer("g", namesrv=tc.namesrv_addr, max_inflated_body_size=1 << 20,
                              pull_threshold_size_for_queue_mib=8) as c:
        assert (c._aio.max_inflated_body_size, c._aio.pull_threshold_size_for_queue_mib) == (1 << 20, 8)
        assert c.poll(0.05) == []
        with pytest.raises(InvalidArgumentError, match="not assigned"):
            c.position(MessageQueue("T", "broker-a", 0))


def test_calls_from_the_facades_own_loop_thread_are_refused(tc: ThreadCluster) -> None:
    make_topic(tc, "SL")
    with SyncProducer("spg", namesrv=tc.namesrv_addr) as p:
        errors: list[BaseException] = []

        def callback(result: SendResult | None, error: BaseException | None) -> None:
            try:
                p.send(Message("SL", b"from the callback"))  # runs on the facade's loop thread
            except BaseException as exc:
                errors.append(exc)

        p.send_async(Message("SL", b"x"), callback).result(10)
        assert len(errors) == 1 and isinstance(errors[0], ClientStateError)
        assert "own event-loop thread" in str(errors[0])

        async def inside_the_loop() -> None:
            p.send(Message("SL", b"y"))

        with pytest.raises(ClientStateError, match="own event-loop thread"):
            p._run(inside_the_loop)


def test_calls_from_a_thread_running_its_own_loop(tc: ThreadCluster) -> None:
    make_topic(tc, "SO")
    with SyncProducer("spg", namesrv=tc.namesrv_addr) as p:
        async def app() -> list[SendResult]:
            # An asyncio application calling the blocking API: it blocks this loop, but nothing waits on it.
            return [p.send(Message("SO", f"{i}".encode())) for i in range(3)]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = [f.result(30) for f in [pool.submit(asyncio.run, app()) for _ in range(2)]]
        assert all(r.ok for rs in results for r in rs) and sum(len(rs) for rs in results) == 6


def test_push_consumer_facade(tc: ThreadCluster) -> None:
    make_topic(tc, "SP", 2)
    got: list[bytes] = []
    lock = threading.Lock()
    with SyncProducer("spg", namesrv=tc.namesrv_addr) as p:
        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            # A plain listener runs in a worker thread: blocking facade calls are allowed there.
            with lock:
                got.extend(m.body for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = SyncPushConsumer("spc", namesrv=tc.namesrv_addr, listener=listener, consume_from="first")
        c.subscribe("SP")
        with c:
            for i in range(6):
                p.send(Message("SP", f"p{i}".encode()))
            wait_until(lambda: len(got) >= 6, 15, "six messages", step=0.02)
            assert sorted(got) == [f"p{i}".encode() for i in range(6)]
            assert len({q for q in c.assignment() if q.topic == "SP"}) == 2
            c.commit()


def test_an_unclosed_facade_releases_the_loop_when_collected(tc: ThreadCluster) -> None:
    SyncAdmin(namesrv=tc.namesrv_addr)  # never started nor closed
    gc.collect()
    assert not loop_thread_running()
