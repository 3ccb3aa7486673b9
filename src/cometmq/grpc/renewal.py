"""Renewal of auto-renewing receives (RocketMQ 5 proxy's ReceiptHandleProcessor / DefaultReceiptHandleManager).

A ReceiveMessage with ``auto_renew`` (what the 5.x push consumers send) pops with ``default_invisible_ms``; the
endpoint remembers each delivery it hands to the client, per client id, and keeps it invisible while the client
holds it:

* every ``renew_period_ms`` it looks at the deliveries; one whose invisible time ends within ``renew_ahead_ms`` is
  renewed (CHANGE_MESSAGE_INVISIBLETIME) by the next of ``renew_steps_ms`` (RocketMQ: 1, 3, 5, 10, 30, 60 minutes,
  the last repeated), until ``renew_max_ms`` after the first pop; then the message is given back with the group's
  retry delay and forgotten. ``max_renew_retries`` failures in a row (timeouts, a broker not reached) and it is left
  to expire; a broker refusing the handle (acked, or delivered again) forgets it at once.
* the client acks, changes or forwards to the DLQ with the handle it was given: the endpoint acts on the latest
  renewed one instead (the original is stale once renewed) and forgets the delivery.
* a client that ends (NotifyClientTermination) or goes silent (its session expires) has every delivery it still
  holds made visible again after ``clear_invisible_ms`` (1 s), not after the rest of its invisible time; the
  same when the endpoint stops.

Bounded: at most ``renew_max_per_client`` deliveries per client and ``renew_max_handles`` in all; a delivery past
either is not renewed (it keeps its ``default_invisible_ms``). The scanning task runs only while something is held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.handles import ReceiptHandle
from cometmq.grpc.sessions import SESSION_EXPIRY_S, Sessions
from cometmq.grpc.status import GrpcError
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.pop import ExtraInfo

log = logging.getLogger("cometmq.grpc")

#: RocketMQ's default group retry policy (CustomizedRetryPolicy: 1s 5s 10s 30s 1m … 2h), read at reconsumeTimes + 2:
#: how long a message whose renewal time is used up stays invisible before it is delivered again
RETRY_POLICY_MS = tuple(s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200,
                                           1800, 3600, 7200))
#: broker answers after which renewing the delivery again is pointless (RocketMQ's renewExceptionNeedRetry is false
#: for an invalid handle or broker); others (timeouts, a broker not reached, busy) are retried at the next scan
_FINAL = frozenset({pb.Code.INVALID_RECEIPT_HANDLE, pb.Code.BAD_REQUEST, pb.Code.FORBIDDEN, pb.Code.TOPIC_NOT_FOUND,
                    pb.Code.CONSUMER_GROUP_NOT_FOUND, pb.Code.UNSUPPORTED})

#: one delivery: broker, topic, queue id, queue offset (the handle's pop time tells deliveries of it apart)
Key = tuple[str, str, int, int]
#: CHANGE_MESSAGE_INVISIBLETIME of (group, handle, invisible ms) -> the new handle; GrpcError when refused
ChangeFn = Callable[[str, ReceiptHandle, int], Awaitable[ReceiptHandle]]
SpawnFn = Callable[[Coroutine[Any, Any, None]], None]


def key_of(h: ReceiptHandle) -> Key:
    return h.broker_name, h.topic, h.queue_id, h.offset


def retry_delay_ms(reconsume_times: int) -> int:
    return RETRY_POLICY_MS[min(max(reconsume_times, 0) + 2, len(RETRY_POLICY_MS) - 1)]


@dataclass(slots=True, eq=False)
class Held:
    """A delivery a client holds."""

    group: str
    #: the delivery as the client was given it
    original: ExtraInfo
    #: the latest renewed handle
    handle: ReceiptHandle
    #: the first pop's time (ms): renewal stops ``renew_max_ms`` after it
    first_pop_ms: int
    reconsume_times: int
    renew_times: int = 0
    retry_times: int = 0
    #: a renewal in flight: the handle changes when it ends
    busy: asyncio.Future[None] | None = None


class Renewer:
    def __init__(self, config: ProxyConfig, sessions: Sessions, change: ChangeFn, spawn: SpawnFn) -> None:
        self.config = config
        self.sessions = sessions
        self._change = change
        self._spawn = spawn
        #: client id -> its deliveries
        self._clients: dict[str, dict[Key, Held]] = {}
        self._count = 0
        self._running = False
        self._full_logged = 0.0

    def __len__(self) -> int:
        return self._count

    def held(self, client_id: str) -> int:
        """How many deliveries the endpoint renews for ``client_id``."""
        return len(self._clients.get(client_id, ()))

    # -- the receive side ---------------------------------------------------------------------------------------
    def track(self, client_id: str, group: str, h: ReceiptHandle, reconsume_times: int) -> bool:
        """Renew the delivery ``h`` for ``client_id`` until it is acked, changed or the client goes away. False
        (not renewed) when renewal is off or the tables are full."""
        if not self.config.auto_renew or not client_id:
            return False
        table = self._clients.get(client_id)
        key = key_of(h)
        replaced = table is not None and key in table  # an earlier delivery of it to this client: that one is over
        if not replaced and (self._count >= self.config.renew_max_handles
                             or (table is not None and len(table) >= self.config.renew_max_per_client)):
            now = time.monotonic()
            if now - self._full_logged > 60:
                self._full_logged = now
                log.warning("not renewing %s-%d@%d for client %s: %d deliveries held (%d by the client); it stays "
                            "invisible for %d ms", h.topic, h.queue_id, h.offset, client_id, self._count,
                            len(table or ()), self.config.default_invisible_ms)
            return False
        if table is None:
            table = self._clients[client_id] = {}
        if not replaced:
            self._count += 1
        table[key] = Held(group, h.extra_info, h, h.extra_info.pop_time, reconsume_times)
        if not self._running:
            self._running = True
            self._spawn(self._run())
        return True

    def forget(self, client_id: str, h: ReceiptHandle) -> None:
        """Stop renewing ``h`` (popped for the client, but not handed to it: the receive gives it back itself)."""
        table = self._clients.get(client_id)
        held = table.get(key_of(h)) if table is not None else None
        if held is not None and held.original == h.extra_info:
            self._drop(client_id, key_of(h), held)

    # -- the client's ack / change / DLQ ------------------------------------------------------------------------
    async def take(self, client_id: str, group: str, h: ReceiptHandle) -> ReceiptHandle:
        """The handle to act on for the client's ``h``: the latest renewal of that delivery when the endpoint renews
        it (which it then forgets: the client decides now), else ``h`` itself."""
        table = self._clients.get(client_id)
        if table is None:
            return h
        key = key_of(h)
        held = table.get(key)
        if held is None or held.group != group or h.extra_info not in (held.original, held.handle.extra_info):
            return h
        self._drop(client_id, key, held)
        await self._settled(held)
        return held.handle

    # -- the client goes away -----------------------------------------------------------------------------------
    def clear(self, client_id: str) -> int:
        """Forget what ``client_id`` holds and make it visible again after ``clear_invisible_ms`` (in the
        background). Returns how many deliveries that is."""
        table = self._clients.pop(client_id, None)
        if not table:
            return 0
        self._count -= len(table)
        helds = list(table.values())
        self._spawn(self._give_back(client_id, helds))
        return len(helds)

    async def close(self, timeout: float) -> None:
        """The endpoint stops: every held delivery is given back (as for a client that went away), waiting up to
        ``timeout`` seconds for the brokers' answers."""
        tables, self._clients, self._count = list(self._clients.items()), {}, 0
        if tables:
            loop = asyncio.get_running_loop()
            jobs = [loop.create_task(self._give_back(cid, list(table.values()))) for cid, table in tables]
            _, late = await asyncio.wait(jobs, timeout=timeout)
            for job in late:  # (they come back at the end of their invisible time)
                job.cancel()

    async def _give_back(self, client_id: str, helds: list[Held]) -> None:
        async def one(held: Held) -> None:
            await self._settled(held)
            try:
                await self._change(held.group, held.handle, self.config.clear_invisible_ms)
            except (GrpcError, ProtocolError) as exc:
                h = held.handle
                log.info("giving back %s-%d@%d of group %s held by client %s: %s", h.topic, h.queue_id, h.offset,
                         held.group, client_id, exc)

        await asyncio.gather(*(one(held) for held in helds))

    # -- the scan -----------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while self._clients:
                await asyncio.sleep(self.config.renew_period_ms / 1000)
                self.scan()
        finally:
            self._running = False

    def scan(self) -> None:
        """Give back what clients that went away hold; start the renewal of every delivery due for one."""
        now_ms = time.time() * 1000
        ahead = self.config.renew_ahead_ms
        for client_id in list(self._clients):
            if self._gone(client_id):
                log.info("client %s went away holding %d messages: given back", client_id, self.clear(client_id))
                continue
            for key, held in list(self._clients[client_id].items()):
                if held.busy is None and held.handle.extra_info.visible_at - now_ms <= ahead:
                    held.busy = asyncio.get_running_loop().create_future()
                    self._spawn(self._renew(client_id, key, held))

    def _gone(self, client_id: str) -> bool:
        """The client ended its session, or was silent (no call, no Telemetry stream) for SESSION_EXPIRY_S."""
        s = self.sessions.find(client_id)
        return s is None or (s.outbox is None and time.monotonic() - s.last_seen > SESSION_EXPIRY_S)

    async def _renew(self, client_id: str, key: Key, held: Held) -> None:
        cfg = self.config
        try:
            if held.retry_times >= cfg.max_renew_retries:
                log.warning("stopped renewing %s: %d renewals failed", _name(held), held.retry_times)
                self._drop(client_id, key, held)
                return
            if time.time() * 1000 - held.first_pop_ms >= cfg.renew_max_ms:
                # held for renew_max_ms: given back with the group's retry delay, as RocketMQ does
                self._drop(client_id, key, held)
                try:
                    await self._change(held.group, held.handle, retry_delay_ms(held.reconsume_times))
                except (GrpcError, ProtocolError) as exc:
                    log.info("giving back %s after %d ms held: %s", _name(held), cfg.renew_max_ms, exc)
                return
            steps = cfg.renew_steps_ms
            try:
                held.handle = await self._change(held.group, held.handle,
                                                 steps[min(held.renew_times, len(steps) - 1)])
            except GrpcError as exc:
                if exc.code in _FINAL:
                    log.info("stopped renewing %s: %s", _name(held), exc)
                    self._drop(client_id, key, held)
                else:
                    held.retry_times += 1
                return
            held.renew_times += 1
            held.retry_times = 0
        except Exception:
            log.exception("renewing %s failed", _name(held))
            self._drop(client_id, key, held)
        finally:
            busy, held.busy = held.busy, None
            if busy is not None and not busy.done():
                busy.set_result(None)

    # -- the tables ---------------------------------------------------------------------------------------------
    def _drop(self, client_id: str, key: Key, held: Held) -> None:
        table = self._clients.get(client_id)
        if table is not None and table.get(key) is held:
            del table[key]
            self._count -= 1
            if not table:
                del self._clients[client_id]

    async def _settled(self, held: Held) -> None:
        """Wait for a renewal of ``held`` in flight (its handle is stale once it lands)."""
        busy = held.busy
        if busy is not None:
            await asyncio.wait([busy], timeout=self.config.request_timeout_s + 1)


def _name(held: Held) -> str:
    h = held.handle
    return f"{h.topic}-{h.queue_id}@{h.offset} of group {held.group}"
