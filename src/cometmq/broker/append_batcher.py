"""Coalesce the appends of concurrent requests into one commit-log append per event-loop turn.

Many producers sending at once each used to make their own ``store.put_messages`` call: a lock, a record
encoding pass, a dispatch and a flush request per message. Here the requests that arrive in one turn of the
event loop are appended together as one batch at the end of the turn (the store's fast path: ~3 µs a record
instead of ~13 µs) and dispatched together. Under ASYNC_FLUSH the first request of a turn is appended at once,
so a lone request waits for nothing; under SYNC_FLUSH all of them wait for the end of the turn and then for one
group commit, awaited once for the whole batch — or, with ``durable_now``, made durable right there (the store runs
the fdatasync in this thread while the disk is fast, which saves two thread hand-offs per round). Each caller still
gets a ``PutResult`` of its own messages only. What "durable" means is not decided here: ``broker/appender.py``
owns that rule and hands it in.

If the combined batch is refused (one request's message is too large, say), each request is appended on its own
so that one bad message fails only its own request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cometmq.store.message import MessageInner
from cometmq.store.status import PutResult, PutStatus

log = logging.getLogger(__name__)

PutMessages = Callable[[list[MessageInner]], PutResult]
#: wait (on the loop) until the log is durable to an offset: PUT_OK, or the timeout status to answer with
WaitDurable = Callable[[int], Awaitable[PutStatus]]
#: try to make the log durable to an offset now; True if it is (else wait with WaitDurable)
DurableNow = Callable[[int], bool]
#: told a request's result as soon as its records are in the log (before they are durable)
OnStored = Callable[[PutResult], None]
_Pending = tuple[list[MessageInner], "asyncio.Future[PutResult]", OnStored | None]


class AppendBatcher:
    def __init__(self, loop: asyncio.AbstractEventLoop, put_messages: PutMessages, *, max_batch: int = 1024,
                 max_bytes: int = 4 << 20, wait_durable: WaitDurable | None = None,
                 durable_now: DurableNow | None = None, eager_first: bool | None = None) -> None:
        self.loop = self._loop = loop
        #: the first request of a loop turn is appended at once (default: when nothing needs a group commit)
        self._eager_first = wait_durable is None if eager_first is None else eager_first
        self._put = put_messages
        self._durable_now = durable_now
        #: with it, a request's future resolves only once its records are durable (one wait per batch)
        self._wait_durable = wait_durable
        self._waits: set[asyncio.Task[None]] = set()
        self._max_batch = max_batch
        self._max_bytes = max_bytes
        self._bytes = 0
        self._pending: list[_Pending] = []
        self._count = 0
        self._scheduled = False
        #: appends made / requests served (their ratio is the coalescing achieved)
        self.appends = 0
        self.requests = 0

    def put(self, msgs: list[MessageInner], on_stored: OnStored | None = None) -> asyncio.Future[PutResult]:
        """Append ``msgs`` with the other requests of this loop turn. ``on_stored`` is called with the result
        right after the append, in the same call (a state machine can take note of where its record went
        before anything else runs on the loop); the future resolves once the records are durable."""
        fut: asyncio.Future[PutResult] = self._loop.create_future()
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)
            if self._eager_first:
                # ASYNC_FLUSH: the first request of a loop turn is appended at once (no added latency for a lone
                # request); the window it opens gathers the requests that arrive later in the same turn. Under
                # SYNC_FLUSH the whole turn waits for one group commit, so its first request waits with the rest.
                self.requests += 1
                self._finish([(fut, self._stored(self._append(msgs), on_stored))])
                return fut
        self._pending.append((msgs, fut, on_stored))
        self._count += len(msgs)
        self._bytes += sum(len(m.body) for m in msgs)
        if self._count >= self._max_batch or self._bytes >= self._max_bytes:
            self._drain_pending()
        return fut

    def put_now(self, msgs: list[MessageInner], put_now: PutMessages | None = None
                ) -> PutResult | asyncio.Future[PutResult]:
        """``put`` for a request that is likely alone in its loop turn: when it opens the turn's window and is
        appended at once (``eager_first``) and is durable on return (or refused), its result itself, with no
        future to make, set and await; otherwise the future ``put`` would return. ``put_now``: what appends it
        when that happens at once, in this call (default: the batcher's own ``put_messages``)."""
        if self._scheduled or not self._eager_first:
            return self.put(msgs)
        self._scheduled = True
        self._loop.call_soon(self._drain)
        self.requests += 1
        self.appends += 1
        result = (put_now or self._put)(msgs)
        if self._wait_durable is None or result.status is not PutStatus.PUT_OK or (
                self._durable_now is not None and self._durable_now(result.end_offset)):
            return result
        fut: asyncio.Future[PutResult] = self._loop.create_future()
        self._wait_then_settle(result.end_offset, [(fut, result)])
        return fut

    def _drain(self) -> None:
        """The end of the loop turn: append what gathered since the turn's first request."""
        self._scheduled = False
        if self._pending:  # (a lone request's turn gathered nothing more)
            self._drain_pending()

    def _drain_pending(self) -> None:
        pending, self._pending, self._count, self._bytes = self._pending, [], 0, 0
        if not pending:
            return
        self.requests += len(pending)
        try:
            self._append_pending(pending)
        except Exception as exc:
            # A bug past this point must not leave senders waiting for an answer that never comes (their clients
            # would time out, and a batch drained from a loop callback has nobody else to tell): they get the error.
            log.exception("appending %d requests failed", len(pending))
            for _, fut, _ in pending:
                if not fut.done():
                    fut.set_exception(exc)

    def _append_pending(self, pending: list[_Pending]) -> None:
        settled: list[tuple[asyncio.Future[PutResult], PutResult]]
        if len(pending) == 1:
            msgs, fut, on_stored = pending[0]
            settled = [(fut, self._stored(self._append(msgs), on_stored))]
        else:
            everything = [m for msgs, _, _ in pending for m in msgs]
            result = self._append(everything)
            if not result.ok:  # isolate the request that made the batch fail
                settled = [(fut, self._stored(self._append(msgs), on_stored)) for msgs, fut, on_stored in pending]
            else:
                settled = []
                records = result.records
                i = 0
                for msgs, fut, on_stored in pending:
                    mine = records[i:i + len(msgs)]
                    i += len(msgs)
                    last = mine[-1]
                    res = PutResult(result.status, mine, result.remark, end_offset=last.phy_offset + last.size)
                    settled.append((fut, self._stored(res, on_stored)))
        self._finish(settled)

    def _finish(self, settled: list[tuple[asyncio.Future[PutResult], PutResult]]) -> None:
        if self._wait_durable is None:
            for fut, res in settled:
                self._settle(fut, res)
            return
        end = max((res.end_offset for _, res in settled if res.ok), default=0)
        if not end or (self._durable_now is not None and self._durable_now(end)):
            for fut, res in settled:
                self._settle(fut, res)
            return
        self._wait_then_settle(end, settled)

    def _wait_then_settle(self, end: int, settled: list[tuple[asyncio.Future[PutResult], PutResult]]) -> None:
        task = self._loop.create_task(self._settle_when_durable(end, settled))
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def _settle_when_durable(self, end: int, settled: list[tuple[asyncio.Future[PutResult], PutResult]]
                                   ) -> None:
        assert self._wait_durable is not None
        status = await self._wait_durable(end)
        for fut, res in settled:
            if res.ok:
                res.status = status
            self._settle(fut, res)

    @staticmethod
    def _stored(result: PutResult, on_stored: OnStored | None) -> PutResult:
        if on_stored is not None:
            on_stored(result)
        return result

    def _append(self, msgs: list[MessageInner]) -> PutResult:
        self.appends += 1
        return self._put(msgs)

    @staticmethod
    def _settle(fut: asyncio.Future[PutResult], result: PutResult) -> None:
        if not fut.done():
            fut.set_result(result)
