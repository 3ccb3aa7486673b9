"""Orderly consumption for the push consumer: broker queue locks, one batch at a time per queue, in offset order.

RocketMQ keeps the messages of one business key in order by sending them to one queue (a selector on the
key, :meth:`Producer.send_orderly`) and by letting only one consumer of the group consume a queue at a
time. That one is the consumer holding the queue's lock on the queue's master broker (LOCK_BATCH_MQ /
UNLOCK_BATCH_MQ; the broker forgets a lock not renewed for ``lockMaxLiveTime``, 60 s by default).

How a consumer built with ``PushConsumer(..., orderly=True)`` (or :class:`OrderlyPushConsumer`) runs::

    rebalance assigns a queue ──▶ pending ──LOCK_BATCH_MQ granted──▶ read the committed offset ──▶ pull + consume
           (at once: the lock keeper is woken; a refused lock is tried       │ one batch at a time, in offset order;
            again after 0.05 s, doubling up to 0.5 s — not at the next 20 s  │ SUSPEND puts the batch back and waits
            round, unlike RocketMQ #2621/#5465)                              ▼
    rebalance takes it away ──▶ stop ──(the batch in flight ends)──▶ commit the offset ──▶ UNLOCK_BATCH_MQ

- Locks are renewed every ``lock_renew_interval`` (20 s). A queue whose grant is older than ``lock_expiry``
  (30 s, below the broker's 60 s) is not consumed until renewed; one the broker no longer grants (another
  consumer has it), or whose broker connection dropped (the broker then frees the lock), is reset: its
  pulled messages are discarded, its uncommitted progress is *not* committed, and it starts again from the
  committed offset once it is locked again (a contiguous replay, never a gap or a reordering).
- Giving a queue up waits up to ``unlock_wait`` (1 s) for a batch in the listener; after that the unlock is
  delayed until the batch ends (RocketMQ's unlockDelay) — the lock is still renewed meanwhile, so no other
  consumer can start the queue while this one is still in it. Closing unlocks everything at once.
- The listener gets ``(msgs)`` or ``(msgs, context)`` (:class:`ConsumeOrderlyContext`) and returns a
  :class:`ConsumeOrderlyStatus` (a :class:`ConsumeStatus` or None are understood too; an exception counts as
  SUSPEND_CURRENT_QUEUE_A_MOMENT). With auto-commit (the default) SUCCESS commits the batch; with
  ``auto_commit=False`` (or ``context.auto_commit = False``) SUCCESS only moves on, COMMIT commits everything
  consumed so far and ROLLBACK puts everything since the last commit back to be consumed again.
- SUSPEND_CURRENT_QUEUE_A_MOMENT retries the batch in place after ``context.suspend_current_queue_time_ms``
  or, when the listener did not set one, after ``suspend_time_ms`` doubled per attempt (up to 30 s), by
  default without limit (``max_reconsume_times`` -1: Integer.MAX_VALUE, as RocketMQ's orderly consumers). Given
  a limit, a message still failing after ``max_reconsume_times`` retries goes, by ``orderly_give_up``, to the group's
  dead-letter topic ("dlq", the default), to the retry topic ("retry", CLUSTERING only: it comes back later, out
  of order), or is retried forever ("never": the C++ client's behaviour). Each give-up is logged and counted in
  ``stats.given_up``, so one bad message does not block its queue unnoticed.
- BROADCASTING consumers keep the per-queue order but take no locks (every consumer reads every queue).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from cometmq.client.consume_types import task_cancelled
from cometmq.client.errors import NoRouteError
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.client.process_queue import ProcessQueue, PullRequest
from cometmq.common.tasks import cancel_and_wait
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import LockBatchBody, decode_lock_ok
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request

if TYPE_CHECKING:
    from cometmq.client.push_consumer import PushConsumer

log = logging.getLogger(__name__)

__all__ = ["GIVE_UP_POLICIES", "ConsumeOrderlyContext", "ConsumeOrderlyStatus", "OrderlyService"]

#: what happens to a message still failing after ``max_reconsume_times`` local retries
GIVE_UP_POLICIES = ("dlq", "retry", "never")

_SUSPEND_MIN_MS = 10
_SUSPEND_MAX_MS = 30_000


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener returns for its batch."""

    SUCCESS = "SUCCESS"
    #: auto-commit off: put back everything consumed since the last commit and consume it again (after the
    #: suspend time)
    ROLLBACK = "ROLLBACK"
    #: auto-commit off: commit everything consumed so far (this batch included)
    COMMIT = "COMMIT"
    #: consume this batch again after a moment; the queue waits (its order is kept)
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclasses.dataclass
class ConsumeOrderlyContext:
    """Handed to an orderly listener that takes a second argument; it may change the two settings."""

    queue: MessageQueue
    #: commit after each successful batch; False gives the listener COMMIT / ROLLBACK
    auto_commit: bool = True
    #: how long SUSPEND_CURRENT_QUEUE_A_MOMENT / ROLLBACK wait (ms); -1: the consumer's back-off
    suspend_current_queue_time_ms: int = -1


def _wants_context(listener: Any) -> bool:
    """Does the listener take ``(msgs, context)`` rather than ``(msgs)``?"""
    try:
        params = inspect.signature(listener).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


class OrderlyService:
    """The orderly half of a :class:`PushConsumer`: its lock keeper and one consume task per queue."""

    #: renew every held lock this often (RocketMQ: 20 s)
    lock_renew_interval = 20.0
    #: consume a queue only while its last grant is at most this old (s); must stay below the broker's lifetime
    lock_expiry = 30.0
    #: a refused or failed lock is tried again after this delay, doubling up to the max
    lock_retry_delay = 0.05
    lock_retry_delay_max = 0.5
    #: giving a queue up waits this long for a batch in the listener before delaying the unlock
    unlock_wait = 1.0
    #: the suspend back-off stops doubling here (s)
    suspend_backoff_max = 30.0

    def __init__(self, consumer: PushConsumer) -> None:
        self.c = consumer
        self._sem = asyncio.Semaphore(consumer.max_concurrency)
        self._wake = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._retry = self.lock_retry_delay
        self._renew_due = False
        #: queues given up (or reset) whose batch in flight has not ended yet; they are not started again
        #: until it has, and are still renewed (if held) so that nobody else starts them meanwhile
        self._releasing: dict[MessageQueue, PullRequest] = {}
        self._release_tasks: set[asyncio.Task[None]] = set()
        self._watched: set[RemotingConnection] = set()
        self._wants_context = False
        self._warned_auto_commit = False
        #: offsets the broker reset queues to: where they start once locked again (not read back from the broker,
        #: where a commit of this consumer's old position sent before the notice came may have landed after them)
        self._reset_to: dict[MessageQueue, int] = {}

    # -- state ----------------------------------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def lock_valid(self, pq: ProcessQueue) -> bool:
        return not self.c.clustering or pq.lock_valid(self._now(), self.lock_expiry)

    @property
    def consuming(self) -> frozenset[MessageQueue]:
        """The queues this consumer holds the lock of and consumes now."""
        return frozenset(mq for mq, req in self.c._requests.items() if req.started and self.lock_valid(req.pq))

    def _pending(self) -> list[PullRequest]:
        """Assigned queues to lock: not started yet, or started with a grant too old to consume on."""
        return [req for mq, req in self.c._requests.items()
                if mq not in self._releasing and (not req.started or not self.lock_valid(req.pq))]

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        listener = self.c.listener
        self._wants_context = listener is not None and _wants_context(listener)
        self._keeper = asyncio.create_task(self._keep_locks(), name=f"locks-{self.c.group}")

    async def close(self) -> None:
        """Stop everything, let batches in the listener end (up to ``close_timeout``), commit, unlock at once."""
        c = self.c
        await cancel_and_wait([self._keeper])
        self._keeper = None
        reqs = list(c._requests.values())
        for req in reqs:
            req.pq.dropped = True
            req.cancel()
            req.wake.set()
        await cancel_and_wait([req.task for req in reqs])
        busy = [t for req in reqs
                if (t := req.consume_task) is not None and not t.done() and req.pq.consume_lock.locked()]
        await cancel_and_wait([t for req in reqs if (t := req.consume_task) is not None and t not in busy])
        waiting = busy + list(self._release_tasks)
        if waiting:
            _, stuck = await asyncio.wait(waiting, timeout=c.close_timeout)
            if stuck:
                log.warning("%d orderly batches of %s still running after %.1fs; closing anyway", len(stuck), c.group,
                            c.close_timeout)
                await cancel_and_wait(stuck)
        held = [req for req in [*reqs, *self._releasing.values()] if req.pq.locked]
        # Only offsets of queues still validly locked are committed: an older grant may have passed to another
        # consumer, whose progress a stale commit would undo.
        await c.offset_store.persist([req.mq for req in held if req.started and self.lock_valid(req.pq)])
        for req in reqs:
            c.offset_store.remove(req.mq)
        if c.clustering:
            await self._unlock([req.mq for req in held])
        for req in held:
            req.pq.locked = False
        self._releasing.clear()

    # -- assignment (called by the rebalancer, through PushConsumer) ----------------------------------------
    async def apply(self, topic: str, queues: list[MessageQueue]) -> bool:
        c = self.c
        wanted = set(queues)
        removed = [mq for mq in c._requests if mq.topic == topic and mq not in wanted]
        if removed:
            await asyncio.gather(*(self.drop(mq) for mq in removed))
        added = sorted(mq for mq in wanted if mq not in c._requests)
        if c._closing:
            return True
        for mq in added:
            c._requests[mq] = PullRequest(mq, ProcessQueue(0), 0)
        if added:
            self._retry = self.lock_retry_delay
            self._wake.set()  # lock (and start) them now, not at the next periodic round
        if added or removed:
            log.info("%s was assigned %d queues of %s and gave up %d; it now has %d (consuming those it can lock)",
                     c.group, len(added), topic, len(removed), sum(1 for mq in c._requests if mq.topic == topic))
        return True

    async def drop(self, mq: MessageQueue) -> None:
        """Give a queue up: stop pulling and consuming, commit, then unlock (once a batch in flight ended)."""
        c = self.c
        req = c._requests.pop(mq, None)
        self._reset_to.pop(mq, None)  # its next owner reads the reset offset the broker committed
        if req is None:
            return
        pq = req.pq
        pq.dropped = True
        req.cancel()
        req.wake.set()
        task = req.consume_task
        if task is not None and not task.done() and pq.consume_lock.locked():
            done, _ = await asyncio.wait([task], timeout=self.unlock_wait)
            if not done:
                pq.try_unlock_times += 1
                log.info("%s: a batch of %s/%s/%d is still in the listener; unlocking it when that ends", c.group,
                         mq.topic, mq.broker_name, mq.queue_id)
                self._release_later(req, unlock=True)
                return
        else:
            await cancel_and_wait([task])
        await self._release(req)

    async def _release(self, req: PullRequest) -> None:
        """Commit the queue's offset and unlock it (only if the lock is still ours)."""
        mq, pq = req.mq, req.pq
        if not pq.locked:
            return
        try:
            if req.started and self.lock_valid(pq):
                await self.c.offset_store.persist([mq])
        finally:
            self.c.offset_store.remove(mq)
            pq.locked = False
            if self.c.clustering:
                await self._unlock([mq])

    def _release_later(self, req: PullRequest, *, unlock: bool) -> None:
        """Wait (in the background) for the queue's batch in flight to end, then release it if ``unlock``."""
        mq = req.mq
        self._releasing[mq] = req

        async def finish() -> None:
            try:
                if req.consume_task is not None:
                    await asyncio.wait([req.consume_task])
                if unlock:
                    await self._release(req)
            finally:
                if self._releasing.get(mq) is req:
                    del self._releasing[mq]
                self._wake.set()

        task = asyncio.create_task(finish(), name=f"release-{mq.topic}-{mq.queue_id}")
        self._release_tasks.add(task)
        task.add_done_callback(self._release_tasks.discard)

    def reset_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """The broker reset and committed these queues' offsets: each one being consumed stops, forgets what it
        pulled and its uncommitted progress, and starts again from the new offset once it is locked again (and
        commits it: as RocketMQ's client, which puts the reset offsets in its offset store)."""
        for mq, offset in sorted(offsets.items()):
            req = self.c._requests.get(mq)
            if req is None or offset < 0:
                continue
            self._reset_to[mq] = offset
            if req.started:
                self._reset(req, "its offset was reset", lock_lost=False)

    def _reset(self, req: PullRequest, why: str, *, lock_lost: bool = True) -> None:
        """The lock is lost: stop the queue, forget its uncommitted progress, and wait to lock it again."""
        c = self.c
        mq, pq = req.mq, req.pq
        if c._requests.get(mq) is not req:
            return
        if lock_lost:
            self._reset_to.pop(mq, None)  # whoever had the lock meanwhile may have moved on from it
            c.stats.locks_lost += 1
            log.warning("%s lost the lock of %s/%s/%d (%s): it stops consuming the queue until it locks it again",
                        c.group, mq.topic, mq.broker_name, mq.queue_id, why)
        else:
            log.info("%s restarts %s/%s/%d (%s): from the committed offset once it is locked again", c.group,
                     mq.topic, mq.broker_name, mq.queue_id, why)
        pq.locked = False
        pq.dropped = True
        req.cancel()
        req.wake.set()
        c.offset_store.remove(mq)  # what was consumed since the last commit is consumed again (in order)
        c._requests[mq] = PullRequest(mq, ProcessQueue(0), 0)
        task = req.consume_task
        if task is not None and not task.done():
            if pq.consume_lock.locked():
                self._release_later(req, unlock=False)
            else:
                task.cancel()
        self._retry = self.lock_retry_delay
        self._wake.set()

    # -- locks ----------------------------------------------------------------------------------------------
    async def _keep_locks(self) -> None:
        loop = asyncio.get_running_loop()
        next_renew = loop.time() + self.lock_renew_interval
        while True:
            timeout = max(0.0, next_renew - loop.time())
            if self._pending() or self._renew_due:
                timeout = min(timeout, self._retry)
            if timeout > 0:
                try:
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            try:
                if loop.time() >= next_renew or self._renew_due:
                    next_renew = loop.time() + self.lock_renew_interval
                    await self.lock_all()
                    if self._renew_due:  # a broker did not answer: try again, less and less often
                        self._retry = min(self._retry * 2, self.lock_retry_delay_max)
                else:
                    pending = self._pending()
                    if pending and not await self.lock([req.mq for req in pending]):
                        self._retry = min(self._retry * 2, self.lock_retry_delay_max)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the lock keeper of %s failed; going on", self.c.group)

    async def lock_all(self) -> None:
        """Lock (renew) every assigned queue, and those given up whose batch is still in the listener."""
        mqs = list(self.c._requests) + [mq for mq, req in self._releasing.items() if req.pq.locked]
        self._renew_due = False
        if mqs:
            await self.lock(mqs)

    async def lock(self, mqs: Iterable[MessageQueue]) -> bool:
        """LOCK_BATCH_MQ to each queue's master, then act on the answers; True when some queue was granted."""
        by_broker: dict[str, list[MessageQueue]] = defaultdict(list)
        for mq in dict.fromkeys(mqs):
            by_broker[mq.broker_name].append(mq)
        results = await asyncio.gather(*(self._lock_on(name, group) for name, group in by_broker.items()))
        return any(results)

    async def _lock_on(self, broker_name: str, mqs: list[MessageQueue]) -> bool:
        c = self.c
        sent_at = self._now()
        granted: frozenset[MessageQueue] | None
        if not c.clustering:
            granted = frozenset(mqs)
        else:
            try:
                addr = await self._master(broker_name, mqs[0].topic)
                # Watch the connection before the grant can arrive on it: when it closes, the broker frees the
                # locks it granted there, so they must be given up here too.
                conn = await c.instance.remoting.get_connection(addr, c.instance.request_timeout)
                self._watch(conn, addr, broker_name)
                body = LockBatchBody(c.group, c.instance.client_id, frozenset(mqs)).encode()
                response = await c.instance.invoke_ok(addr, make_request(RequestCode.LOCK_BATCH_MQ, {}, body),
                                                      context=f"lock {len(mqs)} queues of {c.group}")
                if conn.closed:
                    raise ConnectionError(f"the connection to {addr} closed while locking")
                granted = decode_lock_ok(response.body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no route, no answer, an error code, a bad body
                log.warning("locking %d queues of %s on %s failed: %s", len(mqs), c.group, broker_name, exc)
                granted = None
                self._renew_due = True  # renew again soon, not in 20 s
        return await self._on_lock_answer(mqs, granted, sent_at)

    async def _on_lock_answer(self, mqs: list[MessageQueue], granted: frozenset[MessageQueue] | None,
                              sent_at: float) -> bool:
        c = self.c
        now = self._now()
        to_start: list[PullRequest] = []
        unwanted: list[MessageQueue] = []
        for mq in mqs:
            req = c._requests.get(mq)
            if req is None:
                releasing = self._releasing.get(mq)
                if releasing is not None and releasing.pq.locked:
                    if granted is not None and mq in granted:
                        releasing.pq.last_lock_time = sent_at
                    elif granted is not None:
                        releasing.pq.locked = False  # someone else has it: the batch's result is not committed
                elif granted is not None and mq in granted and mq not in self._releasing:
                    unwanted.append(mq)  # given up while the request was on its way
                continue
            pq = req.pq
            if granted is None:
                if req.started and not pq.lock_valid(now, self.lock_expiry):
                    self._reset(req, f"not renewed for {self.lock_expiry:.0f}s")
                continue
            if mq in granted:
                pq.locked = True
                pq.last_lock_time = sent_at
                if req.started:
                    req.wake.set()  # it may have paused on an old grant
                elif mq not in self._releasing:  # (else: once the last batch of its previous run has ended)
                    to_start.append(req)
            elif req.started:
                self._reset(req, "the broker did not renew it: another consumer holds it")
            else:
                pq.locked = False
                self._reset_to.pop(mq, None)  # the holder consumes it from the reset offset the broker committed
                log.debug("%s/%d of %s is locked by another consumer; trying again soon", mq.topic, mq.queue_id,
                          c.group)
        if unwanted and c.clustering:
            await self._unlock(unwanted)
        if to_start:
            self._retry = self.lock_retry_delay
            await asyncio.gather(*(self._start(req) for req in to_start))
        return bool(granted)

    async def _master(self, broker_name: str, topic: str) -> str:
        instance = self.c.instance
        addr = instance.master_addr(broker_name)
        if addr is None:
            await instance.route(topic, refresh=True)
            addr = instance.master_addr(broker_name)
        if addr is None:
            raise NoRouteError(f"no master address for broker {broker_name}")
        return addr

    def _watch(self, conn: RemotingConnection, addr: str, broker_name: str) -> None:
        """When the connection to a broker drops, the broker frees this client's locks: drop them here too."""
        if conn in self._watched:
            return
        self._watched.add(conn)

        def closed(conn: RemotingConnection) -> None:
            self._watched.discard(conn)
            if self.c._closing or not self.c.started:
                return
            for req in list(self.c._requests.values()):
                if req.mq.broker_name == broker_name:
                    if req.started:
                        self._reset(req, f"the connection to {addr} closed")
                    else:
                        req.pq.locked = False
            for req in self._releasing.values():
                if req.mq.broker_name == broker_name:
                    req.pq.locked = False

        conn.add_close_callback(closed)

    async def _unlock(self, mqs: Iterable[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ to each queue's master (failures are logged: the broker's expiry frees them)."""
        c = self.c
        by_broker: dict[str, list[MessageQueue]] = defaultdict(list)
        for mq in dict.fromkeys(mqs):
            by_broker[mq.broker_name].append(mq)

        async def one(broker_name: str, group: list[MessageQueue]) -> None:
            try:
                addr = await self._master(broker_name, group[0].topic)
                body = LockBatchBody(c.group, c.instance.client_id, frozenset(group)).encode()
                await c.instance.invoke_ok(addr, make_request(RequestCode.UNLOCK_BATCH_MQ, {}, body),
                                           context=f"unlock {len(group)} queues of {c.group}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("unlocking %d queues of %s on %s failed: %s (they expire on the broker)", len(group),
                            c.group, broker_name, exc)
            else:
                log.info("%s unlocked %s on %s", c.group, ", ".join(f"{q.topic}/{q.queue_id}" for q in group),
                         broker_name)

        await asyncio.gather(*(one(name, group) for name, group in by_broker.items()))

    async def _start(self, req: PullRequest) -> None:
        """The queue is locked: read where it starts (after the lock: the last owner committed before unlocking)."""
        c = self.c
        mq = req.mq
        reset_to = self._reset_to.get(mq)
        try:
            start = reset_to if reset_to is not None else await c._start_offset(mq)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("cannot find where %s starts in %s/%s/%d: %s (trying again soon)", c.group, mq.topic,
                        mq.broker_name, mq.queue_id, exc)
            self._renew_due = True
            return
        if c._requests.get(mq) is not req or req.pq.dropped or req.started or c._closing or mq in self._releasing:
            return
        if reset_to is not None and self._reset_to.get(mq) == reset_to:
            del self._reset_to[mq]
        c.offset_store.update(mq, start, increase_only=False)
        req.next_offset = start
        req.pq.next_offset = start
        req.started = True
        req.consume_task = asyncio.create_task(self._consume_loop(req), name=f"orderly-{mq.topic}-{mq.queue_id}")
        c._pull_now(req)
        log.info("%s locked %s/%s/%d and consumes it from offset %d", c.group, mq.topic, mq.broker_name, mq.queue_id,
                 start)

    # -- consuming ------------------------------------------------------------------------------------------
    def submit(self, req: PullRequest) -> None:
        """New messages arrived for the queue."""
        req.wake.set()

    async def _consume_loop(self, req: PullRequest) -> None:
        pq = req.pq
        c = self.c
        while not pq.dropped:
            await req.wake.wait()
            req.wake.clear()
            while not pq.dropped:
                if not self.lock_valid(pq):
                    log.info("the lock of %s/%d (%s) is %s: consuming it waits", req.mq.topic, req.mq.queue_id,
                             c.group, "old" if pq.locked else "gone")
                    self._renew_due = True
                    self._wake.set()
                    break
                msgs = pq.take(c.batch_max_size)
                if not msgs:
                    break
                try:
                    delay = await self._consume_batch(req, msgs)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug here must not stop the queue for good
                    log.exception("consuming %d messages of %s/%d for %s failed; consuming them again", len(msgs),
                                  req.mq.topic, req.mq.queue_id, c.group)
                    pq.rollback()
                    delay = c.suspend_time_ms / 1000
                if delay is not None and not pq.dropped:
                    await asyncio.sleep(delay)

    async def _consume_batch(self, req: PullRequest, msgs: list[MessageExt]) -> float | None:
        """Consume one batch and act on the answer; returns how long the queue waits before the next, if it must."""
        pq = req.pq
        c = self.c
        async with self._sem, pq.consume_lock:
            if pq.dropped:
                pq.rollback()
                return None
            ctx = ConsumeOrderlyContext(req.mq, auto_commit=c.auto_commit)
            status = await self._call_listener(msgs, ctx)
            return await self._on_result(req, msgs, status, ctx)

    async def _call_listener(self, msgs: list[MessageExt], ctx: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        c = self.c
        listener = c.listener
        assert listener is not None
        args: tuple[Any, ...] = (list(msgs), ctx) if self._wants_context else (list(msgs),)
        try:
            if c._listener_is_async:
                result = await listener(*args)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(c._executor, functools.partial(listener, *args))
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            if task_cancelled():
                raise
            # Raised on, it would end the queue's consume task: the queue held, never consumed again.
            log.exception("the orderly listener of %s raised CancelledError on %d messages of %s/%d (first offset "
                          "%d); the queue waits and consumes them again", c.group, len(msgs), ctx.queue.topic,
                          ctx.queue.queue_id, msgs[0].queue_offset)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        except Exception:
            log.exception("the orderly listener of %s raised on %d messages of %s/%d (first offset %d); the queue "
                          "waits and consumes them again", c.group, len(msgs), ctx.queue.topic, ctx.queue.queue_id,
                          msgs[0].queue_offset)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return self._status(result)

    def _status(self, result: Any) -> ConsumeOrderlyStatus:
        from cometmq.client.push_consumer import ConsumeStatus

        if result is None or result is ConsumeStatus.CONSUME_SUCCESS:
            return ConsumeOrderlyStatus.SUCCESS
        if isinstance(result, ConsumeOrderlyStatus):
            return result
        if result is not ConsumeStatus.RECONSUME_LATER:
            log.warning("the orderly listener of %s returned %r, not a ConsumeOrderlyStatus: taken as "
                        "SUSPEND_CURRENT_QUEUE_A_MOMENT", self.c.group, result)
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    async def _on_result(self, req: PullRequest, msgs: list[MessageExt], status: ConsumeOrderlyStatus,
                         ctx: ConsumeOrderlyContext) -> float | None:
        c = self.c
        pq = req.pq
        n = len(msgs)
        if status is ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT:
            c.stats.failed += n
            again = await self._retry_or_give_up(req, msgs)
            if again:
                pq.make_again(again)
                return self._suspend_delay(ctx, max(m.reconsume_times for m in again))
            if ctx.auto_commit:
                self._commit(req)
            return None
        if not ctx.auto_commit and status is ConsumeOrderlyStatus.ROLLBACK:
            c.stats.rolled_back += pq.rollback()
            return self._suspend_delay(ctx, 1)
        if ctx.auto_commit and status is not ConsumeOrderlyStatus.SUCCESS and not self._warned_auto_commit:
            self._warned_auto_commit = True
            log.warning("the orderly listener of %s returned %s with auto-commit on: taken as SUCCESS (COMMIT and "
                        "ROLLBACK need auto_commit=False)", c.group, status.name)
        c.stats.consumed += n
        if ctx.auto_commit or status is ConsumeOrderlyStatus.COMMIT:
            self._commit(req)
        return None

    def _commit(self, req: PullRequest) -> None:
        pq = req.pq
        offset = pq.commit()
        if pq.dropped and not pq.locked:
            return  # the lock is gone: whoever has the queue now starts from the committed offset
        self.c.offset_store.update(req.mq, offset)

    async def _retry_or_give_up(self, req: PullRequest, msgs: list[MessageExt]) -> list[MessageExt]:
        """The messages to consume again (reconsume count raised); those past the maximum go to the retry/DLQ
        path instead (when ``orderly_give_up`` allows and the send-back works)."""
        c = self.c
        policy = c.orderly_give_up
        again: list[MessageExt] = []
        for m in msgs:
            if policy != "never" and m.reconsume_times >= c.max_reconsume_times and not req.pq.dropped:
                if await c._send_back(m, delay_level=-1 if policy == "dlq" else 0):
                    c.stats.given_up += 1
                    log.error("%s gave up on message %s (%s/%d offset %d, keys %s) after %d retries: sent to the %s",
                              c.group, m.msg_id, m.topic, m.queue.queue_id, m.queue_offset, m.keys, m.reconsume_times,
                              "dead-letter topic" if policy == "dlq" else "retry topic")
                    continue
                c.stats.send_back_failed += 1
            again.append(dataclasses.replace(m, reconsume_times=m.reconsume_times + 1))
        return again

    def _suspend_delay(self, ctx: ConsumeOrderlyContext, attempt: int) -> float:
        if ctx.suspend_current_queue_time_ms > 0:
            ms = float(ctx.suspend_current_queue_time_ms)
        else:
            ms = min(self.c.suspend_time_ms * 2.0 ** min(max(attempt - 1, 0), 30), self.suspend_backoff_max * 1000)
        return min(max(ms, _SUSPEND_MIN_MS), _SUSPEND_MAX_MS) / 1000
