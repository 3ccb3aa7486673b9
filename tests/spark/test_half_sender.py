"""The exactly-once task's columnar sending (cometmq.spark.exactly_once._HalfSender) against a recording
transaction producer: every row once in a packed half with the write's properties, in the queue its row asks for,
keyed rows in order, the halves (one per batch of rows) in that order; an answered refusal is sent again (the same
bytes), a request without an answer is not; timer rows are refused. No broker, no Spark."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from cometmq.client.errors import BrokerError, ClientTimeoutError, InvalidArgumentError
from cometmq.client.message import MessageQueue, SendStatus
from cometmq.client.transaction_producer import HalfBatchRange
from cometmq.protocol.batch import decode_batch
from cometmq.protocol.codes import ResponseCode
from cometmq.spark.exactly_once import _HalfSender
from cometmq.spark.options import WriteOptions
from tests.spark.test_write_plan import QUEUES, Recorder, drive, plans

EXTRA = {"__SPARK_QUERY_ID": "q", "__SPARK_BATCH_ID": "0", "__SPARK_WRITE_ID": "w"}


class HalfRecorder(Recorder):
    """What _HalfSender uses of a TransactionProducer; keeps every packed half, fails as told."""

    group = "g"

    def __init__(self, max_batch_bytes: int, failures: list[BaseException] | None = None) -> None:
        super().__init__(max_batch_bytes)
        self.halves: list[tuple[MessageQueue, bytes, list[str]]] = []
        #: each packed half's own properties
        self.half_props: list[dict[str, str]] = []
        self.failures = failures or []
        self.offset = 0

    async def send_packed_half(self, queue: MessageQueue, body: bytes, count: int, msg_id: str,
                               properties: dict[str, str] | None = None, *,
                               timeout: float | None = None) -> HalfBatchRange:
        await asyncio.sleep(0)
        msg_ids = [it.properties["UNIQ_KEY"] for it in decode_batch(body)]
        assert (msg_ids[0], len(msg_ids)) == (msg_id, count)
        self.halves.append((queue, body, msg_ids))
        self.half_props.append(dict(properties or {}))
        if self.failures:
            raise self.failures.pop(0)
        first, self.offset = self.offset, self.offset + 1
        return HalfBatchRange(SendStatus.SEND_OK, queue, first, f"7F00000100002A9F{first:016X}", msg_id, 1)


def run_halves(batches: list[pa.RecordBatch], opts: WriteOptions, cap: int = 1 << 20,
               failures: list[BaseException] | None = None) -> tuple[HalfRecorder, _HalfSender]:
    producer = HalfRecorder(cap, failures)
    return producer, drive(lambda: _HalfSender(producer, opts, dict(EXTRA)), batches)  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_every_row_once_as_a_half_and_the_refs_in_row_order(plan: tuple[list[pa.RecordBatch], int, int]) -> None:
    batches, batch_size, cap = plan
    producer, sender = run_halves(batches, WriteOptions(namesrv="h:1", topic="T", batch_size=batch_size), cap)
    table = pa.Table.from_batches(batches)
    keys = table.column("shardingKey").to_pylist() if "shardingKey" in table.column_names else [None] * len(table)
    qids = table.column("queueId").to_pylist() if "queueId" in table.column_names else [None] * len(table)
    row_of: dict[str, int] = {}
    for queue, body, ids in producer.halves:
        items = decode_batch(body)
        assert 1 <= len(items) <= batch_size and [it.properties["UNIQ_KEY"] for it in items] == ids
        for it in items:
            r = int(it.body.split(b":")[0][1:])
            row_of[it.properties["UNIQ_KEY"]] = r
            # each item the message its commit delivers: the write's ids and PGROUP, no TRAN_MSG
            assert {k: it.properties[k] for k in (*EXTRA, "PGROUP")} == {**EXTRA, "PGROUP": "g"}
            assert "TRAN_MSG" not in it.properties
            if qids[r] is not None:
                assert queue.queue_id == qids[r]
            elif keys[r] is not None:
                assert queue.queue_id == zlib.crc32(keys[r].encode()) % QUEUES
    assert producer.half_props == [EXTRA] * len(producer.halves)  # the half itself carries the ids for the checker
    refs = sender.halves()  # a packed half each: its first row's msg id, count 1
    ids_of = {ids[0]: ids for _, _, ids in producer.halves}
    assert all(ref[6] == 1 for ref in refs) and len(refs) == len(producer.halves)
    assert sorted(row_of[i] for ref in refs for i in ids_of[ref[3]]) == list(range(len(table)))
    per_queue: dict[int, list[int]] = {}
    for _broker, _clo, _qo, msg_id, qid, ordered, _n in refs:
        for i in ids_of[msg_id]:
            r = row_of[i]
            assert ordered == (qids[r] is not None or keys[r] is not None)
            if ordered:
                per_queue.setdefault(qid, []).append(r)
    assert all(rows == sorted(rows) for rows in per_queue.values()), per_queue  # committed in row order
    assert (sender.sent, sender.requests) == (len(table), len(producer.halves))


@pytest.mark.parametrize("keyed", [False, True])
def test_an_answered_refusal_is_sent_again_unchanged(keyed: bool) -> None:
    cols: dict[str, Any] = {"body": ["a", "b"]}
    if keyed:
        cols["queueId"] = [1, 1]
    busy = BrokerError(ResponseCode.SYSTEM_BUSY, "busy")
    producer, sender = run_halves([pa.RecordBatch.from_pydict(cols)], WriteOptions(namesrv="h:1", topic="T"),
                                  failures=[busy])
    (q1, b1, ids1), (q2, b2, ids2) = producer.halves
    assert (b1, ids1) == (b2, ids2)  # the same bytes, the same ids
    assert (q1 == q2) == keyed  # plain rows try another queue; ordered ones stay
    assert [ref[6] for ref in sender.halves()] == [1] and (sender.sent, sender.requests) == (2, 1)


def test_a_request_without_an_answer_is_not_sent_again() -> None:
    with pytest.raises(ClientTimeoutError):
        run_halves([pa.RecordBatch.from_pydict({"body": ["a", "b"], "queueId": [1, 1]})],
                   WriteOptions(namesrv="h:1", topic="T"), failures=[ClientTimeoutError("no answer")])


def test_timer_rows_are_refused_naming_the_row() -> None:
    ok = pa.RecordBatch.from_pydict({"body": [f"r{i}" for i in range(10)]})
    timed = pa.RecordBatch.from_pydict({"body": ["a", "b"], "delay": [None, 5.0]})
    with pytest.raises(InvalidArgumentError, match="row 11 of the task: a transactional write cannot send timer"):
        run_halves([ok, timed], WriteOptions(namesrv="h:1", topic="T"))
    bad_queue_first = pa.RecordBatch.from_pydict({"body": ["a", "b"], "delay": [None, 5.0], "queueId": [7, None]})
    with pytest.raises(InvalidArgumentError, match="row 10 of the task: topic T has no writable queue 7"):
        run_halves([ok, bad_queue_first], WriteOptions(namesrv="h:1", topic="T"))
