"""Exactly-once writes (sink option ``transactional=true``): rows as transactional half messages, committed by
the driver, recoverable after a driver crash.

Tasks (executors)
    A task's rows are sent as RocketMQ transactions' *halves* (invisible to consumers) of the producer group
    ``cometmq-spark-eos-<queryId>``, *packed* (cometmq's extension, protocol/transaction_batch.py): each request is
    one half, one record in the broker's log, whose body is a batch of ``batchSize`` rows at most, cut and encoded
    from the Arrow columns by the at-least-once writer's columnar path (no Python object per row), each item's
    properties the row's own merged with :data:`QUERY_ID`, :data:`BATCH_ID`, :data:`WRITE_ID` (one id per task
    attempt) and ``PGROUP`` (a constant suffix of the encoder; a row's property of one of those names takes the
    write's value, as a dict merge): the message its commit delivers. The half itself carries those ids too, for
    the check-back, ``TRAN_MSG`` and CHECK_IMMUNITY_TIME_IN_SECONDS (``transactionTimeoutMs``, in seconds rounded
    up); it is sent with ``TransactionProducer.send_packed_half``. A task returns a :class:`HalfBatch`: its
    halves, each what an entry of END_TRANSACTION_BATCH needs (broker name, the half's commit-log and half-queue
    offsets and msg id, queue id, ordered, count 1; a marker written before packed halves lists half batches as
    ranges, count > 1, and is still decided as it says), and when it started sending. A task that fails rolls
    back what it had sent.

    A packed half costs the broker one record instead of one per row when it is stored, and its commit appends
    the rows as an at-least-once write's batch does: an exactly-once write stores each row once in the log, not
    twice (docs/benchmarks.md, [17]).

Driver, ``commit(messages, batchId)``
    0. *Late?* With no marker yet, when the batch's first task started sending ``transactionTimeoutMs`` ago or
       more, the broker may have discarded some halves: all are rolled back and the commit fails, naming the
       option (all or nothing).
    1. *Marker*: a message on the commit topic (``commitTopic``, default ``cometmq-spark-commits``; 1 queue, made
       when missing) keyed ``<queryId>:<batchId>`` whose body lists the write ids to commit and their half ranges
       (in parts of at most :data:`PART_HALVES` ranges, each naming every write id; a range is six numbers). It
       is on the broker, found through the broker's key index (QUERY_MESSAGE), so it outlives the driver and does
       not depend on where the checkpoint lives. If several markers of one batch exist (a replay that wrote its
       own), the first stored one is *the* marker: everyone decides from it.
    2. COMMIT for each half the marker lists, ROLLBACK for halves of this run the marker does not list (a
       replay's): END_TRANSACTION_BATCH requests of range entries (cometmq's extension, up to 16,384 halves
       each; the broker decides each half of a range as a single END would), each broker's in the marker's order,
       so rows with a sharding key or queue id are committed in row order per queue.
    3. *Done*: the consumer offset of group ``cometmq-spark-eos-<queryId>`` on the commit topic's queue 0 is set
       to ``batchId + 1``.

Replay (Spark reruns batch B after a crash: its commit log lacks B)
    The replay's tasks send new halves; its commit finds B's marker (the crashed run's), COMMITs the halves it
    lists again (idempotent: the broker answers "already resolved" for those done) and rolls back the new ones.
    No row is lost or doubled. Without a marker, the replay writes its own and the crashed run's halves are
    orphans.

Check-back (orphans, lost END_TRANSACTIONs)
    Every producer of the group (the tasks while they run, the driver while it commits) answers the broker's
    CHECK_TRANSACTION_STATE from the marker: the half's write id listed → COMMIT; a marker that does not list it
    → ROLLBACK; no marker yet → UNKNOW (the batch may still be running). The first check comes
    ``transactionTimeoutMs`` after the half. A half nobody decides is moved by the broker to
    TRANS_CHECK_MAX_TIME_TOPIC after ``transactionCheckMax`` checks: never delivered to the target. A commit
    whose END requests meet such a half fails with :class:`TransactionTimeoutError` (the batch is then written in
    part; the age check in step 0 is there so that this does not happen).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import re
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from cometmq.client.admin import Admin
from cometmq.client.errors import BrokerError, InvalidArgumentError, MQClientError, NoRouteError
from cometmq.client.message import Message, MessageExt, MessageQueue
from cometmq.client.producer import Producer
from cometmq.client.transaction_producer import (
    EndEntry,
    HalfBatchRange,
    LocalTransactionState,
    TransactionClientInstance,
    TransactionProducer,
)
from cometmq.common import failpoints
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY, inflate_body
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.properties import PGROUP
from cometmq.protocol.transaction_batch import MAX_END_ENTRIES
from cometmq.spark.link import Link
from cometmq.spark.options import WriteOptions
from cometmq.spark.writer import _Pending, _Sender, _suspect, to_messages

log = logging.getLogger(__name__)

__all__ = ["BATCH_ID", "QUERY_ID", "WRITE_ID", "HalfBatch", "TransactionTimeoutError", "abort_halves", "commit_halves",
           "group_for", "send_halves"]

#: properties every transactional row carries (and keeps once committed)
QUERY_ID = "__SPARK_QUERY_ID"
BATCH_ID = "__SPARK_BATCH_ID"
WRITE_ID = "__SPARK_WRITE_ID"
GROUP_PREFIX = "cometmq-spark-eos-"
#: half ranges per marker message (about 60 bytes each before compression)
PART_HALVES = 40_000
#: RocketMQ's property: no check-back of a half sooner than this many seconds after it was stored
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
_COMMIT = LocalTransactionState.COMMIT_MESSAGE
_ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE

#: halves stored by one append (a half batch's, or part of one): (broker name, the first one's commit-log offset,
#: half-queue offset and msg id, real queue id, ordered, how many: the others follow at the next half-queue offsets)
HalfRef = tuple[str, int, int, str, int, bool, int]


def group_for(query_id: str) -> str:
    return GROUP_PREFIX + query_id


def marker_key(query_id: str, batch_id: int) -> str:
    return f"{query_id}:{batch_id}"


@dataclasses.dataclass
class HalfBatch(WriterCommitMessage):
    """What one task sent: its halves, not yet visible."""

    query_id: str
    batch_id: int
    write_id: str
    halves: list[HalfRef]
    #: the rows the halves hold (a packed half holds many)
    rows: int = 0
    #: when the task started sending (epoch ms, the task's clock; 0: not known): its halves are younger
    started_ms: int = 0

    @property
    def messages(self) -> int:
        return self.rows


def count_halves(ranges: Sequence[HalfRef]) -> int:
    return sum(h[6] for h in ranges)


def immunity_s(opts: WriteOptions) -> int:
    """CHECK_IMMUNITY_TIME_IN_SECONDS of the write's halves: transactionTimeoutMs in seconds, rounded up. The
    broker neither asks about a half nor discards it sooner (it takes its transactionTimeOut when longer)."""
    return -(-opts.transaction_timeout_ms // 1000)


class TransactionTimeoutError(MQClientError):
    """A transactional write's halves outlived transactionTimeoutMs before the driver committed them."""


# -- the marker --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Marker:
    commit_id: str
    write_ids: frozenset[str]
    halves: list[HalfRef]
    parts: int
    parts_seen: int


class Markers:
    """The commit markers of the commit topic, and the per-query 'done' pointer (a consumer offset)."""

    def __init__(self, instance: TransactionClientInstance, topic: str, timeout: float) -> None:
        self.admin = Admin(instance=instance, timeout=timeout)
        self.admin.started = True  # the link's instance is used unstarted: requests only
        self.instance = instance
        self.topic = topic
        self.timeout = timeout
        self._found: dict[tuple[str, int], Marker] = {}

    async def ensure_topic(self) -> None:
        try:
            await self.admin.topic_route(self.topic)
        except NoRouteError:
            log.info("creating the exactly-once commit topic %s", self.topic)
            await self.admin.create_topic(self.topic, read_queues=1, wait=10.0)

    async def find(self, query_id: str, batch_id: int) -> Marker | None:
        """The batch's marker (the first stored, if there are several); None when there is none yet."""
        known = self._found.get((query_id, batch_id))
        if known is not None and known.parts_seen == known.parts:
            return known
        key = marker_key(query_id, batch_id)
        try:
            msgs = await self.admin.query_messages_by_key(self.topic, key, max_num=4096)
        except NoRouteError:
            return None
        parts: dict[str, dict[int, dict[str, Any]]] = {}
        order: list[str] = []
        for m in msgs:  # oldest first
            try:
                # (inflated to 16 MiB at most: a part of PART_HALVES ranges is a few MiB; whatever writes to the
                # topic could store a few KiB that inflate to gigabytes in the driver)
                doc = json.loads(inflate_body(m.body, DEFAULT_MAX_INFLATED_BODY) or b"")
                cid = str(doc["commit"])
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable commit marker %s in %s", m.msg_id, self.topic)
                continue
            if cid not in parts:
                order.append(cid)
            parts.setdefault(cid, {})[int(doc["part"])] = doc
        if not order:
            return None
        first = parts[order[0]]
        any_part = next(iter(first.values()))
        halves: list[HalfRef] = []
        for _, doc in sorted(first.items()):
            for broker, rows in doc["halves"].items():
                # a row: [clo, qo, msg id, queue id, ordered] and the range's count (a marker before ranges: 1)
                halves.extend((broker, int(r[0]), int(r[1]), str(r[2]), int(r[3]), bool(r[4]),
                               int(r[5]) if len(r) > 5 else 1) for r in rows)
        marker = Marker(order[0], frozenset(any_part["writeIds"]), halves, int(any_part["parts"]), len(first))
        self._found[(query_id, batch_id)] = marker
        return marker

    async def write(self, producer: Producer, query_id: str, batch_id: int, write_ids: Sequence[str],
                    halves: Sequence[HalfRef]) -> str:
        commit_id = uuid.uuid4().hex
        chunks = [halves[i:i + PART_HALVES] for i in range(0, len(halves), PART_HALVES)] or [[]]
        for n, chunk in enumerate(chunks):
            by_broker: dict[str, list[list[Any]]] = {}
            for broker, clo, qo, msg_id, qid, ordered, count in chunk:
                by_broker.setdefault(broker, []).append([clo, qo, msg_id, qid, int(ordered), count])
            doc = {"query": query_id, "batch": batch_id, "commit": commit_id, "part": n, "parts": len(chunks),
                   "writeIds": sorted(write_ids), "halves": by_broker}
            body = zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)
            result = await producer.send(Message(self.topic, body, keys=marker_key(query_id, batch_id),
                                                 tags="commit"), timeout=self.timeout)
            if not result.ok:
                raise MQClientError(f"the commit marker of batch {batch_id} was stored as {result.status.value}, "
                                    "not SEND_OK")
        return commit_id

    async def _done_queue(self) -> tuple[str, MessageQueue] | None:
        qs = await self.instance.subscribe_queues(self.topic, refresh=False)
        if not qs:
            return None
        q = min(qs, key=lambda q: (q.broker_name, q.queue_id))
        addr = self.instance.master_addr(q.broker_name)
        return None if addr is None else (addr, q)

    async def done(self, query_id: str) -> int:
        """Batches below this one are committed in full (0: none known)."""
        got = await self._done_queue()
        if got is None:
            return 0
        off = await self.admin.committed_offset(group_for(query_id), got[1])
        return off or 0

    async def set_done(self, query_id: str, next_batch: int) -> None:
        got = await self._done_queue()
        if got is not None:
            await self.admin.update_consumer_offset(group_for(query_id), got[1], next_batch)


class Checker:
    """Answers CHECK_TRANSACTION_STATE for the group from the markers."""

    def __init__(self, markers: Markers) -> None:
        self.markers = markers

    async def __call__(self, msg: MessageExt) -> LocalTransactionState:
        q, b, w = msg.properties.get(QUERY_ID), msg.properties.get(BATCH_ID), msg.properties.get(WRITE_ID)
        if not q or not w or b is None or not b.lstrip("-").isdigit():
            return LocalTransactionState.UNKNOW
        try:
            marker = await self.markers.find(q, int(b))
        except MQClientError as exc:
            log.info("check of %s: cannot read the commit marker (%s)", msg.msg_id, exc)
            return LocalTransactionState.UNKNOW
        if marker is None:
            return LocalTransactionState.UNKNOW  # the batch may still be running
        state = _COMMIT if w in marker.write_ids else _ROLLBACK
        log.info("check of %s (query %s batch %s): %s", msg.msg_id, q, b, state.name)
        return state


# -- tasks ---------------------------------------------------------------------------------------------------------
class _HalfSender(_Sender):
    """A task's rows as packed halves (cometmq's extension: one request, one record per batch of rows) through the
    at-least-once writer's columnar path (writer.py): the same routing (plain rows round-robin over the topic's
    queues, rows with a sharding key or queue id batched per queue and sent one batch after another per queue, in
    row order), the same cuts (``batchSize`` rows and the producer's byte cap), ``maxInFlight`` requests at once,
    and the same encoder, with ``suffix`` = the write's ids + PGROUP merged into each row's properties: each item
    the message the half's commit delivers. Timer rows are refused."""

    def __init__(self, producer: TransactionProducer, opts: WriteOptions, extra: dict[str, str]) -> None:
        # A half batch is one range of END_TRANSACTION_BATCH, which names at most MAX_END_ENTRIES halves.
        super().__init__(producer, dataclasses.replace(opts, batch_size=min(opts.batch_size, MAX_END_ENTRIES)))
        self.tx = producer
        #: the half's own properties (the checker reads the write's ids from them)
        self.extra = extra
        # Each item as its commit delivers it: the row's properties, the write's ids and PGROUP (a half's
        # committed message keeps those; TRAN_MSG it drops), UNIQ_KEY and WAIT.
        self.suffix = {**extra, PGROUP: producer.group}
        #: (batch number, what was stored, ordered): the halves stored so far
        self.stored: list[tuple[int, HalfBatchRange, bool]] = []
        self.seq = itertools.count()

    async def add(self, batch: pa.RecordBatch, first_row: int) -> None:
        names = batch.schema.names
        timed: np.ndarray | None = None
        for name in ("deliverAt", "delay"):
            if name in names:
                valid = batch.column(name).is_valid().to_numpy(zero_copy_only=False)
                timed = valid if timed is None else timed | valid
        if timed is not None and timed.any():
            # As the per-row path: a bad row anywhere in the batch first, then a bad queue before the timer row.
            if _suspect(batch, self.opts.topic):
                to_messages(batch, self.opts.topic, first_row)
            i = int(np.argmax(timed))
            if i:
                await self._route(batch.slice(0, i), first_row)
            raise InvalidArgumentError(f"row {first_row + i} of the task: a transactional write cannot send timer "
                                       "messages (deliverAt/delay)")
        await super().add(batch, first_row)

    async def _flush(self, key: str | MessageQueue, pend: _Pending) -> None:
        if not pend.count:
            return
        body = pend.parts[0] if len(pend.parts) == 1 else b"".join(pend.parts)
        prefix, first, _ = pend.ids[0]
        # Lock first, in row order (asyncio locks are FIFO): batches of one queue go out one after another.
        lock = None if isinstance(key, str) else self.queue_locks.setdefault(key, asyncio.Lock())
        self._spawn(self._send_half(next(self.seq), key, body, f"{prefix}{first:012X}", pend.count, lock))
        await self._throttle()

    async def _send_half(self, n: int, key: str | MessageQueue, body: bytes, first_id: str, count: int,
                         lock: asyncio.Lock | None) -> None:
        """One half batch, to the next queue of the topic ``key`` or to the queue ``key`` (ordered)."""
        ordered = isinstance(key, MessageQueue)
        async with lock or _NO_LOCK, self.slots:
            if isinstance(key, MessageQueue):
                queue, qs = key, [key]
            else:
                qs = await self.queues(key)
                queue = qs[next(self._rr) % len(qs)]
            for attempt in range(self.opts.retries + 1):
                try:
                    stored = await self.tx.send_packed_half(queue, body, count, first_id, self.extra,
                                                            timeout=self.opts.send_timeout)
                    break
                except BrokerError as exc:
                    # Only an answered refusal is sent again (nothing was stored; the same bytes, the same ids); a
                    # request without an answer may have stored its halves, and a copy would carry this task's
                    # write id. Plain rows try another queue, as send_half_batch does; ordered ones wait.
                    if not exc.retriable or attempt == self.opts.retries:
                        raise
                    log.info("half batch to %s refused (%s); retrying", queue, exc)
                    if ordered:
                        await asyncio.sleep(0.2 * (attempt + 1))
                    else:
                        queue = qs[next(self._rr) % len(qs)]
        if not stored.ok:
            log.warning("%d halves stored as %s", stored.count, stored.status.value)
        self.stored.append((n, stored, ordered))
        self.sent += count
        self.requests += 1

    async def settle(self) -> None:
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    def halves(self) -> list[HalfRef]:
        """Every half stored, in the order the batches were made (so per queue in row order)."""
        return [half_range(stored, ordered) for _, stored, ordered in sorted(self.stored, key=lambda t: t[0])]


#: offset msg ids (IPv4 32 or IPv6 56 hex digits, the offset, the last 16, below 2**63), comma-separated
_OFFSET_ID = r"(?:[0-9A-Fa-f]{16}|[0-9A-Fa-f]{40})[0-7][0-9A-Fa-f]{15}"
_OFFSET_ID_ONE = re.compile(_OFFSET_ID)


def half_range(stored: HalfBatchRange, ordered: bool) -> HalfRef:
    """The range of a half batch as stored: its first half's commit-log offset as ``decode_offset_msg_id`` reads
    it."""
    oid = stored.offset_msg_id
    offset = int(oid[-16:], 16) if _OFFSET_ID_ONE.fullmatch(oid) else decode_offset_msg_id(oid).offset
    return (stored.queue.broker_name, offset, stored.queue_offset, stored.msg_id, stored.queue.queue_id, ordered,
            stored.count)


_NO_LOCK = contextlib.nullcontext()


def send_halves(batches: Iterator[pa.RecordBatch], opts: WriteOptions, query_id: str, batch_id: int) -> HalfBatch:
    """Send every row of ``batches`` as a half of ``query_id``'s group; on failure roll back what was sent."""
    link = Link(opts.namesrv, timeout=opts.send_timeout, credentials=opts.credentials, tls=opts.tls,
                transactions=True)
    instance = link.instance
    assert isinstance(instance, TransactionClientInstance)
    group = group_for(query_id)
    checker = Checker(Markers(instance, opts.commit_topic, opts.send_timeout))
    producer = TransactionProducer(group, instance=instance, checker=checker, send_timeout=opts.send_timeout,
                                   retries=opts.retries)
    write_id = uuid.uuid4().hex
    started_ms = int(time.time() * 1000)
    # The broker's first check-back of a half comes no sooner than transactionTimeoutMs: a batch still being
    # written is not asked about (each check re-appends the half and costs a marker lookup), nor discarded after
    # transactionCheckMax checks; orphans (a crashed job's) wait this long.
    extra = {QUERY_ID: query_id, BATCH_ID: str(batch_id), WRITE_ID: write_id,
             CHECK_IMMUNITY_TIME_IN_SECONDS: str(immunity_s(opts))}
    sender = _HalfSender(producer, opts, extra)
    try:
        link.run(producer.start())
        row = 0
        try:
            for batch in batches:
                if batch.num_rows:
                    link.run(sender.add(batch, row))
                    row += batch.num_rows
            link.run(sender.finish())
        except BaseException:
            link.run(sender.settle())
            sent = sender.halves()
            rolled = link.run(_Ender(producer, opts.topic).rolled_back(sent))
            log.warning("transactional write task failed; rolled back %d of its %d halves", rolled,
                        count_halves(sent))
            raise
        return HalfBatch(query_id, batch_id, write_id, sender.halves(), sender.sent, started_ms)
    finally:
        try:
            link.run(producer.close())
        finally:
            link.close()


# -- driver --------------------------------------------------------------------------------------------------------
class _Ender:
    """Decides many halves of one group: END_TRANSACTION_BATCH requests, each broker's in list order (so the
    rows of one queue are committed in row order), the brokers at once. ``topic``: the write's topic, named in
    the requests (with ACLs on, a request naming none needs an admin account); None when rows name theirs."""

    def __init__(self, producer: TransactionProducer, topic: str | None) -> None:
        self.producer = producer
        self.topic = topic
        #: halves decided before (a replay's commit finds those the crashed run committed)
        self.already = 0
        #: halves whose END failed (or may have: a request without an answer)
        self.failed = 0
        #: of those, halves the broker had discarded (undecided through its check-backs)
        self.discarded = 0

    async def end_all(self, halves: Sequence[HalfRef], state: LocalTransactionState,
                      halfway: Callable[[], None] | None = None) -> list[BaseException]:
        """END ``state`` for every half of the ranges ``halves``; returns the failures (one per range entry
        refused in part or in whole; :attr:`failed` counts the halves). ``halfway`` (a failpoint) runs once the
        first half of the ranges is answered, before the rest is sent."""
        if halfway is not None:
            mid = len(halves) // 2
            first = await self.end_all(halves[:mid], state)
            halfway()
            return first + await self.end_all(halves[mid:], state)
        errors: list[BaseException] = []
        by_broker: dict[str, list[HalfRef]] = {}
        for h in halves:
            by_broker.setdefault(h[0], []).append(h)

        async def one(broker: str, hs: list[HalfRef]) -> None:
            entries = [EndEntry(clo, qo, state.value, msg_id, n) for _, clo, qo, msg_id, _, _, n in hs]
            try:
                outcomes = await self.producer.end_transaction_batch(broker, entries, topic=self.topic)
            except (MQClientError, OSError) as exc:  # the broker's halves undecided (some may be): count each
                errors.extend([exc] * len(hs))
                self.failed += count_halves(hs)
                return
            for h, o in zip(hs, outcomes, strict=True):
                if not o.ok:
                    errors.append(MQClientError(f"END_TRANSACTION {state.name} of {h[6]} halves from {h[3]} "
                                                f"refused: code {o.code} {o.remark}"))
                    self.failed += h[6]  # (some of them may be decided: the remark says how many are not)
                    if o.code == ResponseCode.TRANSACTION_FAILED and "discarded" in o.remark:
                        self.discarded += h[6]
                else:
                    self.already += o.resolved_before

        await asyncio.gather(*(one(b, hs) for b, hs in by_broker.items()))
        return errors

    async def rolled_back(self, halves: Sequence[HalfRef]) -> int:
        """Roll ``halves`` back; how many were (the rest the check-back rolls back)."""
        if not halves:
            return 0
        before = self.failed
        await self.end_all(halves, _ROLLBACK)
        return count_halves(halves) - (self.failed - before)


class _Driver:
    """The driver's side of one commit or abort: a link, a producer of the group (so it answers check-backs
    while it works) and the markers."""

    def __init__(self, opts: WriteOptions, query_id: str) -> None:
        self.opts = opts
        self.query_id = query_id
        self.link = Link(opts.namesrv, timeout=opts.send_timeout, credentials=opts.credentials, tls=opts.tls,
                         transactions=True)
        instance = self.link.instance
        assert isinstance(instance, TransactionClientInstance)
        self.instance = instance
        self.markers = Markers(instance, opts.commit_topic, opts.send_timeout)
        self.producer = TransactionProducer(group_for(query_id), instance=instance, checker=Checker(self.markers),
                                            send_timeout=opts.send_timeout, retries=opts.retries,
                                            compress_over=1 << 30)
        self.ender = _Ender(self.producer, opts.topic)

    def __enter__(self) -> _Driver:
        try:
            self.link.run(self.producer.start())
            self.link.run(self.markers.admin.cluster_info())  # every broker's address, for END_TRANSACTION
            self.link.run(self.instance.heartbeat())  # now a producer of the group: check-backs can reach us
        except BaseException:
            self.link.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.link.run(self.producer.close())
        finally:
            self.link.close()


def _collect(messages: Sequence[WriterCommitMessage | None]) -> tuple[str | None, list[str], list[HalfRef]]:
    query_id: str | None = None
    write_ids: list[str] = []
    halves: list[HalfRef] = []
    for m in messages:
        if isinstance(m, HalfBatch):
            query_id = query_id or m.query_id
            write_ids.append(m.write_id)
            halves.extend(m.halves)
    return query_id, write_ids, halves


def commit_halves(opts: WriteOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> int:
    """Commit batch ``batch_id``'s halves exactly once (see the module docstring); returns the halves the marker
    lists (each a packed half of rows, or one row of a marker written before packed halves)."""
    query_id, write_ids, halves = _collect(messages)
    if query_id is None or not halves:
        return 0
    with _Driver(opts, query_id) as d:
        run = d.link.run
        run(d.markers.ensure_topic())
        done = run(d.markers.done(query_id))
        marker = run(d.markers.find(query_id, batch_id))
        if marker is None:
            _refuse_if_late(d, messages, halves, batch_id)
            mine = run(d.markers.write(d.producer, query_id, batch_id, write_ids, halves))
            marker = _wait_for_marker(d, query_id, batch_id)
            if marker.commit_id != mine:
                log.warning("batch %d of query %s: another commit's marker came first; committing its rows",
                            batch_id, query_id)
        else:
            log.warning("batch %d of query %s is a replay: committing the rows its marker lists (%d), rolling "
                        "back this run's %d", batch_id, query_id, count_halves(marker.halves), count_halves(halves))
        failpoints.hit(f"spark.commit.after_marker.{batch_id}")
        listed = marker.write_ids
        errors: list[BaseException] = []
        if done <= batch_id:
            partial = f"spark.commit.partial.{batch_id}"
            # (the COMMITs in two steps only for that failpoint: one request less in a commit otherwise)
            errors = run(d.ender.end_all(marker.halves, _COMMIT, functools.partial(failpoints.hit, partial)
                                         if failpoints.armed(partial) else None))
        failed, discarded = d.ender.failed, d.ender.discarded
        unlisted = [h for m in messages if isinstance(m, HalfBatch) and m.write_id not in listed for h in m.halves]
        if unlisted:
            bad = run(d.ender.end_all(unlisted, _ROLLBACK))
            if bad:
                log.warning("batch %d: rollbacks of %d halves failed (the check-back rolls them back): %s",
                            batch_id, d.ender.failed - failed, bad[0])
        if discarded:
            raise TransactionTimeoutError(
                f"batch {batch_id}: the broker had discarded {discarded} of the {count_halves(marker.halves)} "
                f"halves its marker lists (left undecided past transactionTimeoutMs={opts.transaction_timeout_ms} "
                "and the broker's transactionCheckMax check-backs; their rows are in TRANS_CHECK_MAX_TIME_TOPIC): "
                "the others are committed, so the batch is written only in part, and a replay of it fails the same "
                f"way. Set transactionTimeoutMs above the job's (a micro-batch's) length. First refusal: {errors[0]}")
        if errors:
            raise MQClientError(f"batch {batch_id}: END_TRANSACTION COMMITs of {failed} of "
                                f"{count_halves(marker.halves)} halves failed (the replay after a restart, or the "
                                f"broker's check-back, completes them): {errors[0]}")
        run(d.markers.set_done(query_id, max(done, batch_id + 1)))
        if marker.parts_seen < marker.parts:
            log.warning("batch %d: %d of the marker's %d parts are missing; the check-back commits their halves",
                        batch_id, marker.parts - marker.parts_seen, marker.parts)
        return count_halves(marker.halves)


def _refuse_if_late(d: _Driver, messages: Sequence[WriterCommitMessage | None], halves: Sequence[HalfRef],
                    batch_id: int) -> None:
    """Before the marker: when the batch's first task started sending transactionTimeoutMs ago or more, the broker
    may have discarded some of its halves, and a commit would write only the others. Roll them all back and
    raise instead: all or nothing. (Younger halves are safe: the broker asks about none of them before their
    immunity, and once the marker exists the check-back commits those the END requests have not reached yet.)"""
    timeout = d.opts.transaction_timeout_ms
    starts = [m.started_ms for m in messages if isinstance(m, HalfBatch) and m.started_ms > 0]
    age = int(time.time() * 1000) - min(starts) if starts else 0
    if age < timeout:
        return
    d.link.run(d.ender.end_all(halves, _ROLLBACK))
    raise TransactionTimeoutError(
        f"batch {batch_id}: its first task started sending {age / 1000:.1f} s ago, past transactionTimeoutMs="
        f"{timeout}: the broker may have discarded some of its halves, so none is committed ({count_halves(halves)}"
        f" rolled back, {d.ender.failed} of them left to the check-back). Set transactionTimeoutMs above the job's "
        "(a micro-batch's) length.")


def _wait_for_marker(d: _Driver, query_id: str, batch_id: int) -> Marker:
    """The batch's first marker once the broker's key index shows ours (it is built just after the append)."""
    for _ in range(200):
        marker = d.link.run(d.markers.find(query_id, batch_id))
        if marker is not None:
            return marker
        d.link.run(asyncio.sleep(0.05))
    raise MQClientError(f"the commit marker of batch {batch_id} is not found by key on the broker after 10 s: "
                        "exactly-once writes need the broker's message index (messageIndexEnable=true)")


def abort_halves(opts: WriteOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> int:
    """Roll back the halves of the tasks that finished (unless a marker already commits them); returns how many.
    Failed tasks rolled back their own; what is left the check-back resolves."""
    query_id, _, halves = _collect(messages)
    if query_id is None or not halves:
        return 0
    with _Driver(opts, query_id) as d:
        marker = d.link.run(d.markers.find(query_id, batch_id))
        listed = marker.write_ids if marker is not None else frozenset()
        drop = [h for m in messages if isinstance(m, HalfBatch) and m.write_id not in listed for h in m.halves]
        bad = d.link.run(d.ender.end_all(drop, _ROLLBACK))
        if bad:
            log.warning("batch %d: rollbacks of %d halves failed (the check-back rolls them back): %s", batch_id,
                        d.ender.failed, bad[0])
        return count_halves(drop) - d.ender.failed
