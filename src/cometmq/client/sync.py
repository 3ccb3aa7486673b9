"""The synchronous facade: blocking twins of the asyncio clients, for code without an event loop.

    from cometmq.client.sync import SyncProducer, SyncLitePullConsumer

    with SyncProducer("pg", namesrv="127.0.0.1:9876") as producer:
        producer.send(Message("TopicTest", b"hello"))

    with SyncLitePullConsumer("cg", namesrv="127.0.0.1:9876", consume_from="first") as consumer:
        consumer.subscribe("TopicTest")
        for msg in consumer.poll(timeout=1.0):
            ...

Every facade object runs its asyncio twin (reachable as ``.aio``) on ONE event loop shared by the whole
process, in a daemon thread started by the first facade object and stopped when the last one is closed (or
garbage-collected). A call submits a coroutine to that loop with ``asyncio.run_coroutine_threadsafe`` and waits
for it, at most ``timeout`` seconds (the object's ``call_timeout`` unless the call says otherwise); running out
of time cancels the operation and raises :class:`ClientTimeoutError`. Calls may come from any number of
threads, including threads that run an event loop of their own (the call blocks that loop meanwhile). They may
not come from the facade's own loop thread, e.g. from a ``send_async`` callback or a push listener running on
it: that would wait for itself forever, so it raises :class:`ClientStateError` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as _dt
import inspect
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from cometmq.client.admin import Admin, ConsumeStats, OffsetReset, TopicOffset
from cometmq.client.admin_controller import ControllerMetadata, ElectResult, GroupSyncState
from cometmq.client.admin_ha import EpochCache, HAStatus, RoleChange
from cometmq.client.admin_kv import ConsumeDirectlyResult, ConsumerRunningInfo
from cometmq.client.admin_ops import ConsumerConnection, PullResult, ResetResult
from cometmq.client.errors import ClientStateError, ClientTimeoutError
from cometmq.client.lite_pull_consumer import CommitCallback, ConsumeFrom, LitePullConsumer
from cometmq.client.message import Message, MessageExt, MessageQueue, SendResult
from cometmq.client.producer import MessageQueueSelector, Producer, SendCallback
from cometmq.client.push_consumer import MessageListener, PushConsumer
from cometmq.client.simple_consumer import ReceivedMessage, SimpleConsumer
from cometmq.client.transaction_producer import (
    LocalTransactionState,
    TransactionChecker,
    TransactionProducer,
    TransactionSendResult,
    run_local_transaction,
)
from cometmq.protocol.admin_bodies import BrokerStatsData, Connection
from cometmq.protocol.route import PERM_READ_WRITE, ClusterInfo, TopicRouteData

log = logging.getLogger(__name__)

__all__ = ["SyncAdmin", "SyncLitePullConsumer", "SyncProducer", "SyncPushConsumer", "SyncSimpleConsumer",
           "SyncTransactionProducer", "loop_thread_running"]

T = TypeVar("T")
A = TypeVar("A", bound="_Lifecycle")

#: extra time a blocking call waits beyond the operation's own timeout (poll)
_MARGIN = 30.0


# -- the shared loop thread ----------------------------------------------------------------------------------------
class _LoopThread:
    def __init__(self) -> None:
        from cometmq.net.loop import uvloop_factory

        factory = uvloop_factory()
        self.loop: asyncio.AbstractEventLoop = factory() if factory is not None else asyncio.new_event_loop()
        self.users = 0
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cometmq-sync-loop", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
            # Whatever a careless user left running is cancelled, not abandoned mid-flight.
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(30)


_lock = threading.Lock()
_shared: _LoopThread | None = None


def _acquire() -> _LoopThread:
    global _shared
    with _lock:
        if _shared is None:
            _shared = _LoopThread()
        _shared.users += 1
        return _shared


def _release(lt: _LoopThread) -> None:
    global _shared
    with _lock:
        lt.users -= 1
        if lt.users > 0:
            return
        if _shared is lt:
            _shared = None
    lt.stop()


def loop_thread_running() -> bool:
    """Whether the facade's shared loop thread runs now (it does while some facade object is open)."""
    with _lock:
        return _shared is not None and _shared.thread.is_alive()


class _Lease:
    """One facade object's hold on the loop thread, given back once (by close or by garbage collection)."""

    def __init__(self) -> None:
        self.lt = _acquire()
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            _release(self.lt)


async def _call(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


def _in_loop(fn: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """A plain call made on the loop thread: the async objects' state is only ever touched there."""
    async def call() -> T:
        return fn()

    return call


class _Lifecycle(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


class _Facade(Generic[A]):
    """Runs an async client object on the shared loop thread and blocks for its results; ``start`` / ``close``
    and the context manager drive the object's own ``start()`` / ``close()``."""

    _what = "client"

    def __init__(self, make: Callable[[], A], call_timeout: float | None) -> None:
        self.call_timeout = call_timeout
        self._lease = _Lease()
        self._finalizer = weakref.finalize(self, self._lease.release)
        self._closed = False
        try:
            self._aio: A = self._run(self._construct(make), call_timeout)
        except BaseException:
            self._finalizer()
            raise

    def start(self, timeout: float | None = None) -> None:
        self._run(self._aio.start, timeout)

    def close(self, timeout: float | None = None) -> None:
        self._close(self._aio.close, timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @staticmethod
    def _construct(make: Callable[[], A]) -> Callable[[], Awaitable[A]]:
        async def build() -> A:
            return make()  # inside the loop thread: anything the object binds to is that loop's

        return build

    @property
    def aio(self) -> A:
        """The asyncio object behind this facade; use it only on the facade's loop (e.g. in callbacks)."""
        return self._aio

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._lease.lt.loop

    def _check_thread(self) -> None:
        if self._lease.released:
            raise ClientStateError(f"this sync {self._what} is closed")
        if threading.current_thread() is self._lease.lt.thread:
            raise ClientStateError(
                f"a blocking call of the sync {self._what} came from the facade's own event-loop thread (a callback "
                "or listener running there?); it would wait for itself forever. Use the asyncio object (.aio) "
                "there, or hand the work to another thread")

    def _submit(self, fn: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(_call(fn), self._lease.lt.loop)

    def _run(self, fn: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        future = self._submit(fn)
        limit = self.call_timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except TimeoutError:
            if future.done() and not future.cancelled():
                raise  # the operation itself timed out: its own error, as it is
            future.cancel()
            raise ClientTimeoutError(f"the sync {self._what} call did not complete within {limit:g}s") from None
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: do not leave the operation running
            raise

    def _close(self, close: Callable[[], Awaitable[None]], timeout: float | None) -> None:
        if self._lease.released:
            return
        try:
            self._run(close, timeout)
        finally:
            self._finalizer()


# -- producer ----------------------------------------------------------------------------------------------------
class SyncProducer(_Facade[Producer]):
    """A blocking :class:`Producer`. ``send_async`` returns a ``concurrent.futures.Future``; its callback runs
    on the facade's loop thread (keep it short, and make no blocking facade call in it)."""

    _what = "producer"

    def __init__(self, group: str = "DEFAULT_PRODUCER", *, namesrv: str, send_timeout: float = 3.0,
                 retries: int = 2, compress_over: int = 4096, compress_level: int = 5,
                 max_message_size: int = 4 * 1024 * 1024, max_batch_bytes: int = 1024 * 1024,
                 call_timeout: float | None = 60.0, auto_batch: bool = False,
                 batch_max_delay_ms: float = 10.0, batch_max_bytes: int = 32 * 1024,
                 total_batch_max_bytes: int = 32 * 1024 * 1024) -> None:
        """``auto_batch`` and the ``batch_*`` options: see :class:`Producer` (sends from many threads at once
        coalesce on the facade's loop)."""
        super().__init__(lambda: Producer(group, namesrv=namesrv, send_timeout=send_timeout, retries=retries,
                                          compress_over=compress_over, compress_level=compress_level,
                                          max_message_size=max_message_size, max_batch_bytes=max_batch_bytes,
                                          auto_batch=auto_batch, batch_max_delay_ms=batch_max_delay_ms,
                                          batch_max_bytes=batch_max_bytes,
                                          total_batch_max_bytes=total_batch_max_bytes),
                         call_timeout)

    def send(self, msg: Message, *, queue: MessageQueue | None = None, selector: MessageQueueSelector | None = None,
             arg: Any = None, timeout: float | None = None) -> SendResult:
        return self._run(lambda: self._aio.send(msg, queue=queue, selector=selector, arg=arg, timeout=timeout))

    def send_orderly(self, msg: Message, sharding_key: str | int, *, timeout: float | None = None) -> SendResult:
        return self._run(lambda: self._aio.send_orderly(msg, sharding_key, timeout=timeout))

    def send_async(self, msg: Message, callback: SendCallback | None = None, *, queue: MessageQueue | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None
                   ) -> concurrent.futures.Future[SendResult]:
        async def send() -> SendResult:
            return await self._aio.send_async(msg, callback, queue=queue, selector=selector, arg=arg)

        return self._submit(send)

    def send_oneway(self, msg: Message) -> None:
        self._run(lambda: self._aio.send_oneway(msg))

    def recall(self, topic: str, recall_handle: str, *, timeout: float | None = None) -> str:
        """Cancel a timer message before it is due; see :meth:`Producer.recall`."""
        return self._run(lambda: self._aio.recall(topic, recall_handle, timeout=timeout))

    def send_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None,
                   timeout: float | None = None) -> list[SendResult]:
        return self._run(lambda: self._aio.send_batch(msgs, queue=queue, timeout=timeout))

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._run(lambda: self._aio.queues(topic))


class SyncTransactionProducer(SyncProducer):
    """A blocking :class:`TransactionProducer`. The local transaction runs in the calling thread; a blocking
    ``checker`` runs in a worker thread (an ``async def`` one on the loop), so neither stalls the client."""

    _what = "transaction producer"

    def __init__(self, group: str, *, namesrv: str, checker: TransactionChecker | None = None,
                 send_timeout: float = 3.0, retries: int = 2, call_timeout: float | None = 60.0) -> None:
        aio_checker: TransactionChecker | None = checker
        if checker is not None and not inspect.iscoroutinefunction(checker):
            blocking = checker

            async def in_thread(msg: MessageExt) -> LocalTransactionState:
                return await asyncio.to_thread(blocking, msg)  # type: ignore[arg-type]

            aio_checker = in_thread
        _Facade.__init__(self, lambda: TransactionProducer(group, namesrv=namesrv, checker=aio_checker,
                                                           send_timeout=send_timeout, retries=retries),
                         call_timeout)

    @property
    def _tx(self) -> TransactionProducer:
        return self._aio  # type: ignore[return-value]

    def send_in_transaction(self, msg: Message, local_transaction: Callable[[Message, Any], object],
                            arg: Any = None, *, timeout: float | None = None) -> TransactionSendResult:
        """Send the half, run ``local_transaction(msg, arg)`` here, then commit or roll back as it says."""
        result = self._run(lambda: self._tx.send_half(msg, timeout=timeout))
        if result.ok:
            state = run_local_transaction(lambda: local_transaction(msg, arg),
                                          f"local transaction of {result.msg_id}")
        else:
            state = LocalTransactionState.ROLLBACK
        self._run(lambda: self._tx.end_transaction(result, state))
        return TransactionSendResult(result, state)


# -- lite-pull consumer --------------------------------------------------------------------------------------------
class SyncLitePullConsumer(_Facade[LitePullConsumer]):
    """A blocking :class:`LitePullConsumer`. ``options``: the LitePullConsumer's other keyword arguments
    (credentials, allocate, max_inflated_body_size, pull_threshold_size_for_queue_mib)."""

    _what = "lite-pull consumer"

    def __init__(self, group: str, *, namesrv: str, pull_batch_size: int = 256, auto_commit: bool = True,
                 auto_commit_interval: float = 5.0, consume_from: ConsumeFrom = "last",
                 pull_threshold_for_all: int = 10_000, pull_threshold_for_queue: int = 1_000,
                 long_poll_timeout: float = 15.0, error_backoff: float = 1.0, route_refresh_interval: float = 30.0,
                 call_timeout: float | None = 60.0, **options: Any) -> None:
        super().__init__(lambda: LitePullConsumer(
            group, namesrv=namesrv, pull_batch_size=pull_batch_size, auto_commit=auto_commit,
            auto_commit_interval=auto_commit_interval, consume_from=consume_from,
            pull_threshold_for_all=pull_threshold_for_all, pull_threshold_for_queue=pull_threshold_for_queue,
            long_poll_timeout=long_poll_timeout, error_backoff=error_backoff,
            route_refresh_interval=route_refresh_interval, **options), call_timeout)

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self._run(lambda: self._aio.subscribe(topic, expression, expression_type=expression_type))

    def unsubscribe(self, topic: str) -> None:
        self._run(lambda: self._aio.unsubscribe(topic))

    def assign(self, queues: Iterable[MessageQueue], expression: str = "*", *, expression_type: str = "TAG") -> None:
        queues = list(queues)
        self._run(lambda: self._aio.assign(queues, expression, expression_type=expression_type))

    def assignment(self) -> list[MessageQueue]:
        return self._run(_in_loop(self._aio.assignment))

    def poll(self, timeout: float = 5.0, max_messages: int | None = None) -> list[MessageExt]:
        return self._run(lambda: self._aio.poll(timeout, max_messages), timeout + _MARGIN)

    def seek(self, queue: MessageQueue, offset: int) -> None:
        self._run(lambda: self._aio.seek(queue, offset))

    def seek_to_beginning(self, queue: MessageQueue | None = None) -> None:
        self._run(lambda: self._aio.seek_to_beginning(queue))

    def seek_to_end(self, queue: MessageQueue | None = None) -> None:
        self._run(lambda: self._aio.seek_to_end(queue))

    def seek_to_timestamp(self, queue: MessageQueue | None, timestamp: int | _dt.datetime) -> None:
        self._run(lambda: self._aio.seek_to_timestamp(queue, timestamp))

    def offset_for_timestamp(self, queue: MessageQueue, timestamp: int | _dt.datetime) -> int:
        return self._run(lambda: self._aio.offset_for_timestamp(queue, timestamp))

    def position(self, queue: MessageQueue) -> int | None:
        return self._run(_in_loop(lambda: self._aio.position(queue)))

    def committed(self, queue: MessageQueue) -> int | None:
        return self._run(lambda: self._aio.committed(queue))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        queues = list(queues)
        self._run(_in_loop(lambda: self._aio.pause(queues)))

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        queues = list(queues)
        self._run(_in_loop(lambda: self._aio.resume(queues)))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None, *, timeout: float | None = None) -> None:
        self._run(lambda: self._aio.commit(offsets), timeout)

    def commit_async(self, callback: CommitCallback | None = None) -> concurrent.futures.Future[None]:
        """Start a commit; ``callback(error or None)`` runs on the facade's loop thread when it ends."""
        async def commit() -> None:
            await self._aio.commit_async(callback)

        return self._submit(commit)


# -- push consumer ----------------------------------------------------------------------------------------------
class SyncPushConsumer(_Facade[PushConsumer]):
    """A blocking-lifecycle :class:`PushConsumer`. A plain ``def`` listener runs in the consumer's thread pool
    (it may make blocking facade calls, e.g. send with a SyncProducer); an ``async def`` one runs on the
    facade's loop thread. ``options`` are the PushConsumer's keyword arguments."""

    _what = "push consumer"

    def __init__(self, group: str, *, namesrv: str, listener: MessageListener | None = None,
                 call_timeout: float | None = 60.0, **options: Any) -> None:
        super().__init__(lambda: PushConsumer(group, namesrv=namesrv, listener=listener, **options), call_timeout)

    def register_listener(self, listener: MessageListener) -> MessageListener:
        return self._run(_in_loop(lambda: self._aio.register_listener(listener)))

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self._run(_in_loop(
            lambda: self._aio.subscribe(topic, expression, expression_type=expression_type)))

    def unsubscribe(self, topic: str) -> None:
        self._run(lambda: self._aio.unsubscribe(topic))

    def commit(self, timeout: float | None = None) -> None:
        self._run(self._aio.commit, timeout)

    def assignment(self) -> frozenset[MessageQueue]:
        return self._run(_in_loop(lambda: self._aio.assignment))


# -- admin ------------------------------------------------------------------------------------------------------
class SyncAdmin(_Facade[Admin]):
    """A blocking :class:`Admin`."""

    _what = "admin client"

    def __init__(self, *, namesrv: str, timeout: float = 3.0, call_timeout: float | None = 60.0) -> None:
        super().__init__(lambda: Admin(namesrv=namesrv, timeout=timeout), call_timeout)

    def cluster_info(self) -> ClusterInfo:
        return self._run(self._aio.cluster_info)

    def list_topics(self) -> list[str]:
        return self._run(self._aio.list_topics)

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._run(lambda: self._aio.topic_route(topic))

    def create_topic(self, topic: str, *, read_queues: int = 4, write_queues: int | None = None,
                     perm: int = PERM_READ_WRITE, order: bool = False, message_type: str | None = None,
                     cluster: str | None = None, broker: str | None = None, wait: float = 5.0,
                     topic_sys_flag: int = 0) -> list[str]:
        return self._run(lambda: self._aio.create_topic(
            topic, read_queues=read_queues, write_queues=write_queues, perm=perm, order=order,
            message_type=message_type, cluster=cluster, broker=broker, wait=wait, topic_sys_flag=topic_sys_flag))

    update_topic = create_topic

    def delete_topic(self, topic: str, *, cluster: str | None = None, wait: float = 5.0) -> list[str]:
        return self._run(lambda: self._aio.delete_topic(topic, cluster=cluster, wait=wait))

    def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        return self._run(lambda: self._aio.topic_stats(topic))

    def consumer_progress(self, group: str, topic: str | None = None) -> ConsumeStats:
        return self._run(lambda: self._aio.consumer_progress(group, topic))

    def reset_offset_by_timestamp(self, group: str, topic: str, timestamp: int | _dt.datetime, *,
                                  force: bool = True) -> list[OffsetReset]:
        return self._run(lambda: self._aio.reset_offset_by_timestamp(group, topic, timestamp, force=force))

    def create_subscription_group(self, group: str, *, cluster: str | None = None, broker: str | None = None,
                                  consume_enable: bool = True, consume_broadcast_enable: bool = True,
                                  consume_from_min_enable: bool = True, retry_queue_nums: int = 1,
                                  retry_max_times: int = 16, consume_message_orderly: bool = False,
                                  **extra: Any) -> list[str]:
        return self._run(lambda: self._aio.create_subscription_group(
            group, cluster=cluster, broker=broker, consume_enable=consume_enable,
            consume_broadcast_enable=consume_broadcast_enable, consume_from_min_enable=consume_from_min_enable,
            retry_queue_nums=retry_queue_nums, retry_max_times=retry_max_times,
            consume_message_orderly=consume_message_orderly, **extra))

    def delete_subscription_group(self, group: str, *, cluster: str | None = None,
                                  broker: str | None = None, clean_offset: bool = False) -> list[str]:
        return self._run(lambda: self._aio.delete_subscription_group(group, cluster=cluster, broker=broker,
                                                                     clean_offset=clean_offset))

    def subscription_groups(self, broker: str) -> dict[str, dict[str, Any]]:
        return self._run(lambda: self._aio.subscription_groups(broker))

    def min_offset(self, queue: MessageQueue) -> int:
        return self._run(lambda: self._aio.min_offset(queue))

    def max_offset(self, queue: MessageQueue) -> int:
        return self._run(lambda: self._aio.max_offset(queue))

    def search_offset(self, queue: MessageQueue, timestamp: int | _dt.datetime) -> int:
        return self._run(lambda: self._aio.search_offset(queue, timestamp))

    def committed_offset(self, group: str, queue: MessageQueue) -> int | None:
        return self._run(lambda: self._aio.committed_offset(group, queue))

    def update_consumer_offset(self, group: str, queue: MessageQueue, offset: int) -> None:
        self._run(lambda: self._aio.update_consumer_offset(group, queue, offset))

    def view_message(self, offset_msg_id: str, topic: str | None = None) -> MessageExt:
        return self._run(lambda: self._aio.view_message(offset_msg_id, topic))

    def query_messages_by_key(self, topic: str, key: str, *, max_num: int = 32, begin: int | _dt.datetime = 0,
                              end: int | _dt.datetime | None = None) -> list[MessageExt]:
        return self._run(lambda: self._aio.query_messages_by_key(topic, key, max_num=max_num, begin=begin, end=end))

    def query_message_by_unique_key(self, topic: str, msg_id: str) -> MessageExt:
        return self._run(lambda: self._aio.query_message_by_unique_key(topic, msg_id))

    def query_message(self, topic: str, msg_id: str) -> MessageExt:
        return self._run(lambda: self._aio.query_message(topic, msg_id))

    def timer_metrics(self, *, cluster: str | None = None, broker: str | None = None,
                      addr: str | None = None) -> dict[str, dict[str, Any]]:
        return self._run(lambda: self._aio.timer_metrics(cluster=cluster, broker=broker, addr=addr))

    # -- the operator, replication, controller, ACL and KV methods (admin_ops, admin_ha, admin_controller,
    # admin_acl, admin_kv): one twin each
    def acl_config(self, *, cluster: str | None = None, broker: str | None = None) -> dict[str, Any]:
        return self._run(lambda: self._aio.acl_config(cluster=cluster, broker=broker))

    def acl_versions(self, *, cluster: str | None = None, broker: str | None = None) -> dict[str, Any]:
        return self._run(lambda: self._aio.acl_versions(cluster=cluster, broker=broker))

    def add_write_perm(self, broker_name: str) -> dict[str, int]:
        return self._run(lambda: self._aio.add_write_perm(broker_name))

    def broker_addrs(
        self, *, cluster: str | None = None, broker: str | None = None, masters_only: bool = True
    ) -> dict[str, str]:
        return self._run(lambda: self._aio.broker_addrs(cluster=cluster, broker=broker, masters_only=masters_only))

    def broker_config(self, addr: str) -> dict[str, str]:
        return self._run(lambda: self._aio.broker_config(addr))

    def broker_runtime_info(self, addr: str) -> dict[str, str]:
        return self._run(lambda: self._aio.broker_runtime_info(addr))

    def broker_stats(self, addr: str, name: str, key: str) -> BrokerStatsData | None:
        return self._run(lambda: self._aio.broker_stats(addr, name, key))

    def clean_broker_data(
        self,
        controller_addr: str,
        cluster: str,
        broker_name: str,
        broker_ids: Iterable[int] | None = None,
        *,
        clean_living: bool = False,
    ) -> None:
        broker_ids = None if broker_ids is None else list(broker_ids)
        self._run(
            lambda: self._aio.clean_broker_data(
                controller_addr, cluster, broker_name, broker_ids, clean_living=clean_living
            )
        )

    def consume_message_directly(
        self, group: str, client_id: str, msg_id: str, topic: str | None = None
    ) -> ConsumeDirectlyResult:
        return self._run(lambda: self._aio.consume_message_directly(group, client_id, msg_id, topic))

    def consumer_connection(self, group: str, *, broker: str | None = None) -> ConsumerConnection:
        return self._run(lambda: self._aio.consumer_connection(group, broker=broker))

    def consumer_running_info(
        self, group: str, client_id: str, *, broker: str | None = None, jstack: bool = False
    ) -> ConsumerRunningInfo:
        return self._run(lambda: self._aio.consumer_running_info(group, client_id, broker=broker, jstack=jstack))

    def delete_acl_account(
        self, access_key: str, *, cluster: str | None = None, broker: str | None = None
    ) -> list[str]:
        return self._run(lambda: self._aio.delete_acl_account(access_key, cluster=cluster, broker=broker))

    def delete_kv_config(self, namespace: str, key: str) -> None:
        self._run(lambda: self._aio.delete_kv_config(namespace, key))

    def demote(
        self,
        broker_addr: str,
        master_addr: str,
        *,
        epoch: int | None = None,
        broker_id: int | None = None,
        master_ha_addr: str | None = None,
    ) -> RoleChange:
        return self._run(
            lambda: self._aio.demote(
                broker_addr, master_addr, epoch=epoch, broker_id=broker_id, master_ha_addr=master_ha_addr
            )
        )

    def elect_master(
        self, controller_addr: str, cluster: str, broker_name: str, broker_id: int | None = None
    ) -> ElectResult:
        return self._run(lambda: self._aio.elect_master(controller_addr, cluster, broker_name, broker_id))

    def epoch_cache(self, broker_addr: str) -> EpochCache:
        return self._run(lambda: self._aio.epoch_cache(broker_addr))

    def get_controller_metadata(self, controller_addr: str) -> ControllerMetadata:
        return self._run(lambda: self._aio.get_controller_metadata(controller_addr))

    def get_kv_config(self, namespace: str, key: str) -> str | None:
        return self._run(lambda: self._aio.get_kv_config(namespace, key))

    def get_sync_state_data(self, controller_addr: str, broker_names: Iterable[str]) -> dict[str, GroupSyncState]:
        broker_names = list(broker_names)
        return self._run(lambda: self._aio.get_sync_state_data(controller_addr, broker_names))

    def ha_status(self, broker_addr: str) -> HAStatus:
        return self._run(lambda: self._aio.ha_status(broker_addr))

    def kv_list(self, namespace: str) -> dict[str, str]:
        return self._run(lambda: self._aio.kv_list(namespace))

    def producer_connection(self, group: str, topic: str) -> tuple[Connection, ...]:
        return self._run(lambda: self._aio.producer_connection(group, topic))

    def promote(self, broker_addr: str, epoch: int | None = None) -> RoleChange:
        return self._run(lambda: self._aio.promote(broker_addr, epoch))

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        expression: str = "*",
        group: str = "TOOLS_CONSUMER",
    ) -> PullResult:
        return self._run(lambda: self._aio.pull(queue, offset, max_nums, expression=expression, group=group))

    def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        self._run(lambda: self._aio.put_kv_config(namespace, key, value))

    def query_message_by_offset(self, queue: MessageQueue, offset: int) -> MessageExt:
        return self._run(lambda: self._aio.query_message_by_offset(queue, offset))

    def query_messages_by_unique_key(self, topic: str, msg_id: str, *, max_num: int = 32) -> list[MessageExt]:
        return self._run(lambda: self._aio.query_messages_by_unique_key(topic, msg_id, max_num=max_num))

    def read_range(
        self,
        queue: MessageQueue,
        begin: int,
        end: int,
        *,
        expression: str = "*",
        limit: int | None = None,
        group: str = "TOOLS_CONSUMER",
    ) -> list[MessageExt]:
        return self._run(
            lambda: self._aio.read_range(queue, begin, end, expression=expression, limit=limit, group=group)
        )

    def reset_offset(self, group: str, topic: str, timestamp: int | _dt.datetime, *, force: bool = True) -> ResetResult:
        return self._run(lambda: self._aio.reset_offset(group, topic, timestamp, force=force))

    def topic_configs(self, broker: str) -> dict[str, dict[str, Any]]:
        return self._run(lambda: self._aio.topic_configs(broker))

    def topic_consumer_groups(self, topic: str) -> list[str]:
        return self._run(lambda: self._aio.topic_consumer_groups(topic))

    def topic_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(lambda: self._aio.topic_queues(topic))

    def update_acl_account(
        self,
        access_key: str,
        *,
        secret_key: str | None = None,
        white_remote_address: str | None = None,
        admin: bool | None = None,
        default_topic_perm: str | None = None,
        default_group_perm: str | None = None,
        topic_perms: Iterable[str] | None = None,
        group_perms: Iterable[str] | None = None,
        cluster: str | None = None,
        broker: str | None = None,
    ) -> list[str]:
        topic_perms = None if topic_perms is None else list(topic_perms)
        group_perms = None if group_perms is None else list(group_perms)
        return self._run(
            lambda: self._aio.update_acl_account(
                access_key,
                secret_key=secret_key,
                white_remote_address=white_remote_address,
                admin=admin,
                default_topic_perm=default_topic_perm,
                default_group_perm=default_group_perm,
                topic_perms=topic_perms,
                group_perms=group_perms,
                cluster=cluster,
                broker=broker,
            )
        )

    def update_broker_config(self, addr: str, changes: Mapping[str, str]) -> None:
        changes = dict(changes)
        self._run(lambda: self._aio.update_broker_config(addr, changes))

    def update_global_white_addrs(
        self, patterns: Iterable[str], *, cluster: str | None = None, broker: str | None = None
    ) -> list[str]:
        patterns = list(patterns)
        return self._run(lambda: self._aio.update_global_white_addrs(patterns, cluster=cluster, broker=broker))

    def update_order_conf(self, topic: str, conf: str, *, replace: bool = True) -> str:
        return self._run(lambda: self._aio.update_order_conf(topic, conf, replace=replace))

    def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        return self._run(lambda: self._aio.wipe_write_perm(broker_name))


class SyncSimpleConsumer(_Facade[SimpleConsumer]):
    """A blocking :class:`~cometmq.client.simple_consumer.SimpleConsumer` (POP consumption)."""

    _what = "simple consumer"

    def __init__(self, group: str, *, namesrv: str, invisible_duration: float = 30.0, await_duration: float = 20.0,
                 ordered: bool = False, consume_from: Literal["last", "first"] = "last", request_timeout: float = 3.0,
                 call_timeout: float | None = 60.0) -> None:
        super().__init__(lambda: SimpleConsumer(
            group, namesrv=namesrv, invisible_duration=invisible_duration, await_duration=await_duration,
            ordered=ordered, consume_from=consume_from, request_timeout=request_timeout), call_timeout)

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self._run(_in_loop(lambda: self._aio.subscribe(topic, expression, expression_type=expression_type)))

    def receive(self, max_messages: int = 16, invisible_duration: float | None = None,
                wait: float | None = None) -> list[ReceivedMessage]:
        wait_s = self._aio.await_ms / 1000 if wait is None else wait
        return self._run(lambda: self._aio.receive(max_messages, invisible_duration, wait), wait_s + _MARGIN)

    def ack(self, msg: ReceivedMessage) -> None:
        self._run(lambda: self._aio.ack(msg))

    def ack_many(self, msgs: Iterable[ReceivedMessage]) -> None:
        msgs = list(msgs)
        self._run(lambda: self._aio.ack_many(msgs))

    def change_invisible_duration(self, msg: ReceivedMessage, duration: float) -> ReceivedMessage:
        return self._run(lambda: self._aio.change_invisible_duration(msg, duration))
