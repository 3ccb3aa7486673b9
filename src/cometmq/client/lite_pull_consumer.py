"""The lite-pull consumer: assign queues or subscribe to topics, then ``await poll()`` batches.

Each assigned queue has one background task that keeps one long-polling PULL_MESSAGE in flight (with the
subscription in the request, so no rebalance state is needed on the broker) and puts what it gets into one
bounded buffer that :meth:`LitePullConsumer.poll` drains. The offsets of the messages poll has returned are
committed with UPDATE_CONSUMER_OFFSET: by :meth:`commit` / :meth:`commit_async`, every ``auto_commit_interval``
seconds when ``auto_commit`` is on, and on close.

``subscribe`` takes every readable queue of the topic by default: there is no rebalance among the members of
a group, so two consumers of one group that subscribe to one topic both read every queue. Pass ``allocate=``
(one of the push consumer's strategies, e.g. ``AllocateAverage()``) to share them out instead: the queues are
then allocated among the group's consumers as the brokers list them, again whenever a broker announces that
the group changed (NOTIFY_CONSUMER_IDS_CHANGED) and every ``route_refresh_interval`` seconds. Or split the
queues yourself with ``assign``.

Messages are decoded lazily (:mod:`cometmq.client.pulled`): a poll returns :class:`MessageExt` objects that
hold the record's bytes and work out properties, ids and host strings on first access.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

from cometmq.client.admin import (
    broker_addr_of,
    check_group,
    check_queue,
    check_topic,
    max_offset,
    min_offset,
    query_consumer_offset,
    queue_label,
    search_offset,
    to_millis,
    update_consumer_offset,
)
from cometmq.client.errors import (
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
    NoRouteError,
)
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.client.lite_pull_state import Batch, QueueState, Subscription
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.client.pulled import decode_pulled, decode_pulled_within
from cometmq.client.rebalance import AllocateStrategy
from cometmq.common.java_text import JAVA_TRIM
from cometmq.common.periodic import Periodic
from cometmq.protocol.acl import Credentials
from cometmq.protocol.client_bodies import CLUSTERING, CONSUME_ACTIVELY, ConsumerData
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY
from cometmq.protocol.remoting import make_request

log = logging.getLogger(__name__)

__all__ = ["CommitCallback", "ConsumeFrom", "LitePullConsumer", "decode_pulled"]

ConsumeFrom = Literal["last", "first"] | int | _dt.datetime
CommitCallback = Callable[[BaseException | None], None]

# PullSysFlag bits: a lite pull never commits through the pull; it suspends and carries its subscription.
_FLAG_SUSPEND = 0x2
_FLAG_SUBSCRIPTION = 0x4
#: broker answers that are passing conditions, not worth surfacing through poll()
_TRANSIENT = frozenset({ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.FLOW_CONTROL})


class LitePullConsumer:
    """An asyncio lite-pull consumer (RocketMQ's DefaultLitePullConsumer)::

        async with LitePullConsumer("group", namesrv="127.0.0.1:9876", consume_from="first") as c:
            await c.subscribe("TopicTest")
            while True:
                for msg in await c.poll(1.0):
                    ...

    ``pull_batch_size`` is the maxMsgNums of each pull (256 by default; RocketMQ's default is 10). The broker
    caps each answer at its ``maxTransferCountOnMessageInMemory`` (32 by default) and
    ``maxTransferBytesOnMessageInMemory``, so a large value costs nothing and lets a broker that allows more
    send more per round trip. ``consume_from`` applies to queues the group never committed an offset for:
    ``"last"`` (the end of the queue), ``"first"`` (the start) or a timestamp (epoch ms or datetime).
    Unlike the Java client, "last" is not turned into "first" for queues that still start at offset 0.
    ``max_inflated_body_size`` bounds the inflating of a COMPRESSED body (default 16 MiB, four times the producers'
    default max_message_size; a few KiB stored can inflate to gigabytes): one that inflates to more is polled as
    stored, ``sys_flag & 1`` set (an inflated body has that bit cleared, as in RocketMQ's clients).
    ``pull_threshold_size_for_queue_mib`` (100, as RocketMQ's pullThresholdSizeForQueue) bounds the body bytes, as
    inflated, buffered for a queue: its pulls wait while it holds that much, and an answer is inflated only up to
    it (beyond its first message; the rest is pulled again).
    """

    def __init__(self, group: str, *, namesrv: str | Iterable[str] | None = None,
                 instance: ClientInstance | None = None, credentials: Credentials | tuple[str, str] | None = None,
                 pull_batch_size: int = 256, auto_commit: bool = True,
                 auto_commit_interval: float = 5.0, consume_from: ConsumeFrom = "last",
                 pull_threshold_for_all: int = 10_000, pull_threshold_for_queue: int = 1_000,
                 long_poll_timeout: float = 15.0, error_backoff: float = 1.0,
                 route_refresh_interval: float = 30.0, allocate: AllocateStrategy | None = None,
                 max_inflated_body_size: int = DEFAULT_MAX_INFLATED_BODY,
                 pull_threshold_size_for_queue_mib: float = 100) -> None:
        if instance is None and namesrv is None:
            raise InvalidArgumentError("a consumer needs namesrv='host:port' or a ClientInstance")
        check_group(group)
        if not 1 <= pull_batch_size <= 65536:
            raise InvalidArgumentError(f"pull_batch_size must be within 1..65536, got {pull_batch_size}")
        if auto_commit_interval <= 0 or long_poll_timeout <= 0 or error_backoff < 0:
            raise InvalidArgumentError("auto_commit_interval and long_poll_timeout must be > 0, error_backoff >= 0")
        if pull_threshold_for_all < 1 or pull_threshold_for_queue < 1:
            raise InvalidArgumentError("pull thresholds must be >= 1")
        if isinstance(pull_threshold_size_for_queue_mib, bool) or not isinstance(
                pull_threshold_size_for_queue_mib, int | float) or not pull_threshold_size_for_queue_mib > 0:
            raise InvalidArgumentError(f"pull_threshold_size_for_queue_mib must be a positive number of MiB, "
                                       f"got {pull_threshold_size_for_queue_mib!r}")
        if not isinstance(max_inflated_body_size, int) or max_inflated_body_size < 1:
            raise InvalidArgumentError(f"max_inflated_body_size must be a positive number of bytes, "
                                       f"got {max_inflated_body_size!r}")
        if consume_from not in ("last", "first"):
            to_millis(consume_from)  # type: ignore[arg-type]  # checks int / datetime
        self.group = group
        self.instance = instance or ClientInstance(namesrv or "", credentials=credentials)
        self.pull_batch_size = pull_batch_size
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.consume_from = consume_from
        self.pull_threshold_for_all = pull_threshold_for_all
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue_mib = pull_threshold_size_for_queue_mib
        self.long_poll_timeout = long_poll_timeout
        self.error_backoff = error_backoff
        self.route_refresh_interval = route_refresh_interval
        self.allocate = allocate
        self.max_inflated_body_size = max_inflated_body_size
        self._rebalance_task: asyncio.Task[None] | None = None
        self._mode: Literal["assign", "subscribe"] | None = None
        self._subscriptions: dict[str, Subscription] = {}
        self._assigned: list[MessageQueue] = []
        self._assign_expression = ("*", "TAG")
        self._states: dict[MessageQueue, QueueState] = {}
        self._buffer: collections.deque[Batch] = collections.deque()
        self._buffered = 0
        self._data = asyncio.Event()
        self._errors: collections.deque[MQClientError] = collections.deque(maxlen=16)
        self._services: list[Periodic] = []
        self._pending: set[asyncio.Task[Any]] = set()
        self._lock = asyncio.Lock()
        self.started = False
        self._closing = False

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        if self._closing:
            raise ClientStateError("the consumer is closed; make a new one")
        self.instance.register_consumer(self)
        await self.instance.start()
        self.started = True
        try:
            await self._apply()
            await self.instance.heartbeat()
        except BaseException:
            await self.close()
            raise
        self._services = [
            Periodic(f"lite-commit-{self.group}", self.auto_commit_interval, self._auto_commit_pass, logger=log),
            Periodic(f"lite-routes-{self.group}", self.route_refresh_interval, self._route_pass, logger=log)]
        for service in self._services:
            service.start()

    async def close(self) -> None:
        """Stop pulling, commit the consumed offsets (when ``auto_commit``) and leave the group. A closed
        consumer (or one whose start failed) cannot start again: make a new one."""
        if not self.started or self._closing:
            return
        self._closing = True
        for service in self._services:
            await service.stop()
        self._services.clear()
        tasks = [*([self._rebalance_task] if self._rebalance_task else []),
                 *(st.task for st in self._states.values() if st.task is not None)]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.auto_commit:
            try:
                await self.commit()
            except MQClientError as exc:
                log.warning("committing the offsets of %s on close failed: %s", self.group, exc)
        self.started = False
        self._data.set()  # a poll waiting now returns at once
        try:
            await self.instance.unregister(consumer_group=self.group)
        finally:
            await self.instance.close()

    async def __aenter__(self) -> LitePullConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _check_started(self) -> None:
        if not self.started:
            raise ClientStateError("the consumer is not started (use 'async with LitePullConsumer(...)' or start())")

    # -- what ClientInstance asks of a consumer ----------------------------------------------------------------
    def consumer_data(self) -> ConsumerData:
        if self._mode == "subscribe":
            subs = tuple(s.data() for s in self._subscriptions.values())
        else:
            expr, etype = self._assign_expression
            subs = tuple(Subscription(t, expr, etype, 0).data() for t in sorted({q.topic for q in self._assigned}))
        where = {"last": "CONSUME_FROM_LAST_OFFSET", "first": "CONSUME_FROM_FIRST_OFFSET"}.get(
            self.consume_from if isinstance(self.consume_from, str) else "", "CONSUME_FROM_TIMESTAMP")
        return ConsumerData(self.group, CONSUME_ACTIVELY, CLUSTERING, where, subs)

    def on_ids_changed(self) -> None:
        """The group changed: share the queues out again (only with ``allocate``; else every queue is read)."""
        if not self.started or self._closing or self.allocate is None or self._mode != "subscribe":
            return
        if self._rebalance_task is None or self._rebalance_task.done():
            self._rebalance_task = asyncio.ensure_future(self._rebalance_soon())

    async def _rebalance_soon(self) -> None:
        await asyncio.sleep(0.05)  # let the rest of a burst of notices arrive
        try:
            await self._apply()
        except MQClientError as exc:
            log.warning("rebalancing %s failed: %s", self.group, exc)

    async def _allocated(self, topic: str, queues: list[MessageQueue]) -> list[MessageQueue]:
        """This consumer's share of ``queues`` by the ``allocate`` strategy; its current share when the brokers
        do not list it among the group's consumers (yet)."""
        assert self.allocate is not None
        me = self.instance.client_id
        for attempt in range(2):
            ids: list[str] = []
            for broker in dict.fromkeys(q.broker_name for q in queues):
                try:
                    ids = await self.instance.consumer_ids(self.group, broker)
                except MQClientError as exc:
                    log.info("cannot list the consumers of %s on %s: %s", self.group, broker, exc)
                if ids:
                    break
            if me in ids:
                return self.allocate.allocate(self.group, me, queues, sorted(ids))
            if attempt == 0:
                await self.instance.heartbeat()
        log.info("consumer %s is not listed in group %s yet; keeping its queues of %s", me, self.group, topic)
        return [q for q in self._states if q.topic == topic]

    # -- assignment ------------------------------------------------------------------------------------------
    async def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        """Read every readable queue of ``topic`` (messages whose tag matches ``expression``, e.g. "a || b")."""
        check_topic(topic)
        if self._mode == "assign":
            raise ClientStateError("this consumer has assigned queues; subscribe and assign cannot be mixed")
        if not isinstance(expression, str):
            raise InvalidArgumentError("the subscription expression must be a string")
        self._mode = "subscribe"
        old = self._subscriptions.get(topic)
        # (tags are trimmed as the broker and RocketMQ trim them: String.trim, not str.strip)
        text = expression.strip(JAVA_TRIM) if expression_type.upper() == "TAG" else expression.strip()
        self._subscriptions[topic] = Subscription(topic, text or "*", expression_type.upper(), int(time.time() * 1000))
        if self.started:
            try:
                await self._apply()
            except BaseException:
                if old is None:
                    self._subscriptions.pop(topic, None)
                else:
                    self._subscriptions[topic] = old
                raise
            await self.instance.heartbeat()

    async def unsubscribe(self, topic: str) -> None:
        if self._subscriptions.pop(topic, None) is not None and self.started:
            await self._apply()

    async def assign(self, queues: Iterable[MessageQueue], expression: str = "*", *,
                     expression_type: str = "TAG") -> None:
        """Read exactly these queues (replacing any earlier assignment)."""
        if self._mode == "subscribe":
            raise ClientStateError("this consumer has subscriptions; subscribe and assign cannot be mixed")
        if not isinstance(expression, str):
            raise InvalidArgumentError("the subscription expression must be a string")
        new = sorted({check_queue(q) for q in queues})
        old, old_expr = self._assigned, self._assign_expression
        self._mode = "assign"
        self._assigned = new
        self._assign_expression = (expression.strip() or "*", expression_type.upper())
        if self.started:
            try:
                await self._apply()
            except BaseException:
                self._assigned, self._assign_expression = old, old_expr
                raise
            await self.instance.heartbeat()

    def assignment(self) -> list[MessageQueue]:
        """The queues being read now."""
        return sorted(self._states)

    async def _wanted(self) -> dict[MessageQueue, tuple[str, str, int]]:
        """queue -> (expression, expression type, sub version), checked against the routes."""
        out: dict[MessageQueue, tuple[str, str, int]] = {}
        if self._mode == "subscribe":
            for sub in self._subscriptions.values():
                queues = await self.instance.subscribe_queues(sub.topic, refresh=True)
                if not queues:
                    raise NoRouteError(f"topic {sub.topic} does not exist or has no readable queue "
                                       "(no nameserver has a route for it)")
                if self.allocate is not None:
                    queues = await self._allocated(sub.topic, queues)
                for q in queues:
                    out[q] = (sub.expression, sub.expression_type, sub.version)
        elif self._mode == "assign":
            expr, etype = self._assign_expression
            for topic in sorted({q.topic for q in self._assigned}):
                route = await self.instance.route(topic, refresh=True)
                if route is None:
                    raise NoRouteError(f"topic {topic} does not exist (no nameserver has a route for it)")
                readable = {q.broker_name: q.queue_id + 1
                            for q in ClientInstance.queues_of(route, topic, writable=False)}
                for q in self._assigned:
                    if q.topic != topic:
                        continue
                    if q.broker_name not in readable:
                        raise InvalidArgumentError(f"queue {queue_label(q)}: broker {q.broker_name} has no "
                                                   f"readable queue of {topic} (brokers: {sorted(readable)})")
                    if q.queue_id >= readable[q.broker_name]:
                        raise InvalidArgumentError(f"queue {queue_label(q)} is out of range: {topic} has "
                                                   f"{readable[q.broker_name]} readable queues on {q.broker_name}")
                    out[q] = (expr, etype, 0)
        return out

    async def _apply(self) -> None:
        async with self._lock:
            wanted = await self._wanted()
            for q in [q for q in self._states if q not in wanted]:
                await self._drop_queue(q)
            for q, (expr, etype, version) in sorted(wanted.items()):
                st = self._states.get(q)
                if st is not None and (st.expression, st.expression_type) == (expr, etype):
                    continue
                new = QueueState(q, expr, etype, version)
                if st is not None:  # a changed expression: go on from where the old one stopped
                    new.pull_offset, new.consumed, new.committed = st.consumed, st.consumed, st.committed
                    new.paused = st.paused
                    await self._stop_queue(st)
                self._states[q] = new
                self._start_queue(new)

    async def _drop_queue(self, q: MessageQueue) -> None:
        st = self._states.pop(q)
        await self._stop_queue(st)
        if self.auto_commit and st.consumed >= 0 and st.consumed != st.committed:
            try:
                await update_consumer_offset(self.instance, self.group, q, st.consumed)
            except MQClientError as exc:
                log.warning("committing %s of %s on release failed: %s", queue_label(q), self.group, exc)

    async def _stop_queue(self, st: QueueState) -> None:
        task, st.task = st.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._purge(st)

    def _start_queue(self, st: QueueState) -> None:
        st.task = asyncio.create_task(self._pull_loop(st), name=f"lite-pull-{queue_label(st.queue)}")

    def _purge(self, st: QueueState) -> None:
        if st.buffered:
            self._buffer = collections.deque(b for b in self._buffer if b.state is not st)
            self._buffered -= st.buffered
            st.buffered = st.buffered_bytes = 0
            self._wake_blocked()

    # -- pulling ---------------------------------------------------------------------------------------------
    async def _initial_offset(self, st: QueueState) -> int:
        q = st.queue
        committed = await query_consumer_offset(self.instance, self.group, q)
        if committed is not None and committed >= 0:
            st.committed = committed
            return committed
        cf = self.consume_from
        if cf == "last":
            return await max_offset(self.instance, q)
        if cf == "first":
            return await min_offset(self.instance, q)
        return await search_offset(self.instance, q, to_millis(cf))

    async def _pull_loop(self, st: QueueState) -> None:
        q = st.queue
        inst = self.instance
        group = self.group
        timeout = self.long_poll_timeout + max(5.0, inst.request_timeout)
        suspend_ms = str(int(self.long_poll_timeout * 1000))
        flags = str(_FLAG_SUSPEND | _FLAG_SUBSCRIPTION)
        batch = str(self.pull_batch_size)
        context = f"pull of {queue_label(q)}"
        while True:
            max_bytes = int(self.pull_threshold_size_for_queue_mib * 1024 * 1024)
            if st.paused or st.buffered >= self.pull_threshold_for_queue or st.buffered_bytes >= max_bytes \
                    or self._buffered >= self.pull_threshold_for_all:
                st.blocked = True
                st.wake.clear()
                await st.wake.wait()
                st.blocked = False
                continue
            try:
                if st.pull_offset < 0:
                    st.pull_offset = await self._initial_offset(st)
                    if st.consumed < 0:
                        st.consumed = st.pull_offset
                # the master; while the group has none (a failover under way), a replica: it serves reads
                addr = inst.master_addr(q.broker_name) or inst.broker_addr(q.broker_name) \
                    or await broker_addr_of(inst, q.broker_name, q.topic)
                cmd = make_request(RequestCode.PULL_MESSAGE, {
                    "consumerGroup": group, "topic": q.topic, "queueId": str(q.queue_id),
                    "queueOffset": str(st.pull_offset), "maxMsgNums": batch, "sysFlag": flags, "commitOffset": "0",
                    "suspendTimeoutMillis": suspend_ms, "subscription": st.expression,
                    "subVersion": str(st.sub_version), "expressionType": st.expression_type})
                response = await inst.invoke(addr, cmd, timeout, context)
                code = response.code
                if code == ResponseCode.SUCCESS:
                    next_offset = int(response.ext_fields["nextBeginOffset"])
                    # inflated only up to the queue's byte threshold: the rest is pulled again (a few KiB of zlib
                    # inflate to MiBs, and the broker's limits on an answer count the stored bytes)
                    msgs, cut, size = decode_pulled_within(response.body, q, self.max_inflated_body_size,
                                                           max(max_bytes - st.buffered_bytes, 0), partial=True)
                    if cut:
                        next_offset = msgs[-1].queue_offset + 1
                    if st.tags is not None:  # a tag whose hash code collides with a wanted one
                        msgs = [m for m in msgs if m.tags in st.tags]
                        size = sum(len(m.body) for m in msgs)
                    st.pull_offset = next_offset
                    st.reported = None
                    if msgs:
                        self._buffer.append(Batch(st, msgs, next_offset, size))
                        n = len(msgs)
                        st.buffered += n
                        st.buffered_bytes += size
                        self._buffered += n
                        self._data.set()
                elif code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                              ResponseCode.PULL_OFFSET_MOVED):
                    nxt = response.ext_fields.get("nextBeginOffset")
                    if nxt is not None and nxt.lstrip("-").isdigit():
                        if code == ResponseCode.PULL_OFFSET_MOVED:
                            log.warning("%s: offset %d is not in the queue; going on from %s", context,
                                        st.pull_offset, nxt)
                        st.pull_offset = int(nxt)
                    st.reported = None
                else:
                    raise BrokerError(code, response.remark or "", addr=addr, context=context)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever it is: a pull task that ended would leave its queue unread for good
                self._pull_failed(st, exc)
                if route_stale(exc) and await self._follow_route(q):
                    continue  # the queue's broker moved (a new master): pull there at once
                await asyncio.sleep(self.error_backoff)

    async def _follow_route(self, q: MessageQueue) -> bool:
        """After a pull failed on a broker that may be gone: ask for the route at once (rate-limited, shared);
        True when the queue's address changed."""
        inst = self.instance
        before = inst.master_addr(q.broker_name) or inst.broker_addr(q.broker_name)
        await inst.refresh_route(q.topic)
        after = inst.master_addr(q.broker_name) or inst.broker_addr(q.broker_name)
        return after is not None and after != before

    def _pull_failed(self, st: QueueState, exc: Exception) -> None:
        if isinstance(exc, BrokerError):
            key = (exc.code, exc.remark)
            if exc.code not in _TRANSIENT and st.reported != key:
                st.reported = key
                self._errors.append(exc)  # poll() raises it, once
                self._data.set()
                log.warning("%s", exc)
            return
        if isinstance(exc, MQClientError):
            log.warning("pull of %s failed: %s", queue_label(st.queue), exc)
            return
        if not isinstance(exc, ProtocolError | KeyError | ValueError):  # not a bad answer: a bug, an unmapped error
            key = (-1, repr(exc))
            log.error("pull of %s raised %r; pulling again in %.1fs", queue_label(st.queue), exc, self.error_backoff,
                      exc_info=None if st.reported == key else exc)  # (the traceback once while it repeats)
            st.reported = key
            return
        err = BrokerError(ResponseCode.SYSTEM_ERROR, f"bad pull answer: {exc}", context=queue_label(st.queue))
        self._errors.append(err)
        self._data.set()
        log.warning("%s", err)

    def _wake_blocked(self) -> None:
        if self._buffered >= self.pull_threshold_for_all:
            return
        for st in self._states.values():
            if st.blocked and not st.paused and st.buffered < self.pull_threshold_for_queue \
                    and st.buffered_bytes < self.pull_threshold_size_for_queue_mib * 1024 * 1024:
                st.wake.set()

    # -- polling -----------------------------------------------------------------------------------------------
    async def poll(self, timeout: float = 5.0, max_messages: int | None = None) -> list[MessageExt]:
        """Messages from any assigned queue, at most ``max_messages`` (default: ``pull_batch_size``); waits up to
        ``timeout`` seconds for some to arrive and returns [] when none did. A broker's refusal of a pull (an
        unknown topic, a bad queue, a bad expression) is raised here once; the pull is retried meanwhile."""
        self._check_started()
        limit = self.pull_batch_size if max_messages is None else max_messages
        if limit < 1:
            raise InvalidArgumentError(f"max_messages must be >= 1, got {max_messages}")
        if not self._buffer:
            if self._errors:
                raise self._errors.popleft()
            if timeout <= 0:
                return []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not self._buffer:
                if self._errors:
                    raise self._errors.popleft()
                remaining = deadline - loop.time()
                if remaining <= 0 or not self.started:
                    return []
                self._data.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._data.wait()
                except TimeoutError:
                    pass
        return self._take(limit)

    def _take(self, limit: int) -> list[MessageExt]:
        buffer = self._buffer
        out: list[MessageExt] = []
        taken = 0
        wake = False
        while buffer and taken < limit:
            b = buffer[0]
            st = b.state
            msgs = b.msgs
            n = len(msgs)
            room = limit - taken
            if n <= room:
                buffer.popleft()
                if not out:
                    out = msgs
                else:
                    out.extend(msgs)
                st.consumed = b.next_offset
                st.buffered_bytes -= b.size
            else:
                n = room
                part = msgs[:room]
                del msgs[:room]  # (a memmove of pointers) the batch does not keep the taken bodies alive
                out.extend(part)
                st.consumed = part[-1].queue_offset + 1
                size = sum(len(m.body) for m in part)
                b.size -= size
                st.buffered_bytes -= size
            taken += n
            st.buffered -= n
            if st.blocked:
                wake = True
        self._buffered -= taken
        if wake or self._buffered < self.pull_threshold_for_all:
            self._wake_blocked()
        return out

    # -- positions -------------------------------------------------------------------------------------------
    def _state(self, queue: MessageQueue) -> QueueState:
        self._check_started()
        st = self._states.get(queue)
        if st is None:
            raise InvalidArgumentError(f"queue {queue_label(queue) if isinstance(queue, MessageQueue) else queue!r} "
                                       "is not assigned to this consumer")
        return st

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        """Read ``queue`` from ``offset`` on; what poll returns next for it starts there, and a commit writes
        it. The offset must be within the queue's [min, max] offsets."""
        st = self._state(queue)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgumentError(f"offset {offset!r} is not an integer")
        lo, hi = await asyncio.gather(min_offset(self.instance, queue), max_offset(self.instance, queue))
        if not lo <= offset <= hi:
            raise InvalidArgumentError(f"seek offset {offset} of {queue_label(queue)} is outside [{lo}, {hi}]")
        await self._seek(st, offset)

    async def _seek(self, st: QueueState, offset: int) -> None:
        await self._stop_queue(st)
        if self._states.get(st.queue) is not st:  # dropped meanwhile
            return
        st.pull_offset = offset
        st.consumed = offset
        st.reported = None
        self._start_queue(st)

    async def reset_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """The broker reset the group's offsets (RESET_CONSUMER_CLIENT_OFFSET): assigned queues among them are
        read on from the new offsets, as after ``seek``."""
        for mq, offset in sorted(offsets.items()):
            st = self._states.get(mq)
            if st is not None:
                await self._seek(st, offset)

    async def seek_to_beginning(self, queue: MessageQueue | None = None) -> None:
        """Seek ``queue`` (default: every assigned queue) to its min offset."""
        for st in self._targets(queue):
            await self._seek(st, await min_offset(self.instance, st.queue))

    async def seek_to_end(self, queue: MessageQueue | None = None) -> None:
        """Seek ``queue`` (default: every assigned queue) to its max offset: only new messages are read."""
        for st in self._targets(queue):
            await self._seek(st, await max_offset(self.instance, st.queue))

    async def seek_to_timestamp(self, queue: MessageQueue | None, timestamp: int | _dt.datetime) -> None:
        """Seek ``queue`` (None: every assigned queue) to its first message stored at or after ``timestamp``
        (epoch ms or datetime), found with SEARCH_OFFSET_BY_TIMESTAMP."""
        ts = to_millis(timestamp)
        for st in self._targets(queue):
            await self._seek(st, await search_offset(self.instance, st.queue, ts))

    async def offset_for_timestamp(self, queue: MessageQueue, timestamp: int | _dt.datetime) -> int:
        return await search_offset(self.instance, check_queue(queue), to_millis(timestamp))

    def _targets(self, queue: MessageQueue | None) -> list[QueueState]:
        if queue is None:
            self._check_started()
            return list(self._states.values())
        return [self._state(queue)]

    def position(self, queue: MessageQueue) -> int | None:
        """The offset a commit would write for ``queue``: after the last message poll returned."""
        st = self._state(queue)
        return st.consumed if st.consumed >= 0 else None

    async def committed(self, queue: MessageQueue) -> int | None:
        """The offset the broker holds for this group and ``queue``; None when none was ever committed."""
        self._check_started()
        return await query_consumer_offset(self.instance, self.group, check_queue(queue))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop pulling these queues (what is buffered is still returned by poll)."""
        for q in queues:
            self._state(q).paused = True

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        for q in queues:
            st = self._state(q)
            st.paused = False
            st.wake.set()

    # -- commits -----------------------------------------------------------------------------------------------
    async def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Write the consumed offsets (those of the messages poll has returned), or the given ``offsets``, to the
        brokers and wait for them to answer."""
        self._check_started()
        if offsets is None:
            todo = {q: st.consumed for q, st in self._states.items()
                    if st.consumed >= 0 and st.consumed != st.committed}
        else:
            todo = {}
            for q, off in offsets.items():
                check_queue(q)
                if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                    raise InvalidArgumentError(f"offset {off!r} for {queue_label(q)} is not a non-negative integer")
                todo[q] = off
        if not todo:
            return
        results = await asyncio.gather(*(update_consumer_offset(self.instance, self.group, q, off)
                                         for q, off in todo.items()), return_exceptions=True)
        first: BaseException | None = None
        for (q, off), res in zip(todo.items(), results, strict=True):
            if isinstance(res, BaseException):
                first = first or res
                continue
            st = self._states.get(q)
            if st is not None:
                st.committed = off
        if first is not None:
            raise first

    def commit_async(self, callback: CommitCallback | None = None) -> asyncio.Task[None]:
        """Start a commit of the consumed offsets; ``callback(error or None)`` runs when it ends."""
        self._check_started()
        task = asyncio.ensure_future(self.commit())
        self._pending.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._pending.discard(t)
            exc = asyncio.CancelledError() if t.cancelled() else t.exception()
            if callback is not None:
                callback(exc)
            elif exc is not None:
                log.warning("async commit of %s failed: %s", self.group, exc)

        task.add_done_callback(done)
        return task

    async def _auto_commit_pass(self) -> None:
        if not self.auto_commit:
            return
        try:
            await self.commit()
        except MQClientError as exc:
            log.warning("auto-commit of %s failed: %s", self.group, exc)

    async def _route_pass(self) -> None:
        """Subscriptions follow their topics' routes: queues added or removed are picked up here."""
        if self._mode != "subscribe":
            return
        try:
            await self._apply()
        except MQClientError as exc:
            log.warning("refreshing the queues of %s failed: %s", self.group, exc)
