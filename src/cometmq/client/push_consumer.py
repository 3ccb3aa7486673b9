"""The push consumer: long-poll pulls per assigned queue, a bounded number of listener calls, rebalance, offsets.

How it runs (RocketMQ's push consumer, in asyncio)::

    Rebalancer ──assigns queues──▶ PullRequest per queue ──one long-poll PULL_MESSAGE in flight──▶ broker
         ▲                              │  the answer re-issues the next pull (or delays it: flow control,
    NOTIFY_CONSUMER_IDS_CHANGED         │  errors); new messages go into the queue's ProcessQueue
    (and every 20 s)                    ▼
                                listener calls ──listener(msgs)──▶ CONSUME_SUCCESS: offset moves on
                                                                    RECONSUME_LATER: CONSUMER_SEND_MSG_BACK

Usage::

    async def handle(msgs: list[MessageExt]) -> ConsumeStatus:
        ...
        return ConsumeStatus.CONSUME_SUCCESS

    async with PushConsumer("my-group", namesrv="127.0.0.1:9876", listener=handle) as consumer:
        consumer.subscribe("Orders", "TagA || TagB")   # may also come before start()
        await stop_event.wait()

A plain ``def`` listener runs in a thread pool; an ``async def`` one runs as a task. Either way at most
``max_concurrency`` calls run at once. Returning None counts as success; raising an exception counts as
RECONSUME_LATER (and is logged).

``PushConsumer(..., orderly=True)`` (or :class:`OrderlyPushConsumer`) consumes each queue one batch at a time
in offset order, only while it holds the queue's lock on the broker: see :mod:`cometmq.client.orderly`.

``PushConsumer(..., pop=True)`` builds a :class:`~cometmq.client.pop_push_consumer.PopPushConsumer` instead:
POP consumption, where the broker shares out single messages and invisible time is renewed automatically.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from cometmq.client.concurrent_consume import ConcurrentConsumeService
from cometmq.client.consume_types import ConsumerStats, ConsumeStatus, MessageListener, Subscription
from cometmq.client.errors import (
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    NoRouteError,
    raise_unreadable,
)
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from cometmq.client.orderly import GIVE_UP_POLICIES, ConsumeOrderlyContext, ConsumeOrderlyStatus, OrderlyService
from cometmq.client.process_queue import ProcessQueue, PullRequest
from cometmq.client.pulled import decode_pulled_within
from cometmq.client.rebalance import AllocateAverage, AllocateStrategy, Rebalancer
from cometmq.common.periodic import Periodic
from cometmq.common.tasks import cancel_and_wait
from cometmq.protocol.acl import Credentials
from cometmq.protocol.client_bodies import (
    BROADCASTING,
    CLUSTERING,
    CONSUME_PASSIVELY,
    ConsumerData,
)
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.headers import ConsumerSendMsgBackRequestHeader, PullMessageRequestHeader
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY
from cometmq.protocol.names import RETRY_TOPIC_PREFIX, TOPIC_NAME_MAX, has_name_chars_only
from cometmq.protocol.remoting import RemotingCommand, make_request

log = logging.getLogger(__name__)

__all__ = ["ConsumeOrderlyContext", "ConsumeOrderlyStatus", "ConsumeStatus", "ConsumerStats", "MessageListener",
           "OrderlyPushConsumer", "PushConsumer", "Subscription"]


# PullSysFlag bits
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

_PULL_ANSWERS = frozenset({ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                           ResponseCode.PULL_OFFSET_MOVED})
_FROM_WHERE = {"last": "CONSUME_FROM_LAST_OFFSET", "first": "CONSUME_FROM_FIRST_OFFSET",
               "timestamp": "CONSUME_FROM_TIMESTAMP"}


class PushConsumer:
    """An asyncio push consumer (RocketMQ's DefaultMQPushConsumer, concurrent or orderly listeners).

    ``message_model`` is "CLUSTERING" (the group's consumers share the queues; offsets on the brokers) or
    "BROADCASTING" (every consumer gets every message; offsets in ``offset_store_dir``).
    ``consume_from`` says where a queue the group never committed an offset for starts: "last" (only
    messages sent from now on), "first" (everything still stored), or a time (epoch ms or datetime).

    ``orderly=True``: consume each queue one batch at a time, in offset order, while holding its broker lock;
    the listener returns a :class:`ConsumeOrderlyStatus` and may take a :class:`ConsumeOrderlyContext` as
    second argument. ``auto_commit`` (orderly) commits after each successful batch; off, the listener commits
    with COMMIT and rolls back with ROLLBACK. ``suspend_time_ms`` is the wait after
    SUSPEND_CURRENT_QUEUE_A_MOMENT (doubled per retry of the same batch, up to 30 s); a message still failing
    after ``max_reconsume_times`` retries goes where ``orderly_give_up`` says: "dlq", "retry" (CLUSTERING only) or
    "never". ``max_reconsume_times`` -1 (the default), as RocketMQ's: 16, and for an orderly consumer 2**31 - 1
    (Integer.MAX_VALUE: a failing message is retried in place, its queue held, until it succeeds).
    ``max_inflated_body_size`` bounds the inflating of a COMPRESSED body (default 16 MiB, four times the producers'
    default max_message_size; a few KiB stored can inflate to gigabytes): one that inflates to more is delivered as
    stored, ``sys_flag & 1`` set (an inflated body has that bit cleared, as in RocketMQ's clients). The inflated
    sizes count towards ``pull_threshold_size_for_queue_mib``, and a pull answer is inflated only up to it (beyond
    its first message): the rest is pulled again once the queue has room.
    """

    #: delay before a pull is tried again after an error (doubling per consecutive error, up to the max)
    pull_error_delay = 1.0
    pull_error_delay_max = 3.0
    #: delay of a pull held back by flow control
    flow_control_delay = 0.05
    #: flow control also holds a concurrent consumer's pulls back while the offsets in flight in a queue span more
    #: than this: one slow message pins the committable offset, and everything after it would be consumed again
    #: after a restart. Not an orderly one's (as RocketMQ): it consumes in order, and with auto-commit off the
    #: uncommitted messages may span any distance until the listener's COMMIT, which must get its messages.
    consume_max_span = 2000
    #: client-side timeout of a long-poll pull beyond the broker's suspend time
    pull_timeout_margin = 5.0
    #: when the send-back of a failed message fails too, consume it again locally after this delay
    local_retry_delay = 1.0

    def __new__(cls, group: str, *, pop: bool = False, **kwargs: Any) -> PushConsumer:
        if pop:
            # POP mode: the broker shares out messages; see cometmq.client.pop_push_consumer.
            from cometmq.client.pop_push_consumer import PopPushConsumer

            return PopPushConsumer(group, **kwargs)  # type: ignore[return-value]
        return super().__new__(cls)

    def __init__(self, group: str, *, namesrv: str | None = None, instance: ClientInstance | None = None,
                 credentials: Credentials | tuple[str, str] | None = None,
                 listener: MessageListener | None = None, message_model: str = CLUSTERING,
                 consume_from: str | int | datetime.datetime = "last", allocate: AllocateStrategy | None = None,
                 max_concurrency: int = 20, batch_max_size: int = 1, pull_batch_size: int = 32,
                 pull_threshold_for_queue: int = 1000, pull_threshold_size_for_queue_mib: int = 100,
                 suspend_timeout_ms: int = 15_000, max_reconsume_times: int = -1, auto_commit_interval: float = 5.0,
                 offset_store_dir: str | Path = "~/.cometmq_offsets", rebalance_interval: float = 20.0,
                 close_timeout: float = 10.0, orderly: bool = False, auto_commit: bool = True,
                 suspend_time_ms: int = 1000, orderly_give_up: str = "dlq", pop: bool = False,
                 max_inflated_body_size: int = DEFAULT_MAX_INFLATED_BODY) -> None:
        if instance is None and namesrv is None:
            raise InvalidArgumentError("a push consumer needs namesrv='host:port' or a ClientInstance")
        if not group or not all(c.isalnum() or c in "%|-_" for c in group) or len(group) > 255:
            raise InvalidArgumentError(f"consumer group {group!r} is not a valid group name")
        model = message_model.upper() if isinstance(message_model, str) else ""
        if model not in (CLUSTERING, BROADCASTING):
            raise InvalidArgumentError(f"message_model must be 'CLUSTERING' or 'BROADCASTING', not {message_model!r}")
        _positive(max_concurrency=max_concurrency, pull_threshold_for_queue=pull_threshold_for_queue,
                  pull_threshold_size_for_queue_mib=pull_threshold_size_for_queue_mib,
                  suspend_timeout_ms=suspend_timeout_ms, auto_commit_interval=auto_commit_interval,
                  rebalance_interval=rebalance_interval)
        if not 1 <= batch_max_size <= 1024:
            raise InvalidArgumentError(f"batch_max_size must be within 1..1024, not {batch_max_size}")
        if not 1 <= pull_batch_size <= 1024:
            raise InvalidArgumentError(f"pull_batch_size must be within 1..1024, not {pull_batch_size}")
        if max_reconsume_times < -1:
            raise InvalidArgumentError(f"max_reconsume_times must be -1 (the default) or more, "
                                       f"not {max_reconsume_times}")
        if orderly_give_up not in GIVE_UP_POLICIES:
            raise InvalidArgumentError(f"orderly_give_up must be one of {', '.join(GIVE_UP_POLICIES)}, "
                                       f"not {orderly_give_up!r}")
        if orderly and orderly_give_up == "retry" and model == BROADCASTING:
            # broadcasting consumers read no retry topic (RocketMQ retries no broadcast message): a message given
            # up there would be read by nobody
            raise InvalidArgumentError("orderly_give_up='retry' needs CLUSTERING: a BROADCASTING consumer does not "
                                       "read the group's retry topic (use 'dlq' or 'never')")
        _positive(suspend_time_ms=suspend_time_ms, max_inflated_body_size=max_inflated_body_size)
        self.group = group
        self.message_model = model
        self.consume_from, self.consume_timestamp = _parse_consume_from(consume_from)
        self.allocate: AllocateStrategy = allocate if allocate is not None else AllocateAverage()
        self.max_concurrency = max_concurrency
        self.batch_max_size = batch_max_size
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue_mib = pull_threshold_size_for_queue_mib
        self.suspend_timeout_ms = suspend_timeout_ms
        # -1, as RocketMQ's DefaultMQPushConsumer: 16 retries, or for an orderly consumer Integer.MAX_VALUE
        self.max_reconsume_times = max_reconsume_times if max_reconsume_times >= 0 else (2**31 - 1 if orderly else 16)
        self.auto_commit_interval = auto_commit_interval
        self.close_timeout = close_timeout
        self.orderly = orderly
        self.auto_commit = auto_commit
        self.suspend_time_ms = suspend_time_ms
        self.orderly_give_up = orderly_give_up
        self.max_inflated_body_size = max_inflated_body_size
        self.instance = instance or ClientInstance(namesrv or "", credentials=credentials)
        self.offset_store: OffsetStore
        if model == CLUSTERING:
            self.offset_store = RemoteBrokerOffsetStore(self.instance, group)
        else:
            self.offset_store = LocalFileOffsetStore(offset_store_dir, group)
        self.stats = ConsumerStats()
        self.started = False
        self._closing = False
        self._listener: MessageListener | None = None
        self._listener_is_async = False
        if listener is not None:
            self.register_listener(listener)
        self._subscriptions: dict[str, Subscription] = {}
        self._requests: dict[MessageQueue, PullRequest] = {}
        self._rebalancer = Rebalancer(self.instance, group, strategy=self.allocate, broadcasting=not self.clustering,
                                      topics=lambda: list(self._subscriptions), apply=self._apply_assignment,
                                      period=rebalance_interval)
        self._executor: ThreadPoolExecutor | None = None
        self._committer = Periodic(f"commit-{self.group}", auto_commit_interval, self._commit_pass, logger=log)
        self._background: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the orderly consume service (lock keeper, one consume task per queue); None for concurrent listeners
        self._orderly: OrderlyService | None = OrderlyService(self) if orderly else None
        #: the concurrent one: listener slots, backlog, local retries (unused when orderly)
        self._concurrent = ConcurrentConsumeService(self)

    # -- configuration --------------------------------------------------------------------------------------
    @property
    def clustering(self) -> bool:
        return self.message_model == CLUSTERING

    @property
    def retry_topic(self) -> str:
        return RETRY_TOPIC_PREFIX + self.group

    @property
    def listener(self) -> MessageListener | None:
        return self._listener

    def register_listener(self, listener: MessageListener) -> MessageListener:
        """Set the listener (usable as a decorator). Only before :meth:`start`."""
        if self.started:
            raise ClientStateError("the listener cannot change while the consumer runs")
        if not callable(listener):
            raise InvalidArgumentError(f"the listener must be callable, not {type(listener).__name__}")
        self._listener = listener
        self._listener_is_async = inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
            type(listener).__call__)  # an object with an async __call__
        return listener

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        """Take the topic's messages that match ``expression``: tags ("TagA || TagB", "*") or, with
        ``expression_type="SQL92"``, a property filter the broker evaluates ("a > 5 AND b = 'x'")."""
        if not topic or len(topic) > TOPIC_NAME_MAX or not has_name_chars_only(topic):
            raise InvalidArgumentError(f"topic {topic!r} is not a valid topic name")
        if topic.startswith(RETRY_TOPIC_PREFIX):
            raise InvalidArgumentError(f"{topic} is a retry topic: the consumer subscribes to its own by itself")
        self._subscriptions[topic] = Subscription.parse(topic, expression, expression_type)
        if self.started:
            self._spawn(self._subscriptions_changed())

    async def unsubscribe(self, topic: str) -> None:
        """Stop taking the topic's messages (its queues are committed and given up)."""
        if self._subscriptions.pop(topic, None) is None:
            return
        if self.started:
            await asyncio.gather(*(self._drop_queue(mq) for mq in list(self._requests) if mq.topic == topic))
            await self.instance.heartbeat()

    @property
    def subscriptions(self) -> dict[str, Subscription]:
        return {t: s for t, s in self._subscriptions.items() if not t.startswith(RETRY_TOPIC_PREFIX)}

    @property
    def assignment(self) -> frozenset[MessageQueue]:
        """The queues this consumer pulls from now (retry queues included)."""
        return frozenset(self._requests)

    @property
    def locked_queues(self) -> frozenset[MessageQueue]:
        """Orderly: the assigned queues whose lock this consumer holds and that it consumes now."""
        if self._orderly is None:
            return frozenset()
        return self._orderly.consuming

    @property
    def orderly_service(self) -> OrderlyService | None:
        return self._orderly

    def in_flight(self, mq: MessageQueue) -> int:
        """How many messages of the queue are pulled and not yet consumed."""
        req = self._requests.get(mq)
        return req.pq.count if req else 0

    # -- ClientInstance's view of a consumer ---------------------------------------------------------------
    def consumer_data(self) -> ConsumerData:
        return ConsumerData(group_name=self.group, consume_type=CONSUME_PASSIVELY, message_model=self.message_model,
                            consume_from_where=_FROM_WHERE[self.consume_from],
                            subscriptions=tuple(s.data() for s in self._subscriptions.values()))

    def on_ids_changed(self) -> None:
        """A broker says the group's consumers changed: rebalance now (a burst of notices makes one run)."""
        if self.started:
            log.debug("consumers of %s changed: rebalancing", self.group)
            self._rebalancer.request()

    # -- what the tools ask a client through a broker (client/consumer_requests.py) ---------------------------------
    def queue_info(self) -> dict[MessageQueue, dict[str, Any]]:
        """Per queue held, RocketMQ's ProcessQueueInfo figures (GET_CONSUMER_RUNNING_INFO's mqTable)."""
        locked = self.locked_queues
        return {mq: {"cachedMsgCount": self.in_flight(mq), "locked": mq in locked, "droped": False}
                for mq in sorted(self._requests)}

    async def consume_directly(self, msg: MessageExt) -> dict[str, Any]:
        """Run the listener on one message a tool names (CONSUME_MESSAGE_DIRECTLY, ``queryMsgById -g -d``):
        nothing is committed or sent back. RocketMQ's ConsumeMessageDirectlyResult as a dict."""
        listener = self._listener
        if listener is None:
            return {"order": False, "autoCommit": True, "consumeResult": "CR_THROW_EXCEPTION",
                    "remark": "the consumer has no listener", "spentTimeMills": 0}
        orderly = self._orderly is not None
        args: tuple[Any, ...] = ([msg],)
        if orderly and self._orderly is not None and self._orderly._wants_context:
            args = ([msg], ConsumeOrderlyContext(msg.queue, auto_commit=self.auto_commit))
        begin = time.monotonic()
        remark: str | None = None
        try:
            if self._listener_is_async or self._executor is None:
                result = listener(*args)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._executor, lambda: listener(*args))
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, remark = "CR_THROW_EXCEPTION", f"{type(exc).__name__}: {exc}"
        else:
            results: dict[object, str] = {
                ConsumeStatus.CONSUME_SUCCESS: "CR_SUCCESS", ConsumeOrderlyStatus.SUCCESS: "CR_SUCCESS",
                ConsumeOrderlyStatus.ROLLBACK: "CR_ROLLBACK", ConsumeOrderlyStatus.COMMIT: "CR_COMMIT"}
            # None is success (as the SDK takes it); anything else is consumed later, as the listener calls do
            code = "CR_SUCCESS" if result is None else results.get(result, "CR_LATER") \
                if isinstance(result, (ConsumeStatus, ConsumeOrderlyStatus)) else "CR_LATER"
        return {"order": orderly, "autoCommit": self.auto_commit if orderly else True, "consumeResult": code,
                "remark": remark, "spentTimeMills": int((time.monotonic() - begin) * 1000)}

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        if self._listener is None:
            raise ClientStateError("the consumer has no listener: pass listener= or call register_listener()")
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        self._loop = asyncio.get_running_loop()
        self._closing = False
        if self.clustering:
            # Messages sent back for redelivery come through the group's retry topic (restored to their topic).
            self._subscriptions.setdefault(self.retry_topic, Subscription(self.retry_topic, version=_now_ms()))
        self.instance.register_consumer(self)
        await self.instance.start()
        try:
            await self.offset_store.load()
            if not self._listener_is_async:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=f"consume-{self.group}")
            if self._orderly is not None:
                self._orderly.start()
            await self._learn_routes()
            # The brokers must know this consumer before it asks them who the group's consumers are.
            await self.instance.heartbeat()
            self.started = True
            await self._rebalancer.rebalance()
            self._rebalancer.start()
            self._committer.start()
        except BaseException:
            self.started = True
            await self.close()
            raise
        log.info("push consumer %s (%s) started as %s: %s", self.group, self.message_model, self.instance.client_id,
                 ", ".join(f"{s.topic} [{s.expression}]" for s in self.subscriptions.values()))

    async def close(self) -> None:
        """Stop pulling, let running listener calls finish (up to ``close_timeout``), commit, unregister."""
        if not self.started:
            return
        self.started = False
        self._closing = True
        await self._rebalancer.stop()
        await self._committer.stop()
        await cancel_and_wait(self._background)
        requests = list(self._requests.values())
        if self._orderly is not None:
            # batches in the listener end, offsets are committed, every lock is released in one request per broker
            await self._orderly.close()
        else:
            await self._stop_workers(requests)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        for req in requests:
            req.pq.dropped = True
        await self.offset_store.persist([req.mq for req in requests])
        self._requests.clear()
        await self.instance.unregister(consumer_group=self.group)
        await self.instance.close()
        log.info("push consumer %s closed (%s)", self.group, self.stats)

    async def _stop_workers(self, requests: list[PullRequest]) -> None:
        for req in requests:
            req.cancel()
        await cancel_and_wait([req.task for req in requests])
        await self._concurrent.stop(self.close_timeout)

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _subscriptions_changed(self) -> None:
        await self._learn_routes()
        await self.instance.heartbeat()
        self._rebalancer.request()

    async def _learn_routes(self) -> None:
        """Fetch the routes of the subscribed topics, so the instance knows (and heartbeats) their brokers."""
        for topic in list(self._subscriptions):
            try:
                if await self.instance.route(topic) is None and not topic.startswith(RETRY_TOPIC_PREFIX):
                    log.warning("no route for topic %s yet; consumer %s will pick it up when it appears", topic,
                                self.group)
            except Exception as exc:
                log.warning("cannot fetch the route of %s: %s", topic, exc)

    async def _commit_pass(self) -> None:
        try:
            await self.offset_store.persist(self._committable_queues())
        except Exception:
            log.exception("committing the offsets of %s failed", self.group)

    async def commit(self) -> None:
        """Commit the consumed offsets of every assigned queue now (also done every ``auto_commit_interval``)."""
        await self.offset_store.persist(self._committable_queues())

    def _committable_queues(self) -> list[MessageQueue]:
        """The queues whose offsets this consumer may commit: all of them, or (orderly) those it holds locked."""
        if self._orderly is None:
            return list(self._requests)
        return list(self._orderly.consuming)

    # -- rebalance ------------------------------------------------------------------------------------------
    async def rebalance(self) -> bool:
        """Run a rebalance now; True when every topic got its queues."""
        return await self._rebalancer.rebalance()

    async def _apply_assignment(self, topic: str, queues: list[MessageQueue]) -> bool:
        if self._closing:
            return True
        if self._orderly is not None:
            return await self._orderly.apply(topic, queues)
        wanted = set(queues)
        removed = [mq for mq in self._requests if mq.topic == topic and mq not in wanted]
        if removed:
            await asyncio.gather(*(self._drop_queue(mq) for mq in removed))
        added = sorted(mq for mq in wanted if mq not in self._requests)
        if not added:
            if removed:
                log.info("%s gave up %d queues of %s", self.group, len(removed), topic)
            return True
        starts = await asyncio.gather(*(self._start_offset(mq) for mq in added), return_exceptions=True)
        complete = True
        taken = 0
        for mq, start in zip(added, starts, strict=True):
            if isinstance(start, BaseException):
                if isinstance(start, asyncio.CancelledError):
                    raise start
                log.warning("cannot find where %s starts in %s/%s/%d: %s (trying again soon)", self.group, mq.topic,
                            mq.broker_name, mq.queue_id, start)
                complete = False
                continue
            if self._closing or mq in self._requests:
                continue
            self.offset_store.update(mq, start, increase_only=False)
            req = PullRequest(mq, ProcessQueue(start), start)
            self._requests[mq] = req
            taken += 1
            self._pull_now(req)
        log.info("%s took %d queues of %s and gave up %d; it now has %d", self.group, taken, topic, len(removed),
                 sum(1 for mq in self._requests if mq.topic == topic))
        return complete

    async def _drop_queue(self, mq: MessageQueue) -> None:
        """Give a queue up: stop pulling, commit what was consumed, forget it."""
        if self._orderly is not None:
            await self._orderly.drop(mq)  # ... and unlock it (once its batch in flight has ended)
            return
        req = self._requests.pop(mq, None)
        if req is None:
            return
        req.pq.dropped = True
        req.cancel()
        try:
            await self.offset_store.persist([mq])
        finally:
            self.offset_store.remove(mq)

    async def reset_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """The broker reset the group's offsets (RESET_CONSUMER_CLIENT_OFFSET) and committed them: what was
        pulled of those queues is dropped unconsumed, and they are pulled again from the new offsets (RocketMQ's
        MQClientInstance.resetOffset). An orderly consumer restarts those queues from the committed offsets once it
        has locked them again (a batch in the listener ends first, and its result is not committed)."""
        if self._closing:
            return
        if self._orderly is not None:
            self._orderly.reset_offsets(offsets)
            return
        for mq, offset in sorted(offsets.items()):
            req = self._requests.get(mq)
            if req is None:
                continue  # not this consumer's: its holder was told too
            req.pq.dropped = True
            req.cancel()
            self.offset_store.update(mq, offset, increase_only=False)
            new = PullRequest(mq, ProcessQueue(offset), offset)
            self._requests[mq] = new
            self._pull_now(new)
        log.info("%s reads on from reset offsets: %s", self.group,
                 {f"{q.topic}/{q.broker_name}/{q.queue_id}": o for q, o in offsets.items() if q in self._requests})

    async def _start_offset(self, mq: MessageQueue) -> int:
        """The committed offset, or where ``consume_from`` says to start."""
        stored = await self.offset_store.read_stored(mq)
        if stored >= 0:
            return stored
        if mq.topic.startswith(RETRY_TOPIC_PREFIX):
            return 0  # everything in the group's retry topic is meant for the group
        if self.consume_from == "last":
            return await self._broker_offset(mq, RequestCode.GET_MAX_OFFSET, {})
        if self.consume_from == "first":
            return await self._broker_offset(mq, RequestCode.GET_MIN_OFFSET, {})
        return await self._broker_offset(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                                         {"timestamp": str(self.consume_timestamp)})

    async def _broker_offset(self, mq: MessageQueue, code: int, extra: dict[str, str]) -> int:
        addr = await self._addr(mq, 0)
        cmd = make_request(code, {"topic": mq.topic, "queueId": str(mq.queue_id), **extra})
        response = await self.instance.invoke_ok(addr, cmd, context=f"offset lookup {code} of {mq.topic}/{mq.queue_id}")
        try:
            return max(0, int(response.ext_fields["offset"]))
        except (KeyError, ValueError):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "answer without a usable offset", addr=addr) from None

    async def _addr(self, mq: MessageQueue, broker_id: int) -> str:
        addr = self.instance.broker_addr(mq.broker_name, broker_id)
        if addr is None:
            await self.instance.route(mq.topic, refresh=True)
            addr = self.instance.broker_addr(mq.broker_name, broker_id)
        if addr is None:
            raise NoRouteError(f"no address for broker {mq.broker_name} (queue {mq.topic}/{mq.queue_id})")
        return addr

    # -- pulling (PullMessageService) -------------------------------------------------------------------------
    def _pull_now(self, req: PullRequest) -> None:
        req.timer = None
        if req.pq.dropped or self._closing:
            return
        assert self._loop is not None
        req.task = self._loop.create_task(self._pull(req), name=f"pull-{req.mq.topic}-{req.mq.queue_id}")

    def _pull_later(self, req: PullRequest, delay: float) -> None:
        if req.pq.dropped or self._closing:
            return
        assert self._loop is not None
        req.timer = self._loop.call_later(delay, self._pull_now, req)

    async def _pull(self, req: PullRequest) -> None:
        """One pull of one queue; its completion issues the next (at once, or after a delay)."""
        pq = req.pq
        if pq.count >= self.pull_threshold_for_queue or \
                pq.size_bytes >= self.pull_threshold_size_for_queue_mib * 1024 * 1024:
            self.stats.flow_controlled += 1
            if self.stats.flow_controlled % 1000 == 1:
                log.info("flow control: %s/%d of %s holds %d unconsumed messages (%d bytes); pulling later",
                         req.mq.topic, req.mq.queue_id, self.group, pq.count, pq.size_bytes)
            self._pull_later(req, self.flow_control_delay)
            return
        if self._orderly is None and pq.max_span > self.consume_max_span:
            self.stats.flow_controlled += 1
            if self.stats.flow_controlled % 1000 == 1:
                log.info("flow control: offsets in flight in %s/%d of %s span %d (> %d); pulling later",
                         req.mq.topic, req.mq.queue_id, self.group, pq.max_span, self.consume_max_span)
            self._pull_later(req, self.flow_control_delay)
            return
        if self._orderly is not None and not self._orderly.lock_valid(pq):
            self._pull_later(req, self._orderly.lock_retry_delay_max)  # not consumed now: no need for more
            return
        sub = self._subscriptions.get(req.mq.topic)
        if sub is None:
            self._pull_later(req, self.pull_error_delay_max)  # being unsubscribed; the queue goes soon
            return
        try:
            consume = await self._pull_once(req, sub)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            req.errors += 1
            self.stats.pull_errors += 1
            delay = min(self.pull_error_delay * 2 ** (req.errors - 1), self.pull_error_delay_max)
            if route_stale(exc) and await self._follow_route(req):
                delay = self.flow_control_delay  # the queue's broker moved (a new master): pull there now
            log.warning("pull of %s/%s/%d at %d for %s failed: %s; trying again in %.1fs", req.mq.topic,
                        req.mq.broker_name, req.mq.queue_id, req.next_offset, self.group, exc, delay)
            self._pull_later(req, delay)
            return
        req.errors = 0
        # The next pull of the queue, in a task of its own made in the next loop turn: the listener call below
        # goes first (its first step runs in this turn either way), without a task to create before it.
        assert self._loop is not None
        req.task = None
        req.timer = self._loop.call_soon(self._pull_now, req)
        if consume:
            # PullMessageService hands the messages to the consume service and pulls again. Here the first
            # batch is consumed in this very task, now that its pull is done, when a listener slot is free:
            # no hand-off to another task, so the listener runs in the loop turn the answer arrived in. That call
            # goes on with the backlog (other pulls' messages): ``consume`` must not keep this pull's ones alive.
            first = self._concurrent.run_first(req, consume)
            del consume
            if first is not None:
                await first

    async def _follow_route(self, req: PullRequest) -> bool:
        """After a pull failed on a broker that may be gone: back to the master (a suggested replica may be the
        one gone), ask for the route at once, and say whether the queue's address changed."""
        mq = req.mq
        before = self.instance.broker_addr(mq.broker_name, req.broker_id)
        req.broker_id = 0
        await self.instance.refresh_route(mq.topic)
        after = self.instance.broker_addr(mq.broker_name, 0)
        return after is not None and after != before

    async def _pull_once(self, req: PullRequest, sub: Subscription) -> list[MessageExt]:
        """One pull and its answer; returns the messages the concurrent listener calls are to take (none for an
        orderly consumer, whose queue task takes them)."""
        mq = req.mq
        addr = await self._addr(mq, req.broker_id)
        commit_offset = -1
        if self.clustering and addr == self.instance.master_addr(mq.broker_name) and (
                self._orderly is None or self._orderly.lock_valid(req.pq)):
            commit_offset = self.offset_store.read(mq)
        sys_flag = FLAG_SUSPEND | FLAG_SUBSCRIPTION | (FLAG_COMMIT_OFFSET if commit_offset > 0 else 0)
        header = PullMessageRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=req.next_offset,
            max_msg_nums=self.pull_batch_size, sys_flag=sys_flag, commit_offset=max(commit_offset, 0),
            suspend_timeout_millis=self.suspend_timeout_ms, subscription=sub.expression, sub_version=sub.version,
            expression_type=sub.expression_type)
        response = await self.instance.invoke_now(addr, make_request(RequestCode.PULL_MESSAGE, header.to_ext()),
                                                  self.suspend_timeout_ms / 1000 + self.pull_timeout_margin,
                                                  context=f"pull {mq.topic}/{mq.queue_id} at {req.next_offset}")
        return await self._on_pull_answer(req, sub, response, addr)

    async def _on_pull_answer(self, req: PullRequest, sub: Subscription, response: RemotingCommand,
                              addr: str) -> list[MessageExt]:
        mq, pq = req.mq, req.pq
        code = response.code
        if code not in _PULL_ANSWERS:
            raise BrokerError(code, response.remark or "", addr=addr, context=f"pull {mq.topic}/{mq.queue_id}")
        if self._subscriptions.get(mq.topic) is not sub:
            # The subscription changed while this pull was out (held by the broker): the broker filtered by the old
            # one, and its nextBeginOffset may pass messages that match only the new one. Dropped: the next pull asks
            # again from the same offset with the new filter.
            return []
        ext = response.ext_fields
        try:
            next_offset = int(ext["nextBeginOffset"])
            suggested = int(ext.get("suggestWhichBrokerId", "0") or 0)
        except (KeyError, ValueError):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "pull answer without a usable nextBeginOffset",
                              addr=addr) from None
        req.broker_id = suggested if suggested and self.instance.broker_addr(mq.broker_name, suggested) else 0
        consume: list[MessageExt] = []
        if pq.dropped:
            return consume
        if code == ResponseCode.SUCCESS:
            try:
                # lazy: fields are read from the record when asked for
                # the bodies inflated only while they fit the queue's pullThresholdSizeForQueue: the rest is pulled
                # again (a few KiB of zlib inflate to MiBs, and the broker's answer limits count stored bytes)
                msgs, cut, _ = decode_pulled_within(response.body, mq, self.max_inflated_body_size, max(
                    self.pull_threshold_size_for_queue_mib * 1024 * 1024 - pq.size_bytes, 0), partial=True)
            except ProtocolError as exc:  # (as ``with reading_reply(...)``, without its calls on the latency path)
                raise_unreadable("undecodable pull body", exc, addr=addr)
            if cut:
                next_offset = msgs[-1].queue_offset + 1
            self.stats.pulled += len(msgs)
            kept = msgs if sub.tags is None else [m for m in msgs if sub.matches(m)]
            self.stats.filtered += len(msgs) - len(kept)
            added = pq.put(kept, next_offset)
            req.next_offset = next_offset
            if added:
                if self._orderly is not None:
                    self._orderly.submit(req)  # the queue's own consume task takes them, in order
                else:
                    consume = added
        elif code == ResponseCode.PULL_OFFSET_MOVED:
            log.warning("offset of %s in %s/%s/%d moved from %d to %d", self.group, mq.topic, mq.broker_name,
                        mq.queue_id, req.next_offset, next_offset)
            req.next_offset = next_offset
            pq.advance(next_offset)
            self.offset_store.update(mq, next_offset, increase_only=False)
            await self.offset_store.persist([mq])
            return consume
        else:  # PULL_NOT_FOUND (the long poll timed out), PULL_RETRY_IMMEDIATELY (nothing matched)
            req.next_offset = next_offset
            pq.advance(next_offset)
        if pq.count == 0:
            # Nothing in flight: everything up to the pull position is done (filtered messages included).
            self.offset_store.update(mq, pq.committable)
        return consume

    # -- consuming (the concurrent half is ConcurrentConsumeService; the orderly one OrderlyService) -----
    async def _send_back(self, msg: MessageExt, delay_level: int = 0) -> bool:
        """CONSUMER_SEND_MSG_BACK: the broker of the message's queue republishes it to the retry topic
        (or, past ``max_reconsume_times`` or with a negative ``delay_level``, to the dead-letter topic)."""
        try:
            addr = self.instance.master_addr(msg.queue.broker_name) or msg.store_host
            header = ConsumerSendMsgBackRequestHeader(
                offset=msg.commit_log_offset, group=self.group, delay_level=delay_level, origin_msg_id=msg.msg_id,
                origin_topic=msg.topic, max_reconsume_times=self.max_reconsume_times)
            await self.instance.invoke_ok(addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext()),
                                          context=f"send back {msg.msg_id} of {msg.topic}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("sending message %s back for redelivery failed: %s; consuming it again here in %.1fs",
                        msg.msg_id, exc, self.local_retry_delay)
            if route_stale(exc):
                self.instance.refresh_route_soon(msg.queue.topic)
            return False
        return True

    def __repr__(self) -> str:
        state = "running" if self.started else "stopped"
        kind = " orderly" if self.orderly else ""
        return f"<PushConsumer {self.group} {self.message_model}{kind} {state} queues={len(self._requests)}>"


class OrderlyPushConsumer(PushConsumer):
    """``PushConsumer(..., orderly=True)``: see :mod:`cometmq.client.orderly`."""

    def __init__(self, group: str, **kwargs: Any) -> None:
        kwargs.setdefault("orderly", True)
        super().__init__(group, **kwargs)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise InvalidArgumentError(f"{name} must be positive, not {value}")


def _parse_consume_from(value: str | int | datetime.datetime) -> tuple[str, int]:
    if isinstance(value, str):
        mode = value.strip().lower()
        if mode in ("last", "first"):
            return mode, 0
        raise InvalidArgumentError(f"consume_from must be 'last', 'first', epoch ms or a datetime, not {value!r}")
    if isinstance(value, datetime.datetime):
        return "timestamp", int(value.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return "timestamp", value
    raise InvalidArgumentError(f"consume_from must be 'last', 'first', epoch ms or a datetime, not {value!r}")
