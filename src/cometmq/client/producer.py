"""The producer: send (awaited), send_async with a callback, oneway, batches, queue selectors, ordered sends."""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from cometmq.client.auto_batch import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_DELAY_MS,
    DEFAULT_TOTAL_BATCH_MAX_BYTES,
    MAX_BATCH_MAX_BYTES,
    MAX_BATCH_MAX_DELAY_MS,
    AutoBatcher,
)
from cometmq.client.errors import (
    BrokerError,
    ClientStateError,
    ClientTimeoutError,
    InvalidArgumentError,
    MQClientError,
    NoRouteError,
)
from cometmq.client.instance import ClientInstance, request_error, route_stale
from cometmq.client.message import (
    _SEND_RESULT_FIELDS,
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    properties_text,
    send_result,
    send_results,
)
from cometmq.client.send_frame import PLAIN_HEAD, PLAIN_TAIL, ProducerKeys, SendFrameTemplate, properties_json
from cometmq.client.wire import SdkConnection, SdkRemotingClient
from cometmq.common.native import load_c_helper
from cometmq.protocol.acl import Credentials
from cometmq.protocol.batch import encode_keyed_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2
from cometmq.protocol.msgid import UniqKeyGenerator
from cometmq.protocol.remoting import ONEWAY_FLAG, RemotingCommand, make_request, next_opaque
from cometmq.protocol.route import TopicRouteData

if TYPE_CHECKING:
    from cometmq.client.auto_batch import _Item

log = logging.getLogger(__name__)
T = TypeVar("T")

#: (queues, message, arg) -> the queue to send to
MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]
SendCallback = Callable[[SendResult | None, BaseException | None], None]

_STATUS: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}


def _v2_key(field: str, **values: Any) -> str:
    """The SEND_MESSAGE_V2 key of a header field: where a probe header's distinctive value lands."""
    probe = send_header_to_v2(SendMessageRequestHeader(**{"producer_group": "\x00group", "topic": "\x00topic",
                                                          **values}))
    [key] = [k for k, v in probe.items() if v == str(values[field])]
    return key


_V2_GROUP = _v2_key("producer_group", producer_group="\x00probe")
_V2_TOPIC = _v2_key("topic", topic="\x00probe")
_V2_QUEUE_ID = _v2_key("queue_id", queue_id=424242)
_V2_SYS_FLAG = _v2_key("sys_flag", sys_flag=434343)
_V2_BORN_TIMESTAMP = _v2_key("born_timestamp", born_timestamp=454545)
_V2_FLAG = _v2_key("flag", flag=464646)
_V2_PROPERTIES = _v2_key("properties", properties="\x00probe")


def send_call_timeout(topic: str, timeout: float, attempts: int, last: MQClientError | None) -> ClientTimeoutError:
    """The error of a send whose timeout ran out before its next attempt: RocketMQ's "sendDefaultImpl call
    timeout" (the timeout is a budget for the whole send, retries included, not one per attempt)."""
    why = f"; the last failed: {last}" if last is not None else ""
    return ClientTimeoutError(f"sendDefaultImpl call timeout: the send to {topic} ran out of its {timeout:g}s after "
                              f"{attempts} attempt{'' if attempts == 1 else 's'}{why}")


def select_by_hash(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """The same argument always picks the same queue (stable across processes: no ``hash()``)."""
    key = arg if isinstance(arg, int) else zlib.crc32(str(arg).encode())
    return queues[abs(key) % len(queues)]


_round_robin = itertools.count()


def select_round_robin(queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    return queues[next(_round_robin) % len(queues)]


class Producer:
    """An asyncio producer. Use ``async with Producer(namesrv=...) as p: await p.send(msg)``."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", *, namesrv: str | None = None,
                 instance: ClientInstance | None = None, send_timeout: float = 3.0, retries: int = 2,
                 compress_over: int = 4096, compress_level: int = 5, max_message_size: int = 4 * 1024 * 1024,
                 max_batch_bytes: int = 1024 * 1024, credentials: Credentials | tuple[str, str] | None = None,
                 auto_batch: bool = False, batch_max_delay_ms: float = DEFAULT_BATCH_MAX_DELAY_MS,
                 batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
                 total_batch_max_bytes: int = DEFAULT_TOTAL_BATCH_MAX_BYTES) -> None:
        """``auto_batch``: concurrent :meth:`send` calls for one topic go as one batch request, at once when none of
        the topic's batches is in flight, else held until its answer, at most ``batch_max_delay_ms`` (1 .. 30000),
        or until ``batch_max_bytes`` (1 .. 2 MiB) of them; at most
        ``total_batch_max_bytes`` held across topics (a send past it waits). RocketMQ 5's ``autoBatch``,
        ``batchMaxDelayMs``, ``batchMaxBytes``, ``totalBatchMaxBytes``, with its defaults (off, 10 ms, 32 KiB,
        32 MiB). See :mod:`cometmq.client.auto_batch`."""
        if instance is None and namesrv is None:
            raise InvalidArgumentError("a producer needs namesrv='host:port' or a ClientInstance")
        if not group:
            raise InvalidArgumentError("the producer group name is empty")
        if not 0 < batch_max_delay_ms <= MAX_BATCH_MAX_DELAY_MS:
            raise InvalidArgumentError(f"batch_max_delay_ms must be more than 0 and at most "
                                       f"{MAX_BATCH_MAX_DELAY_MS:g}, not {batch_max_delay_ms}")
        if not 0 < batch_max_bytes <= MAX_BATCH_MAX_BYTES:
            raise InvalidArgumentError(f"batch_max_bytes must be 1 .. {MAX_BATCH_MAX_BYTES}, not {batch_max_bytes}")
        if total_batch_max_bytes <= 0:
            raise InvalidArgumentError(f"total_batch_max_bytes must be more than 0, not {total_batch_max_bytes}")
        self.group = group
        self._own_instance = instance is None
        self.instance = instance or ClientInstance(namesrv or "", credentials=credentials)
        self.send_timeout = send_timeout
        self.retries = max(0, retries)
        self.compress_over = compress_over
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.max_batch_bytes = max_batch_bytes
        self._uniq: UniqKeyGenerator = ProducerKeys(self.instance.client_ip)
        self._next_queue = itertools.count()
        self._pending: set[asyncio.Task[Any]] = set()
        #: topic names _check found valid (str only: a subclass could compare equal and differ)
        self._valid_topics: set[str] = set()
        self._v2_template: dict[str, str] | None = None
        self._queue_cache: dict[str, tuple[TopicRouteData, list[MessageQueue]]] = {}
        #: topic -> (group, its SEND_MESSAGE_V2 frame template, None: not templatable) for _start_send
        self._frame_templates: dict[str, tuple[str, SendFrameTemplate | None]] = {}
        #: the accumulator of auto-batched sends (None: auto_batch off)
        self.batcher = AutoBatcher(self, batch_max_delay_ms, batch_max_bytes, total_batch_max_bytes) \
            if auto_batch else None
        self.started = False

    async def start(self) -> None:
        if self.started:
            return
        self.instance.register_producer(self.group)
        await self.instance.start()
        if self.batcher is not None:
            self.batcher.open()
        self.started = True

    async def close(self) -> None:
        if not self.started:
            return
        if self.batcher is not None:
            await self.batcher.close()  # sends the open batches and waits for their answers
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        self.started = False
        await self.instance.unregister(producer_group=self.group)
        await self.instance.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- checks ---------------------------------------------------------------------------------------------
    def _check(self, msg: Message) -> None:
        if not self.started:
            raise ClientStateError("the producer is not started")
        if not isinstance(msg, Message):
            raise InvalidArgumentError(f"expected a Message, got {type(msg).__name__}")
        self._check_topic(msg.topic)
        if not msg.body:
            raise InvalidArgumentError(f"the message body for {msg.topic} is empty")
        if len(msg.body) > self.max_message_size:
            raise InvalidArgumentError(f"the message body for {msg.topic} is {len(msg.body)} bytes, more than "
                                       f"{self.max_message_size}")

    def _check_topic(self, topic: str) -> None:
        if type(topic) is not str or topic not in self._valid_topics:
            if not topic or len(topic) > 127 or not all(c.isalnum() or c in "%|-_" for c in topic):
                raise InvalidArgumentError(f"topic {topic!r} is not a valid topic name")
            if type(topic) is str:
                if len(self._valid_topics) >= 1024:
                    self._valid_topics.clear()
                self._valid_topics.add(topic)

    def _check_batch(self, msgs: Sequence[Message]) -> None:
        """:meth:`_check` of every message (the same errors, in the same order), plus the batch's own rules,
        with the per-message part cut to what can differ once the first message passed."""
        first = msgs[0]
        self._check(first)
        topic = first.topic
        max_size = self.max_message_size
        for m in msgs:
            if type(m) is not Message or m.topic != topic or not m.body or len(m.body) > max_size:
                self._check(m)
                if m.topic != topic:
                    raise InvalidArgumentError("a batch must hold messages of one topic")
            if m.delay_level or m.deliver_at is not None or m.delay is not None:
                raise InvalidArgumentError("scheduled messages cannot be sent in a batch")

    # -- routes ---------------------------------------------------------------------------------------------
    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues; an unknown topic is sent through the brokers' default route (TBW102)."""
        return list(await self._queues(topic))

    async def _queues(self, topic: str) -> list[MessageQueue]:
        """:meth:`queues`, shared: computed once per route object the client instance holds (a refreshed route
        is a new object), not on every send. Callers must not change the list."""
        route = self.instance.routes.get(topic)
        if route is not None:
            cached = self._queue_cache.get(topic)
            if cached is not None and cached[0] is route:
                return cached[1]
            queues = self.instance.queues_of(route, topic, writable=True)
            if queues:
                if len(self._queue_cache) >= 1024:
                    self._queue_cache.clear()
                self._queue_cache[topic] = (route, queues)
                return queues
            # A known route without a writable queue: its master is gone (a failover under way?). Ask again now
            # (rate-limited) rather than at the next poll.
            await self.instance.refresh_route(topic)
        queues = await self.instance.publish_queues(topic)
        if queues:
            return queues
        if topic in self.instance.routes:
            # The topic exists but no master takes writes now (a failover under way, or a read-only topic). As
            # RocketMQ, the default route is only for a topic no nameserver knows: its 4 queues per broker would
            # send to queue ids this topic does not have.
            raise NoRouteError(f"topic {topic} has no writable queue now (no master of its brokers is registered, "
                               "or its permission forbids writes)")
        default = await self.instance.publish_queues("TBW102")
        if not default:
            raise NoRouteError(f"no route for topic {topic}, and no broker allows auto-creating it")
        # As RocketMQ: up to 4 queues per broker for an auto-created topic.
        return [MessageQueue(topic, q.broker_name, q.queue_id) for q in default if q.queue_id < 4]

    # -- send -----------------------------------------------------------------------------------------------
    async def send(self, msg: Message, *, queue: MessageQueue | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout: float | None = None) -> SendResult:
        """Send and wait for the broker's answer. Retries on another queue (and broker) when the failure allows
        it, unless a queue was chosen (``queue`` or ``selector``), where a failure is reported as it is.
        ``timeout`` (default ``send_timeout``) bounds the whole send, route lookup and retries included, as
        RocketMQ's: each attempt gets what is left of it, and none is made once it ran out (ClientTimeoutError).

        With ``auto_batch`` on, a message without ``queue``/``selector`` that can go in a batch (not scheduled, not
        a transaction's half, small enough) goes with the other sends of its topic in one request: at once when
        none of the topic's batches is in flight, else when that answer comes (at most ``batch_max_delay_ms``
        later) (:mod:`cometmq.client.auto_batch`)."""
        if not (self.started and type(msg) is Message and type(msg.topic) is str and msg.topic in self._valid_topics
                and msg.body and len(msg.body) <= self.max_message_size):  # else one of _check's errors
            self._check(msg)
        topic = msg.topic
        timeout = self.send_timeout if timeout is None else timeout
        begin = time.monotonic()
        if queue is not None or selector is not None:
            left = timeout
            if queue is None:
                assert selector is not None
                queues = await self.queues(msg.topic)
                queue = selector(queues, msg, arg)
                left = begin + timeout - time.monotonic()
                if left <= 0:
                    raise send_call_timeout(topic, timeout, 0, None)
            try:
                return await self._send_to(queue, msg, left)
            except MQClientError as exc:
                if route_stale(exc):  # not retried here, but the next send goes to the new master
                    self.instance.refresh_route_soon(msg.topic)
                raise
        batcher = self.batcher
        if batcher is not None and batcher.admits(msg):
            return await batcher.send(msg, timeout)
        # _with_retries' first attempt inline (the usual send needs no more): a failure it may
        # retry goes on there, from the second attempt
        deadline = begin + timeout
        cached = self._queue_cache.get(topic)
        route = self.instance.routes.get(topic)
        if cached is not None and route is not None and cached[0] is route:
            queues, left = cached[1], timeout
        else:
            queues = await self._queues(topic)
            left = deadline - time.monotonic()
            if left <= 0:
                raise send_call_timeout(topic, timeout, 0, None)
        q = queues[next(self._next_queue) % len(queues)]
        uniq = self._uniq.new_key()  # one id for every attempt, as RocketMQ: a retry of a stored send is a duplicate
        try:
            return await self._send_to(q, msg, left, uniq)
        except MQClientError as exc:
            if not exc.retriable:
                raise
            return await self._with_retries(topic, lambda q, left: self._send_to(q, msg, left, uniq), timeout, begin,
                                            (queues, q, exc))

    async def _with_retries(self, topic: str, attempt: Callable[[MessageQueue, float], Awaitable[T]],
                            timeout: float, begin: float,
                            failed: tuple[list[MessageQueue], MessageQueue, MQClientError] | None = None) -> T:
        """``attempt(queue, seconds)`` on the next queue of ``topic``, and again on another queue (and broker) after
        a retriable failure, up to ``retries`` times (RocketMQ's retryTimesWhenSendFailed). ``failed``: the
        first attempt was made already, on (queues, queue), and failed with this retriable error.

        ``timeout`` is a budget for the whole send, from ``begin`` (``time.monotonic()``), as in RocketMQ's
        sendDefaultImpl: each attempt gets what is left of it, and when nothing is left before an attempt, no more
        are made (:func:`send_call_timeout`)."""
        deadline = begin + timeout
        last_error: MQClientError | None = None
        failed_broker: str | None = None
        if failed is None:
            queues = await self._queues(topic)
            first = 0
        else:
            queues, q, last_error = failed
            failed_broker = q.broker_name
            queues = await self._note_failure(topic, 0, q, last_error, queues, deadline)
            first = 1
        for n in range(first, self.retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise send_call_timeout(topic, timeout, n, last_error) from last_error
            candidates = queues if failed_broker is None else \
                [q for q in queues if q.broker_name != failed_broker] or queues
            q = candidates[next(self._next_queue) % len(candidates)]
            try:
                return await attempt(q, left)
            except MQClientError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
                failed_broker = q.broker_name
                queues = await self._note_failure(topic, n, q, exc, queues, deadline)
        assert last_error is not None
        raise last_error

    async def _note_failure(self, topic: str, n: int, q: MessageQueue, exc: MQClientError,
                            queues: list[MessageQueue], deadline: float) -> list[MessageQueue]:
        """After attempt ``n`` (on ``q``) failed with a retriable ``exc``: the queues for the next attempt."""
        if n < self.retries and time.monotonic() < deadline:
            log.info("send to %s failed (%s); retrying on another queue", q, exc)
            return await self._after_failure(topic, exc, queues)
        if route_stale(exc):
            # no retry left: the next send must not go to a gone master until the 30 s route poll
            self.instance.refresh_route_soon(topic)
        return queues

    async def _after_failure(self, topic: str, exc: MQClientError, queues: list[MessageQueue]
                             ) -> list[MessageQueue]:
        """The queues to retry on after a retriable failure. When the route may be stale (the broker is gone,
        or answered that it is not the master) it is asked for again first (rate-limited, shared with other
        sends: ClientInstance.refresh_route), so the retry can reach a newly elected master."""
        if route_stale(exc):
            await self.instance.refresh_route(topic)
        elif not (isinstance(exc, BrokerError) and exc.code == ResponseCode.TOPIC_NOT_EXIST):
            return queues
        try:
            return await self._queues(topic)
        except NoRouteError:
            return queues  # no master known right now: the retry fails over the old route, as it would have

    async def send_orderly(self, msg: Message, sharding_key: str | int, *, timeout: float | None = None) -> SendResult:
        """Send to the queue that ``sharding_key`` selects, never another one: a failure is raised."""
        return await self.send(msg, selector=select_by_hash, arg=sharding_key, timeout=timeout)

    def send_async(self, msg: Message, callback: SendCallback | None = None, **kwargs: Any
                   ) -> asyncio.Task[SendResult]:
        """Start a send; ``callback(result, error)`` runs when it completes. Returns the task."""
        task = asyncio.ensure_future(self.send(msg, **kwargs))
        self._pending.add(task)

        def done(t: asyncio.Task[SendResult]) -> None:
            self._pending.discard(t)
            if callback is None:
                if not t.cancelled() and t.exception() is not None:
                    log.warning("async send failed: %s", t.exception())
                return
            if t.cancelled():
                callback(None, asyncio.CancelledError())
            elif t.exception() is not None:
                callback(None, t.exception())
            else:
                callback(t.result(), None)

        task.add_done_callback(done)
        return task

    async def send_oneway(self, msg: Message) -> None:
        """Send without waiting for an answer (nor knowing whether it arrived)."""
        self._check(msg)
        queues = await self.queues(msg.topic)
        q = queues[next(self._next_queue) % len(queues)]
        addr = await self._addr(q)
        cmd, _ = self._request(q, msg, oneway=True)
        self.instance.send_oneway(addr, cmd)

    async def send_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> list[SendResult]:
        """Send many messages of one topic, packed into as few requests as ``max_batch_bytes`` allows, one after the
        other. ``timeout`` (default ``send_timeout``) bounds the whole call, route lookup included, as send's does:
        each request gets what is left of it; when it runs out, ClientTimeoutError says how many messages the
        requests answered before stored."""
        if not msgs:
            return []
        self._check_batch(msgs)
        topic = msgs[0].topic
        timeout = self.send_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if queue is None:
            queues = await self._queues(topic)
            queue = queues[next(self._next_queue) % len(queues)]
        results: list[SendResult] = []
        for chunk in batch_chunks(msgs, self.max_batch_bytes):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise ClientTimeoutError(f"no time left for the request of the next {len(chunk)}")
                results.extend(await self._send_batch_to(queue, chunk, left))
            except ClientTimeoutError as exc:
                raise ClientTimeoutError(f"send_batch to {topic} ran out of its {timeout:g}s: {len(results)} of its "
                                         f"{len(msgs)} messages were stored; {exc}") from None
        return results

    # -- wire -----------------------------------------------------------------------------------------------
    async def _addr(self, q: MessageQueue) -> str:
        addr = self.instance.master_addr(q.broker_name)
        if addr is None:
            await self.queues(q.topic)  # learns the brokers of the topic's route (or of the default route)
            addr = self.instance.master_addr(q.broker_name)
        if addr is None:
            raise NoRouteError(f"no master address for broker {q.broker_name}")
        return addr

    def _request(self, q: MessageQueue, msg: Message, *, oneway: bool = False, uniq: str | None = None
                 ) -> tuple[Any, str]:
        """The SEND_MESSAGE_V2 of ``msg`` to ``q`` and its message id (``uniq``, else a new one)."""
        if uniq is None:
            uniq = self._uniq.new_key()
        body = bytes(msg.body)
        sys_flag = 0
        if len(body) >= self.compress_over:
            # only when it shrinks: zlib's framing lengthens a body that does not compress, and one of
            # maxMessageSize would then be refused by the broker
            packed = zlib.compress(body, self.compress_level)
            if len(packed) < len(body):
                body = packed
                sys_flag |= 1
        ext = self._v2_fields(msg.topic, q.queue_id, sys_flag, _now_ms(), msg.flag, properties_text(msg, uniq))
        # ext holds only strings already: no need for make_request's normalising copy
        return RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=next_opaque(), flag=ONEWAY_FLAG if oneway else 0,
                               ext_fields=ext, body=body), uniq

    def _v2_fields(self, topic: str, queue_id: int, sys_flag: int, born_timestamp: int, flag: int,
                   properties: str) -> dict[str, str]:
        """send_header_to_v2(SendMessageRequestHeader(...)) of a send, filled into a copy of this producer's
        template instead of building and converting the header dataclass each time."""
        template = self._v2_template
        if template is None or template[_V2_GROUP] != self.group:
            template = self._v2_template = send_header_to_v2(SendMessageRequestHeader(
                producer_group=self.group, topic="", default_topic="TBW102", default_topic_queue_nums=4, queue_id=0,
                sys_flag=0, born_timestamp=0, flag=0, properties="", reconsume_times=0))
        ext = template.copy()
        ext[_V2_TOPIC] = topic
        ext[_V2_QUEUE_ID] = str(queue_id)
        ext[_V2_SYS_FLAG] = str(sys_flag)
        ext[_V2_BORN_TIMESTAMP] = str(born_timestamp)
        ext[_V2_FLAG] = str(flag)
        ext[_V2_PROPERTIES] = properties
        return ext

    async def _send_to(self, q: MessageQueue, msg: Message, timeout: float, uniq: str | None = None) -> SendResult:
        """One attempt to send ``msg`` to ``q`` with message id ``uniq`` (a retry passes the first attempt's; None:
        a new one)."""
        if uniq is None:
            uniq = self._uniq.new_key()
        started = self._start_send(q, msg, timeout, uniq)
        if started is None:  # the general way: a command, encoded and sent by the client instance
            cmd, uniq = self._request(q, msg, uniq=uniq)
            addr = self.instance.master_addr(q.broker_name) or await self._addr(q)
            response = await self.instance.invoke(addr, cmd, timeout, context=f"send to {q.topic}/{q.queue_id}")
            return self._result(response, q, uniq, addr)[0]
        future, conn, opaque, uniq, addr = started
        try:
            response = await future
        except BaseException as exc:
            error = _wait_error(exc, conn, opaque, future, addr, q)
            if error is exc:
                raise
            raise error from None
        return self._result_one(response, q, uniq, addr)

    def _start_send(self, q: MessageQueue, msg: Message, timeout: float, uniq: str | None = None
                    ) -> tuple[asyncio.Future[RemotingCommand], SdkConnection, int, str, str] | None:
        """:meth:`_send_to`'s request written straight to an open connection, its frame head from the topic's
        :class:`SendFrameTemplate` (the bytes ``_request`` and the codec would give): (reply future, connection,
        opaque, message id, broker address). None when this path does not apply: a subclass building its own
        request, signed requests, no open connection yet, a compressed body, a header the template cannot
        write; then ``_request`` and ``instance.invoke`` do it all."""
        instance = self.instance
        addr = instance.master_addr(q.broker_name)
        remoting = instance.remoting
        if addr is None or instance.credentials is not None or type(remoting) is not SdkRemotingClient \
                or type(self)._request is not Producer._request:
            return None
        conn = remoting.open_connection(addr)
        body = msg.body
        if type(body) is not bytes:
            body = bytes(body)  # as _request: a memoryview's len() may count items, not bytes
        flag = msg.flag
        if conn is None or len(body) >= self.compress_over or type(flag) is not int or type(q.queue_id) is not int:
            return None
        topic = msg.topic
        entry = self._frame_templates.get(topic)
        if entry is None or entry[0] != self.group:
            if len(self._frame_templates) >= 1024:
                self._frame_templates.clear()
            entry = self._frame_templates[topic] = (self.group, SendFrameTemplate.build(topic, self._v2_fields))
        template = entry[1]
        if template is None:
            return None
        if uniq is None:
            uniq = self._uniq.new_key()
        if not msg.properties and not msg.tags and not msg.keys and not msg.delay_level and msg.deliver_at is None \
                and msg.delay is None:  # msg.plain: UNIQ_KEY and WAIT only
            properties = PLAIN_HEAD + uniq.encode() + PLAIN_TAIL
        else:
            properties = properties_json(properties_text(msg, uniq))
        opaque = next_opaque()
        head = template.frame_head(opaque, q.queue_id, time.time_ns() // 1_000_000, flag, properties, len(body))
        if head is None:
            return None
        try:
            future = conn.start_request(head, body, opaque, RequestCode.SEND_MESSAGE_V2, timeout)
        except (OSError, ConnectionError) as exc:  # closed meanwhile: as instance.invoke reports it
            raise request_error(exc, addr, f"send to {q.topic}/{q.queue_id}") from None
        return future, conn, opaque, uniq, addr

    def _batch_request(self, q: MessageQueue, msgs: list[Message]) -> tuple[Any, list[str]]:
        # Each item's properties are encode_properties(m.wire_properties(key)): the part before UNIQ_KEY (most
        # often empty), then UNIQ_KEY and WAIT; the keys and the body in one C call when built (protocol/batch.py).
        prefix, first = self._uniq.reserve(len(msgs))
        body, uniqs = encode_keyed_batch([(m.body, m.batch_properties_head(), m.flag) for m in msgs], prefix, first)
        return self._batch_body_request(q, body), uniqs

    def _batch_body_request(self, q: MessageQueue, body: bytes) -> RemotingCommand:
        """The SEND_BATCH_MESSAGE of an encoded batch ``body`` to ``q``."""
        header = SendMessageRequestHeader(producer_group=self.group, topic=q.topic, queue_id=q.queue_id,
                                          born_timestamp=_now_ms(), properties="", batch=True)
        return make_request(RequestCode.SEND_BATCH_MESSAGE, send_header_to_v2(header), body)

    async def _send_batch_to(self, q: MessageQueue, msgs: list[Message], timeout: float) -> list[SendResult]:
        cmd, uniqs = self._batch_request(q, msgs)
        try:
            addr = await self._addr(q)
            response = await self.instance.invoke(addr, cmd, timeout, context=f"batch to {q.topic}/{q.queue_id}")
            return self._batch_result(response, q, uniqs, addr)
        except MQClientError as exc:
            if route_stale(exc):  # a batch is not retried (a part may be stored); the next send finds the master
                self.instance.refresh_route_soon(q.topic)
            raise

    def reserve_msg_ids(self, n: int) -> tuple[str, int]:
        """``n`` message ids (UNIQ_KEYs, n >= 1) for a batch body encoded outside the producer
        (:meth:`send_batch_body`): (prefix, first); id ``i`` is ``f"{prefix}{first + i:012X}"``."""
        return self._uniq.reserve(n)

    async def send_batch_body(self, queue: MessageQueue, body: bytes, *, timeout: float | None = None) -> SendStatus:
        """Send a SEND_BATCH_MESSAGE body the caller encoded to ``queue``: the columnar Spark sink's path, with no
        Message per row. The body has :func:`cometmq.protocol.batch.encode_batch_raw`'s layout, no scheduled
        message, and each item's properties end with ``UNIQ_KEY\x01<id>\x02WAIT\x01true\x02``, the ids from
        :meth:`reserve_msg_ids`. The answer's status covers every item; a broker error raises. Not retried (a
        part may be stored): the caller decides."""
        if not self.started:
            raise ClientStateError("the producer is not started")
        self._check_topic(queue.topic)
        if not body:
            raise InvalidArgumentError(f"the batch body for {queue.topic} is empty")
        cmd = self._batch_body_request(queue, body)
        try:
            addr = self.instance.master_addr(queue.broker_name) or await self._addr(queue)
            response = await self.instance.invoke(addr, cmd, self.send_timeout if timeout is None else timeout,
                                                  context=f"batch to {queue.topic}/{queue.queue_id}")
            return self._answer(response, queue, addr)[0]
        except MQClientError as exc:
            if route_stale(exc):
                self.instance.refresh_route_soon(queue.topic)
            raise

    async def _send_items(self, topic: str, items: list[_Item], timeout: float) -> list[SendResult]:
        """An auto-batch's messages (:mod:`cometmq.client.auto_batch`) in one SEND_BATCH_MESSAGE under the retry
        policy of :meth:`send`; a retry sends the same body (the same message ids). One message goes as a
        single send."""
        begin = time.monotonic()  # (the timeout is a budget for the batch's attempts, from when it is sent)
        if len(items) == 1:
            msg = items[0].msg
            uniq = self._uniq.new_key()  # (the same id for every attempt, as send's)
            return [await self._with_retries(topic, lambda q, left: self._send_to(q, msg, left, uniq), timeout, begin)]
        prefix, first = self._uniq.reserve(len(items))
        body, uniqs = encode_keyed_batch([(it.body, it.head, it.flag) for it in items], prefix, first)

        async def attempt(q: MessageQueue, left: float) -> list[SendResult]:
            header = SendMessageRequestHeader(producer_group=self.group, topic=q.topic, queue_id=q.queue_id,
                                              born_timestamp=_now_ms(), properties="", batch=True)
            cmd = make_request(RequestCode.SEND_BATCH_MESSAGE, send_header_to_v2(header), body)
            addr = self.instance.master_addr(q.broker_name) or await self._addr(q)
            response = await self.instance.invoke(addr, cmd, left, context=f"batch to {q.topic}/{q.queue_id}")
            return self._batch_result(response, q, uniqs, addr)

        return await self._with_retries(topic, attempt, timeout, begin)

    @staticmethod
    def _batch_result(response: Any, q: MessageQueue, uniqs: list[str], addr: str) -> list[SendResult]:
        """As :meth:`_result` for a batch (which holds no timer message, so no recall handle)."""
        if len(uniqs) == 1:
            return Producer._result(response, q, uniqs[0], addr)
        status, real_q, first_offset = Producer._answer(response, q, addr)
        return send_results(status, uniqs, response.ext_fields.get("msgId", "").split(","), real_q, first_offset)

    @staticmethod
    def _answer(response: Any, q: MessageQueue, addr: str) -> tuple[SendStatus, MessageQueue, int]:
        """(status, the queue the broker put it in, its first queue offset) of a send answer; BrokerError for
        an error code."""
        status = _STATUS.get(response.code)
        if status is None:
            raise BrokerError(response.code, response.remark or "", addr=addr, context=f"send to {q.topic}")
        ext = response.ext_fields
        try:
            first_offset = int(ext.get("queueOffset", "-1"))
            queue_id = int(ext.get("queueId", str(q.queue_id)))
        except ValueError:
            first_offset, queue_id = -1, q.queue_id
        return status, MessageQueue(q.topic, q.broker_name, queue_id), first_offset

    @staticmethod
    def _result_one(response: RemotingCommand, q: MessageQueue, uniq: str, addr: str) -> SendResult:
        """``_result(response, q, uniq, addr)[0]`` of a single message (``uniq`` one id), built directly: one C
        call (client/_sendfast.c) when the helper is built and the answer is the usual one."""
        status = _STATUS.get(response.code)
        if status is not None and _C_RESULT is not None:
            result: SendResult | None = _C_RESULT(status, response.ext_fields, q, uniq)
            if result is not None:
                return result
        return Producer._result_one_py(response, q, uniq, addr)

    @staticmethod
    def _result_one_py(response: RemotingCommand, q: MessageQueue, uniq: str, addr: str) -> SendResult:
        """:meth:`_result_one` in Python: the reference of the C helper's ``send_result``."""
        status = _STATUS.get(response.code)
        if status is None:
            raise BrokerError(response.code, response.remark or "", addr=addr, context=f"send to {q.topic}")
        ext = response.ext_fields
        get = ext.get
        queue_id = q.queue_id  # an int (_start_send checked)
        try:
            first_offset = int(get("queueOffset", "-1"))
            answered = get("queueId")
            if answered is not None:
                queue_id = int(answered)
        except ValueError:
            first_offset, queue_id = -1, q.queue_id
        real_q = q if queue_id == q.queue_id and type(q) is MessageQueue \
            else MessageQueue(q.topic, q.broker_name, queue_id)
        return send_result(status, uniq, get("msgId", "").partition(",")[0], real_q, first_offset,
                           get("recallHandle") or None)

    @staticmethod
    def _result(response: Any, q: MessageQueue, uniq: str, addr: str) -> list[SendResult]:
        status, real_q, first_offset = Producer._answer(response, q, addr)
        ext = response.ext_fields
        offset_ids = ext.get("msgId", "").split(",")
        uniqs = uniq.split(",")
        recall = ext.get("recallHandle") or None  # a single timer message's (batches cannot hold timers)
        return [SendResult(status, u, offset_ids[i] if i < len(offset_ids) else "", real_q, first_offset + i,
                           recall if len(uniqs) == 1 else None)
                for i, u in enumerate(uniqs)]

    # -- recall ---------------------------------------------------------------------------------------------
    async def recall(self, topic: str, recall_handle: str, *, timeout: float | None = None) -> str:
        """Cancel a timer message before it is due (RocketMQ 5's RecallMessage) with the handle its send
        returned (``SendResult.recall_handle``). Returns the message id. A malformed handle raises
        :class:`InvalidArgumentError`; the broker's refusals (a handle of another topic, a message already
        due or delivered: "timestamp invalid") raise :class:`BrokerError` (ILLEGAL_OPERATION)."""
        if not self.started:
            raise ClientStateError("the producer is not started")
        if not topic or len(topic) > 127 or not all(c.isalnum() or c in "%|-_" for c in topic):
            raise InvalidArgumentError(f"topic {topic!r} is not a valid topic name")
        if topic.startswith(("%RETRY%", "%DLQ%")):
            raise InvalidArgumentError("retry and dead-letter topics hold no recallable messages")
        broker_name = recall_handle_broker(recall_handle)
        await self.queues(topic)  # learns the route (a topic without one cannot be recalled from)
        addr = self.instance.master_addr(broker_name)
        if addr is None:
            raise NoRouteError(f"the recall handle names broker {broker_name}, which has no master for {topic}")
        cmd = make_request(RequestCode.RECALL_MESSAGE, {"producerGroup": self.group, "topic": topic,
                                                        "recallHandle": recall_handle})
        response = await self.instance.invoke(addr, cmd, self.send_timeout if timeout is None else timeout,
                                              context=f"recall in {topic}")
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark or "", addr=addr, context=f"recall in {topic}")
        return response.ext_fields.get("msgId", "")


def recall_handle_broker(handle: str) -> str:
    """The broker a RocketMQ v1 recall handle names (``v1 topic brokerName timestamp msgId``, URL-safe
    base64); :class:`InvalidArgumentError` when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii") + b"=" * (-len(handle) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raw = ""
    items = raw.split(" ")
    if not handle or len(items) < 5 or items[0] != "v1" or not items[2]:
        raise InvalidArgumentError("recall handle is invalid")
    return items[2]


def _bound_result_helper() -> Any:
    """client/_sendfast.c's send_result bound to SendResult's slots, or None (not built, COMETMQ_PURE_PYTHON)."""
    helper = load_c_helper("cometmq.client._sendfast")
    if helper is None:
        return None
    helper.bind_results(SendResult, _SEND_RESULT_FIELDS, MessageQueue)
    return helper.send_result


_C_RESULT: Any = _bound_result_helper()


def _wait_error(exc: BaseException, conn: SdkConnection, opaque: int, future: asyncio.Future[RemotingCommand],
                addr: str, q: MessageQueue) -> BaseException:
    """What instance.invoke makes of a failed wait for a reply (from :meth:`Producer._start_send`): the error to
    raise (``exc`` itself for anything it lets through). A cancelled wait forgets its request."""
    if isinstance(exc, asyncio.CancelledError):
        conn.forget(opaque, future)
        return exc
    return request_error(exc, addr, f"send to {q.topic}/{q.queue_id}")


#: what a batch item takes besides its body and the properties its message was given (tags, keys, user properties),
#: counted from above: the item's head, UNIQ_KEY and WAIT (the Spark sink counts its rows with it too)
BATCH_ITEM_OVERHEAD = 200


def batch_item_estimate(m: Message) -> int:
    """The bytes ``m`` takes in a batch body, counted from above: its body, the UTF-8 bytes of its tags, keys and
    user properties (up to 32 KiB: a chunk counted by its bodies alone could pass the broker's max message size
    many times over), and ``BATCH_ITEM_OVERHEAD``."""
    est = len(m.body) + BATCH_ITEM_OVERHEAD
    if m.properties:
        est += sum(len(k.encode()) + len(v.encode()) + 2 for k, v in m.properties.items())
    if m.keys:
        est += len(m.keys.encode()) if isinstance(m.keys, str) else sum(len(k.encode()) + 1 for k in m.keys)
    if m.tags:
        est += len(m.tags.encode())
    return est


def batch_chunks(msgs: Sequence[Message], max_bytes: int) -> list[list[Message]]:
    """``msgs`` cut into batches of at most ``max_bytes`` (counted by :func:`batch_item_estimate`); a message larger
    than that goes alone."""
    chunks: list[list[Message]] = []
    chunk: list[Message] = []
    size = 0
    for m in msgs:
        est = batch_item_estimate(m) if m.properties or m.keys or m.tags else len(m.body) + BATCH_ITEM_OVERHEAD
        if chunk and size + est > max_bytes:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(m)
        size += est
    if chunk:
        chunks.append(chunk)
    return chunks


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
