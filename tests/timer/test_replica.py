"""The timer on a replica (timer/replica.py): it indexes the master's timer records, delivers nothing, follows the
master's deliveries, and once promoted delivers exactly what the master had not put: no loss, no duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cometmq.protocol.message import MessageRecord, decode_record
from cometmq.store.config import StoreConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.config import TimerConfig
from cometmq.timer.message import Rewrite, delete_marker, rewrite_for_timer
from cometmq.timer.service import TimerMessageService
from tests.kit import FakeClock

pytestmark = pytest.mark.timeout(30)


class Node:
    """A store and its timer; ``deliver`` off makes it a replica."""

    def __init__(self, path: Path, clock: FakeClock, *, deliver: bool) -> None:
        cfg = StoreConfig(store_path=path, commitlog_segment_size=1 << 22, consume_queue_units_per_file=4096,
                          max_message_size=1 << 16, max_hash_slot_num=1024, max_index_num=8192,
                          flush_interval_commitlog_ms=50, flush_commitlog_least_pages=0, preallocate=False)
        self.clock = clock
        self.store = MessageStore(cfg, clock=clock)
        self.timer = TimerMessageService(self.store, TimerConfig(timerlog_file_size=56 * 4096, preallocate=False,
                                                                 flush_interval_ms=100),
                                         self.put, clock=clock, deliver=deliver)

    async def put(self, msgs: list[MessageInner]) -> PutResult:
        return self.store.put_messages(msgs)

    async def start(self) -> Node:
        self.store.start()
        self.store.add_arrival_batch_listener(self.timer.on_arrivals)
        await self.timer.start()
        return self

    async def stop(self) -> None:
        await self.timer.stop()
        self.store.shutdown()

    def schedule(self, uniq: str, deliver_ms: int) -> None:
        m = MessageInner(topic="T", body=uniq.encode(), queue_id=0,
                         properties={"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(deliver_ms)})
        assert rewrite_for_timer(m, self.clock(), 86_400_000).outcome is Rewrite.SCHEDULED
        assert self.store.put_messages([m]).ok

    def cancel(self, uniq: str, deliver_ms: int) -> None:
        m = delete_marker("T", uniq, deliver_ms, producer_group=None, born_ms=self.clock(),
                          born_host=b"\x7f\0\0\1\0\0\0\0")
        assert rewrite_for_timer(m, self.clock(), 86_400_000).outcome is Rewrite.SCHEDULED
        assert self.store.put_messages([m]).ok

    def delivered(self) -> list[str]:
        r = self.store.get_messages("T", 0, 0, 4096, max_bytes=64 << 20)
        recs: list[MessageRecord] = [decode_record(v)[0] for v in r.buffers]
        return [rec.properties["UNIQ_KEY"] for rec in recs]


def copy_log(master: MessageStore, replica: MessageStore) -> None:
    """Ship the master's log to the replica as the HA link does (raw bytes at the same offsets)."""
    offset = replica.commitlog.max_offset
    while offset < master.commitlog.max_offset:
        mf = master.commitlog.files.find(offset)
        assert mf is not None
        pos = offset - mf.file_from_offset
        n = min(4096, mf.wrote_position - pos)
        assert replica.append_raw(offset, bytes(mf.view(pos, n)))
        offset += n


async def settle(*nodes: Node) -> None:
    for _ in range(3):
        for n in nodes:
            n.timer.wakeup()
        for _ in range(100):
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Node] = []

    async def make(name: str, clock: FakeClock, *, deliver: bool) -> Node:
        node = await Node(tmp_path / name, clock, deliver=deliver).start()
        made.append(node)
        return node

    yield make
    for n in made:
        if n.timer.loaded:
            await n.stop()


async def test_replica_follows_and_takes_over_without_loss_or_duplicates(nodes: Callable[..., Any]) -> None:
    clock = FakeClock()
    master: Node = await nodes("m", clock, deliver=True)
    replica: Node = await nodes("r", clock, deliver=False)
    t0 = clock()
    for i in range(10):
        master.schedule(f"A{i}", t0 + 1_000 + i * 100)  # due during the master's watch
    for i in range(10):
        master.schedule(f"B{i}", t0 + 5_000 + i * 100)  # due after the failover
    master.cancel("A3", t0 + 1_300)
    master.cancel("B3", t0 + 5_300)
    await settle(master)
    copy_log(master.store, replica.store)
    await settle(replica)
    assert replica.timer.metrics()["scheduled"] == 18  # indexed (20 messages less 2 markers), none delivered
    assert replica.delivered() == []

    clock.advance(3_000)  # the A messages come due: the master puts them, the replica only watches
    await settle(master, replica)
    assert replica.delivered() == []
    assert sorted(master.delivered()) == sorted(f"A{i}" for i in range(10) if i != 3)
    read_before = replica.timer.read_slot
    copy_log(master.store, replica.store)
    await settle(replica)
    # The copies arrived: the replica's read slot moves over the A slots (A3 cancelled), not the B ones.
    assert replica.timer.read_slot > read_before
    assert replica.timer.read_slot <= (t0 + 5_000) // replica.timer.precision_ms
    assert replica.timer.apply_master_checkpoint(master.timer.checkpoint_info()) in (True, False)

    # The master fails; the replica is promoted: it delivers every B (not B3), and no A again.
    await master.stop()
    replica.timer.set_deliver(True)
    clock.advance(10_000)
    await settle(replica)
    got = replica.delivered()
    assert sorted(got) == sorted([f"A{i}" for i in range(10) if i != 3] + [f"B{i}" for i in range(10) if i != 3])
    assert len(got) == len(set(got))


async def test_replica_waits_for_a_message_the_master_has_not_put(nodes: Callable[..., Any]) -> None:
    clock = FakeClock()
    master: Node = await nodes("m", clock, deliver=True)
    replica: Node = await nodes("r", clock, deliver=False)
    due = clock() + 1_000
    master.schedule("X", due)
    copy_log(master.store, replica.store)
    await settle(master, replica)
    clock.advance(2_000)
    # The replica sees the slot pass, but no copy of X: its read slot must not move past X's slot.
    await settle(replica)
    assert replica.timer.read_slot <= due // replica.timer.precision_ms
    await master.stop()  # the master died before putting X (its put never reached the replica)
    replica.timer.set_deliver(True)
    await settle(replica)
    assert replica.delivered() == ["X"]


async def test_replica_restart_keeps_what_the_master_put(nodes: Callable[..., Any], tmp_path: Path) -> None:
    clock = FakeClock()
    master: Node = await nodes("m", clock, deliver=True)
    replica: Node = await nodes("r", clock, deliver=False)
    t0 = clock()
    master.schedule("EARLY", t0 + 500)
    master.schedule("LATE", t0 + 60_000)
    copy_log(master.store, replica.store)
    await settle(master, replica)
    assert replica.timer.apply_master_checkpoint(master.timer.checkpoint_info())
    clock.advance(1_000)
    await settle(master)
    copy_log(master.store, replica.store)
    await settle(replica)
    await replica.stop()
    again: Node = await nodes("r", clock, deliver=False)  # restarted on the same folder
    assert again.timer.master_commit_offset is not None
    await master.stop()
    again.timer.set_deliver(True)
    clock.advance(60_000)
    await settle(again)
    assert sorted(again.delivered()) == ["EARLY", "LATE"]  # EARLY once: the master's copy



async def test_demoted_master_stops_delivering_and_resumes_once(nodes: Callable[..., Any]) -> None:
    clock = FakeClock()
    node: Node = await nodes("m", clock, deliver=True)
    t0 = clock()
    node.schedule("A", t0 + 500)
    node.schedule("B", t0 + 5_000)
    clock.advance(1_000)
    await settle(node)
    assert node.delivered() == ["A"]
    node.timer.set_deliver(False)  # demoted: B comes due while it follows another master
    clock.advance(5_000)
    await settle(node)
    assert node.delivered() == ["A"]
    node.timer.set_deliver(True)  # promoted again: B once, A not again (its copy is in the log)
    await settle(node)
    assert node.delivered() == ["A", "B"]
