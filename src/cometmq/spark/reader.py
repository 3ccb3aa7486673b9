"""Reading topics into Spark: the batch reader, the streaming reader, and what a task does.

Planning (on the driver) turns the options into offset ranges per queue and cuts them into
:class:`QueueSlice` partitions. A slice carries everything its task needs: the broker's address, the
range, the filter, the consumer-group name for the pull requests; so a task talks to that broker only.

A task pulls its range with PULL_MESSAGE (no long polling, the subscription in the request), asks for
the next chunk before it decodes the one it has, and yields Arrow record batches of about 4 MiB of records
(:func:`cometmq.spark.decode.decode_records`). Offsets below the queue's first offset, or missing in the
middle of an unfiltered range, are data loss: an error with ``failOnDataLoss`` (the default), else skipped
with a warning.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from cometmq.client.errors import BrokerError, ClientConnectionError, ClientTimeoutError, NoRouteError
from cometmq.client.message import MessageQueue
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.spark.decode import decode_records
from cometmq.spark.link import Link
from cometmq.spark.options import ReadOptions, queue_key
from cometmq.spark.planning import QueueRange, from_json, limit_rows, split_ranges, to_json
from cometmq.spark.resolve import DataLossError, check_data_loss, discover, resolve_bound
from cometmq.spark.schema import arrow_schema

log = logging.getLogger(__name__)

__all__ = ["CometBatchReader", "CometStreamReader", "QueueSlice", "read_slice"]

#: records joined into one Arrow batch (bytes as pulled)
BATCH_BYTES = 4 << 20
#: records asked for per pull; the broker caps it (maxTransferCountOnMessageInMemory / ...Bytes...)
PULL_BATCH = 1024
#: pulls on the wire at once per task when the range is unfiltered (the next offsets are then known)
PULL_DEPTH = 3
_FLAG_SUBSCRIPTION = 0x4
_CONNECT_RETRIES = 3


class QueueSlice(InputPartition):
    """Offsets ``[start, end)`` of one queue, and how to read them."""

    def __init__(self, queue: MessageQueue, start: int, end: int, addr: str, opts: ReadOptions) -> None:
        super().__init__(None)
        self.topic = queue.topic
        self.broker_name = queue.broker_name
        self.queue_id = queue.queue_id
        self.start = start
        self.end = end
        self.addr = addr
        self.namesrv = opts.namesrv
        self.group = opts.group
        self.expression = opts.expression
        self.expression_type = opts.expression_type
        self.filtered = opts.filtered
        self.fail_on_data_loss = opts.fail_on_data_loss
        self.timeout = opts.timeout

    @property
    def label(self) -> str:
        return f"{self.topic} {queue_key(self.broker_name, self.queue_id)}"

    def __repr__(self) -> str:
        return f"QueueSlice({self.label} [{self.start}, {self.end}) at {self.addr})"


def _slices(link: Link, ranges: list[QueueRange], opts: ReadOptions) -> list[QueueSlice]:
    out = []
    for r in split_ranges(ranges, opts.min_partitions):
        addr = link.instance.master_addr(r.queue.broker_name)
        if addr is None:
            link.queues([r.queue.topic], missing_ok=True)
            addr = link.broker_addr(r.queue.broker_name)
        out.append(QueueSlice(r.queue, r.start, r.end, addr, opts))
    return out


# -- a task's read --------------------------------------------------------------------------------------------
def read_slice(part: QueueSlice, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of ``part`` as record batches of ``schema``."""
    if part.end <= part.start:
        return
    link = Link(part.namesrv, timeout=part.timeout)
    try:
        yield from _SliceReader(link, part, schema).batches()
    finally:
        link.close()


class _SliceReader:
    def __init__(self, link: Link, part: QueueSlice, schema: pa.Schema) -> None:
        self.link = link
        self.part = part
        self.schema = schema
        self.addr = part.addr

    def _request(self, offset: int, count: int) -> RemotingCommand:
        p = self.part
        return make_request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": p.group, "topic": p.topic, "queueId": str(p.queue_id), "queueOffset": str(offset),
            "maxMsgNums": str(count), "sysFlag": str(_FLAG_SUBSCRIPTION), "commitOffset": "0",
            "suspendTimeoutMillis": "0", "subscription": p.expression, "subVersion": "0",
            "expressionType": p.expression_type})

    async def _pull(self, offset: int, count: int) -> RemotingCommand:
        p = self.part
        for attempt in range(_CONNECT_RETRIES):
            try:
                return await self.link.instance.invoke(self.addr, self._request(offset, count), p.timeout,
                                                       f"pull of {p.label}")
            except (ClientConnectionError, ClientTimeoutError):
                if attempt == _CONNECT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
                try:  # the broker may have moved: ask the nameserver once more
                    await self.link.instance.route(p.topic, refresh=True)
                    self.addr = self.link.instance.master_addr(p.broker_name) or self.addr
                except (ClientConnectionError, ClientTimeoutError, NoRouteError, BrokerError):
                    pass
        raise AssertionError("unreachable")

    def _lost(self, first: int, upto: int, why: str) -> None:
        msg = (f"{self.part.label}: offsets {first}..{upto - 1} {why}. "
               "Set failOnDataLoss=false to skip them.")
        if self.part.fail_on_data_loss:
            raise DataLossError(msg)
        log.warning("skipping lost messages: %s", msg)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Pull the range and yield it as record batches.

        An unfiltered range has one message per offset, so the next pulls' offsets are known before the
        answers: up to PULL_DEPTH pulls are on the wire, each for the next ``count`` offsets. An answer that
        stops short (the broker's per-answer byte or count cap) gets a pull for the rest of its offsets
        before the later ones are used, and ``count`` shrinks to what the broker gives. Any other surprise
        (offset moved, nothing found, ...) drops the pulls ahead and goes on from where the broker says, as
        a filtered range always does (one pull at a time, each from the previous answer's next offset)."""
        p = self.part
        link = self.link
        depth = 1 if p.filtered else PULL_DEPTH
        count = PULL_BATCH
        ahead: collections.deque[tuple[int, int, asyncio.Task[RemotingCommand]]] = collections.deque()
        follow: int | None = p.start  # the offset the next pull starts at, when known
        chunks: list[bytes] = []
        size = 0
        expect = p.start  # the offset the next decoded record should have (unfiltered reads)

        def pull(offset: int, n: int) -> tuple[int, int, asyncio.Task[RemotingCommand]]:
            return offset, n, link.loop.create_task(self._pull(offset, n))

        def fill() -> None:
            nonlocal follow
            while follow is not None and follow < p.end and len(ahead) < depth:
                n = PULL_BATCH if p.filtered else min(count, p.end - follow)
                ahead.append(pull(follow, n))
                follow = follow + n if not p.filtered else None

        def drop_ahead() -> None:
            while ahead:
                _, _, task = ahead.pop()
                task.cancel()
                try:
                    link.run(task)
                except BaseException:
                    pass

        try:
            fill()
            link.run(asyncio.sleep(0))  # the pulls go on the wire
            while ahead:
                offset, asked, task = ahead.popleft()
                response = link.run(task)
                code = response.code
                ext = response.ext_fields
                try:
                    nxt = int(ext["nextBeginOffset"])
                except (KeyError, ValueError):
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, "pull answer without nextBeginOffset",
                                      addr=self.addr, context=p.label) from None
                body = b""
                if code == ResponseCode.SUCCESS:
                    body = response.body
                elif code == ResponseCode.PULL_OFFSET_MOVED or (
                        code == ResponseCode.PULL_RETRY_IMMEDIATELY and response.remark == "MESSAGE_WAS_REMOVING"):
                    if nxt <= offset:
                        raise DataLossError(f"{p.label}: offset {offset} is past the queue's end ({nxt}); "
                                            f"the range [{p.start}, {p.end}) is no longer there")
                    self._lost(offset, min(nxt, p.end), "were deleted before they were read (retention?)")
                elif code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                    pass  # nothing matched the filter in the part scanned
                elif code == ResponseCode.PULL_NOT_FOUND:
                    self._lost(offset, p.end, f"are not in the queue (it ends at {ext.get('maxOffset', '?')})")
                    nxt = p.end
                else:
                    raise BrokerError(code, response.remark or "", addr=self.addr, context=f"pull of {p.label}")
                if nxt <= offset and not body:
                    raise BrokerError(code, f"pull made no progress at offset {offset}", addr=self.addr,
                                      context=p.label)
                if not body and code != ResponseCode.SUCCESS:
                    expect = nxt  # what was skipped was reported above
                if p.filtered:
                    follow = nxt
                elif code == ResponseCode.SUCCESS and offset < nxt <= offset + asked:
                    if nxt < offset + asked:  # capped by the broker: fetch the rest first
                        ahead.appendleft(pull(nxt, offset + asked - nxt))
                        count = max(1, min(count, nxt - offset) * 7 // 8)
                else:  # the pulls ahead started at offsets that no longer follow
                    drop_ahead()
                    follow = nxt
                fill()
                if body:
                    chunks.append(body)
                    size += len(body)
                if chunks and (size >= BATCH_BYTES or not ahead):
                    link.run(asyncio.sleep(0))  # the pulls just made go on the wire before decoding
                    batch = self._decode(b"".join(chunks) if len(chunks) > 1 else chunks[0], expect)
                    chunks, size = [], 0
                    if batch.num_rows:
                        expect = int(batch.column("queueOffset")[-1].as_py()) + 1
                        yield batch
        finally:
            drop_ahead()

    def _decode(self, buf: bytes, expect: int) -> pa.RecordBatch:
        p = self.part
        batch = decode_records(buf, p.topic, p.broker_name, self.schema)
        offsets = batch.column("queueOffset").to_numpy()
        if len(offsets) and offsets[-1] >= p.end:
            keep = offsets < p.end
            batch = batch.filter(pa.array(keep))
            offsets = offsets[keep]
        if not p.filtered and len(offsets):
            wanted = np.arange(expect, expect + len(offsets), dtype=np.int64)
            if not np.array_equal(offsets, wanted):
                bad = int(np.flatnonzero(offsets != wanted)[0])
                self._lost(int(wanted[bad]), int(offsets[bad]),
                           "are missing from the broker's answer (deleted while being read?)")
        return batch


# -- batch ------------------------------------------------------------------------------------------------------
class CometBatchReader(DataSourceReader):
    """``spark.read.format("cometmq")``: the offsets between the starting and ending bounds, fixed at planning."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)

    def partitions(self) -> list[QueueSlice]:
        opts = self.opts
        with Link(opts.namesrv, timeout=opts.timeout) as link:
            queues = discover(link, opts, streaming=False)
            starts = resolve_bound(link, opts.starting, queues, missing=-2)
            ends = resolve_bound(link, opts.ending, queues, missing=-1)
            backwards = [q for q in queues if starts[q] > ends[q]]
            if backwards:
                q = backwards[0]
                raise ValueError(f"{q.topic} {queue_key(q.broker_name, q.queue_id)}: the starting offset "
                                 f"{starts[q]} is past the ending offset {ends[q]} "
                                 f"(startingOffsets {opts.starting.describe()}, "
                                 f"endingOffsets {opts.ending.describe()})")
            starts = check_data_loss(starts, link.min_offsets(queues), fail=opts.fail_on_data_loss)
            ranges = [QueueRange(q, starts[q], ends[q]) for q in queues]
            return _slices(link, ranges, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when there is nothing to read
            return iter(())
        return read_slice(partition, self.arrow)


# -- streaming ----------------------------------------------------------------------------------------------------
class CometStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("cometmq")``.

    Offsets are ``{topic: {"broker:queueId": next offset}}``. Queues that appear later (new topics matching
    the pattern, queues added to a topic) start at offset 0. Spark writes each micro-batch's (start, end) to its
    checkpoint before running it, and :meth:`partitions` depends on nothing but that pair, so a restarted
    query reads exactly the ranges it had planned: no message twice, none skipped.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)
        self._link: Link | None = None
        self._target: dict[MessageQueue, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_link"] = None
        return state

    @property
    def link(self) -> Link:
        if self._link is None or self._link.closed:
            self._link = Link(self.opts.namesrv, timeout=self.opts.timeout)
        return self._link

    def initialOffset(self) -> dict[str, Any]:
        queues = discover(self.link, self.opts, streaming=True)
        start = resolve_bound(self.link, self.opts.starting, queues, missing=-1)
        return to_json(start)

    def _latest(self, known: dict[MessageQueue, int]) -> tuple[dict[MessageQueue, int], dict[MessageQueue, int]]:
        """(start with new queues at 0, each queue's end now)."""
        queues = discover(self.link, self.opts, streaming=True)
        start = dict(known)
        for q in queues:
            start.setdefault(q, 0)
        return start, self.link.max_offsets(sorted(start, key=lambda q: (q.topic, q.broker_name, q.queue_id)))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin, latest = self._latest(from_json(start, "the checkpointed start offset"))
        if self._target is not None:
            latest = {q: min(off, self._target.get(q, begin[q])) for q, off in latest.items()}
        latest = {q: max(off, begin[q]) for q, off in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = limit_rows(begin, latest, limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable):
            log.warning("cometmq ignores the read limit %r", limit)
        return to_json(latest)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            queues = discover(self.link, self.opts, streaming=True)
            return to_json(self.link.max_offsets(queues))
        except Exception as exc:  # reporting only
            log.debug("latest offset for the progress report: %s", exc)
            return None

    def prepareForTriggerAvailableNow(self) -> None:
        queues = discover(self.link, self.opts, streaming=True)
        self._target = self.link.max_offsets(queues)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueSlice]:
        begin = from_json(start, "the micro-batch's start offset")
        stop = from_json(end, "the micro-batch's end offset")
        moving = {q: begin.get(q, 0) for q, off in stop.items() if off > begin.get(q, 0)}
        if not moving:
            return []
        link = self.link
        queues = sorted(moving, key=lambda q: (q.topic, q.broker_name, q.queue_id))
        moving = check_data_loss(moving, link.min_offsets(queues), fail=self.opts.fail_on_data_loss)
        return _slices(link, [QueueRange(q, moving[q], stop[q]) for q in queues], self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when there is nothing to read
            return iter(())
        return read_slice(partition, self.arrow)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.commit_to_group
        if group is None:
            return
        offsets = from_json(end, "the committed offset")
        try:
            self.link.commit(group, offsets)
        except Exception as exc:  # reporting only: Spark's checkpoint holds the real progress
            log.warning("could not report offsets to group %s: %s", group, exc)

    def stop(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None

