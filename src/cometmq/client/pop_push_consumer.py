"""A push consumer on POP: ``PushConsumer(group, pop=True, ...)`` (or :class:`PopPushConsumer`).

Instead of rebalancing queues among the group's members and pulling each, it keeps ``receivers`` long-polling
POP requests open (see :mod:`cometmq.client.simple_consumer`): the broker shares out single messages, so any
number of consumers — more than there are queues — get work, and one slow consumer holds back only the
messages it has in hand. Each message goes to the listener (at most ``max_concurrency`` at once). While the
listener runs, the message's invisible time is renewed every ``invisible_duration / 2`` seconds
(``auto_renew``), so slow processing is not mistaken for a crash. CONSUME_SUCCESS acks it; RECONSUME_LATER (or
an exception) makes it invisible for a back-off (1 s, 5 s, 10 s, 30 s, then 60 s per attempt) after which the
broker delivers it again with ``reconsume_times`` + 1, up to the group's retry limit, then to ``%DLQ%<group>``.

``ordered=True``: each queue hands out its next message only after the previous one was acked; the messages
of one queue in a batch are consumed one after the other, and a failure holds back the rest of that queue's
batch until the failed message comes back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Literal

from cometmq.client.consume_types import ConsumerStats, ConsumeStatus, MessageListener, task_cancelled
from cometmq.client.errors import ClientStateError, InvalidArgumentError, MQClientError
from cometmq.client.instance import ClientInstance
from cometmq.client.simple_consumer import ReceivedMessage, SimpleConsumer
from cometmq.common.tasks import cancel_and_wait
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY

log = logging.getLogger(__name__)

__all__ = ["PopPushConsumer"]

#: invisible time after a failed attempt, by attempt number (the last repeats)
BACKOFF_S = (1.0, 5.0, 10.0, 30.0, 60.0)


class PopPushConsumer:
    def __init__(self, group: str, *, namesrv: str | None = None, instance: ClientInstance | None = None,
                 listener: MessageListener | None = None, max_concurrency: int = 20, batch_size: int = 32,
                 receivers: int = 1, invisible_duration: float = 30.0, long_polling_timeout: float = 15.0,
                 auto_renew: bool = True, ordered: bool = False, orderly: bool | None = None,
                 consume_from: Literal["last", "first"] = "last", close_timeout: float = 10.0,
                 max_inflated_body_size: int = DEFAULT_MAX_INFLATED_BODY, **ignored: Any) -> None:
        if ignored:
            log.debug("PopPushConsumer ignores pull-mode options %s", sorted(ignored))
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InvalidArgumentError(f"max_concurrency must be a positive integer, not {max_concurrency!r}")
        if not isinstance(receivers, int) or receivers < 1:
            raise InvalidArgumentError(f"receivers must be a positive integer, not {receivers!r}")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 1024:
            raise InvalidArgumentError(f"batch_size must be within 1..1024, not {batch_size!r}")
        self.ordered = bool(ordered or orderly)
        self.simple = SimpleConsumer(group, namesrv=namesrv, instance=instance,
                                     invisible_duration=invisible_duration, await_duration=long_polling_timeout,
                                     ordered=self.ordered, consume_from=consume_from,
                                     max_inflated_body_size=max_inflated_body_size)
        self.group = self.simple.group
        self.max_concurrency = max_concurrency
        self.batch_size = batch_size
        self.receivers = receivers
        self.invisible_duration = invisible_duration
        self.auto_renew = auto_renew
        self.close_timeout = close_timeout
        self.stats = ConsumerStats()
        self.renewed = 0
        self._listener: MessageListener | None = None
        self._listener_is_async = False
        if listener is not None:
            self.register_listener(listener)
        self._slots = asyncio.Semaphore(max_concurrency)
        self._busy = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._consuming: set[asyncio.Task[None]] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    # -- configuration --------------------------------------------------------------------------------------
    def register_listener(self, listener: MessageListener) -> MessageListener:
        if not callable(listener):
            raise InvalidArgumentError("the listener must be callable")
        self._listener = listener
        self._listener_is_async = inspect.iscoroutinefunction(listener)
        return listener

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self.simple.subscribe(topic, expression, expression_type=expression_type)

    async def unsubscribe(self, topic: str) -> None:
        self.simple.unsubscribe(topic)

    @property
    def instance(self) -> ClientInstance:
        return self.simple.instance

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        if self._listener is None:
            raise ClientStateError("register a listener before starting the consumer")
        self._loop = asyncio.get_running_loop()
        if not self._listener_is_async:
            self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=f"pop-{self.group}")
        await self.simple.start()
        self.started = True
        self._tasks = [asyncio.create_task(self._receive_loop(), name=f"pop-receive-{self.group}-{i}")
                       for i in range(self.receivers)]

    async def close(self) -> None:
        if not self.started:
            return
        self.started = False
        await cancel_and_wait(self._tasks)
        if self._consuming:
            _done, pending = await asyncio.wait(self._consuming, timeout=self.close_timeout)
            if pending:
                log.warning("%d listener calls of %s still running after %.0fs; their messages will be "
                            "redelivered", len(pending), self.group, self.close_timeout)
                await cancel_and_wait(list(pending))
        await self.simple.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> PopPushConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- receiving ------------------------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        """Receive and hand out messages until cancelled. Any failure of a receive (an SDK error, or anything else:
        a bug, an error the SDK did not map) is logged and retried after a back-off (0.5 s doubling up to 5 s): a
        loop that ended here would leave the consumer started and consuming nothing."""
        backoff = 0.5
        traced = False  # the traceback of an unexpected failure was logged since the last receive that worked
        while True:
            # Do not take more than the free listener slots: messages waiting here would only burn invisible time.
            while self._busy >= self.max_concurrency:
                await asyncio.sleep(0.005)
            want = min(self.batch_size, self.max_concurrency - self._busy)
            try:
                msgs = await self.simple.receive(want)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, MQClientError):
                    log.warning("POP receive of %s failed: %s; retrying in %.1fs", self.group, exc, backoff)
                else:  # the traceback once per run of failures, then a line per back-off
                    log.error("POP receive of %s raised %r; retrying in %.1fs", self.group, exc, backoff,
                              exc_info=None if traced else exc)
                    traced = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            traced = False
            if not msgs:
                continue
            self.stats.pulled += len(msgs)
            if self.ordered:
                by_queue: dict[tuple[str, int], list[ReceivedMessage]] = {}
                for m in msgs:
                    by_queue.setdefault((m.topic, m.handle.queue_id), []).append(m)
                for batch in by_queue.values():
                    await self._slots.acquire()
                    self._spawn(self._consume_in_order(batch))
            else:
                for m in msgs:
                    await self._slots.acquire()
                    self._spawn(self._consume_one(m))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._consuming.add(task)
        self._busy += 1

        def done(t: asyncio.Task[None]) -> None:
            self._consuming.discard(t)
            self._busy -= 1
            self._slots.release()

        task.add_done_callback(done)

    # -- consuming ------------------------------------------------------------------------------------------
    async def _consume_one(self, msg: ReceivedMessage, renewal: _Renewal | None = None) -> bool:
        """Call the listener on ``msg`` (its invisible time renewed meanwhile: by ``renewal``, else by one started
        here), then ack it or make it invisible for the back-off; True when it was acked."""
        if renewal is None and self.auto_renew:
            renewal = _Renewal(self, msg)
        try:
            status = await self._call_listener(msg)
        finally:
            if renewal is not None:
                await renewal.stop()
        try:
            if status is ConsumeStatus.CONSUME_SUCCESS:
                await self.simple.ack(msg)
                self.stats.consumed += 1
                return True
            self.stats.failed += 1
            delay = BACKOFF_S[min(msg.reconsume_times, len(BACKOFF_S) - 1)]
            await self.simple.change_invisible_duration(msg, delay)
            self.stats.retried += 1
        except MQClientError as exc:
            log.warning("settling message %s of %s failed: %s (it will be redelivered)", msg.msg_id, self.group, exc)
        return False

    async def _consume_in_order(self, msgs: list[ReceivedMessage]) -> None:
        # The messages waiting their turn are renewed too: else their invisible time could pass meanwhile, and the
        # broker would hand them out again (consumed twice, alongside and out of order).
        renewals = [_Renewal(self, m) if self.auto_renew else None for m in msgs]
        try:
            for i, m in enumerate(msgs):
                if not await self._consume_one(m, renewals[i]):
                    # Hold the rest back until the failed one comes back: same back-off, so they stay behind it.
                    delay = BACKOFF_S[min(m.reconsume_times, len(BACKOFF_S) - 1)]
                    for rest, renewal in zip(msgs[i + 1:], renewals[i + 1:], strict=True):
                        if renewal is not None:
                            await renewal.stop()
                        try:
                            await self.simple.change_invisible_duration(rest, delay)
                        except MQClientError:
                            pass
                    return
        finally:
            for renewal in renewals:  # (all stopped, unless this was cancelled)
                if renewal is not None:
                    renewal.task.cancel()

    async def _renew(self, msg: ReceivedMessage, done: asyncio.Event) -> None:
        """Renew the message's invisible time every half of it until ``done`` is set."""
        period = max(self.invisible_duration / 2, 0.05)
        while True:
            try:
                async with asyncio.timeout(period):
                    await done.wait()
                return
            except TimeoutError:
                pass
            try:
                await self.simple.change_invisible_duration(msg, self.invisible_duration)
                self.renewed += 1
            except MQClientError as exc:
                log.warning("renewing the invisible time of %s failed: %s", msg.msg_id, exc)
                return

    async def _call_listener(self, msg: ReceivedMessage) -> ConsumeStatus:
        listener = self._listener
        assert listener is not None
        try:
            if self._listener_is_async:
                result = await listener([msg.message])
            else:
                assert self._loop is not None
                result = await self._loop.run_in_executor(self._executor, listener, [msg.message])
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            if task_cancelled():
                raise
            # the listener's own (it awaited something cancelled): a failure as any other, not the consumer closing
            log.exception("the listener of %s raised CancelledError on message %s; it will be consumed again",
                          self.group, msg.msg_id)
            return ConsumeStatus.RECONSUME_LATER
        except Exception:
            log.exception("the listener of %s raised on message %s; it will be consumed again", self.group,
                          msg.msg_id)
            return ConsumeStatus.RECONSUME_LATER
        if result is None or result is ConsumeStatus.CONSUME_SUCCESS:
            return ConsumeStatus.CONSUME_SUCCESS
        return ConsumeStatus.RECONSUME_LATER

    def __repr__(self) -> str:
        return f"<PopPushConsumer {self.group} {'running' if self.started else 'stopped'}>"


class _Renewal:
    """The renewal of one message's invisible time while it is consumed or waits its turn."""

    __slots__ = ("done", "task")

    def __init__(self, consumer: PopPushConsumer, msg: ReceivedMessage) -> None:
        self.done = asyncio.Event()
        self.task = asyncio.create_task(consumer._renew(msg, self.done))

    async def stop(self) -> None:
        """Stop renewing. Not by cancelling: a renewal on its way brings the new receipt handle the ack needs (the
        broker makes the old one stale as soon as it renews)."""
        self.done.set()
        try:
            await asyncio.wait([self.task])
        except asyncio.CancelledError:
            self.task.cancel()
            raise
