"""The SDK's TransactionProducer against an in-process nameserver + broker (real sockets)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.broker.transaction import CHECK_MAX_TOPIC
from cometmq.client import (
    InvalidArgumentError,
    LitePullConsumer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionClientInstance,
    TransactionProducer,
)
from cometmq.client.sync import SyncLitePullConsumer, SyncTransactionProducer, loop_thread_running
from tests.kit import eventually, wait_until

from .conftest import Cluster
from .test_sync import ThreadCluster, poll_n

S = LocalTransactionState
FAST = {"transaction_timeout_ms": 200, "transaction_check_interval_ms": 200}


@pytest.fixture
async def fast_cluster(cluster: Cluster) -> AsyncIterator[Cluster]:
    """The cluster's broker replaced by one that checks back after 200 ms."""
    old = cluster.brokers.pop()
    await old.stop()
    await cluster.add_broker("broker-tx", **FAST)
    yield cluster


async def consume(cluster: Cluster, topic: str, want: int, *, group: str = "cg-tx", settle: float = 0.5,
                  timeout: float = 20.0) -> list[MessageExt]:
    """Everything in ``topic`` once ``want`` messages arrived and nothing more came for ``settle`` seconds."""
    consumer = LitePullConsumer(group, namesrv=cluster.namesrv_addr, consume_from="first")
    await consumer.start()
    await consumer.subscribe(topic)
    got: list[MessageExt] = []
    try:
        async with asyncio.timeout(timeout):
            while len(got) < want:
                got += await consumer.poll(timeout=0.2)
        got += await consumer.poll(timeout=settle)
    finally:
        await consumer.close()
    return got


def broker(cluster: Cluster) -> BrokerController:
    return cluster.brokers[0]


async def test_commit_rollback_and_unknown_then_checked(fast_cluster: Cluster) -> None:
    asked: list[MessageExt] = []

    def checker(msg: MessageExt) -> LocalTransactionState:
        asked.append(msg)
        return S.COMMIT

    calls: list[tuple[bytes, Any]] = []

    def local(msg: Message, arg: Any) -> LocalTransactionState:
        calls.append((bytes(msg.body), arg))
        return arg  # type: ignore[no-any-return]

    async with TransactionProducer("tx-pg", namesrv=fast_cluster.namesrv_addr, checker=checker) as p:
        r_commit = await p.send_in_transaction(Message("TxSdk", b"c", keys="order-c", tags="T",
                                                       properties={"shop": "7"}), local, S.COMMIT)
        r_roll = await p.send_in_transaction(Message("TxSdk", b"r"), local, S.ROLLBACK)
        r_unknown = await p.send_in_transaction(Message("TxSdk", b"u", keys="order-u"), local, S.UNKNOW)
        assert [r.local_state for r in (r_commit, r_roll, r_unknown)] == [S.COMMIT, S.ROLLBACK, S.UNKNOW]
        assert calls == [(b"c", S.COMMIT), (b"r", S.ROLLBACK), (b"u", S.UNKNOW)]
        got = await consume(fast_cluster, "TxSdk", 2)
    by_body = {m.body: m for m in got}
    assert sorted(by_body) == [b"c", b"u"] and len(got) == 2
    c = by_body[b"c"]
    assert c.msg_id == r_commit.msg_id == r_commit.transaction_id
    assert c.keys == ["order-c"] and c.tags == "T" and c.properties["shop"] == "7"
    assert c.queue.queue_id == r_commit.send_result.queue.queue_id
    assert by_body[b"u"].msg_id == r_unknown.msg_id
    # Only the undecided one was asked about, with the message as it was sent.
    assert [m.msg_id for m in asked] == [r_unknown.msg_id]
    assert asked[0].topic == "TxSdk" and asked[0].keys == ["order-u"] and asked[0].body == b"u"
    assert broker(fast_cluster).transactions.metrics.committed == 2


async def test_async_functions_and_a_failing_local_transaction(fast_cluster: Cluster) -> None:
    async def checker(msg: MessageExt) -> LocalTransactionState:
        await asyncio.sleep(0)
        return S.ROLLBACK

    async def local_ok(msg: Message, arg: Any) -> LocalTransactionState:
        return S.COMMIT

    def local_fails(msg: Message, arg: Any) -> LocalTransactionState:
        raise RuntimeError("database down")

    async with TransactionProducer("tx-pg2", namesrv=fast_cluster.namesrv_addr, checker=checker) as p:
        ok = await p.send_in_transaction(Message("TxAsync", b"ok"), local_ok)
        failed = await p.send_in_transaction(Message("TxAsync", b"failed"), local_fails)
        assert failed.local_state is S.UNKNOW
        b = broker(fast_cluster)
        await eventually(lambda: not b.transactions.table, 20, what="the broker's half table to empty", step=0.05)
        assert p.checks_answered[S.ROLLBACK] == 1
    got = await consume(fast_cluster, "TxAsync", 1)
    assert [m.msg_id for m in got] == [ok.msg_id]


async def test_without_a_checker_undecided_ones_end_in_the_check_max_topic(cluster: Cluster) -> None:
    old = cluster.brokers.pop()
    await old.stop()
    b = await cluster.add_broker("broker-max", transaction_timeout_ms=100, transaction_check_interval_ms=100,
                                 transaction_check_max=2)
    async with TransactionProducer("tx-pg3", namesrv=cluster.namesrv_addr) as p:
        r = await p.send_in_transaction(Message("TxMax", b"lost"), lambda m, a: S.UNKNOW)
        async with asyncio.timeout(20):
            while b.transactions.metrics.discarded == 0:
                await asyncio.sleep(0.05)
        assert p.checks_answered[S.UNKNOW] == 2
    [kept] = await consume(cluster, CHECK_MAX_TOPIC, 1)
    assert kept.msg_id == r.msg_id and kept.body == b"lost"
    assert b.store.max_offset("TxMax", r.send_result.queue.queue_id) == 0


async def test_bad_use_is_refused(cluster: Cluster) -> None:
    with pytest.raises(InvalidArgumentError):
        TransactionProducer("g")
    with pytest.raises(InvalidArgumentError):
        TransactionProducer("g", namesrv=cluster.namesrv_addr, checker="not callable")  # type: ignore[arg-type]
    instance = TransactionClientInstance(cluster.namesrv_addr)
    async with TransactionProducer("g", instance=instance) as p:
        with pytest.raises(InvalidArgumentError, match="delayed"):
            await p.send_in_transaction(Message("TxBad", b"x", delay_level=2), lambda m, a: S.COMMIT)
        with pytest.raises(InvalidArgumentError, match="callable"):
            await p.send_in_transaction(Message("TxBad", b"x"), "commit")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="already has"):
            await TransactionProducer("g", instance=instance).start()
        wrong = await p.send_in_transaction(Message("TxBad", b"x"), lambda m, a: "yes")  # type: ignore[arg-type,return-value]
        assert wrong.local_state is S.UNKNOW  # a wrong answer never commits


async def test_two_groups_share_one_instance(fast_cluster: Cluster) -> None:
    instance = TransactionClientInstance(fast_cluster.namesrv_addr)
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def check_a(m: MessageExt) -> LocalTransactionState:
        seen["a"].append(m.msg_id)
        return S.COMMIT

    def check_b(m: MessageExt) -> LocalTransactionState:
        seen["b"].append(m.msg_id)
        return S.ROLLBACK

    pa = TransactionProducer("tx-a", instance=instance, checker=check_a)
    pb = TransactionProducer("tx-b", instance=instance, checker=check_b)
    async with pa, pb:
        ra = await pa.send_in_transaction(Message("TxShare", b"a"), lambda m, a: S.UNKNOW)
        rb = await pb.send_in_transaction(Message("TxShare", b"b"), lambda m, a: S.UNKNOW)
        b = broker(fast_cluster)
        await eventually(lambda: not b.transactions.table, 20, what="the broker's half table to empty", step=0.05)
    assert seen == {"a": [ra.msg_id], "b": [rb.msg_id]}
    got = await consume(fast_cluster, "TxShare", 1)
    assert [m.body for m in got] == [b"a"]


def test_sync_facade(tmp_path: Path) -> None:
    tc = ThreadCluster(tmp_path)
    try:
        async def fast_broker() -> BrokerController:
            await tc.cluster.brokers.pop().stop()
            return await tc.cluster.add_broker("broker-sync", **FAST)

        b = tc.run(fast_broker())
        threads: list[str] = []

        def checker(msg: MessageExt) -> LocalTransactionState:
            threads.append(threading.current_thread().name)
            return S.COMMIT

        def local(msg: Message, arg: Any) -> LocalTransactionState:
            threads.append(threading.current_thread().name)
            return arg  # type: ignore[no-any-return]

        with SyncTransactionProducer("tx-sync", namesrv=tc.namesrv_addr, checker=checker) as p:
            r1 = p.send_in_transaction(Message("TxSync", b"yes"), local, S.COMMIT)
            r2 = p.send_in_transaction(Message("TxSync", b"no"), local, S.ROLLBACK)
            r3 = p.send_in_transaction(Message("TxSync", b"later"), local, S.UNKNOW)
            wait_until(lambda: b.transactions.metrics.committed >= 2, 20, "the check-back to commit", step=0.05)
        assert [r.local_state for r in (r1, r2, r3)] == [S.COMMIT, S.ROLLBACK, S.UNKNOW]
        me = threading.current_thread().name
        assert threads[:3] == [me] * 3  # local transactions run in the caller's thread
        assert len(threads) == 4 and threads[3] not in (me, "cometmq-sync-loop")  # the checker in a worker
        with SyncLitePullConsumer("cg-sync-tx", namesrv=tc.namesrv_addr, consume_from="first") as c:
            c.subscribe("TxSync")
            got = poll_n(c, 2)
        assert sorted((m.body, m.msg_id) for m in got) == sorted([(b"yes", r1.msg_id), (b"later", r3.msg_id)])
    finally:
        tc.close()
    assert not loop_thread_running()
