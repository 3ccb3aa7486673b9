"""The sink's columnar sending (cometmq.spark.writer._Sender) against a recording producer: every row once, in the
queue its row asks for, keyed rows in order, requests within batchSize and the producer's byte cap, and bad rows
named; no broker, no Spark."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cometmq.client.errors import InvalidArgumentError
from cometmq.client.message import Message, MessageQueue, SendResult, SendStatus
from cometmq.client.producer import select_by_hash
from cometmq.protocol.batch import decode_batch
from cometmq.spark.options import WriteOptions
from cometmq.spark.writer import _hashes, _Sender

QUEUES = 4


class Recorder:
    """What _Sender uses of a Producer; keeps every request."""

    max_message_size = 4 * 1024 * 1024

    def __init__(self, max_batch_bytes: int) -> None:
        self.max_batch_bytes = max_batch_bytes
        self.bodies: list[tuple[MessageQueue, bytes]] = []
        self.singles: list[tuple[MessageQueue | None, Message]] = []
        self._next = 0

    async def queues(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, "broker-a", i) for i in range(QUEUES)]

    def reserve_msg_ids(self, n: int) -> tuple[str, int]:
        first, self._next = self._next, self._next + n
        return "0" * 20, first

    async def send_batch_body(self, queue: MessageQueue, body: bytes, *, timeout: float | None = None) -> SendStatus:
        await asyncio.sleep(0)  # let others run, as a real request would
        self.bodies.append((queue, body))
        return SendStatus.SEND_OK

    async def send(self, msg: Message, *, queue: MessageQueue | None = None,
                   timeout: float | None = None) -> SendResult:
        self.singles.append((queue, msg))
        q = queue or MessageQueue(msg.topic, "broker-a", 0)
        return SendResult(SendStatus.SEND_OK, "id", "", q, 0)


S = TypeVar("S", bound=_Sender)


def drive(make: Callable[[], S], batches: list[pa.RecordBatch]) -> S:
    """A task's writer as the sink runs it: every batch added in order, then finished (made in the loop it runs in)."""
    async def go() -> S:
        sender = make()
        row = 0
        for b in batches:
            await sender.add(b, row)
            row += b.num_rows
        await sender.finish()
        return sender

    return asyncio.run(go())


def run_sender(batches: list[pa.RecordBatch], opts: WriteOptions, cap: int = 1 << 20) -> tuple[Recorder, _Sender]:
    producer = Recorder(cap)
    return producer, drive(lambda: _Sender(producer, opts), batches)  # type: ignore[arg-type]


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[pa.RecordBatch], int, int]:
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    batches, row = [], 0
    kind = draw(st.sampled_from(["plain", "sharding", "queue", "mixed", "given"]))
    for n in sizes:
        rows = range(row, row + n)
        cols: dict[str, pa.Array] = {
            "body": pa.array([f"r{i}:".encode() + b"x" * draw(st.integers(0, 300)) for i in rows], pa.binary())}
        if kind == "given":  # tags, keys and properties that outweigh the bodies (up to ~1.5 KiB a row)
            cols["tags"] = pa.array([draw(st.sampled_from([None, "t", "é" * 100])) for _ in rows], pa.string())
            cols["keys"] = pa.array([draw(st.sampled_from([None, [], ["k"], ["ü" * 50, "k2"]])) for _ in rows],
                                    pa.list_(pa.string()))
            cols["properties"] = pa.array(
                [draw(st.sampled_from([None, [], [("p", "v")], [("big", "x" * 1000), ("ß", "ü" * 100)]]))
                 for _ in rows], pa.map_(pa.string(), pa.string()))
        if kind in ("sharding", "mixed"):
            cols["shardingKey"] = pa.array([draw(st.sampled_from([None, "a", "b", "c", "dd"])) for _ in rows],
                                           pa.string())
        if kind in ("queue", "mixed"):
            qids = [draw(st.sampled_from([None, 0, 1, 3])) for _ in rows]
            if kind == "mixed" and "shardingKey" in cols:  # a row gives one or the other
                keys = cols["shardingKey"].to_pylist()
                qids = [None if k is not None else q for q, k in zip(qids, keys, strict=True)]
            cols["queueId"] = pa.array(qids, pa.int32())
        batches.append(pa.RecordBatch.from_pydict(cols))
        row += n
    return batches, draw(st.integers(1, 12)), draw(st.sampled_from([600, 2000, 1 << 20]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_every_row_once_where_it_belongs(plan: tuple[list[pa.RecordBatch], int, int]) -> None:
    batches, batch_size, cap = plan
    producer, sender = run_sender(batches, WriteOptions(namesrv="h:1", topic="T", batch_size=batch_size), cap)
    table = pa.Table.from_batches(batches)
    keys = table.column("shardingKey").to_pylist() if "shardingKey" in table.column_names else [None] * len(table)
    qids = table.column("queueId").to_pylist() if "queueId" in table.column_names else [None] * len(table)
    seen: list[int] = []
    ids: set[str] = set()
    per_queue: dict[int, list[int]] = {}
    for queue, body in producer.bodies:
        items = decode_batch(body)
        assert 1 <= len(items) <= batch_size
        assert len(items) == 1 or len(body) <= cap  # what the row gives besides its body counted too
        for it in items:
            r = int(it.body.split(b":")[0][1:])
            seen.append(r)
            ids.add(it.properties["UNIQ_KEY"])
            if qids[r] is not None:
                assert queue.queue_id == qids[r]
            elif keys[r] is not None:
                assert queue.queue_id == zlib.crc32(keys[r].encode()) % QUEUES
            if qids[r] is not None or keys[r] is not None:
                per_queue.setdefault(queue.queue_id, []).append(r)
    assert sorted(seen) == list(range(len(table)))
    assert len(ids) == len(table)
    assert all(rows == sorted(rows) for rows in per_queue.values()), per_queue  # keyed rows keep their order
    assert (sender.sent, sender.requests) == (len(table), len(producer.bodies))


def test_full_requests_wait_for_the_next_batch() -> None:
    """Rows of several small Arrow batches share requests: 3 batches of 5 rows, batchSize 8 -> 8 + 7."""
    batches = [pa.RecordBatch.from_pydict({"body": [f"r{i}" for i in range(k, k + 5)]}) for k in (0, 5, 10)]
    producer, sender = run_sender(batches, WriteOptions(namesrv="h:1", topic="T", batch_size=8))
    assert [len(decode_batch(b)) for _, b in producer.bodies] == [8, 7]
    assert [q.queue_id for q, _ in producer.bodies] == [0, 1]  # round-robin over the topic's queues
    assert sender.requests == 2


def test_timer_rows_go_one_by_one_and_the_rest_batched() -> None:
    batch = pa.RecordBatch.from_pydict({"body": ["a", "b", "c"], "delay": [None, 5.0, None],
                                        "queueId": [None, 2, 1]})
    producer, sender = run_sender([batch], WriteOptions(namesrv="h:1", topic="T"))
    assert [(q.queue_id if q else None, m.body, m.delay) for q, m in producer.singles] == [(2, b"b", 5.0)]
    assert sorted((q.queue_id, [it.body for it in decode_batch(b)]) for q, b in producer.bodies) == \
        [(0, [b"a"]), (1, [b"c"])]
    assert (sender.sent, sender.requests) == (3, 3)


@pytest.mark.parametrize(("cols", "needle"), [
    ({"body": ["a", None]}, "row 11 of the task: the body is null or empty"),
    ({"body": ["a", "b"], "properties": pa.array([None, [("WAIT", "x")]], pa.map_(pa.string(), pa.string()))},
     "row 11 of the task: property 'WAIT' is reserved"),
    ({"body": ["a", "b"], "tags": ["ok", "t\x02"]}, "row 11 of the task: .*separator"),
    ({"body": ["a", "b"], "keys": ["ok", "k\x01"]}, "row 11 of the task: .*separator"),
    ({"body": ["a", "b"], "queueId": [0, 7]}, "row 11 of the task: topic T has no writable queue 7"),
    ({"body": ["a", "b"], "queueId": [0, -7]}, "row 11 of the task: queueId -7 is negative"),
])
def test_a_bad_row_is_named(cols: dict[str, Any], needle: str) -> None:
    ok = pa.RecordBatch.from_pydict({"body": [f"r{i}" for i in range(10)]})
    with pytest.raises(InvalidArgumentError, match=needle):
        run_sender([ok, pa.RecordBatch.from_pydict(cols)], WriteOptions(namesrv="h:1", topic="T"))


@pytest.mark.parametrize("keys", [pa.array([2**60 + 1, None, -(2**63), -5, 7, 0], pa.int64()),
                                  pa.array([3, -3, None, 2**31 - 1], pa.int32()),
                                  pa.array(["a", None, "日本", "", "user42"])])
def test_the_sharding_hash_is_the_sdks(keys: pa.Array) -> None:
    """A row's queue is the one Producer's select_by_hash picks for its key (big integers and nulls beside)."""
    qs = [MessageQueue("T", "broker-a", i) for i in range(7)]
    hashes = _hashes(keys)
    for i, key in enumerate(keys.to_pylist()):
        if key is not None:
            assert qs[int(hashes[i] % 7)] == select_by_hash(qs, Message("T", b"x"), key), key
