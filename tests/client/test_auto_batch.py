"""Producer auto-batching (``Producer(auto_batch=True)``, RocketMQ 5's autoBatch) against a real broker: the
frames the broker sees are counted by wrapping its handler table (read on every request)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cometmq.client import (
    BrokerError,
    ClientTimeoutError,
    InvalidArgumentError,
    Message,
    MessageQueue,
    Producer,
    SendResult,
)
from cometmq.client.admin import Admin
from cometmq.client.sync import SyncProducer
from cometmq.client.transaction_producer import LocalTransactionState, TransactionProducer
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.batch import ITEM_OVERHEAD, decode_batch_raw
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_response

from .conftest import Cluster

BATCH = RequestCode.SEND_BATCH_MESSAGE
SINGLE = RequestCode.SEND_MESSAGE_V2
#: a plain message's batch item: overhead + body + UNIQ_KEY/WAIT properties (52 bytes)
PLAIN_ITEM = ITEM_OVERHEAD + 52


class Frames:
    """Counts the send requests a broker serves (and the messages in each batch); ``fail`` answers batches with
    an error code instead while it returns one (``None``: serve normally); while ``hold`` is set to an event, the
    requests (counted on arrival) are answered only once it is set."""

    def __init__(self, cluster: Cluster) -> None:
        self.count: Counter[int] = Counter()
        self.batch_sizes: list[int] = []
        self.batch_bytes: list[int] = []
        self.fail: Any = lambda: None
        self.hold: asyncio.Event | None = None
        dispatcher = cluster.brokers[0].dispatcher
        for code in (BATCH, SINGLE):
            dispatcher[code] = self._wrap(code, dispatcher[code])

    def _wrap(self, code: int, inner: Any) -> Any:
        async def handler(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
            self.count[code] += 1
            if code == BATCH:
                self.batch_sizes.append(len(decode_batch_raw(cmd.body or b"")))
                self.batch_bytes.append(len(cmd.body or b""))
                error = self.fail()
                if error is not None:
                    return make_response(cmd, error, "injected by the test")
            if self.hold is not None:
                await self.hold.wait()
            result: RemotingCommand = await inner(conn, cmd)
            return result

        return handler


async def read_back(cluster: Cluster, results: list[SendResult]) -> dict[tuple[MessageQueue, int], tuple[bytes, str]]:
    """(queue, offset) -> (body, msg id) of every message stored where ``results`` say, pulled from the broker."""
    out: dict[tuple[MessageQueue, int], tuple[bytes, str]] = {}
    by_queue: dict[MessageQueue, list[int]] = {}
    for r in results:
        by_queue.setdefault(r.queue, []).append(r.queue_offset)
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        for q, offsets in by_queue.items():
            for m in await admin.read_range(q, min(offsets), max(offsets) + 1):
                out[(q, m.queue_offset)] = (m.body, m.msg_id)
    return out


async def stored_bodies(cluster: Cluster, topic: str) -> list[bytes]:
    """Every body stored in ``topic`` (all queues, pulled)."""
    bodies: list[bytes] = []
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        for qid in range(4):
            bodies += [m.body for m in await admin.read_range(MessageQueue(topic, "broker-a", qid), 0, 10_000)]
    return bodies


async def test_concurrent_sends_coalesce_and_each_caller_gets_its_own_result(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=50) as p:
        await p.send(Message("AB", b"warm-up"), queue=MessageQueue("AB", "broker-a", 0))  # route + connection
        frames.count.clear()
        bodies = [f"m{i:03d}".encode() * (1 + i % 5) for i in range(64)]
        results = await asyncio.gather(*(p.send(Message("AB", b, tags=f"t{i % 3}")) for i, b in enumerate(bodies)))
        assert p.batcher is not None and p.batcher.held == 0
    assert frames.count[SINGLE] == 0 and 1 <= frames.count[BATCH] <= 4, frames.count
    assert sum(frames.batch_sizes) == 64
    assert all(r.ok for r in results) and len({r.msg_id for r in results}) == 64
    assert len({(r.queue, r.queue_offset) for r in results}) == 64
    assert len({r.offset_msg_id for r in results}) == 64
    stored = await read_back(cluster, list(results))
    for body, r in zip(bodies, results, strict=True):
        assert stored[(r.queue, r.queue_offset)] == (body, r.msg_id)


async def test_batches_are_per_topic_and_flushed_at_batch_max_bytes(cluster: Cluster) -> None:
    frames = Frames(cluster)
    # items of exactly 100 bytes: 8 fill a batch of 800 bytes, which goes at once (the delay is 10 s)
    body_len = 100 - PLAIN_ITEM
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=10_000,
                        batch_max_bytes=800) as p:
        for t in ("AB1", "AB2"):
            await p.send(Message(t, b"warm-up"), queue=MessageQueue(t, "broker-a", 0))
        frames.count.clear()
        t0 = time.monotonic()
        sends = [p.send(Message(t, f"{t}-{i:02d}".encode().ljust(body_len, b"."))) for i in range(32)
                 for t in ("AB1", "AB2")]
        results = await asyncio.wait_for(asyncio.gather(*sends), 8)
        assert time.monotonic() - t0 < 5  # never waited for the 10 s delay
    assert frames.count[BATCH] == 8 and frames.batch_sizes == [8] * 8, frames.batch_sizes
    assert frames.batch_bytes == [800] * 8
    for t in ("AB1", "AB2"):
        mine = [r for r in results if r.queue.topic == t]
        assert len(mine) == 32
        assert sorted(await stored_bodies(cluster, t)) == sorted(
            [b"warm-up", *(f"{t}-{i:02d}".encode().ljust(body_len, b".") for i in range(32))])


async def test_a_lone_message_goes_at_once(cluster: Cluster) -> None:
    frames = Frames(cluster)
    # nothing of the topic is in flight: the batch goes at the end of the loop turn, not after the 20 s delay
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000) as p:
        await p.send(Message("Lone", b"warm-up"), queue=MessageQueue("Lone", "broker-a", 0))
        frames.count.clear()
        r = await asyncio.wait_for(p.send(Message("Lone", b"alone")), 8)
    assert frames.count == Counter({SINGLE: 1})  # a batch of one goes as an ordinary send
    assert (await read_back(cluster, [r]))[(r.queue, r.queue_offset)] == (b"alone", r.msg_id)


async def first_batch_out(p: Producer, frames: Frames, topic: str, n: int
                          ) -> tuple[asyncio.Event, list[asyncio.Future[SendResult]]]:
    """A warm-up send, then the broker's answers held and ``n`` sends made: their batch is out, unanswered (the
    event lets the answers go)."""
    await p.send(Message(topic, b"warm-up"), queue=MessageQueue(topic, "broker-a", 0))
    frames.count.clear()
    frames.hold = hold = asyncio.Event()
    out = [asyncio.ensure_future(p.send(Message(topic, f"o{i}".encode()))) for i in range(n)]
    await asyncio.sleep(0.05)
    return hold, out


async def test_sends_made_while_a_batch_is_out_go_when_it_is_answered(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000) as p:
        hold, first = await first_batch_out(p, frames, "Out", 3)
        assert frames.batch_sizes == [3]  # went at once, not answered yet
        later = [asyncio.ensure_future(p.send(Message("Out", f"b{i}".encode()))) for i in range(5)]
        await asyncio.sleep(0.1)
        assert frames.batch_sizes == [3] and not any(t.done() for t in first + later)  # held for the answer
        t0 = time.monotonic()
        hold.set()
        results = await asyncio.wait_for(asyncio.gather(*first, *later), 8)
        assert time.monotonic() - t0 < 5  # not the 20 s delay
    assert frames.batch_sizes == [3, 5] and frames.count == Counter({BATCH: 2})
    assert len({r.msg_id for r in results}) == 8


async def test_a_batch_held_behind_one_in_flight_goes_after_batch_max_delay_ms(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=300) as p:
        hold, first = await first_batch_out(p, frames, "Delay", 2)
        t0 = time.monotonic()
        lone = asyncio.ensure_future(p.send(Message("Delay", b"alone")))
        while frames.count[SINGLE] == 0 and time.monotonic() - t0 < 5:
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - t0
        assert 0.25 <= elapsed < 3.0, elapsed  # the delay, though the first batch is still unanswered
        hold.set()
        assert all(r.ok for r in await asyncio.wait_for(asyncio.gather(*first, lone), 8))
    assert frames.count == Counter({BATCH: 1, SINGLE: 1})


async def test_messages_that_cannot_be_batched_go_alone_at_once(cluster: Cluster) -> None:
    frames = Frames(cluster)

    def local(msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    # the delay is 20 s: anything held for a batch would miss the 8 s bound below
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000,
                        batch_max_bytes=1000) as p, \
            TransactionProducer("ab-tx", namesrv=cluster.namesrv_addr, auto_batch=True,
                                batch_max_delay_ms=20_000) as tx:
        q = MessageQueue("Alone", "broker-a", 1)
        await p.send(Message("Alone", b"warm-up"), queue=q)
        frames.count.clear()
        sends = [
            p.send(Message("Alone", b"level", delay_level=1)),
            p.send(Message("Alone", b"timer", delay=60)),
            p.send(Message("Alone", b"at", deliver_at=int(time.time() * 1000) + 60_000)),
            p.send(Message("Alone", b"queue"), queue=q),
            p.send(Message("Alone", b"selector"), selector=lambda qs, m, arg: qs[arg], arg=2),
            p.send_orderly(Message("Alone", b"orderly"), "key-1"),
            p.send(Message("Alone", b"x" * 1000)),  # bigger than batch_max_bytes with its properties
            p.send(Message("Alone", b"group", properties={"PGROUP": "someone"})),
            p.send_oneway(Message("Alone", b"oneway")),
            tx.send_in_transaction(Message("Alone", b"half"), local),
        ]
        results = await asyncio.wait_for(asyncio.gather(*sends), 8)
        assert p.batcher is not None and not p.batcher._open and p.batcher.held == 0
    assert frames.count[BATCH] == 0 and frames.count[SINGLE] == len(sends), frames.count
    assert results[3].queue == q and results[4].queue.queue_id == 2
    assert results[0].recall_handle is None and results[1].recall_handle  # timers went as single sends


async def test_a_broker_error_fails_every_caller_and_retries_as_a_send_does(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=30,
                        retries=2) as p:
        await p.send(Message("Err", b"warm-up"), queue=MessageQueue("Err", "broker-a", 0))
        frames.fail = lambda: ResponseCode.MESSAGE_ILLEGAL  # not retriable
        outcomes = await asyncio.gather(*(p.send(Message("Err", f"bad{i}".encode())) for i in range(10)),
                                        return_exceptions=True)
        assert all(isinstance(e, BrokerError) and e.code == ResponseCode.MESSAGE_ILLEGAL for e in outcomes), outcomes
        assert frames.count[BATCH] == 1

        frames.count.clear()
        frames.fail = lambda: ResponseCode.SYSTEM_BUSY  # retriable: 1 + retries attempts, then every caller fails
        outcomes = await asyncio.gather(*(p.send(Message("Err", f"busy{i}".encode())) for i in range(10)),
                                        return_exceptions=True)
        assert all(isinstance(e, BrokerError) and e.code == ResponseCode.SYSTEM_BUSY for e in outcomes), outcomes
        assert frames.count[BATCH] == 3

        frames.count.clear()
        calls = iter([ResponseCode.SYSTEM_ERROR])  # the first attempt fails, the retry is stored
        frames.fail = lambda: next(calls, None)
        results = await asyncio.gather(*(p.send(Message("Err", f"ok{i}".encode())) for i in range(10)))
        assert frames.count[BATCH] == 2 and frames.batch_sizes[-2:] == [10, 10]
        assert p.batcher is not None and p.batcher.held == 0
    assert len({r.msg_id for r in results}) == 10
    # nothing of the failed batches was stored, and the retried one exactly once
    assert sorted(await stored_bodies(cluster, "Err")) == sorted([b"warm-up"] + [f"ok{i}".encode() for i in range(10)])


async def test_close_flushes_pending_batches(cluster: Cluster) -> None:
    frames = Frames(cluster)
    p = Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000)
    await p.start()
    hold, out = await first_batch_out(p, frames, "Close", 2)  # the next ones are held
    tasks = [asyncio.ensure_future(p.send(Message("Close", f"c{i}".encode()))) for i in range(5)]
    callback_results: list[SendResult | None] = []
    p.send_async(Message("Close", b"async"), lambda r, e: callback_results.append(r))
    await asyncio.sleep(0.05)
    assert frames.batch_sizes == [2] and not any(t.done() for t in tasks)  # held for the 20 s delay
    t0 = time.monotonic()
    closing = asyncio.ensure_future(p.close())
    while len(frames.batch_sizes) < 2 and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.01)
    assert frames.batch_sizes == [2, 6]  # sent by close, the first still unanswered
    hold.set()
    await asyncio.wait_for(closing, 8)
    assert time.monotonic() - t0 < 5
    assert all(t.done() and t.result().ok for t in out + tasks)
    assert len(callback_results) == 1 and callback_results[0] is not None and callback_results[0].ok
    assert frames.count == Counter({BATCH: 2})
    assert sorted(await stored_bodies(cluster, "Close")) == sorted(
        [b"warm-up", b"async"] + [f"o{i}".encode() for i in range(2)] + [f"c{i}".encode() for i in range(5)])


async def test_a_cancelled_send_leaves_its_batch_before_the_flush(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000) as p:
        hold, out = await first_batch_out(p, frames, "Cancel", 2)  # the next batch waits for it
        tasks = [asyncio.ensure_future(p.send(Message("Cancel", f"k{i}".encode()))) for i in range(3)]
        await asyncio.sleep(0.02)
        tasks[1].cancel()
        await asyncio.sleep(0)
        hold.set()
        done = await asyncio.wait_for(asyncio.gather(*out, *tasks, return_exceptions=True), 8)
        assert isinstance(done[3], asyncio.CancelledError)
        assert p.batcher is not None and p.batcher.held == 0
    assert frames.batch_sizes == [2, 2]
    assert sorted(await stored_bodies(cluster, "Cancel")) == [b"k0", b"k2", b"o0", b"o1", b"warm-up"]


async def test_a_batch_cancelled_before_it_went_cancels_its_callers_and_frees_its_room(cluster: Cluster) -> None:
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=20_000) as p:
        await p.send(Message("Gone", b"warm-up"), queue=MessageQueue("Gone", "broker-a", 0))
        frames.count.clear()
        batcher = p.batcher
        assert batcher is not None
        sends = [asyncio.ensure_future(p.send(Message("Gone", f"g{i}".encode()))) for i in range(3)]
        while not batcher._tasks:  # the batch is flushed at the end of the sends' turn: its task made, not run
            await asyncio.sleep(0)
        for task in list(batcher._tasks):
            task.cancel()
        done = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 8)
        assert all(isinstance(d, asyncio.CancelledError) for d in done), done
        assert batcher.held == 0 and not batcher._in_flight
        r = await asyncio.wait_for(p.send(Message("Gone", b"after")), 8)  # at once: nothing is in flight
        assert r.ok
    assert frames.count == Counter({SINGLE: 1})


async def test_total_batch_max_bytes_makes_sends_wait_then_time_out(cluster: Cluster) -> None:
    frames = Frames(cluster)
    body_len = 100 - PLAIN_ITEM
    async with Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=200,
                        total_batch_max_bytes=300) as p:
        await p.send(Message("Room", b"warm-up"), queue=MessageQueue("Room", "broker-a", 0))
        frames.count.clear()
        frames.hold = hold = asyncio.Event()
        sends = [asyncio.ensure_future(p.send(Message("Room", f"{i}".encode().ljust(body_len, b"."))))
                 for i in range(6)]
        await asyncio.sleep(0.05)
        assert frames.batch_sizes == [3]  # the other three wait for room: the first batch's answer
        hold.set()
        results = await asyncio.wait_for(asyncio.gather(*sends), 8)
        assert frames.batch_sizes == [3, 3] and all(r.ok for r in results)

        frames.hold = hold = asyncio.Event()
        held = [asyncio.ensure_future(p.send(Message("Room", f"h{i}".encode().ljust(body_len, b"."))))
                for i in range(3)]
        await asyncio.sleep(0.01)
        with pytest.raises(ClientTimeoutError, match="total_batch_max_bytes"):
            await p.send(Message("Room", b"no room"), timeout=0.05)
        hold.set()
        assert all(r.ok for r in await asyncio.wait_for(asyncio.gather(*held), 8))


async def test_options_are_checked_and_off_by_default(cluster: Cluster) -> None:
    for bad in ({"batch_max_delay_ms": 0}, {"batch_max_delay_ms": 30_001}, {"batch_max_bytes": 0},
                {"batch_max_bytes": 2 * 1024 * 1024 + 1}, {"total_batch_max_bytes": 0}):
        with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
            Producer("ab", namesrv=cluster.namesrv_addr, auto_batch=True, **bad)
    frames = Frames(cluster)
    async with Producer("ab", namesrv=cluster.namesrv_addr) as p:
        assert p.batcher is None
        await asyncio.gather(*(p.send(Message("Off", b"x")) for _ in range(8)))
    assert frames.count == Counter({SINGLE: 8})


async def test_sync_producer_sends_from_many_threads_coalesce(cluster: Cluster) -> None:
    frames = Frames(cluster)
    n = 16
    barrier = threading.Barrier(n)

    def run() -> list[SendResult]:
        with SyncProducer("ab-sync", namesrv=cluster.namesrv_addr, auto_batch=True, batch_max_delay_ms=300) as p:
            p.send(Message("Sync", b"warm-up"), queue=MessageQueue("Sync", "broker-a", 0))

            def one(i: int) -> SendResult:
                barrier.wait()
                return p.send(Message("Sync", f"s{i}".encode()))

            with ThreadPoolExecutor(n) as pool:
                return list(pool.map(one, range(n)))

    results = await asyncio.to_thread(run)
    assert len({r.msg_id for r in results}) == n and all(r.ok for r in results)
    assert 1 <= frames.count[BATCH] <= 4 and sum(frames.batch_sizes) + frames.count[SINGLE] - 1 == n, frames.count
