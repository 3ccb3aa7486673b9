"""Failover with no acknowledged loss, as processes: a master and two replicas, allAck, minInSyncReplicas 2.

Several SDK producers send unique payloads and log each outcome (ok / status / error / timeout); a lite-pull
consumer group reads and commits its offsets to the master. Once the replicas have copied some committed offsets
(their 10 s metadata pass), the master is killed (SIGKILL) mid-stream; the replica with the longest log is
promoted at the next epoch, the other follows it. Then (controller-ha.md §2):

1. every message whose send got SEND_OK is readable on the new master;
2. per queue, offsets run 0, 1, 2, ... with one message each; every message read was sent (no phantoms);
3. every message the first consumer saw is in the new master's log (no dirty reads);
4. the group resumes on the new master from the offsets the replicas copied: never past what the consumer had
   committed (it may re-read, never skip), never past a queue's end;
5. the follower's log is byte-identical to the new master's, and their epoch files agree.

Duplicates (a retried send whose first attempt was stored) and indeterminate sends are counted and printed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cometmq.client import LitePullConsumer, Message, MessageQueue, Producer, SendStatus
from cometmq.client.errors import ClientTimeoutError
from cometmq.client.instance import ClientInstance
from tests.ha.cluster import Cluster
from tests.kit import eventually

TOPIC = "HAFailover"
GROUP = "ha-failover-cg"
QUEUES = 4


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, {"minInSyncReplicas": "2"})
    try:
        yield c
    finally:
        await c.close()


@dataclass
class SendLog:
    """Every send attempt's body and outcome, in the order they finished."""

    outcomes: list[tuple[str, str, float]] = field(default_factory=list)  # body, outcome, monotonic time

    def bodies(self, outcome: str | None = None) -> set[str]:
        return {b for b, o, _ in self.outcomes if outcome is None or o == outcome}

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(o.split(":")[0] for _, o, _ in self.outcomes))


async def producer_loop(namesrv: str, k: int, log: SendLog, stop: asyncio.Event, pause_s: float) -> None:
    instance = ClientInstance(namesrv, instance_name=f"ha-producer-{k}", poll_namesrv_interval=0.5)
    async with Producer(f"ha-failover-pg-{k}", instance=instance, send_timeout=2.0, retries=2) as p:
        i = 0
        while not stop.is_set():
            body = f"p{k}-{i}"
            i += 1
            try:
                r = await p.send(Message(TOPIC, body.encode()))
                outcome = "ok" if r.status is SendStatus.SEND_OK else f"status:{r.status.value}"
            except ClientTimeoutError:
                outcome = "timeout"
            except Exception as exc:  # the dead master, no route yet, in-sync replicas not enough, ...
                outcome = f"error:{type(exc).__name__}"
                await asyncio.sleep(0.05)
            log.outcomes.append((body, outcome, time.monotonic()))
            await asyncio.sleep(pause_s)


@dataclass
class ConsumerLog:
    seen: list[tuple[int, int, str]] = field(default_factory=list)  # queue id, queue offset, body
    committed: dict[int, int] = field(default_factory=dict)  # queue id -> last offset the broker accepted


async def consumer_loop(namesrv: str, log: ConsumerLog) -> None:
    async with LitePullConsumer(GROUP, namesrv=namesrv, auto_commit=False, consume_from="first",
                                long_poll_timeout=1.0, error_backoff=0.1) as c:
        await c.subscribe(TOPIC)
        while True:
            for m in await c.poll(0.5):
                log.seen.append((m.queue.queue_id, m.queue_offset, m.body.decode()))
            positions = {q.queue_id: c.position(q) for q in c.assignment()}
            await c.commit()
            log.committed.update({q: off for q, off in positions.items() if off is not None})


async def drain(namesrv: str, ends: dict[int, int]) -> tuple[dict[int, int], list[tuple[int, int, str]]]:
    """A fresh consumer of the group on the new master: where it starts per queue, and what it reads to the end."""
    seen: list[tuple[int, int, str]] = []
    async with LitePullConsumer(GROUP, namesrv=namesrv, auto_commit=False, consume_from="first",
                                long_poll_timeout=1.0, error_backoff=0.1) as c:
        await c.subscribe(TOPIC)
        starts = {q.queue_id: await c.committed(q) for q in c.assignment()}

        async def done() -> bool:
            for m in await c.poll(0.2):
                seen.append((m.queue.queue_id, m.queue_offset, m.body.decode()))
            return all(c.position(MessageQueue(TOPIC, q.broker_name, q.queue_id)) == ends[q.queue_id]
                       or (ends[q.queue_id] == (starts[q.queue_id] or 0)) for q in c.assignment())

        await eventually(done, 30, what="the resumed consumer reading to the end", step=0)
    return {q: s if s is not None else -1 for q, s in starts.items()}, seen


async def run_failover(cluster: Cluster, producers: int, before_kill_s: float, after_s: float,
                       pause_s: float) -> None:
    master, r1, r2 = await cluster.start(1) + [cluster.add_broker(1), cluster.add_broker(2)]
    await cluster.create_topic(master, TOPIC, QUEUES)
    for r in (r1, r2):
        await r.start()
        # also makes the replica copy the master's topics and offsets at once (then every 10 s)
        reply = await cluster.follow(r, master, 1, r.broker_id)
        assert reply.code == 0, reply.remark
    await cluster.wait_sync_set(master, {0, 1, 2})
    epoch = int((await cluster.status(master))["epoch"])

    sends, consumed = SendLog(), ConsumerLog()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(producer_loop(cluster.namesrv.addr, k, sends, stop, pause_s))
             for k in range(producers)]
    consumer = asyncio.create_task(consumer_loop(cluster.namesrv.addr, consumed))
    try:
        await asyncio.sleep(before_kill_s)

        async def copied() -> bool:  # a metadata pass after the consumer committed something
            offs = [await cluster.consumer_offsets(r.addr, GROUP, TOPIC) for r in (r1, r2)]
            return all(sum(o.values()) > 0 for o in offs)

        await eventually(copied, 15, what="the replicas copying the group's offsets", step=0.2)
        committed_at_kill = dict(consumed.committed)
        master.kill()
        t_kill = time.monotonic()
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)

        statuses = {r.name: await cluster.status(r) for r in (r1, r2)}
        new, other = (r1, r2) if statuses[r1.name]["maxOffset"] >= statuses[r2.name]["maxOffset"] else (r2, r1)
        reply = await cluster.promote(new, epoch + 1)
        assert reply.code == 0, reply.remark
        reply = await cluster.follow(other, new, epoch + 1, other.broker_id)
        assert reply.code == 0, reply.remark
        await cluster.wait_sync_set(new, {0, other.broker_id})
        switched_s = time.monotonic() - t_kill
        first_ok_after = await eventually(
            lambda: any(o == "ok" and t > t_kill for _, o, t in sends.outcomes), 15,
            what="a SEND_OK from the new master")
        await asyncio.sleep(after_s)
    finally:
        stop.set()
        consumer.cancel()
        await asyncio.gather(*tasks, consumer, return_exceptions=True)

    await cluster.wait_caught_up(other, new)
    pulled = await cluster.pull_topic(new.addr, TOPIC, QUEUES)
    log_bodies: list[str] = []
    ends: dict[int, int] = {}
    for q, p in pulled.items():
        offsets = [r.queue_offset for r in p.records]
        assert offsets == list(range(len(offsets))), f"queue {q}: offsets not 0..n-1 with one message each"
        assert p.max_offset == len(offsets)
        ends[q] = len(offsets)
        log_bodies += [r.body.decode() for r in p.records]
    in_log = collections.Counter(log_bodies)
    attempted = sends.bodies()
    ok = sends.bodies("ok")
    lost = ok - set(in_log)
    phantoms = set(in_log) - attempted
    dirty = {b for _, _, b in consumed.seen} - set(in_log)
    duplicates = sum(n - 1 for n in in_log.values() if n > 1)
    indeterminate = attempted - ok
    stored_indeterminate = indeterminate & set(in_log)
    print(f"\nfailover: {len(attempted)} sends {sends.counts()}; promoted {new.name} at epoch {epoch + 1} "
          f"{switched_s:.2f}s after the kill, first SEND_OK from it after {first_ok_after:.2f}s more; "
          f"{len(in_log)} distinct bodies in the log, {duplicates} duplicates, {len(indeterminate)} "
          f"indeterminate sends ({len(stored_indeterminate)} of them stored); consumer saw {len(consumed.seen)}")
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    assert not phantoms, f"messages nobody sent: {sorted(phantoms)[:5]}"
    assert not dirty, f"the consumer saw messages the new master does not have: {sorted(dirty)[:5]}"
    assert len(ok) > 100 and any(t > t_kill for _, o, t in sends.outcomes if o == "ok")

    # the group resumes from what the replicas copied: at most what was committed, within each queue
    copied_offsets = await cluster.consumer_offsets(new.addr, GROUP, TOPIC)
    starts, reread = await drain(cluster.namesrv.addr, ends)
    print(f"consumer: committed at the kill {committed_at_kill}, copied {copied_offsets}, resumed at {starts}")
    for q in range(QUEUES):
        start = starts.get(q, -1)
        assert start == copied_offsets.get(q, -1)
        assert 0 <= start <= committed_at_kill.get(q, 0), f"queue {q}: resumed at {start}, past the commit"
        assert start <= ends[q]
        offsets = sorted(o for qq, o, _ in reread if qq == q)
        assert offsets == list(range(start, ends[q])), f"queue {q}: the resumed consumer skipped or repeated"

    # no divergence: the follower has exactly the new master's log and epochs
    await other.stop()
    await new.stop()
    n_log, o_log = new.log(), other.log()
    assert o_log.end == n_log.end and o_log.data[:o_log.end] == n_log.data[:n_log.end]
    assert o_log.epochs == n_log.epochs and [e.epoch for e in n_log.epochs] == [epoch, epoch + 1]
    assert n_log.epochs[-1].start_offset == statuses[new.name]["maxOffset"]


async def test_failover_loses_no_acknowledged_message(cluster: Cluster) -> None:
    await run_failover(cluster, producers=4, before_kill_s=3.0, after_s=2.0, pause_s=0.01)


@pytest.mark.soak
@pytest.mark.timeout(600)
@pytest.mark.parametrize("round_", range(3))
async def test_failover_soak(cluster: Cluster, round_: int) -> None:
    await run_failover(cluster, producers=8, before_kill_s=12.0 + 4 * round_, after_s=8.0, pause_s=0.0)
