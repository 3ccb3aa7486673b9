"""Producer auto-batching (RocketMQ 5's ``autoBatch`` / ProduceAccumulator): concurrent ``send()`` calls for one
topic are held for at most ``batch_max_delay_ms`` and go as one SEND_BATCH_MESSAGE; each caller gets its own
:class:`SendResult`.

A batch is keyed by (topic, the send's timeout). When no batch of its key is in flight it goes at the end of the
loop turn that opened it: every send made in that turn is in it, and a lone send waits for nothing. While one is in
flight it fills, and goes when that answer comes, when its encoded size reaches ``batch_max_bytes`` (a message that
would take it past that flushes it first and starts the next one), or ``batch_max_delay_ms`` after its first
message, whichever is first; a batch of one message goes as an ordinary send. (RocketMQ 5's accumulator holds every
batch for the whole delay: with N senders each waiting for its answer, that is at most N messages per delay, slower
than not batching once a send costs less than the delay.) The flushed
batch is sent under the producer's retry policy (:meth:`Producer._with_retries`): a retriable failure sends the
same body (same message ids) again on another queue, as a single send is retried; the broker stores a batch
whole or not at all, so batching adds no duplicate a retry of one send would not. A failure after the retries
fails every caller of the batch with that error. The batch's timeout (its sends') is a budget for all its
attempts together, from when it is sent, as a single send's is for its own.

``total_batch_max_bytes`` bounds the bytes held, across topics, from a message's ``send()`` until its batch's
answer: a send that finds no room waits for it (back-pressure) at most its timeout, then raises
:class:`ClientTimeoutError`. (RocketMQ 5's Java client sends such a message on its own instead.) One message is
always admitted when nothing is held, so a message larger than the bound cannot wait forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from cometmq.client.errors import ClientTimeoutError
from cometmq.client.message import Message, SendResult
from cometmq.protocol.batch import ITEM_OVERHEAD
from cometmq.protocol.properties import PGROUP, TRAN_MSG

if TYPE_CHECKING:
    from cometmq.client.producer import Producer

log = logging.getLogger(__name__)

#: bytes of ``UNIQ_KEY\x01<32 hex digits>\x02WAIT\x01true\x02`` that every batch item's properties end with
UNIQ_SUFFIX_BYTES = len("UNIQ_KEY\x01") + 32 + len("\x02WAIT\x01true\x02")

#: RocketMQ 5's defaults (DefaultMQProducer / ProduceAccumulator): autoBatch off, holdMs 10, holdSize 32 KiB,
#: totalHoldSize 32 MiB; and its bounds (1 ms .. 30 s, 1 B .. 2 MiB, > 0)
DEFAULT_BATCH_MAX_DELAY_MS = 10.0
DEFAULT_BATCH_MAX_BYTES = 32 * 1024
DEFAULT_TOTAL_BATCH_MAX_BYTES = 32 * 1024 * 1024
MAX_BATCH_MAX_DELAY_MS = 30_000.0
MAX_BATCH_MAX_BYTES = 2 * 1024 * 1024


class _Item:
    __slots__ = ("body", "flag", "future", "head", "msg", "size")

    def __init__(self, msg: Message, body: bytes, head: bytes, future: asyncio.Future[SendResult]) -> None:
        self.msg = msg
        self.body = body
        self.head = head  # the encoded properties before UNIQ_KEY
        self.flag = msg.flag
        self.size = ITEM_OVERHEAD + len(body) + len(head) + UNIQ_SUFFIX_BYTES
        self.future = future


class _Batch:
    __slots__ = ("items", "key", "size", "timer")

    def __init__(self, key: tuple[str, float]) -> None:
        self.key = key
        self.items: list[_Item] = []
        self.size = 0
        #: what sends it unless it fills first: the end of this loop turn, or the delay
        self.timer: asyncio.Handle | None = None


class AutoBatcher:
    """The accumulator of one :class:`Producer` (``Producer(auto_batch=True)``). Not thread-safe: one loop."""

    def __init__(self, producer: Producer, max_delay_ms: float, max_bytes: int, total_max_bytes: int) -> None:
        self.producer = producer
        self.max_delay = max_delay_ms / 1000
        self.max_bytes = max_bytes
        self.total_max_bytes = total_max_bytes
        #: bytes of the messages held: in open batches, or in batches whose answer has not come yet
        self.held = 0
        #: requests sent: SEND_BATCH_MESSAGE (batches of 2 or more) and single sends of batches of one
        self.batches_sent = 0
        self.messages_batched = 0
        self.closed = False
        self._open: dict[tuple[str, float], _Batch] = {}
        #: batches sent and not answered yet, per key
        self._in_flight: dict[tuple[str, float], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._room: asyncio.Event | None = None

    @staticmethod
    def admits(msg: Message) -> bool:
        """Whether ``msg`` may go in a batch (besides its size): not scheduled, not a transaction's half nor
        carrying a producer group (RocketMQ's rule), not for a retry topic."""
        if msg.delay_level or msg.deliver_at is not None or msg.delay is not None:
            return False
        props = msg.properties
        if props and (PGROUP in props or TRAN_MSG in props):
            return False
        return not msg.topic.startswith("%RETRY%")

    async def send(self, msg: Message, timeout: float) -> SendResult:
        """Send ``msg`` in a batch (or alone, when it is too big or the batcher is closed)."""
        producer = self.producer
        begin = time.monotonic()
        body = msg.body if type(msg.body) is bytes else bytes(msg.body)
        head = msg.batch_properties_head()  # raises InvalidArgumentError (reserved property) before any request
        loop = asyncio.get_running_loop()
        item = _Item(msg, body, head, loop.create_future())
        if self.closed or item.size > self.max_bytes:
            uniq = producer._uniq.new_key()  # (the same id for every attempt, as send's)
            return await producer._with_retries(msg.topic, lambda q, left: producer._send_to(q, msg, left, uniq),
                                                timeout, begin)
        if self.held and self.held + item.size > self.total_max_bytes:
            await self._wait_for_room(item.size, timeout)
        self.held += item.size
        key = (msg.topic, timeout)
        batch = self._open.get(key)
        if batch is not None and batch.size + item.size > self.max_bytes:
            self._flush(batch)
            batch = None
        if batch is None:
            batch = self._open[key] = _Batch(key)
            batch.timer = loop.call_later(self.max_delay, self._flush, batch) if self._in_flight.get(key) \
                else loop.call_soon(self._flush, batch)
        batch.items.append(item)
        batch.size += item.size
        if batch.size >= self.max_bytes:
            self._flush(batch)
        try:
            return await item.future
        except asyncio.CancelledError:
            if self._open.get(key) is batch and item in batch.items:  # not sent yet: take it out
                batch.items.remove(item)
                batch.size -= item.size
                self._release(item.size)
                if not batch.items:
                    self._discard(batch)
            raise

    async def _wait_for_room(self, size: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.held and self.held + size > self.total_max_bytes:
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(self._room.wait(), left)
            except TimeoutError:
                raise ClientTimeoutError(
                    f"auto-batching: {self.held} bytes are held in batches (total_batch_max_bytes "
                    f"{self.total_max_bytes}); no room for {size} more within {timeout} s") from None

    def _release(self, size: int) -> None:
        self.held -= size
        if self._room is not None:
            self._room.set()

    def _discard(self, batch: _Batch) -> None:
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None

    def _flush(self, batch: _Batch) -> None:
        """Close ``batch`` and send it in a task of its own."""
        self._discard(batch)
        if not batch.items:
            return
        self._in_flight[batch.key] = self._in_flight.get(batch.key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: self._answered(batch, t))  # (also when cancelled before it ran)

    def _answered(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        """``batch`` is answered, failed or cancelled: its bytes are no longer held, a caller it never answered is
        cancelled (a task cancelled before it ran), and the next batch of its key, filled meanwhile, goes now if
        this was the last in flight."""
        self._release(batch.size)
        if task.cancelled():
            for it in batch.items:
                it.future.cancel()
        key = batch.key
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
            return
        del self._in_flight[key]
        waiting = self._open.get(key)
        if waiting is not None:
            self._flush(waiting)

    async def _send(self, batch: _Batch) -> None:
        items = batch.items
        self.batches_sent += 1
        self.messages_batched += len(items)
        try:
            results = await self.producer._send_items(batch.key[0], items, batch.key[1])
        except asyncio.CancelledError:
            raise  # (its callers are cancelled by _answered)
        except BaseException as exc:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for it, result in zip(items, results, strict=True):
                if not it.future.done():
                    it.future.set_result(result)

    async def flush(self) -> None:
        """Send every open batch now and wait for the answers of all batches sent."""
        for batch in list(self._open.values()):
            self._flush(batch)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Flush (:meth:`flush`); later sends go alone until :meth:`open`."""
        self.closed = True
        await self.flush()

    def open(self) -> None:
        self.closed = False
