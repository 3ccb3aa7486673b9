"""The chaos workload: producers sending unique payloads and readers pulling every queue, logged to a History.

Every loop stops on an ``asyncio.Event`` (``stop()``) or its deadline and survives every error: the error is
logged to the history (``fail`` when the message was surely not written, ``info`` when it may have been), the
worker backs off 50-200 ms and goes on. Nothing is kept in memory but the counters and each queue's next offset.

Producers use the SDK ``Producer`` with its own retries turned off, and retry here (``retries`` more attempts on
a retriable error, refreshing the route when it may be stale, as the SDK does): so the history knows whether any
attempt might have stored the message. A send ends ``ok`` (SEND_OK), ``info`` (a stored-not-acknowledged status,
or an attempt that timed out or lost its connection: a retry after one may store a duplicate), or ``fail`` (every
attempt was refused before storing).

Readers pull with raw PULL_MESSAGE requests from the master the route names (no consumer group state), so each
message seen is logged with the address it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cometmq.client import BrokerError, ClientConnectionError, MQClientError, NoRouteError, Producer
from cometmq.client.errors import ClientStateError, InvalidArgumentError
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.client.message import Message, SendStatus
from cometmq.protocol.codes import RequestCode, ResponseCode, response_code_name
from cometmq.protocol.message import iter_records
from cometmq.protocol.remoting import make_request
from tests.chaos.history import History, Seen

log = logging.getLogger(__name__)

#: answers that mean "refused before storing" (broker/appender.py _REFUSED_CODES, send.py's checks)
DEFINITE_REFUSALS = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION,
                               ResponseCode.TOPIC_NOT_EXIST, ResponseCode.MESSAGE_ILLEGAL, ResponseCode.SYSTEM_BUSY})
#: SEND_OK's siblings: the message is in the master's log but not durable as configured
INDETERMINATE_STATUSES = frozenset({SendStatus.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT,
                                    SendStatus.SLAVE_NOT_AVAILABLE})

PULL_GROUP = "chaos-reader"
_FLAG_SUSPEND = 0x2
_FLAG_SUBSCRIPTION = 0x4


def surely_not_written(exc: BaseException) -> bool:
    """Whether a failed send attempt surely stored nothing (else it is indeterminate)."""
    if isinstance(exc, NoRouteError | InvalidArgumentError | ClientStateError):
        return True
    if isinstance(exc, BrokerError):
        if exc.code in DEFINITE_REFUSALS:
            return True
        # SYSTEM_ERROR is also OS_ERROR / UNKNOWN_ERROR of a write; only this refusal is surely before it
        return exc.code == ResponseCode.SYSTEM_ERROR and exc.remark.startswith("IN_SYNC_REPLICAS_NOT_ENOUGH")
    if isinstance(exc, ClientConnectionError):
        text = str(exc)
        return "cannot connect to" in text or ("connecting to" in text and "timed out" in text)
    return False  # timeouts, lost connections, anything unknown


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


async def _backoff(rng: random.Random, stop: asyncio.Event, lo: float = 0.05, hi: float = 0.2) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), rng.uniform(lo, hi))


@dataclass
class ProducerStats:
    invoked: int = 0
    ok: int = 0
    fail: int = 0
    info: int = 0


class Producers:
    """``n`` producer workers ("p0".."p<n-1>"), each with its own SDK producer, sending ``<run>-<proc>-<seq>``.

    ``rate``: messages per second per worker (None: as fast as ``concurrency`` allows); ``concurrency``: sends in
    flight per worker. Use ``async with`` or ``start()`` / ``stop()``; ``run(duration)`` does both."""

    def __init__(self, n: int, namesrv: str, topic: str, history: History, *, run_id: str = "run",
                 rate: float | None = None, concurrency: int = 1, seed: int = 0, send_timeout: float = 3.0,
                 retries: int = 2, group: str = "chaos-pg", deadline: float | None = None) -> None:
        self.n = n
        self.namesrv = namesrv
        self.topic = topic
        self.history = history
        self.run_id = run_id
        self.rate = rate
        self.concurrency = max(1, concurrency)
        self.seed = seed
        self.send_timeout = send_timeout
        self.retries = retries
        self.group = group
        self.deadline = deadline  # time.monotonic() after which no new send starts
        self.stats = ProducerStats()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._producers: list[Producer] = []

    async def start(self) -> None:
        for i in range(self.n):
            p = Producer(f"{self.group}-{i}", namesrv=self.namesrv, send_timeout=self.send_timeout, retries=0)
            await p.start()
            self._producers.append(p)
            self._tasks.append(asyncio.ensure_future(self._worker(i, p)))

    async def stop(self, timeout: float | None = None) -> None:
        """Stop starting sends, wait for the ones in flight (each ends within its attempts' timeouts)."""
        self._stop.set()
        limit = timeout if timeout is not None else self.send_timeout * (self.retries + 1) + 5
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=limit)
            for t in pending:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for p in self._producers:
            with contextlib.suppress(Exception):  # a dead broker must not hang the shutdown
                await asyncio.wait_for(p.close(), 5)
        self._tasks.clear()
        self._producers.clear()

    async def run(self, duration: float) -> ProducerStats:
        await self.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), duration)
        await self.stop()
        return self.stats

    async def __aenter__(self) -> Producers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _stopping(self) -> bool:
        return self._stop.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    async def _worker(self, index: int, producer: Producer) -> None:
        proc = f"p{index}"
        rng = random.Random(f"{self.seed}-{proc}")
        seq = 0
        in_flight: set[asyncio.Task[None]] = set()
        interval = None if not self.rate else 1.0 / self.rate
        next_at = time.monotonic()
        try:
            while not self._stopping():
                if len(in_flight) >= self.concurrency:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if interval is not None:
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), delay)
                        continue
                    next_at = max(next_at + interval, time.monotonic() - interval)
                payload = f"{self.run_id}-{proc}-{seq}"
                seq += 1
                task = asyncio.ensure_future(self._send(proc, producer, payload, rng))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                if self.concurrency == 1:
                    await task  # one at a time: a failure's backoff delays the next send
        finally:
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)

    async def _send(self, proc: str, producer: Producer, payload: str, rng: random.Random) -> None:
        h = self.history
        self.stats.invoked += 1
        h.record(proc, "invoke", "send", payload)
        maybe_written = False
        errors: list[str] = []
        attempts = 0
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            attempts = attempt + 1
            try:
                r = await producer.send(Message(self.topic, payload.encode()))
            except asyncio.CancelledError:
                h.record(proc, "info", "send", payload, error="cancelled", attempts=attempts,
                         errors=errors or None)
                self.stats.info += 1
                raise
            except Exception as exc:  # every error: logged, never raised
                last = exc
                errors.append(describe(exc))
                if not surely_not_written(exc):
                    maybe_written = True
                retriable = isinstance(exc, MQClientError) and exc.retriable
                if isinstance(exc, MQClientError) and route_stale(exc):
                    with contextlib.suppress(Exception):
                        await producer.instance.refresh_route(self.topic)
                if not retriable or attempt == self.retries or self._stop.is_set():
                    break
                continue
            addr = producer.instance.master_addr(r.queue.broker_name)
            fields: dict[str, Any] = dict(broker_name=r.queue.broker_name, broker_addr=addr, queue_id=r.queue.queue_id,
                          queue_offset=r.queue_offset, msg_id=r.msg_id, status=r.status.name, attempts=attempts)
            if errors:
                fields["errors"] = errors
            if r.status is SendStatus.SEND_OK:
                h.record(proc, "ok", "send", payload, **fields)
                self.stats.ok += 1
            else:  # stored on the master, not acknowledged as durable
                h.record(proc, "info", "send", payload, **fields)
                self.stats.info += 1
            return
        assert last is not None
        code = getattr(last, "code", None)
        status = response_code_name(code) if isinstance(code, int) else type(last).__name__
        if maybe_written:
            h.record(proc, "info", "send", payload, error=describe(last), status=status, attempts=attempts,
                     errors=errors)
            self.stats.info += 1
        else:
            h.record(proc, "fail", "send", payload, error=describe(last), status=status, attempts=attempts,
                     errors=errors)
            self.stats.fail += 1
        await _backoff(rng, self._stop)


# -- reads --------------------------------------------------------------------------------------------------------
@dataclass
class PullAnswer:
    code: int
    remark: str
    seen: list[Seen]
    next_offset: int | None
    max_offset: int | None


def _decode(body: bytes, addr: str) -> list[Seen]:
    out: list[Seen] = []
    for rec in iter_records(body, check_crc=True):
        data = zlib.decompress(rec.body) if rec.sys_flag & 1 else rec.body
        out.append(Seen(data.decode("utf-8", errors="replace"), rec.queue_id, rec.queue_offset, addr))
    return out


async def pull_once(instance: ClientInstance, addr: str, topic: str, queue_id: int, offset: int, *,
                    max_msgs: int = 32, suspend_ms: int = 0, timeout: float = 3.0) -> PullAnswer:
    """One PULL_MESSAGE to ``addr`` (no offset commit); raises the SDK's connection/timeout errors."""
    sys_flag = _FLAG_SUBSCRIPTION | (_FLAG_SUSPEND if suspend_ms > 0 else 0)
    ext = {"consumerGroup": PULL_GROUP, "topic": topic, "queueId": queue_id, "queueOffset": str(offset),
           "maxMsgNums": max_msgs, "sysFlag": sys_flag, "commitOffset": "0", "subVersion": "0",
           "suspendTimeoutMillis": str(suspend_ms), "subscription": "*"}
    reply = await instance.invoke(addr, make_request(RequestCode.PULL_MESSAGE, ext),
                                  timeout + suspend_ms / 1000, context=f"pull {topic}/{queue_id}@{offset}")
    ext_fields = reply.ext_fields or {}

    def num(key: str) -> int | None:
        v = ext_fields.get(key)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    seen = _decode(reply.body or b"", addr) if reply.code == ResponseCode.SUCCESS else []
    return PullAnswer(reply.code, reply.remark or "", seen, num("nextBeginOffset"), num("maxOffset"))


async def _route_masters(instance: ClientInstance, topic: str, refresh: bool) -> dict[int, str]:
    """queue id -> the master address serving it (one group: the harness runs one)."""
    route = await instance.route(topic, refresh=refresh)
    if route is None:
        raise NoRouteError(f"no route for {topic}")
    out: dict[int, str] = {}
    for q in instance.queues_of(route, topic, writable=False):
        addr = instance.master_addr(q.broker_name)
        if addr is not None:
            out.setdefault(q.queue_id, addr)
    return out


class Readers:
    """One reader per queue ("r<queue id>") pulling the topic's queues from offset 0 throughout the run, from the
    master the route names; every message seen is logged (one ``ok`` read op per non-empty pull). A queue whose
    offset moved (the log was truncated under a reader, or a new master holds less) is logged as ``info`` and
    followed to the offset the broker gives."""

    def __init__(self, namesrv: str, topic: str, history: History, *, queues: int | None = None, seed: int = 0,
                 suspend_ms: int = 500, pull_timeout: float = 3.0, route_interval: float = 1.0,
                 deadline: float | None = None) -> None:
        self.namesrv = namesrv
        self.topic = topic
        self.history = history
        self.queues = queues
        self.seed = seed
        self.suspend_ms = suspend_ms
        self.pull_timeout = pull_timeout
        self.route_interval = route_interval
        self.deadline = deadline
        self.instance = ClientInstance(namesrv)
        self.seen = 0
        self.errors = 0
        self.offsets: dict[int, int] = {}
        self._masters: dict[int, str] = {}
        self._route_at = 0.0
        self._stop = asyncio.Event()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.instance.start()
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        tasks = [*self._tasks.values(), *([self._supervisor] if self._supervisor else [])]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout or self.pull_timeout + self.suspend_ms / 1000 + 2)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.instance.close(), 5)

    async def __aenter__(self) -> Readers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _stopping(self) -> bool:
        return self._stop.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    async def _refresh(self, refresh: bool) -> None:
        self._masters = await _route_masters(self.instance, self.topic, refresh)
        self._route_at = time.monotonic()

    async def _supervise(self) -> None:
        """Learn the queues (route), start one loop per queue; keep the route fresh."""
        rng = random.Random(f"{self.seed}-readers")
        while not self._stopping():
            try:
                await self._refresh(True)
            except Exception as exc:
                self.errors += 1
                self.history.record("r", "info", "read", None, error=describe(exc))
                await _backoff(rng, self._stop, 0.1, 0.3)
                continue
            ids = range(self.queues) if self.queues is not None else sorted(self._masters)
            for q in ids:
                if q not in self._tasks:
                    self.offsets.setdefault(q, 0)
                    self._tasks[q] = asyncio.create_task(self._queue_loop(q), name=f"reader-{q}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.route_interval)

    async def _queue_loop(self, q: int) -> None:
        proc = f"r{q}"
        rng = random.Random(f"{self.seed}-{proc}")
        h = self.history
        while not self._stopping():
            addr = self._masters.get(q)
            if addr is None:
                await _backoff(rng, self._stop)
                continue
            offset = self.offsets[q]
            began = time.monotonic()
            try:
                ans = await pull_once(self.instance, addr, self.topic, q, offset, suspend_ms=self.suspend_ms,
                                      timeout=self.pull_timeout)
            except Exception as exc:
                self.errors += 1
                h.record(proc, "info", "read", None, broker_addr=addr, queue_id=q, queue_offset=offset,
                         error=describe(exc))
                if isinstance(exc, MQClientError) and route_stale(exc):
                    with contextlib.suppress(Exception):
                        await self._refresh(True)
                await _backoff(rng, self._stop)
                continue
            if ans.code == ResponseCode.SUCCESS:
                if ans.seen:
                    h.record(proc, "ok", "read", None, broker_addr=addr, queue_id=q, queue_offset=offset,
                             messages=ans.seen)
                    self.seen += len(ans.seen)
                self.offsets[q] = ans.next_offset if ans.next_offset is not None else \
                    (ans.seen[-1].queue_offset + 1 if ans.seen else offset)
                continue
            if ans.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                if time.monotonic() - began < 0.05:  # answered at once (no long polling there): no busy loop
                    await _backoff(rng, self._stop, 0.02, 0.05)
                if ans.next_offset is not None and ans.next_offset < offset:
                    # the queue ends before where we are: what we read past its end is gone (a truncation)
                    h.record(proc, "info", "read", None, broker_addr=addr, queue_id=q, queue_offset=offset,
                             error=f"queue ends at {ans.next_offset}, below the read offset {offset}",
                             next_offset=ans.next_offset)
                    self.offsets[q] = ans.next_offset
                continue
            if ans.code == ResponseCode.PULL_OFFSET_MOVED and ans.next_offset is not None:
                h.record(proc, "info", "read", None, broker_addr=addr, queue_id=q, queue_offset=offset,
                         error=f"offset moved to {ans.next_offset}: {ans.remark}", next_offset=ans.next_offset)
                self.offsets[q] = ans.next_offset
                await _backoff(rng, self._stop)
                continue
            self.errors += 1
            h.record(proc, "info", "read", None, broker_addr=addr, queue_id=q, queue_offset=offset,
                     error=f"{response_code_name(ans.code)}: {ans.remark}"[:500])
            if ans.code in (ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION,
                            ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.TOPIC_NOT_EXIST):
                with contextlib.suppress(Exception):
                    await self._refresh(True)
            await _backoff(rng, self._stop)


async def drain(namesrv: str, topic: str, history: History | None = None, *, addr: str | None = None,
                queues: Sequence[int] | None = None, timeout: float = 30.0) -> list[Seen]:
    """Read every queue of ``topic`` from offset 0 to its max offset on the final master (``addr``, or the
    master the route names), logging each pull as an ``ok`` drain op. Raises TimeoutError when it cannot finish
    in ``timeout`` (a master that does not answer: the checker then has no drain)."""
    instance = ClientInstance(namesrv)
    await instance.start()
    out: list[Seen] = []
    try:
        async with asyncio.timeout(timeout):
            masters: dict[int, str] = {}
            while not masters:
                try:
                    masters = await _route_masters(instance, topic, True)
                except MQClientError:
                    await asyncio.sleep(0.2)
            ids = list(queues) if queues is not None else sorted(masters)
            for q in ids:
                target = addr or masters.get(q) or next(iter(masters.values()))
                offset, end = 0, None
                while end is None or offset < end:
                    try:
                        ans = await pull_once(instance, target, topic, q, offset, max_msgs=64)
                    except MQClientError as exc:
                        if history is not None:
                            history.record("drain", "info", "drain", None, broker_addr=target, queue_id=q,
                                           queue_offset=offset, error=describe(exc))
                        await asyncio.sleep(0.2)
                        continue
                    if ans.max_offset is not None:
                        end = ans.max_offset
                    if ans.code == ResponseCode.SUCCESS:
                        out += ans.seen
                        if history is not None and ans.seen:
                            history.record("drain", "ok", "drain", None, broker_addr=target, queue_id=q,
                                           queue_offset=offset, messages=ans.seen)
                        offset = ans.next_offset if ans.next_offset is not None else \
                            (ans.seen[-1].queue_offset + 1 if ans.seen else offset)
                    elif ans.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED) and \
                            ans.next_offset is not None and ans.next_offset > offset:
                        # below the queue's min offset (retention): start where it starts
                        if history is not None:
                            history.record("drain", "info", "drain", None, broker_addr=target, queue_id=q,
                                           queue_offset=offset, error=f"moved to {ans.next_offset}")
                        offset = ans.next_offset
                    elif ans.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED):
                        break  # at the end
                    else:
                        await asyncio.sleep(0.1)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(instance.close(), 5)
    return out
