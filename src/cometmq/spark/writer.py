"""Writing DataFrames to cometmq topics (``df.write`` and ``df.writeStream``).

Each task makes one producer and sends all its rows with it:

- rows without ``shardingKey`` or scheduling are packed into SEND_BATCH_MESSAGE requests of up to
  ``batchSize`` messages, spread round-robin over the topic's queues, up to ``maxInFlight`` requests at once;
- rows with a ``shardingKey`` go to the queue the key hashes to (the SDK's ``select_by_hash``: CRC32 of the
  key), in batches sent one after another per queue, so a key's rows keep their order within the task;
- rows with ``deliverAt`` (a timestamp or epoch ms) or ``delay`` (seconds) are timer messages, sent one by one;
- rows with a ``queueId`` (or ``queue``) go to that queue of the topic (on the broker the ``brokerName`` column
  names, needed only when several brokers have a queue of that id), batched and ordered per queue as keyed rows.

Batched rows never become Python objects: each Arrow batch Spark hands the task is checked and routed column by
column (numpy, pyarrow.compute) and its rows are encoded into request bodies straight from the Arrow buffers
(:mod:`cometmq.spark.encode`, C when built). Timer rows, and a batch with a row to refuse, go through
:func:`to_messages` (a Message per row), which names the bad row.

A failed request is retried ``retries`` times (the same bytes, so the same message ids); then the task fails
and Spark runs it again. Delivery is therefore at-least-once: a retried task (or a request whose answer was
lost) can send a row twice.

With the option ``transactional=true`` rows go as transactional half messages that the driver commits:
exactly once for streams, all or nothing for batch jobs (:mod:`cometmq.spark.exactly_once`). They take the same
columnar path (the same routing, cuts and encoder, each item with the write's constant properties appended), sent
as half batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cometmq.client.errors import InvalidArgumentError, MQClientError
from cometmq.client.message import RESERVED_PROPERTIES, Message, MessageQueue, SendResult, SendStatus
from cometmq.client.producer import BATCH_ITEM_OVERHEAD, Producer
from cometmq.spark.encode import Columns, encode_rows, given_bytes
from cometmq.spark.link import Link
from cometmq.spark.options import OptionError, WriteOptions
from cometmq.spark.schema import WRITE_COLUMNS

log = logging.getLogger(__name__)

T = TypeVar("T")

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


def to_messages(batch: pa.RecordBatch, topic: str | None, first_row: int = 0,
                rows: Sequence[int] | None = None) -> list[Outgoing]:
    """What to send per row of ``batch`` (or of its ``rows``); a row that cannot be sent raises
    InvalidArgumentError."""
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
    for i in range(n) if rows is None else rows:
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


# -- columns -> requests ------------------------------------------------------------------------------------------
def _strings(values: Sequence[str]) -> pa.Array:
    """A string array made from its buffers: ``pa.array(list)`` imports pandas (0.2 s in every Python worker
    that imports the sink) to check whether the list is a pandas object."""
    data = [v.encode() for v in values]
    offsets = np.cumsum([0, *(len(d) for d in data)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


_RESERVED_ARRAY = _strings(sorted(RESERVED_PROPERTIES))


def _any(mask: pa.Array | pa.ChunkedArray) -> bool:
    return bool(pc.any(mask).as_py())


def _suspect(batch: pa.RecordBatch, topic: str | None) -> bool:
    """Whether ``batch`` may hold a row :func:`to_messages` refuses, checked column by column (cheap, and never
    False for a batch it refuses): when True, :func:`to_messages` runs and names the row."""
    names = batch.schema.names
    body = batch.column("body")
    if body.null_count or _any(pc.equal(pc.binary_length(body), 0)):
        return True
    if topic is None:
        t = batch.column("topic")
        if t.null_count or _any(pc.equal(pc.binary_length(t), 0)):
            return True
    if "delay" in names:
        delay = batch.column("delay")
        if _any(pc.less(delay, 0)) or ("deliverAt" in names
                                       and _any(pc.and_(pc.is_valid(delay), pc.is_valid(batch.column("deliverAt"))))):
            return True
    qcol = "queue" if "queue" in names else "queueId" if "queueId" in names else None
    if qcol is not None:
        qid = batch.column(qcol)
        if _any(pc.less(qid, 0)) or ("shardingKey" in names
                                     and _any(pc.and_(pc.is_valid(qid), pc.is_valid(batch.column("shardingKey"))))):
            return True
    if "properties" in names:
        props = batch.column("properties")
        offsets = props.offsets
        lo, hi = offsets[0].as_py(), offsets[-1].as_py()
        if _any(pc.is_in(props.keys.slice(lo, hi - lo), value_set=_RESERVED_ARRAY)):
            return True
    return False


def _codes(arr: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(an int64 code per row, -1 for null; the distinct values, by code)."""
    enc = pc.dictionary_encode(arr)
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, enc.dictionary.to_pylist()


def _hashes(arr: pa.Array) -> np.ndarray:
    """``select_by_hash``'s number per row as uint64 (``abs(key)`` for an integer key, CRC32 of the text
    otherwise)."""
    if pa.types.is_integer(arr.type):
        # nulls filled first: with them to_numpy would give floats, wrong past 2**53
        keys: np.ndarray = np.abs(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64)) \
            .astype(np.uint64)
        return keys
    codes, values = _codes(arr)
    crc = np.array([zlib.crc32(str(v).encode()) for v in values] + [0], dtype=np.uint64)
    out: np.ndarray = crc[codes]  # a null (-1) takes the last, unused entry
    return out


def _groups(codes: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(code, its rows in row order) for each code >= 0."""
    if len(codes) and codes[0] >= 0 and (codes == codes[0]).all():
        return [(int(codes[0]), np.arange(len(codes), dtype=np.int64))]
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    values, starts = np.unique(sorted_codes, return_index=True)
    ends = [*starts[1:].tolist(), len(order)]
    return [(int(v), order[a:b]) for v, a, b in zip(values.tolist(), starts.tolist(), ends, strict=True) if v >= 0]


@dataclasses.dataclass
class _Pending:
    """Encoded items waiting for more of their destination's rows (a request holds up to ``batchSize``)."""

    parts: list[bytes] = dataclasses.field(default_factory=list)
    count: int = 0
    est: int = 0
    #: the message ids of the items, in order: runs of (prefix, first id, how many)
    ids: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


# -- sending ------------------------------------------------------------------------------------------------------
class _Sender:
    """One task's sending: requests of up to ``batchSize`` encoded rows, at most ``maxInFlight`` at once."""

    #: properties every item gets after its own (encode_rows' suffix): an exactly-once write's
    suffix: dict[str, str] | None = None

    def __init__(self, producer: Producer, opts: WriteOptions) -> None:
        self.producer = producer
        self.opts = opts
        self.slots = asyncio.Semaphore(opts.max_in_flight)
        self.queue_locks: dict[MessageQueue, asyncio.Lock] = {}
        #: a topic (rows sent round-robin over its queues) or a queue (keyed rows, in order) -> its waiting rows
        self.pending: dict[str | MessageQueue, _Pending] = {}
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

    async def _throttle(self) -> None:
        if len(self.tasks) >= 4 * self.opts.max_in_flight:
            await asyncio.wait(set(self.tasks), return_when=asyncio.FIRST_COMPLETED)
            self._check()

    async def _retrying(self, what: str, send: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(self.opts.retries + 1):
            try:
                return await send()
            except MQClientError as exc:
                if not exc.retriable or attempt == self.opts.retries:
                    raise
                log.warning("%s failed (%s); retrying", what, exc)
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _send_body(self, queue: MessageQueue, body: bytes, n: int, lock: asyncio.Lock | None) -> None:
        """One request; a retry sends the same bytes (the same message ids)."""
        async def send() -> SendStatus:
            return await self.producer.send_batch_body(queue, body, timeout=self.opts.send_timeout)

        if lock is not None:
            async with lock, self.slots:
                status = await self._retrying(f"batch to {queue}", send)
        else:
            async with self.slots:
                status = await self._retrying(f"batch to {queue}", send)
        if status is not SendStatus.SEND_OK:
            log.warning("%d messages were stored but %s", n, status.value)
        self.sent += n
        self.requests += 1

    async def _send_one(self, msg: Message, queue: MessageQueue | None = None) -> None:
        async def send() -> SendResult:
            return await self.producer.send(msg, queue=queue, timeout=self.opts.send_timeout)

        async with self.slots:
            result = await self._retrying(f"timer message to {msg.topic}", send)
        if not result.ok:
            log.warning("a timer message was stored but %s", result.status.value)
        self.sent += 1
        self.requests += 1

    async def add(self, batch: pa.RecordBatch, first_row: int) -> None:
        """Encode and send (or keep for the next batch) every row of ``batch``, row ``first_row`` of the task
        first; a row that cannot be sent raises InvalidArgumentError naming it."""
        self._check()
        if not batch.num_rows:
            return
        topic = self.opts.topic
        if _suspect(batch, topic):
            to_messages(batch, topic, first_row)  # raises, naming the row
        lengths = pc.binary_length(batch.column("body")).to_numpy(zero_copy_only=False)
        limit = self.producer.max_message_size
        if int(lengths.max()) > limit:
            i = int(np.argmax(lengths > limit))
            raise InvalidArgumentError(f"row {first_row + i} of the task: the body is {int(lengths[i])} bytes, "
                                       f"more than {limit}")
        dest, where, timed = await self._route(batch, first_row)
        cols = Columns.of(batch)
        sizes = lengths.astype(np.int64) + given_bytes(cols)
        for code, rows in _groups(dest):
            await self._enqueue(where[code], cols, rows, sizes, first_row)
        if timed.any():
            for out in to_messages(batch, topic, first_row, np.flatnonzero(timed).tolist()):
                target = None
                if out.queue_id is not None:
                    target = pick_queue(await self.queues(out.msg.topic), out.msg.topic, out.broker, out.queue_id,
                                        out.where)
                self._spawn(self._send_one(out.msg, target))
                await self._throttle()

    async def _route(self, batch: pa.RecordBatch,
                     first_row: int) -> tuple[np.ndarray, list[str | MessageQueue], np.ndarray]:
        """Where each row goes, column by column: (a code per row, -1 for a timer row; what each code means: a
        topic, whose rows go round-robin, or a queue a queueId or sharding key names, whose rows keep their
        order; which rows are timer rows)."""
        names = batch.schema.names
        n = batch.num_rows
        if self.opts.topic is not None:
            tcode, topics = np.zeros(n, dtype=np.int64), [self.opts.topic]
        else:
            tcode, topics = _codes(batch.column("topic"))
        dest = tcode.copy()
        where: list[str | MessageQueue] = list(topics)
        codes: dict[MessageQueue, int] = {}

        def code_of(q: MessageQueue) -> int:  # one code per queue, however its rows name it: one order
            c = codes.get(q)
            if c is None:
                c = codes[q] = len(where)
                where.append(q)
            return c

        timed = np.zeros(n, dtype=bool)
        for name in ("deliverAt", "delay"):
            if name in names:
                timed |= batch.column(name).is_valid().to_numpy(zero_copy_only=False)
        qcol = "queue" if "queue" in names else "queueId" if "queueId" in names else None
        named = np.zeros(n, dtype=bool)
        if qcol is not None:
            qid = batch.column(qcol)
            named = qid.is_valid().to_numpy(zero_copy_only=False) & ~timed
            if named.any():
                bcode, brokers = _codes(batch.column("brokerName")) if "brokerName" in names \
                    else (np.full(n, -1, dtype=np.int64), [])
                qids = pc.fill_null(qid, 0).to_numpy(zero_copy_only=False).astype(np.int64)
                combos = np.stack([tcode, bcode, qids], axis=1)[named]
                rows = np.flatnonzero(named)
                uniq, first, inverse = np.unique(combos, axis=0, return_index=True, return_inverse=True)
                local = np.empty(len(uniq), dtype=np.int64)
                for u in np.argsort(first, kind="stable").tolist():  # the first failing row fails, as row by row
                    t, b, q = (int(x) for x in uniq[u])
                    name = topics[t]
                    local[u] = code_of(pick_queue(await self.queues(name), name, brokers[b] if b >= 0 else None, q,
                                                  f"row {first_row + int(rows[first[u]])} of the task"))
                dest[named] = local[inverse.reshape(-1)]
        if "shardingKey" in names:
            shard = batch.column("shardingKey")
            keyed = shard.is_valid().to_numpy(zero_copy_only=False) & ~named & ~timed
            if keyed.any():
                hashes = _hashes(shard)
                for t, name in enumerate(topics):
                    mine = keyed & (tcode == t)
                    if mine.any():
                        qs = await self.queues(name)
                        by_index = np.array([code_of(q) for q in qs], dtype=np.int64)
                        dest[mine] = by_index[(hashes[mine] % np.uint64(len(qs))).astype(np.int64)]
        dest[timed] = -1
        return dest, where, timed

    async def _enqueue(self, key: str | MessageQueue, cols: Columns, rows: np.ndarray, sizes: np.ndarray,
                       first_row: int) -> None:
        """Encode ``rows`` (not empty) for ``key`` into requests of up to ``batchSize`` rows and the producer's
        ``max_batch_bytes`` (each row counted as ``Producer.send_batch`` counts a message: ``sizes``, its body and
        what it gives besides, and BATCH_ITEM_OVERHEAD); send the full ones, keep the rest for the next batch."""
        pend = self.pending.pop(key, None) or _Pending()
        size, cap = self.opts.batch_size, self.producer.max_batch_bytes
        est = sizes[rows] + (BATCH_ITEM_OVERHEAD + sum(len(k.encode()) + len(v.encode()) + 2
                                                       for k, v in (self.suffix or {}).items()))
        # Plan: (end of the next run of rows, whether the request is then full and goes).
        plan: list[tuple[int, bool]] = []
        a, count, used = 0, pend.count, pend.est
        while a < len(rows):
            room = np.cumsum(est[a:a + size - count])
            take = int(np.searchsorted(room, cap - used, side="right"))
            if take == 0 and count == 0:
                take = 1  # a row alone over the cap goes alone, as the producer sends it
            if take:
                used += int(room[take - 1])
                count += take
                a += take
            full = count == size or a < len(rows)
            plan.append((a, full))
            if full:
                count, used = 0, 0
        prefix, first = self.producer.reserve_msg_ids(len(rows))
        ends = sorted({end for end, _ in plan if end > 0})
        encoded = dict(zip(ends, encode_rows(cols, rows, ends, prefix, first, first_row, self.suffix), strict=True))
        start = 0
        for end, full in plan:
            if end > start:
                pend.parts.append(encoded[end])
                pend.ids.append((prefix, first + start, end - start))
                pend.count += end - start
                pend.est += int(est[start:end].sum())
                start = end
            if full:
                await self._flush(key, pend)
                pend = _Pending()
        if pend.count:
            self.pending[key] = pend

    async def _flush(self, key: str | MessageQueue, pend: _Pending) -> None:
        if not pend.count:
            return
        body = pend.parts[0] if len(pend.parts) == 1 else b"".join(pend.parts)
        if isinstance(key, str):
            qs = await self.queues(key)
            self._spawn(self._send_body(qs[next(self._rr) % len(qs)], body, pend.count, None))
        else:
            # Lock first, in row order (asyncio locks are FIFO): batches of one queue go out one after another.
            lock = self.queue_locks.setdefault(key, asyncio.Lock())
            self._spawn(self._send_body(key, body, pend.count, lock))
        await self._throttle()

    async def finish(self) -> None:
        for key, pend in list(self.pending.items()):
            del self.pending[key]
            await self._flush(key, pend)
        while self.tasks:
            await asyncio.wait(set(self.tasks))
        self._check()


def send_batches(batches: Iterator[pa.RecordBatch], opts: WriteOptions) -> SentCount:
    """Send every row of ``batches`` with one producer; raises on the first failure after retries."""
    link = Link(opts.namesrv, timeout=opts.send_timeout, credentials=opts.credentials, tls=opts.tls)
    producer = Producer(opts.producer_group, instance=link.instance, send_timeout=opts.send_timeout,
                        retries=opts.retries)
    try:
        link.run(producer.start())
        sender = _Sender(producer, opts)
        row = 0
        for batch in batches:
            if batch.num_rows:
                link.run(sender.add(batch, row))
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
            from cometmq.spark import exactly_once  # it builds on this module: imported here
            return exactly_once.send_halves(iterator, self.opts, self.job_id, 0)
        return send_batches(iterator, self.opts)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            from cometmq.spark import exactly_once
            n = exactly_once.commit_halves(self.opts, messages, 0)
            rows = sum(m.messages for m in messages if isinstance(m, exactly_once.HalfBatch))
            log.info("cometmq transactional write %s committed: %d halves (%d rows from this run's tasks)",
                     self.job_id, n, rows)
            return
        total = sum(m.messages for m in messages if isinstance(m, SentCount))
        log.info("cometmq write committed: %d messages from %d tasks", total, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.transactional:
            from cometmq.spark import exactly_once
            n = exactly_once.abort_halves(self.opts, messages, 0)
            log.warning("cometmq transactional write %s aborted: %d halves rolled back", self.job_id, n)
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
            from cometmq.spark import exactly_once
            return exactly_once.send_halves(iterator, self.opts, query, batch)
        return send_batches(iterator, self.opts)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.transactional:
            from cometmq.spark import exactly_once
            n = exactly_once.commit_halves(self.opts, messages, batchId)
            log.info("cometmq transactional stream write: batch %d committed, %d halves", batchId, n)
            return
        total = sum(m.messages for m in messages if isinstance(m, SentCount))
        log.info("cometmq stream write: batch %d committed, %d messages", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.transactional:
            from cometmq.spark import exactly_once
            n = exactly_once.abort_halves(self.opts, messages, batchId)
            log.warning("cometmq transactional stream write: batch %d aborted, %d halves rolled back", batchId, n)
            return
        log.warning("cometmq stream write: batch %d aborted; what was sent stays sent (at-least-once)", batchId)
