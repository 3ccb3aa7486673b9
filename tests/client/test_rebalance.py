"""Allocation strategies (pure), the rebalance driver with a fake instance, process queues and offset stores."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.client import (
    AllocateAverage,
    AllocateAverageByCircle,
    AllocateByConfig,
    AllocateConsistentHash,
    AllocateStrategy,
    InvalidArgumentError,
    LocalFileOffsetStore,
    MessageQueue,
)
from cometmq.client.message import MessageExt
from cometmq.client.process_queue import ProcessQueue
from cometmq.client.rebalance import Rebalancer, java_queue_key, md5_hash32


def mqs(n: int, topic: str = "T", brokers: Sequence[str] = ("broker-a",)) -> list[MessageQueue]:
    return [MessageQueue(topic, b, i) for b in brokers for i in range(n)]


def ids(n: int) -> list[str]:
    return [f"10.0.0.{i}@{i}" for i in range(n)]


def split(strategy: AllocateStrategy, queues: list[MessageQueue], cids: list[str]) -> dict[str, list[MessageQueue]]:
    return {cid: strategy.allocate("g", cid, queues, cids) for cid in cids}


def qids(queues: list[MessageQueue]) -> list[int]:
    return [q.queue_id for q in queues]


# -- strategies: worked examples --------------------------------------------------------------------------
def test_average_gives_contiguous_blocks_extra_ones_first() -> None:
    got = split(AllocateAverage(), mqs(8), ids(3))
    assert [qids(v) for v in got.values()] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    got = split(AllocateAverage(), mqs(5), ids(2))
    assert [qids(v) for v in got.values()] == [[0, 1, 2], [3, 4]]
    got = split(AllocateAverage(), mqs(2), ids(4))
    assert [qids(v) for v in got.values()] == [[0], [1], [], []]


def test_average_by_circle_deals_queues_round() -> None:
    got = split(AllocateAverageByCircle(), mqs(8), ids(3))
    assert [qids(v) for v in got.values()] == [[0, 3, 6], [1, 4, 7], [2, 5]]
    got = split(AllocateAverageByCircle(), mqs(2), ids(3))
    assert [qids(v) for v in got.values()] == [[0], [1], []]


def test_strategies_sort_their_inputs_so_every_consumer_agrees() -> None:
    queues = mqs(4, brokers=("broker-a", "broker-b"))
    shuffled = list(reversed(queues))
    cids = ids(3)
    for strategy in (AllocateAverage(), AllocateAverageByCircle(), AllocateConsistentHash()):
        for cid in cids:
            assert strategy.allocate("g", cid, queues, cids) == strategy.allocate("g", cid, shuffled, cids[::-1])


def test_consumer_not_listed_gets_nothing_and_empty_id_is_rejected() -> None:
    for strategy in (AllocateAverage(), AllocateAverageByCircle(), AllocateConsistentHash()):
        assert strategy.allocate("g", "stranger", mqs(4), ids(2)) == []
        assert strategy.allocate("g", ids(1)[0], [], ids(1)) == []
        with pytest.raises(InvalidArgumentError):
            strategy.allocate("g", "", mqs(4), ids(2))


def test_consistent_hash_uses_rocketmq_ring_keys() -> None:
    assert md5_hash32("abc") == 0x90015098  # md5("abc") = 900150983cd24fb0...
    assert java_queue_key(MessageQueue("T", "broker-a", 3)) == "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
    strategy = AllocateConsistentHash(virtual_nodes=3)
    hashes, owners = strategy.ring(["c1", "c2"])
    assert len(hashes) == 6 and hashes == sorted(hashes) and sorted(set(owners)) == ["c1", "c2"]
    with pytest.raises(InvalidArgumentError):
        AllocateConsistentHash(virtual_nodes=0)


def test_consistent_hash_moves_only_queues_to_a_new_consumer() -> None:
    strategy = AllocateConsistentHash()
    queues = mqs(16, brokers=("broker-a", "broker-b"))
    before = {mq: cid for cid, got in split(strategy, queues, ids(4)).items() for mq in got}
    after = {mq: cid for cid, got in split(strategy, queues, ids(5)).items() for mq in got}
    newcomer = ids(5)[4]
    moved = [mq for mq in queues if before[mq] != after[mq]]
    assert all(after[mq] == newcomer for mq in moved)
    assert len(moved) < len(queues)


def test_by_config_takes_the_configured_queues_of_the_topic_only() -> None:
    strategy = AllocateByConfig([MessageQueue("T", "broker-a", 1), MessageQueue("T", "broker-a", 9),
                                 MessageQueue("Other", "broker-a", 0)])
    assert strategy.allocate("g", "anyone", mqs(4), ids(2)) == [MessageQueue("T", "broker-a", 1)]


# -- strategies: properties ---------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(n_queues=st.integers(1, 40), n_brokers=st.integers(1, 3), n_consumers=st.integers(1, 12),
       which=st.sampled_from(["avg", "circle", "hash"]), seed=st.integers(0, 2**16))
def test_every_queue_has_exactly_one_owner(n_queues: int, n_brokers: int, n_consumers: int, which: str,
                                            seed: int) -> None:
    strategy: AllocateStrategy = {"avg": AllocateAverage(), "circle": AllocateAverageByCircle(),
                                  "hash": AllocateConsistentHash()}[which]
    queues = mqs(n_queues, brokers=[f"b{i}" for i in range(n_brokers)])
    cids = ids(n_consumers)
    random.Random(seed).shuffle(cids)
    got = split(strategy, queues, cids)
    owned = [mq for qs in got.values() for mq in qs]
    assert sorted(owned) == sorted(queues)  # all covered, none twice
    if which != "hash":
        sizes = [len(v) for v in got.values()]
        assert max(sizes) - min(sizes) <= 1


# -- the rebalance driver -----------------------------------------------------------------------------------
class FakeInstance:
    def __init__(self, client_id: str, queues: dict[str, list[MessageQueue]], consumers: list[str]) -> None:
        self.client_id = client_id
        self.queues = queues
        self.consumers = consumers
        self.heartbeats = 0
        self.id_lookups = 0

    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return list(self.queues.get(topic, []))

    async def consumer_ids(self, group: str, broker_name: str) -> list[str]:
        self.id_lookups += 1
        return list(self.consumers)

    async def heartbeat(self) -> None:
        self.heartbeats += 1


class Applied:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[MessageQueue]]] = []

    async def __call__(self, topic: str, queues: list[MessageQueue]) -> bool:
        self.calls.append((topic, queues))
        return True


async def test_rebalancer_allocates_each_topic_and_folds_a_burst_of_notices() -> None:
    inst = FakeInstance("c1", {"T": mqs(4), "U": mqs(2, "U")}, ["c1", "c2"])
    applied = Applied()
    rb = Rebalancer(inst, "g", strategy=AllocateAverage(), broadcasting=False, topics=lambda: ["T", "U"],
                    apply=applied, period=60, debounce=0.05)
    assert await rb.rebalance()
    assert applied.calls == [("T", mqs(4)[:2]), ("U", mqs(2, "U")[:1])]
    rb.start()
    try:
        for _ in range(20):
            rb.request()
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)
        assert rb.runs == 2  # the start run and one for the whole burst
        inst.consumers = ["c1"]
        rb.request()
        await asyncio.sleep(0.2)
        assert rb.runs == 3 and applied.calls[-2:] == [("T", mqs(4)), ("U", mqs(2, "U"))]
    finally:
        await rb.stop()


async def test_rebalancer_retries_soon_when_a_route_or_our_id_is_missing() -> None:
    inst = FakeInstance("c1", {}, ["c2"])
    applied = Applied()
    rb = Rebalancer(inst, "g", strategy=AllocateAverage(), broadcasting=False, topics=lambda: ["T"], apply=applied,
                    period=60, retry_delay=0.05)
    assert not await rb.rebalance()  # no route yet
    rb.start()
    try:
        inst.queues["T"] = mqs(2)
        await asyncio.sleep(0.2)
        assert inst.heartbeats >= 1 and applied.calls == []  # not listed yet: announce ourselves, take nothing
        inst.consumers = ["c1", "c2"]
        for _ in range(50):
            if applied.calls:
                break
            await asyncio.sleep(0.02)
        assert applied.calls == [("T", mqs(2)[:1])]
    finally:
        await rb.stop()


async def test_broadcasting_takes_every_queue_without_asking_for_consumers() -> None:
    inst = FakeInstance("c1", {"T": mqs(3)}, [])
    applied = Applied()
    rb = Rebalancer(inst, "g", strategy=AllocateAverage(), broadcasting=True, topics=lambda: ["T"], apply=applied)
    assert await rb.rebalance()
    assert applied.calls == [("T", mqs(3))] and inst.id_lookups == 0


# -- process queue ------------------------------------------------------------------------------------------
def ext(offset: int, body: bytes = b"x") -> MessageExt:
    return MessageExt(topic="T", body=body, properties={}, msg_id=str(offset), offset_msg_id="", queue=mqs(1)[0],
                      queue_offset=offset, commit_log_offset=offset * 100, born_timestamp=0, store_timestamp=0,
                      born_host="", store_host="", reconsume_times=0, sys_flag=0, flag=0)


def test_process_queue_commits_only_below_the_oldest_message_in_flight() -> None:
    pq = ProcessQueue(10)
    assert pq.committable == 10
    msgs = [ext(o, b"abc") for o in range(10, 15)]
    assert pq.put(msgs, 17) == msgs  # 15 and 16 were filtered out by tag
    assert pq.count == 5 and pq.size_bytes == 15
    assert pq.put([ext(12)], 17) == []  # already held
    assert pq.remove([msgs[1], msgs[2]]) == 10  # 10 still running
    assert pq.max_span == 4
    assert pq.remove([msgs[0]]) == 13
    assert pq.remove([msgs[3], msgs[4]]) == 17
    pq.advance(20)
    assert pq.committable == 20 and pq.count == 0 and pq.size_bytes == 0


def test_process_queue_handles_offsets_put_out_of_order() -> None:
    pq = ProcessQueue(0)
    pq.put([ext(5), ext(6)], 7)
    pq.put([ext(2)], 7)
    assert pq.committable == 2
    assert pq.remove([ext(2)]) == 5


# -- local offset store -------------------------------------------------------------------------------------
async def test_local_offset_store_round_trip(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(tmp_path, "bc")
    await store.load()
    q0, q1 = mqs(2)
    assert await store.read_stored(q0) == -1
    store.update(q0, 5)
    store.update(q0, 3)  # increase only
    store.update(q1, 7)
    assert store.read(q0) == 5
    store.update(q0, 4, increase_only=False)
    await store.persist([q0, q1])
    assert (tmp_path / "bc" / "offsets.json").exists()
    again = LocalFileOffsetStore(tmp_path, "bc")
    await again.load()
    assert await again.read_stored(q0) == 4 and await again.read_stored(q1) == 7
    assert again.offsets() == {q0: 4, q1: 7}
    (tmp_path / "bc" / "offsets.json").write_text("{not json")
    broken = LocalFileOffsetStore(tmp_path, "bc")
    await broken.load()
    assert await broken.read_stored(q0) == -1


async def test_local_offset_store_persists_at_once_keep_the_newer_offsets(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two persists at once (the periodic one and a dropped queue's) each wrote the file from a thread: when the
    first one's write was the slower (a slow disk), the older offsets landed last, and the newer ones were not written
    again until an offset changed (a restart then consumed the messages between again)."""
    import time as _time

    from cometmq.client import offset_store

    real = offset_store.write_atomic
    calls: list[bytes] = []

    def slow_first(path: Path, data: bytes, **kw: object) -> None:
        calls.append(data)
        if len(calls) == 1:
            _time.sleep(0.3)  # the first write is slow to land
        real(path, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(offset_store, "write_atomic", slow_first)
    store = LocalFileOffsetStore(tmp_path, "bc")
    await store.load()
    [q0] = mqs(1)
    store.update(q0, 5)
    first = asyncio.create_task(store.persist([q0]))
    await asyncio.sleep(0.05)  # the first write under way
    store.update(q0, 9)
    await store.persist([q0])
    await first
    again = LocalFileOffsetStore(tmp_path, "bc")
    await again.load()
    assert await again.read_stored(q0) == 9
