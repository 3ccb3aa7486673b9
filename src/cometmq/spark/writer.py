"""Writing DataFrames to cometmq topics (``df.write`` and ``df.writeStream``).

Each task makes one producer and sends all its rows with it:

- rows without ``shardingKey`` or scheduling are packed into SEND_BATCH_MESSAGE requests of up to
  ``batchSize`` messages, spread round-robin over the topic's queues, up to ``maxInFlight`` requests at once;
- rows with a ``shardingKey`` go to the queue the key hashes to (the SDK's ``select_by_hash``: CRC32 of the
  key), in batches sent one after another per queue, so a key's rows keep their order within the task;
- rows with ``deliverAt`` (a timestamp or epoch ms) or ``delay`` (seconds) are timer messages, sent one by one;
- rows with a ``queueId`` (or ``queue``) go to that queue of the topic (on the broker the ``brokerName`` column
  names, needed only when several brokers have a queue of that id), batched and ordered per queue as keyed rows.

A failed request is retried ``retries`` times; then the task fails and Spark runs it again. Delivery is
therefore at-least-once: a retried task (or a request whose answer was lost) can send a row twice.

With the option ``transactional=true`` rows go as transactional half messages that the driver commits:
exactly once for streams, all or nothing for batch jobs (:mod:`cometmq.spark.exactly_once`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cometmq.client.errors import InvalidArgumentError, MQClientError
from cometmq.client.message import Message, MessageQueue, SendResult
from cometmq.client.producer import Producer, select_by_hash
from cometmq.spark import exactly_once
from cometmq.spark.link import Link
from cometmq.spark.options import OptionError, WriteOptions
from cometmq.spark.schema import WRITE_COLUMNS

log = logging.getLogger(__name__)

__all__ = ["CometBatchWriter", "CometStreamWriter", "Outgoing", "SentCount", "check_write_schema", "pick_queue"]


@dataclasses.dataclass
class SentCount(WriterCommitMessage):
    """What one task sent."""

    messages: int = 0
    requests: int = 0


def check_write_schema(schema: StructType, opts: WriteOptions) -> None:
    """Refuse, before any task runs, a DataFrame the sink cannot write, naming the column."""
    kinds = {f.name: f.dataType.simpleString() for f in schema.fields}
    for name, kind in kinds.items():
        allowed = WRITE_COLUMNS.get(name)
        if allowed is None:
            raise OptionError(f"column {name!r} cannot be written to cometmq (columns: "
                              f"{', '.join(WRITE_COLUMNS)}); select or drop it first")
        if kind not in allowed:
            raise OptionError(f"column {name!r} is {kind}; cometmq takes {' or '.join(sorted(allowed))}")
    if "body" not in kinds:
        raise OptionError("writing to cometmq needs a 'body' column (binary or string)")
    if "topic" not in kinds and opts.topic is None:
        raise OptionError("say where to write: a 'topic' column or the option topic")
    if "queue" in kinds and "queueId" in kinds:
        raise OptionError("columns 'queue' and 'queueId' contradict each other ('queue' is another name for "
                          "'queueId'): give one")
    if "brokerName" in kinds and "queue" not in kinds and "queueId" not in kinds:
        raise OptionError("column 'brokerName' only means something with a 'queueId' column (the queue to send to)")


# -- rows -> messages ---------------------------------------------------------------------------------------------
def _epoch_ms(col: pa.Array) -> list[int | None]:
    if pa.types.is_timestamp(col.type):
        per_ms = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[col.type.unit]
        ticks = col.cast(pa.int64()).to_pylist()
        return [None if t is None else int(t // per_ms) for t in ticks]
    return col.to_pylist()  # type: ignore[no-any-return]


class Outgoing(NamedTuple):
    """One row to send: the message, its sharding key, and the queue its row names (broker, queue id)."""

    msg: Message
    key: str | int | None
    broker: str | None = None
    queue_id: int | None = None
    where: str = ""


def to_messages(batch: pa.RecordBatch, topic: str | None, first_row: int = 0) -> list[Outgoing]:
    """What to send per row of ``batch``; a row that cannot be sent raises InvalidArgumentError."""
    n = batch.num_rows
    names = batch.schema.names

    def col(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in names else [None] * n

    bodies = col("body")
    topics = [topic] * n if topic is not None else col("topic")
    tags, keys, props, shard = col("tags"), col("keys"), col("properties"), col("shardingKey")
    deliver = _epoch_ms(batch.column("deliverAt")) if "deliverAt" in names else [None] * n
    delay = col("delay")
    queue_ids = col("queue") if "queue" in names else col("queueId")
    brokers = col("brokerName")
    out: list[Outgoing] = []
    for i in range(n):
        where = f"row {first_row + i} of the task"
        body = bodies[i]
        if body is None or len(body) == 0:
            raise InvalidArgumentError(f"{where}: the body is null or empty")
        t = topics[i]
        if not t:
            raise InvalidArgumentError(f"{where}: the topic is null")
        if deliver[i] is not None and delay[i] is not None:
            raise InvalidArgumentError(f"{where}: deliverAt and delay contradict each other: give one")
        if delay[i] is not None and delay[i] < 0:
            raise InvalidArgumentError(f"{where}: delay {delay[i]} is negative")
        qid = queue_ids[i]
        if qid is not None:
            if qid < 0:
                raise InvalidArgumentError(f"{where}: queueId {qid} is negative")
            if shard[i] is not None:
                raise InvalidArgumentError(f"{where}: queueId and shardingKey contradict each other: give one")
        p = props[i]
        try:
            msg = Message(t, body, tags=tags[i], keys=keys[i], properties=dict(p) if p else {},
                          deliver_at=deliver[i], delay=delay[i])
            msg.wire_properties("check")  # reserved or malformed properties are refused here, with the row
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{where}: {exc}") from None
        out.append(Outgoing(msg, shard[i], brokers[i] if qid is not None else None, qid, where))
    return out


def pick_queue(queues: Sequence[MessageQueue], topic: str, broker: str | None, queue_id: int,
               where: str) -> MessageQueue:
    """The queue ``queue_id`` of ``topic`` (on ``broker`` when given) among its writable ``queues``."""
    hit = [q for q in queues if q.queue_id == queue_id and (broker is None or q.broker_name == broker)]
    if len(hit) == 1:
        return hit[0]
    have = ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues) or "none"
    if not hit:
        on = f" on broker {broker}" if broker is not None else ""
        raise InvalidArgumentError(f"{where}: topic {topic} has no writable queue {queue_id}{on} "
                                   f"(its queues: {have})")
    raise InvalidArgumentError(f"{where}: topic {topic} has a queue {queue_id} on several brokers ({have}); "
                               "add a brokerName column to say which")


# -- sending ------------------------------------------------------------------------------------------------------
class _Sender:
    def __init__(self, producer: Producer, opts: WriteOptions) -> None:
        self.producer = producer
        self.opts = opts
        self.slots = asyncio.Semaphore(opts.max_in_flight)
        self.queue_locks: dict[MessageQueue, asyncio.Lock] = {}
        self.plain: dict[str, list[Message]] = {}
        self.keyed: dict[MessageQueue, list[Message]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.errors: list[BaseException] = []
        self.sent = 0
        self.requests = 0
        self._rr = itertools.count()
        self._queues: dict[str, list[MessageQueue]] = {}

    async def queues(self, topic: str) -> list[MessageQueue]:
        qs = self._queues.get(topic)
        if qs is None:
            qs = self._queues[topic] = await self.producer.queues(topic)
        return qs

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    def _check(self) -> None:
        if self.errors:
            raise self.errors[0]

    async def _retrying(self, what: str, send: Any) -> list[SendResult]:
        for attempt in range(self.opts.retries + 1):
            try:
                result: list[SendResult] = await send()
                return result
            except MQClientError as exc:
                if not exc.retriable or attempt == self.opts.retries:
                    raise
                log.warning("%s failed (%s); retrying", what, exc)
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _send_batch(self, queue: MessageQueue, msgs: list[Message], lock: asyncio.Lock | None) -> None:
        async def send() -> list[SendResult]:
            return await self.producer.send_batch(msgs, queue=queue, timeout=self.opts.send_timeout)

        if lock is not None:
            async with lock, self.slots:
                results = await self._retrying(f"batch to {queue}", send)
        else:
            async with self.slots:
                results = await self._retrying(f"batch to {queue}", send)
        self._count(results, len(msgs))

    async def _send_one(self, msg: Message, queue: MessageQueue | None = None) -> None:
        async def send() -> list[SendResult]:
            return [await self.producer.send(msg, queue=queue, timeout=self.opts.send_timeout)]

        async with self.slots:
            self._count(await self._retrying(f"timer message to {msg.topic}", send), 1)

    def _count(self, results: Sequence[SendResult], n: int) -> None:
        bad = [r for r in results if not r.ok]
        if bad:
            log.warning("%d of %d messages were stored but %s", len(bad), n, bad[0].status.value)
        self.sent += n
        self.requests += 1

    async def add(self, rows: list[Outgoing]) -> None:
        self._check()
        size = self.opts.batch_size
        for msg, key, broker, queue_id, where in rows:
            target = None
            if queue_id is not None:
                target = pick_queue(await self.queues(msg.topic), msg.topic, broker, queue_id, where)
            if msg.deliver_at is not None or msg.delay is not None:
                self._spawn(self._send_one(msg, target))
            elif target is not None or key is not None:
                queue = target if target is not None else select_by_hash(await self.queues(msg.topic), msg, key)
                buf = self.keyed.setdefault(queue, [])
                buf.append(msg)
                if len(buf) >= size:
                    self._flush_keyed(queue)
            else:
                buf = self.plain.setdefault(msg.topic, [])
                buf.append(msg)
                if len(buf) >= size:
                    await self._flush_plain(msg.topic)
            if len(self.tasks) >= 4 * self.opts.max_in_flight:
                await asyncio.wait(set(self.tasks), return_when=asyncio.FIRST_COMPLETED)
                self._check()

    def _flush_keyed(self, queue: MessageQueue) -> None:
        msgs = self.keyed.pop(queue, [])
        if msgs:
            # Lock first, in row order (asyncio locks are FIFO): batches of one queue go out one after another.
            lock = self.queue_locks.setdefault(queue, asyncio.Lock())
            self._spawn(self._send_batch(queue, msgs, lock))

    async def _flush_plain(self, topic: str) -> None:
        msgs = self.plain.pop(topic, [])
        if msgs:
            qs = await self.queues(topic)
            self._spawn(self._send_batch(qs[next(self._rr) % len(qs)], msgs, None))

    async def finish(self) -> None:
        for topic in list(self.plain):
            await self._flush_plain(topic)
        for queue in list(self.keyed):
            self._flush_keyed(queue)
        while self.tasks:
            await asyncio.wait(set(self.tasks))
        self._check()


def send_batches(batches: Iterator[pa.RecordBatch], opts: WriteOptions) -> SentCount:
    """Send every row of ``batches`` with one producer; raises on the first failure after retries."""
    link = Link(opts.namesrv, timeout=opts.send_timeout, credentials=opts.credentials)
    producer = Producer(opts.producer_group, instance=link.instance, send_timeout=opts.send_timeout,
                        retries=opts.retries)
    try:
        link.run(producer.start())
        sender = _Sender(producer, opts)
        row = 0
        for batch in batches:
            if batch.num_rows:
                link.run(sender.add(to_messages(batch, opts.topic, row)))
                row += batch.num_rows
        link.run(sender.finish())
        return SentCount(sender.sent, sender.requests)
    finally:
        try:
            link.run(producer.close())
        finally:
            link.close()


class CometBatchWriter(DataSourceArrowWriter):
    """``df.write.format("cometmq")`` (append only); with ``transactional=true`` all or nothing."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        #: a transactional job's id (the writer is made once on the driver and shipped to the tasks)
        self.job_id = f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.opts.transactional:
            return exactly_once.send_halves(iterator, self.opts, self.job_id, 0)
        return send_batches(iterator, self.opts)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            n = exactly_once.commit_halves(self.opts, messages, 0)
            log.info("cometmq transactional write %s committed: %d messages", self.job_id, n)
            return
        total = sum(m.messages for m in messages if isinstance(m, SentCount))
        log.info("cometmq write committed: %d messages from %d tasks", total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            n = exactly_once.abort_halves(self.opts, messages, 0)
            log.warning("cometmq transactional write %s aborted: %d messages rolled back", self.job_id, n)
            return
        sent = sum(m.messages for m in messages if isinstance(m, SentCount))
        log.warning("cometmq write aborted; %d messages of the finished tasks stay sent (at-least-once)", sent)


#: the local properties Spark's micro-batch execution gives every task of a streaming query
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _stream_task_ids() -> tuple[str, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
    if not query or batch is None:
        raise OptionError("transactional=true: this task does not know its streaming query and batch id (Spark "
                          f"sets the local properties {QUERY_ID_PROPERTY} and {BATCH_ID_PROPERTY} in micro-batch "
                          "queries; continuous processing is not supported)")
    return query, int(batch)


class CometStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("cometmq")``: each micro-batch's rows, at least once; with ``transactional=true``
    exactly once."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.opts.transactional:
            query, batch = _stream_task_ids()
            return exactly_once.send_halves(iterator, self.opts, query, batch)
        return send_batches(iterator, self.opts)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.transactional:
            n = exactly_once.commit_halves(self.opts, messages, batchId)
            log.info("cometmq transactional stream write: batch %d committed, %d messages", batchId, n)
            return
        total = sum(m.messages for m in messages if isinstance(m, SentCount))
        log.info("cometmq stream write: batch %d committed, %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.transactional:
            n = exactly_once.abort_halves(self.opts, messages, batchId)
            log.warning("cometmq transactional stream write: batch %d aborted, %d messages rolled back", batchId, n)
            return
        log.warning("cometmq stream write: batch %d aborted; what was sent stays sent (at-least-once)", batchId)
