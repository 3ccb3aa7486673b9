"""The concurrent half of a :class:`~cometmq.client.push_consumer.PushConsumer` (RocketMQ's
ConsumeMessageConcurrentlyService): listener calls of ``batch_max_size`` messages, at most ``max_concurrency``
at once, RECONSUME_LATER sent back to the broker for redelivery.

There is no pool of worker tasks: a pull whose answer brings messages runs the first listener call in its own
task once the next pull is scheduled (``run_here``), further calls start in new tasks while slots are free, the
rest wait in a backlog that a call takes from when it ends. So a message reaches the listener in the loop turn
its answer arrived in, with no hand-off between tasks.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from cometmq.client.consume_types import ConsumeStatus, task_cancelled
from cometmq.client.message import MessageExt
from cometmq.client.process_queue import PullRequest
from cometmq.common.tasks import cancel_and_wait

if TYPE_CHECKING:
    from cometmq.client.push_consumer import PushConsumer

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False, slots=True)
class ConsumeRequest:
    req: PullRequest
    msgs: list[MessageExt]


class ConcurrentConsumeService:
    def __init__(self, consumer: PushConsumer) -> None:
        self.consumer = consumer
        #: listener calls waiting for one of the ``max_concurrency`` slots
        self._backlog: collections.deque[ConsumeRequest] = collections.deque()
        #: the tasks running listener calls (each takes from the backlog when its call ends) and their number
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight = 0
        #: local retries of messages whose send-back failed
        self._retry_timers: set[asyncio.TimerHandle] = set()

    def requests_of(self, req: PullRequest, msgs: list[MessageExt]) -> list[ConsumeRequest]:
        """The listener calls for ``msgs``: ``batch_max_size`` messages each."""
        n = self.consumer.batch_max_size
        if len(msgs) <= n:
            return [ConsumeRequest(req, msgs)]
        return [ConsumeRequest(req, msgs[i:i + n]) for i in range(0, len(msgs), n)]

    def submit(self, req: PullRequest, msgs: list[MessageExt]) -> None:
        """Consume ``msgs`` (a local retry): in new tasks while slots are free, the rest when slots free up."""
        first = self.take_slot(self.requests_of(req, msgs))
        if first is not None:
            self._spawn(first)

    def run_first(self, req: PullRequest, msgs: list[MessageExt]) -> Coroutine[Any, Any, None] | None:
        """``msgs`` just pulled: their listener calls (``requests_of``) started or queued as ``take_slot`` does them,
        and the first, when it got a slot, as the coroutine the pulling task awaits at once (``run_here``); None when
        no slot was free."""
        first = self.take_slot(self.requests_of(req, msgs))
        return None if first is None else self.run_here(first)

    def take_slot(self, requests: list[ConsumeRequest]) -> ConsumeRequest | None:
        """Start or queue ``requests`` (at most ``max_concurrency`` listener calls run at once): returns the
        first, whose slot the caller now holds and must run (``run_here``); the others that get a slot run in
        new tasks; the rest wait in the backlog. None when no slot is free."""
        first: ConsumeRequest | None = None
        limit = self.consumer.max_concurrency
        for creq in requests:
            if self._inflight >= limit:
                self._backlog.append(creq)
            elif first is None:
                self._inflight += 1
                first = creq
            else:
                self._inflight += 1
                self._spawn(creq)
        return first

    def run_here(self, creq: ConsumeRequest) -> Coroutine[Any, Any, None]:
        """Run ``creq`` (its slot taken) and then the backlog in the current task, which closing waits for: the
        coroutine to await at once (``_run`` itself, no coroutine around it)."""
        task = asyncio.current_task(self.consumer._loop)  # (the loop named: no get_running_loop, no getpid call)
        assert task is not None
        self._tasks.add(task)
        return self._run(creq, task)

    def _spawn(self, creq: ConsumeRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._run(creq), name=f"consume-{self.consumer.group}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, creq: ConsumeRequest, here: asyncio.Task[Any] | None = None) -> None:
        """Run ``creq`` in the slot taken for it, then what waits in the backlog; frees the slot at the end (and
        forgets ``here``, the task of ``run_here``: not a done callback, the task does nothing after this)."""
        try:
            while True:
                try:
                    await self._consume(creq)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("consuming %d messages of %s failed", len(creq.msgs), creq.req.mq)
                if not self._backlog or self.consumer._closing:
                    return
                creq = self._backlog.popleft()
        finally:
            self._inflight -= 1
            if here is not None:
                self._tasks.discard(here)

    async def stop(self, timeout: float) -> None:
        """Drop the local retries and the backlog (their messages stay uncommitted and come again), let the
        running listener calls end (up to ``timeout``), then cancel what is left."""
        for handle in self._retry_timers:
            handle.cancel()
        self._retry_timers.clear()
        self._backlog.clear()
        running = list(self._tasks)
        if running:
            _, stuck = await asyncio.wait(running, timeout=timeout)
            if stuck:
                log.warning("%d listener calls of %s still running after %.1fs; closing anyway", len(stuck),
                            self.consumer.group, timeout)
                await cancel_and_wait(stuck)

    async def _consume(self, creq: ConsumeRequest) -> None:
        c = self.consumer
        req, msgs = creq.req, creq.msgs
        pq = req.pq
        if pq.dropped:
            return  # the queue went to another consumer, which starts from the committed offset
        status = await self._call_listener(msgs)
        if status is ConsumeStatus.CONSUME_SUCCESS:
            c.stats.consumed += len(msgs)
            done = msgs
        else:
            c.stats.failed += len(msgs)
            if pq.dropped:
                return
            if c.clustering:
                sent = await asyncio.gather(*(c._send_back(m) for m in msgs))
                done = [m for m, ok in zip(msgs, sent, strict=True) if ok]
                c.stats.retried += len(done)
                again = [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1)
                         for m, ok in zip(msgs, sent, strict=True) if not ok]
                if again:
                    c.stats.send_back_failed += len(again)
                    self._consume_later(req, again)
            else:
                log.warning("broadcasting consumer %s dropped %d messages its listener asked to have again "
                            "(broadcast messages are not redelivered)", c.group, len(msgs))
                done = msgs
        if not pq.dropped:
            c.offset_store.update(req.mq, pq.remove(done))

    async def _call_listener(self, msgs: list[MessageExt]) -> ConsumeStatus:
        c = self.consumer
        listener = c._listener
        assert listener is not None
        try:
            if c._listener_is_async:
                result = await listener(list(msgs))
            else:
                result = await asyncio.get_running_loop().run_in_executor(c._executor, listener, list(msgs))
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            if task_cancelled():
                raise
            # Raised on, it would leave the messages in flight for good, the queue's offset held below them.
            log.exception("the listener of %s raised CancelledError on %d messages (first %s); they will be "
                          "consumed again", c.group, len(msgs), msgs[0].msg_id if msgs else "-")
            return ConsumeStatus.RECONSUME_LATER
        except Exception:
            log.exception("the listener of %s raised on %d messages (first %s); they will be consumed again",
                          c.group, len(msgs), msgs[0].msg_id if msgs else "-")
            return ConsumeStatus.RECONSUME_LATER
        if result is None or result is ConsumeStatus.CONSUME_SUCCESS:
            return ConsumeStatus.CONSUME_SUCCESS
        if result is not ConsumeStatus.RECONSUME_LATER:
            log.warning("the listener of %s returned %r, not a ConsumeStatus: taken as RECONSUME_LATER", c.group,
                        result)
        return ConsumeStatus.RECONSUME_LATER

    def _consume_later(self, req: PullRequest, msgs: list[MessageExt]) -> None:
        def fire() -> None:
            self._retry_timers.discard(handle)
            if not req.pq.dropped and not self.consumer._closing:
                self.submit(req, msgs)

        handle = asyncio.get_running_loop().call_later(self.consumer.local_retry_delay, fire)
        self._retry_timers.add(handle)
