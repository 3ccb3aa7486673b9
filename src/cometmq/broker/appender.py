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
from collections.abc import Awaitable
from typing import Protocol

from cometmq.broker.append_batcher import AppendBatcher, OnStored
from cometmq.broker.offset_waiter import OffsetWaiter
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult, PutStatus

#: a write that is in the log is answered with its records' ids and one of these codes
_STORED_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
}
#: a refused write is answered with one of these codes and its reason (RocketMQ's SendMessageProcessor table)
_REFUSED_CODES = {
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: ResponseCode.SYSTEM_ERROR,
}


def answer_code(result: PutResult) -> int:
    """The response code for a write's outcome: SUCCESS, or a timeout for a write that is stored but not
    durable as configured. A refused write raises RemotingError with its code and reason."""
    code = _STORED_CODES.get(result.status)
    if code is None:
        raise RemotingError(_REFUSED_CODES.get(result.status, ResponseCode.SYSTEM_ERROR),
                            f"{result.status.value}: {result.remark}")
    return code


class ReplicationGate(Protocol):
    """What replication adds to the write path (``broker/ha``): whether this broker may write at all, and the
    in-sync replicas' acknowledgements."""

    def refusal(self) -> PutResult | None:
        """None when a write may start; else the refusal to answer (a replica; too few in-sync replicas)."""
        ...

    def appended(self, end: int) -> None:
        """The log now ends at ``end``: ship it to the replicas."""
        ...

    def acked(self, end: int) -> bool:
        """Whether every replica the rule needs has the log up to ``end``."""
        ...

    def wait_acked(self, end: int) -> Awaitable[bool]:
        """Resolves True once ``acked(end)``, False when the wait for the replicas timed out."""
        ...


class Appender:
    def __init__(self, store: MessageStore, *, sync_flush_timeout_s: float) -> None:
        self._store = store
        self._sync_flush = store.sync_flush
        self._timeout_s = sync_flush_timeout_s
        self._flush_waiter: OffsetWaiter | None = None
        self._batcher: AppendBatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: ReplicationGate | None = None

    @property
    def batcher(self) -> AppendBatcher:
        if self._batcher is None:
            raise RuntimeError("the appender is not started")
        return self._batcher

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the broker's event loop (after the store has started)."""
        self._loop = loop
        if self._sync_flush:
            waiter = self._flush_waiter = OffsetWaiter(loop, self._store.flushed_offset)
            self._store.add_flush_listener(waiter.on_flushed)
        self._batcher = self._new_batcher()

    def set_replication(self, gate: ReplicationGate | None) -> None:
        """Writes from now on also wait for the gate's replicas (None: this broker replicates to nobody)."""
        self._gate = gate
        if self._loop is not None:
            # Requests already gathered by the old batcher are appended by it at the end of this loop turn.
            self._batcher = self._new_batcher()

    def _new_batcher(self) -> AppendBatcher:
        assert self._loop is not None
        store = self._store
        put = store.put_messages if self._gate is None else self._put_and_ship
        if self._sync_flush:
            # The batcher commits each batch itself (durable_now), so its appends do not wake the flush thread.
            return AppendBatcher(self._loop, functools.partial(put, request_flush=False),
                                 wait_durable=self._wait_durable, durable_now=self._durable_now)
        if self._gate is not None:
            return AppendBatcher(self._loop, put, wait_durable=self._wait_durable, durable_now=self._durable_now,
                                 eager_first=True)
        return AppendBatcher(self._loop, put)

    def _put_and_ship(self, msgs: list[MessageInner], request_flush: bool = True) -> PutResult:
        gate = self._gate
        if gate is not None:
            # Asked again at the append itself: a batched request waits for the end of the loop turn, and the
            # broker's role may have changed since it was taken (a demoted master must not write).
            refusal = gate.refusal()
            if refusal is not None:
                return refusal
        result = self._store.put_messages(msgs, request_flush)
        if result.ok and gate is not None:
            gate.appended(result.end_offset)
        return result

    def close(self) -> None:
        """Fail the waits still pending (their records are stored, not acknowledged)."""
        if self._flush_waiter is not None:
            self._flush_waiter.close()

    # -- the two ways in ------------------------------------------------------------------------------------
    def put(self, msgs: list[MessageInner], on_stored: OnStored | None = None) -> asyncio.Future[PutResult]:
        """Append, coalesced with the other requests of this loop turn; resolves once durable as configured.
        ``on_stored`` is told the result as soon as the records are in the log (see ``AppendBatcher.put``)."""
        if self._gate is not None:
            refusal = self._gate.refusal()
            if refusal is not None:
                fut: asyncio.Future[PutResult] = self.batcher.loop.create_future()
                fut.set_result(refusal)
                return fut
        return self.batcher.put(msgs, on_stored)

    def put_now(self, msgs: list[MessageInner]) -> PutResult | asyncio.Future[PutResult]:
        """``put`` without ``on_stored``, answered without a future when it can be: the result itself when the
        write is refused or, appended at once, durable on return (``AppendBatcher.put_now``)."""
        gate = self._gate
        batcher = self._batcher
        if batcher is None:
            raise RuntimeError("the appender is not started")
        if gate is None:
            return batcher.put_now(msgs)
        refusal = gate.refusal()
        if refusal is not None:
            return refusal
        # Appended at once, in this call, the write needs no second look at the gate (``_put_and_ship``'s).
        return batcher.put_now(msgs, self._ship_now)

    def _ship_now(self, msgs: list[MessageInner]) -> PutResult:
        """``_put_and_ship`` right after the gate said yes, in the same call."""
        result = self._store.put_messages(msgs)
        if result.status is PutStatus.PUT_OK and self._gate is not None:
            self._gate.appended(result.end_offset)
        return result

    def append(self, msgs: list[MessageInner]) -> PutResult:
        """Append now, as one contiguous batch, and dispatch; not yet durable (``durable`` waits for that)."""
        if self._gate is not None:
            return self._put_and_ship(msgs)
        return self._store.put_messages(msgs)

    def append_replicated(self, offset: int, data: bytes | memoryview) -> bool:
        """A replica appends its master's log bytes at ``offset`` (its log end); False when they don't fit there.
        Not gated: a replica refuses writes from clients, not its master's. An empty log starts at ``offset``: the
        master's log may no longer start at 0 (retention), and the replica's copy starts where the master's does."""
        store = self._store
        if offset > 0 and store.commitlog.files.last is None:
            with store.lock:
                store.commitlog.files.last_for_append(offset)
                store.reput.reput_offset = offset
        return store.append_raw(offset, data)

    async def durable(self, result: PutResult) -> PutResult:
        """Wait until ``append``'s records are durable as configured; on timeout the status says which wait
        timed out (the records are stored, but must not be acknowledged as durable)."""
        if result.ok:  # (append asked the flush thread already: wait for it, don't commit here too)
            result.status = await self._wait_durable(result.end_offset)
        return result

    # -- the one rule ---------------------------------------------------------------------------------------
    def _durable_now(self, end: int) -> bool:
        if self._sync_flush and not self._store.commit(end):
            return False
        return self._gate is None or self._gate.acked(end)

    async def _wait_durable(self, end: int) -> PutStatus:
        if self._sync_flush:
            waiter = self._flush_waiter
            if waiter is None or not await waiter.wait(end, self._timeout_s):
                return PutStatus.FLUSH_DISK_TIMEOUT
        gate = self._gate
        if gate is not None and not gate.acked(end) and not await gate.wait_acked(end):
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        return PutStatus.PUT_OK
