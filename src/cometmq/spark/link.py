"""Blocking access to cometmq from Spark's Python workers: one private event loop per link.

Spark calls a data source's methods from plain threads, one call at a time, and a worker process may serve
many queries in turn; so each :class:`Link` owns a private asyncio loop driven with ``run_until_complete`` and
a :class:`ClientInstance` that is never started (no heartbeats, no route-refresh task: requests only). Nothing
runs in the background between calls, and ``close()`` leaves nothing behind. TLS is on when the options say so
(``tls=true``), and only then: the SDK's $COMETMQ_TLS variables are not consulted, so the driver and the
executors connect alike whatever their environment.

The driver side uses it for routes, topic lists and queue offsets; a read task pulls over a socket of its own
(see :mod:`cometmq.spark.reader`) and uses a link only to ask the nameserver again when its broker stops
answering.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from cometmq.client.admin import all_topics, max_offset, min_offset, search_offset, update_consumer_offset
from cometmq.client.errors import ClientConnectionError, NoRouteError
from cometmq.client.instance import ClientInstance
from cometmq.client.message import MessageQueue
from cometmq.client.transaction_producer import TransactionClientInstance
from cometmq.protocol.names import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX
from cometmq.protocol.names import is_system_topic as names_system_topic
from cometmq.spark.options import TlsOptions

__all__ = ["Link", "is_system_topic"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: topics the brokers keep for themselves (besides RocketMQ's system topics); never matched by subscribePattern
_INTERNAL_PREFIXES = (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX, "RMQ_SYS_")


def is_system_topic(topic: str) -> bool:
    return names_system_topic(topic) or topic.startswith(_INTERNAL_PREFIXES)


def _loop_factory() -> asyncio.AbstractEventLoop:
    from cometmq.net.loop import uvloop_factory

    factory = uvloop_factory()
    return factory() if factory is not None else asyncio.new_event_loop()


class Link:
    """A blocking client for the Spark source and sink (not thread-safe: one caller at a time)."""

    def __init__(self, namesrv: str, *, timeout: float = 10.0, credentials: tuple[str, str] | None = None,
                 tls: TlsOptions | None = None, transactions: bool = False) -> None:
        """``tls``: every connection uses TLS with these settings (None: plaintext). ``transactions``: the instance
        also answers the brokers' transaction check-backs (while a call runs)."""
        context = tls.context() if tls is not None else False
        self.loop = _loop_factory()
        kind = TransactionClientInstance if transactions else ClientInstance
        self.instance = kind(namesrv, request_timeout=timeout, credentials=credentials, tls=context)
        self.tls = tls
        self.timeout = timeout
        self.closed = False

    def run(self, aw: Awaitable[T]) -> T:
        try:
            return self.loop.run_until_complete(aw)
        except ClientConnectionError as exc:
            if self.tls is None and "was lost" in str(exc):  # the server hung up on a request
                exc.args = (f"{exc} (a server with tls.server.mode=enforcing closes plaintext connections: if the "
                            "cluster uses TLS, set the option tls=true)", *exc.args[1:])
            raise

    def query(self, make: Callable[[], Awaitable[T]]) -> T:
        """``run(make())`` for a request that changes nothing (routes, offsets), made once more when it fails to
        talk to a server. The loop runs only during calls, so a connection the server closed in between (its idle
        timeout, serverChannelMaxIdleTimeSeconds; a restart) is noticed only when a request on it fails; the second
        try opens a new one. A streaming query's driver calls far apart (a trigger every few minutes), or across a
        broker's restart, would otherwise fail the query on a server that is up."""
        try:
            return self.run(make())
        except ClientConnectionError as exc:
            log.info("retrying on a new connection: %s", exc)
            return self.run(make())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.run_until_complete(self.instance.remoting.close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routes -------------------------------------------------------------------------------------------------
    def topics(self) -> list[str]:
        """Every user topic the nameservers know, sorted (system topics left out)."""
        return [t for t in self.query(lambda: all_topics(self.instance)) if not is_system_topic(t)]

    def queues(self, topics: Iterable[str], *, missing_ok: bool) -> dict[str, list[MessageQueue]]:
        """The readable queues of each topic, fresh from the nameserver; an unknown topic raises NoRouteError
        unless ``missing_ok`` (then it has no queues: it may be created later)."""
        topics = list(topics)

        async def go() -> list[list[MessageQueue]]:
            return list(await asyncio.gather(*(self.instance.subscribe_queues(t, refresh=True) for t in topics)))

        out = dict(zip(topics, self.query(go), strict=True))
        if not missing_ok:
            unknown = [t for t, qs in out.items() if not qs]
            if unknown:
                raise NoRouteError(f"topic(s) {', '.join(unknown)} unknown to the nameserver "
                                   f"{';'.join(self.instance.namesrv_addrs)}")
        return out

    def matching_topics(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [t for t in self.topics() if rx.fullmatch(t)]

    def broker_addr(self, broker_name: str) -> str:
        addr = self.instance.master_addr(broker_name)
        if addr is None:
            raise NoRouteError(f"no master address known for broker {broker_name}")
        return addr

    def broker_addrs(self) -> dict[str, str]:
        return {name: addrs[0] for name, addrs in self.instance.brokers.items() if 0 in addrs}

    # -- offsets ------------------------------------------------------------------------------------------------
    def _each(self, queues: list[MessageQueue], make: Any) -> dict[MessageQueue, int]:
        async def go() -> list[int]:
            return list(await asyncio.gather(*(make(q) for q in queues)))

        return dict(zip(queues, self.query(go), strict=True))

    def min_offsets(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        return self._each(queues, lambda q: min_offset(self.instance, q))

    def max_offsets(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        return self._each(queues, lambda q: max_offset(self.instance, q))

    def offsets_for_time(self, queues: list[MessageQueue], timestamp_ms: int) -> dict[MessageQueue, int]:
        """First offset stored at or after ``timestamp_ms`` per queue (SEARCH_OFFSET_BY_TIMESTAMP)."""
        return self._each(queues, lambda q: search_offset(self.instance, q, timestamp_ms))

    def commit(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        """Write ``group``'s offsets on the brokers (reporting only: Spark's checkpoint is the truth)."""
        async def go() -> None:
            await asyncio.gather(*(update_consumer_offset(self.instance, group, q, off)
                                   for q, off in offsets.items()))

        self.run(go())

    # -- raw requests -------------------------------------------------------------------------------------------
    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Schedule ``coro`` and let it run until it waits (a request is then on the wire)."""
        task = self.loop.create_task(coro)
        self.loop.run_until_complete(asyncio.sleep(0))
        return task
