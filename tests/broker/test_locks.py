"""The broker's queue lock table (RebalanceLockManager) with a fake clock, and its requests on the wire."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.broker.config import broker_config_from_properties
from cometmq.broker.locks import RebalanceLockManager
from cometmq.net.client import RemotingClient
from cometmq.protocol.client_bodies import (
    ConsumerData,
    HeartbeatData,
    LockBatchBody,
    MessageQueue,
    decode_lock_ok,
)
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from tests.kit import FakeClock

from .conftest import StartBroker, create_topics

LIFE = 60_000


def qs(*ids: int, topic: str = "T") -> set[MessageQueue]:
    return {MessageQueue(topic, "broker-a", i) for i in ids}


def manager(life: int = LIFE) -> tuple[RebalanceLockManager, FakeClock]:
    clock = FakeClock(1_000_000)
    return RebalanceLockManager(clock, life), clock


def test_a_free_queue_is_locked_and_the_owner_renews_it_by_locking_again() -> None:
    m, clock = manager()
    assert m.try_lock_batch("G", qs(0), "c1") == qs(0)
    clock.advance(50_000)
    assert m.try_lock_batch("G", qs(0), "c2") == set()  # held
    assert m.try_lock_batch("G", qs(0), "c1") == qs(0)  # renewed at 50 s
    clock.advance(50_000)  # 100 s after the first lock, 50 s after the renewal: still c1's
    assert m.try_lock_batch("G", qs(0), "c2") == set()
    assert m.owner("G", *qs(0)) == "c1" and m.is_locked("G", *qs(0), "c1") and not m.is_locked("G", *qs(0), "c2")


def test_a_lock_expires_after_lock_max_live_time_and_another_client_takes_it() -> None:
    m, clock = manager(life=1500)
    m.try_lock_batch("G", qs(0), "c1")
    clock.advance(1500)
    assert m.owner("G", *qs(0)) == "c1"  # exactly the lifetime: not yet expired
    assert m.try_lock_batch("G", qs(0), "c2") == set()
    clock.advance(1)
    assert m.owner("G", *qs(0)) is None and not m.is_locked("G", *qs(0), "c1")
    assert m.try_lock_batch("G", qs(0), "c2") == qs(0)
    assert m.owner("G", *qs(0)) == "c2"
    # the old owner's renewal now fails: the queue has a live owner again
    assert m.try_lock_batch("G", qs(0), "c1") == set()
    # and an expired owner may also simply renew its own lock if nobody took it
    m.try_lock_batch("G", qs(1), "c1")
    clock.advance(5000)
    assert m.try_lock_batch("G", qs(1), "c1") == qs(1)


def test_a_batch_returns_the_set_actually_locked() -> None:
    m, clock = manager()
    m.try_lock_batch("G", qs(0, 1), "c1")  # c1: 0 and 1
    m.try_lock_batch("G", qs(2), "c2")  # c2: 2
    clock.advance(LIFE + 1)
    m.try_lock_batch("G", qs(1), "c1")  # c1 renews 1 only; 0 and 2 expire
    m.try_lock_batch("G", qs(3), "c3")  # c3: 3 (fresh)
    got = m.try_lock_batch("G", qs(0, 1, 2, 3, 4), "c2")
    assert got == qs(0, 2, 4)  # expired (c1's), expired own, free — not c1's live 1 nor c3's 3
    assert {q.queue_id: m.owner("G", q) for q in qs(0, 1, 2, 3, 4)} == {0: "c2", 1: "c1", 2: "c2", 3: "c3", 4: "c2"}
    assert m.try_lock_batch("G", set(), "c2") == set()


def test_unlock_only_by_the_owner() -> None:
    m, _ = manager()
    m.try_lock_batch("G", qs(0, 1), "c1")
    m.unlock_batch("G", qs(0, 1), "c2")  # not c2's: nothing happens
    assert m.owner("G", *qs(0)) == "c1" and m.owner("G", *qs(1)) == "c1"
    m.unlock_batch("G", qs(0), "c1")
    assert m.owner("G", *qs(0)) is None and m.owner("G", *qs(1)) == "c1"
    assert m.try_lock_batch("G", qs(0, 1), "c2") == qs(0)
    m.unlock_batch("G", qs(1), "c1")
    m.unlock_batch("G", qs(0), "c2")
    assert m.table == {}  # empty groups are dropped
    m.unlock_batch("Nobody", qs(0), "c1")  # unknown group: fine


def test_groups_are_separate_and_a_departed_client_loses_every_lock_at_once() -> None:
    m, _ = manager()
    m.try_lock_batch("G1", qs(0, 1), "c1")
    m.try_lock_batch("G2", qs(0), "c1")
    assert m.try_lock_batch("G2", qs(1), "c2") == qs(1)  # same queue, another group: independent
    assert m.try_lock_batch("G1", qs(0), "c2") == set()
    assert m.unlock_client("c1") == 3
    assert m.owner("G1", *qs(0)) is None and m.owner("G2", *qs(0)) is None
    assert m.owner("G2", *qs(1)) == "c2"
    assert m.unlock_client("c1") == 0
    assert m.try_lock_batch("G1", qs(0), "c2") == qs(0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lock", "unlock", "wait", "leave"]), st.sampled_from(["a", "b", "c"]),
                          st.sets(st.integers(0, 3), max_size=4), st.integers(0, 2000)), max_size=40))
def test_a_queue_never_has_two_live_owners(ops: list[tuple[str, str, set[int], int]]) -> None:
    """Against a simple model: who holds each queue and since when."""
    m, clock = manager(life=1000)
    model: dict[int, tuple[str, int]] = {}
    for op, client, ids, ms in ops:
        if op == "wait":
            clock.advance(ms)
        elif op == "leave":
            m.unlock_client(client)
            model = {q: v for q, v in model.items() if v[0] != client}
        elif op == "unlock":
            m.unlock_batch("G", qs(*ids), client)
            model = {q: v for q, v in model.items() if not (q in ids and v[0] == client)}
        else:
            got = m.try_lock_batch("G", qs(*ids), client)
            expect = {q for q in ids if q not in model or model[q][0] == client or clock.now - model[q][1] > 1000}
            assert got == qs(*expect)
            for q in expect:
                model[q] = (client, clock.now)
        for q in range(4):
            live = model.get(q)
            want = live[0] if live is not None and clock.now - live[1] <= 1000 else None
            assert m.owner("G", *qs(q)) == want


# -- the broker ---------------------------------------------------------------------------------------------
def test_lock_max_live_time_comes_from_broker_conf() -> None:
    cfg = broker_config_from_properties({"lockMaxLiveTime": "1500"})
    assert cfg.lock_max_live_time_ms == 1500


async def lock(client: RemotingClient, addr: str, group: str, client_id: str, mqs: set[MessageQueue],
               code: int = RequestCode.LOCK_BATCH_MQ) -> frozenset[MessageQueue]:
    r = await client.invoke(addr, make_request(code, {}, LockBatchBody(group, client_id, frozenset(mqs)).encode()))
    assert r.code == ResponseCode.SUCCESS
    return decode_lock_ok(r.body) if code == RequestCode.LOCK_BATCH_MQ else frozenset()


async def test_the_broker_uses_lock_max_live_time_and_frees_a_closed_clients_locks(start_broker: StartBroker,
                                                                                    tmp_path: Path) -> None:
    b = await start_broker(lock_max_live_time_ms=1500)
    assert b.locks.lock_max_live_ms == 1500
    clock = FakeClock(1_000_000)
    b.locks.clock = clock
    mqs = qs(0, 1, 2)
    async with RemotingClient() as c1, RemotingClient() as c2:
        await create_topics(c1, b.addr, "T")
        assert await lock(c1, b.addr, "G", "id-1", mqs) == mqs
        assert await lock(c2, b.addr, "G", "id-2", mqs) == set()
        clock.advance(1000)
        assert await lock(c1, b.addr, "G", "id-1", qs(0)) == qs(0)  # renew 0 only
        clock.advance(600)  # 1 and 2 expired, 0 renewed 600 ms ago
        assert await lock(c2, b.addr, "G", "id-2", mqs) == qs(1, 2)
        await lock(c2, b.addr, "G", "id-2", qs(0), code=RequestCode.UNLOCK_BATCH_MQ)  # not id-2's
        assert b.locks.owner("G", *qs(0)) == "id-1"

        # A consumer's connection closes (closed or killed): its locks go at once, not after the lifetime.
        hb = HeartbeatData("id-1", (), (ConsumerData("G"),)).encode()
        r = await c1.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, hb))
        assert r.code == ResponseCode.SUCCESS
    for _ in range(100):
        if b.locks.owner("G", *qs(0)) is None:
            break
        await asyncio.sleep(0.01)
    assert b.locks.owner("G", *qs(0)) is None
    assert b.locks.owner("G", *qs(1)) == "id-2"


async def test_unregister_frees_the_clients_locks(start_broker: StartBroker) -> None:
    b = await start_broker()
    async with RemotingClient() as c1:
        await create_topics(c1, b.addr, "T")
        assert await lock(c1, b.addr, "G", "id-1", qs(0, 1)) == qs(0, 1)
        r = await c1.invoke(b.addr, make_request(RequestCode.UNREGISTER_CLIENT,
                                                 {"clientID": "id-1", "consumerGroup": "G", "producerGroup": ""}))
        assert r.code == ResponseCode.SUCCESS
        assert b.locks.owner("G", *qs(0)) is None and b.locks.owner("G", *qs(1)) is None


async def test_unregistering_one_group_keeps_the_clients_locks_in_its_other_groups(start_broker: StartBroker) -> None:
    """One client process (one client id) with two orderly consumers, of groups G1 and G2, shuts down the first:
    its UNREGISTER_CLIENT names G1, yet every lock of the client id was released, G2's too, while G2's consumer
    went on consuming those queues in order; another member of G2 could then lock them and consume them at the
    same time. Now only the named group's locks go (the rest are released when the client leaves altogether)."""
    b = await start_broker()
    async with RemotingClient() as c1:
        await create_topics(c1, b.addr, "T")
        r = await c1.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, HeartbeatData(
            "id-1", (), (ConsumerData("G1"), ConsumerData("G2"))).encode()))
        assert r.code == ResponseCode.SUCCESS
        assert await lock(c1, b.addr, "G1", "id-1", qs(0)) == qs(0)
        assert await lock(c1, b.addr, "G2", "id-1", qs(0, 1)) == qs(0, 1)
        r = await c1.invoke(b.addr, make_request(RequestCode.UNREGISTER_CLIENT,
                                                 {"clientID": "id-1", "consumerGroup": "G1", "producerGroup": ""}))
        assert r.code == ResponseCode.SUCCESS
        assert b.locks.owner("G1", *qs(0)) is None
        assert b.locks.owner("G2", *qs(0)) == "id-1" and b.locks.owner("G2", *qs(1)) == "id-1"
        async with RemotingClient() as c2:  # another member of G2 cannot take them
            assert await lock(c2, b.addr, "G2", "id-2", qs(0, 1)) == frozenset()
    for _ in range(200):  # the client's connection closed: it has left, and its other locks go with it
        if b.locks.owner("G2", *qs(0)) is None:
            break
        await asyncio.sleep(0.01)
    assert b.locks.owner("G2", *qs(0)) is None and b.locks.owner("G2", *qs(1)) is None


async def test_locks_of_a_client_that_never_comes_back_are_dropped_once_expired(start_broker: StartBroker) -> None:
    """A client that locks queues without ever heartbeating on that connection (or under another client id), then
    goes away without UNREGISTER_CLIENT, left its entries in the table for good: nothing removed expired locks,
    and a lock request naming a group and no queues left an empty group behind. Any peer could grow the table
    without bound with made-up group, topic and client names."""
    b = await start_broker(lock_max_live_time_ms=200, consumer_offset_persist_interval_ms=100)
    async with RemotingClient() as c:
        many = {MessageQueue(f"T{i}", "broker-a", q) for i in range(50) for q in range(4)}
        await create_topics(c, b.addr, *sorted({mq.topic for mq in many}))
        assert await lock(c, b.addr, "G-ghost", "ghost", many) == many
        assert await lock(c, b.addr, "G-empty", "ghost", set()) == set()
    assert b.locks.table  # held while alive
    for _ in range(200):
        if not b.locks.table:
            break
        await asyncio.sleep(0.02)
    assert b.locks.table == {}


async def test_only_queues_and_groups_the_broker_has_are_locked(start_broker: StartBroker) -> None:
    """A lock request naming made-up topics, queue ids, broker names or groups had them all locked: one frame held
    ~250,000 entries until they expired, and a peer sending such frames grew the table without bound. Now only
    this broker's queues of a group it has (made as a pull makes it) are locked; the rest are left out."""
    b = await start_broker()
    async with RemotingClient() as c:
        await create_topics(c, b.addr, "T", queues=2)
        made_up = {MessageQueue(f"Ghost{i}", "broker-a", 0) for i in range(1000)} | qs(2, 3, -1) \
            | {MessageQueue("T", f"other-{i}", 0) for i in range(100)}
        assert await lock(c, b.addr, "G", "id-1", made_up | qs(0, 1)) == qs(0, 1)
        assert b.locks.table == {"G": {mq: b.locks.table["G"][mq] for mq in qs(0, 1)}}
    no_auto = await start_broker(Path(b.config.store.store_path).parent / "no-auto",
                                 auto_create_subscription_group=False)
    async with RemotingClient() as c:
        await create_topics(c, no_auto.addr, "T")
        r = await c.invoke(no_auto.addr, make_request(RequestCode.LOCK_BATCH_MQ, {},
                                                       LockBatchBody("Unknown", "id-1", frozenset(qs(0))).encode()))
        assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert no_auto.locks.table == {}


async def test_a_late_close_frees_only_the_locks_taken_on_that_connection(start_broker: StartBroker) -> None:
    """A client that reconnected (a network split, say) and locked its queues again on the new connection, before
    heartbeating there, lost those locks when the broker noticed the old connection's close late: every lock of the
    client id was freed, and another consumer could take the queues while this one still consumed them. A close now
    frees only the locks last taken on that connection."""
    b = await start_broker()
    async with RemotingClient() as old, RemotingClient() as new, RemotingClient() as other:
        await create_topics(other, b.addr, "T")
        r = await old.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, HeartbeatData(
            "id-1", (), (ConsumerData("G"),)).encode()))
        assert r.code == ResponseCode.SUCCESS
        assert await lock(old, b.addr, "G", "id-1", qs(0, 1)) == qs(0, 1)
        assert await lock(new, b.addr, "G", "id-1", qs(0, 1)) == qs(0, 1)  # renewed on the new connection
        await old.close()
        for _ in range(200):
            if not b.consumers.has_client("id-1"):
                break
            await asyncio.sleep(0.01)
        assert not b.consumers.has_client("id-1")  # the close was seen: the client has no registration left
        await asyncio.sleep(0.05)
        assert b.locks.owner("G", *qs(0)) == "id-1" and b.locks.owner("G", *qs(1)) == "id-1"
        assert await lock(other, b.addr, "G", "id-2", qs(0, 1)) == frozenset()
