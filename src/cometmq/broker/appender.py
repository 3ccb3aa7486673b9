"""The broker's one write path: every record the broker stores goes through an ``Appender``.

Sends, batches, send-back to ``%RETRY%``/``%DLQ%``, delay-level and timer deliveries, POP log records and the
transaction half/op records all append here; no other broker module calls the store's put methods (a test checks).
So "durable as configured" is decided in exactly one place, ``_durable_now`` / ``_wait_durable``: today the flush
policy (SYNC_FLUSH waits for the group commit that covers a record), and with replication the in-sync replicas'
acknowledgements as well.

Two ways in:

- ``put(msgs)``: for requests. Concurrent requests of one loop turn are coalesced into one append
  (``AppendBatcher``); the future resolves when the records are durable as configured, with PUT_OK or the
  timeout status to answer with (FLUSH_DISK_TIMEOUT: stored, not acknowledged).
- ``append(msgs)`` then ``await durable(result)``: for state machines (POP, transactions) that must have their
  record in the log, in call order, before they change their state, and only then wait for durability.
"""

from __future__ import annotations

import asyncio
import functools

from cometmq.broker.append_batcher import AppendBatcher, OnStored
from cometmq.broker.flush_waiter import FlushWaiter
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult, PutStatus


class Appender:
    def __init__(self, store: MessageStore, *, sync_flush_timeout_s: float) -> None:
        self._store = store
        self._sync_flush = store.sync_flush
        self._timeout_s = sync_flush_timeout_s
        self._flush_waiter: FlushWaiter | None = None
        self._batcher: AppendBatcher | None = None

    @property
    def batcher(self) -> AppendBatcher:
        if self._batcher is None:
            raise RuntimeError("the appender is not started")
        return self._batcher

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the broker's event loop (after the store has started)."""
        store = self._store
        if self._sync_flush:
            waiter = self._flush_waiter = FlushWaiter(loop, store.flushed_offset)
            store.add_flush_listener(waiter.on_flushed)
            # The batcher commits each batch itself (durable_now), so its appends do not wake the flush thread.
            self._batcher = AppendBatcher(loop, functools.partial(store.put_messages, request_flush=False),
                                          wait_durable=self._wait_durable, durable_now=self._durable_now)
        else:
            self._batcher = AppendBatcher(loop, store.put_messages)

    def close(self) -> None:
        """Fail the waits still pending (their records are stored, not acknowledged)."""
        if self._flush_waiter is not None:
            self._flush_waiter.close()

    # -- the two ways in ------------------------------------------------------------------------------------
    def put(self, msgs: list[MessageInner], on_stored: OnStored | None = None) -> asyncio.Future[PutResult]:
        """Append, coalesced with the other requests of this loop turn; resolves once durable as configured.
        ``on_stored`` is told the result as soon as the records are in the log (see ``AppendBatcher.put``)."""
        return self.batcher.put(msgs, on_stored)

    def append(self, msgs: list[MessageInner]) -> PutResult:
        """Append now, as one contiguous batch, and dispatch; not yet durable (``durable`` waits for that)."""
        return self._store.put_messages(msgs)

    async def durable(self, result: PutResult) -> PutResult:
        """Wait until ``append``'s records are durable as configured; on timeout the status says which wait
        timed out (the records are stored, but must not be acknowledged as durable)."""
        if result.ok:  # (append asked the flush thread already: wait for it, don't commit here too)
            result.status = await self._wait_durable(result.end_offset)
        return result

    # -- the one rule ---------------------------------------------------------------------------------------
    def _durable_now(self, end: int) -> bool:
        return not self._sync_flush or self._store.commit(end)

    async def _wait_durable(self, end: int) -> PutStatus:
        if self._sync_flush:
            waiter = self._flush_waiter
            if waiter is None or not await waiter.wait(end, self._timeout_s):
                return PutStatus.FLUSH_DISK_TIMEOUT
        return PutStatus.PUT_OK
