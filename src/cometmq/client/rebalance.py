"""Queue allocation strategies and the rebalance driver of a push consumer.

Every consumer of a group runs the same strategy over the same sorted lists (the topic's readable queues
and the group's consumer ids, as a broker reports them), so together they split the queues without
talking to each other. The strategies are pure functions; :class:`Rebalancer` decides *when* to run
them: at start, every ``period`` seconds (RocketMQ: 20 s), and at once when a broker says the group's
membership changed (NOTIFY_CONSUMER_IDS_CHANGED) — a burst of such notices is folded into one run.

The average and consistent-hash strategies follow RocketMQ's allocation rules (same inputs, same
queues), so these consumers can share a group with Java or C++ consumers using the same strategy.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

from cometmq.client.errors import InvalidArgumentError
from cometmq.common.tasks import cancel_and_wait
from cometmq.protocol.client_bodies import MessageQueue

log = logging.getLogger(__name__)

__all__ = [
    "AllocateAverage",
    "AllocateAverageByCircle",
    "AllocateByConfig",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "Rebalancer",
]


class AllocateStrategy(Protocol):
    """Picks the queues of one topic that the consumer ``current_id`` owns."""

    name: str

    def allocate(self, group: str, current_id: str, queues: Sequence[MessageQueue],
                 consumer_ids: Sequence[str]) -> list[MessageQueue]: ...


def _prepare(current_id: str, queues: Sequence[MessageQueue],
             consumer_ids: Sequence[str]) -> tuple[list[MessageQueue], list[str]] | None:
    """Sorted copies of the inputs, or None when ``current_id`` is not (yet) one of the group's consumers."""
    if not current_id:
        raise InvalidArgumentError("the current consumer id is empty")
    if not queues or current_id not in consumer_ids:
        return None
    return sorted(set(queues)), sorted(set(consumer_ids))


class AllocateAverage:
    """Contiguous blocks of queues per consumer; the first ``len(queues) % len(consumers)`` get one more."""

    name = "AVG"

    def allocate(self, group: str, current_id: str, queues: Sequence[MessageQueue],
                 consumer_ids: Sequence[str]) -> list[MessageQueue]:
        prepared = _prepare(current_id, queues, consumer_ids)
        if prepared is None:
            return []
        mqs, ids = prepared
        index = ids.index(current_id)
        per_consumer, extra = divmod(len(mqs), len(ids))
        size = per_consumer + (1 if index < extra else 0)
        start = index * per_consumer + min(index, extra)
        return mqs[start:start + size]

    def __repr__(self) -> str:
        return "AllocateAverage()"


class AllocateAverageByCircle:
    """Queues dealt round the consumers like cards: consumer i gets queues i, i+n, i+2n, ..."""

    name = "AVG_BY_CIRCLE"

    def allocate(self, group: str, current_id: str, queues: Sequence[MessageQueue],
                 consumer_ids: Sequence[str]) -> list[MessageQueue]:
        prepared = _prepare(current_id, queues, consumer_ids)
        if prepared is None:
            return []
        mqs, ids = prepared
        return mqs[ids.index(current_id)::len(ids)]

    def __repr__(self) -> str:
        return "AllocateAverageByCircle()"


def md5_hash32(key: str) -> int:
    """The first four bytes of the key's MD5 digest as an unsigned big-endian number (RocketMQ's ring hash)."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()[:4], "big")


def java_queue_key(mq: MessageQueue) -> str:
    """How RocketMQ's Java client names a queue on the hash ring (its ``MessageQueue.toString()``)."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


class AllocateConsistentHash:
    """A hash ring with ``virtual_nodes`` points per consumer; each queue goes to the next point clockwise.

    When a consumer joins or leaves, only the queues next to its points move — the others stay put.
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_nodes: int = 10, hash_function: Callable[[str], int] = md5_hash32) -> None:
        if virtual_nodes < 1:
            raise InvalidArgumentError(f"virtual_nodes must be at least 1, not {virtual_nodes}")
        self.virtual_nodes = virtual_nodes
        self.hash_function = hash_function

    def ring(self, consumer_ids: Iterable[str]) -> tuple[list[int], list[str]]:
        points = sorted((self.hash_function(f"{cid}-{i}"), cid)
                        for cid in set(consumer_ids) for i in range(self.virtual_nodes))
        return [h for h, _ in points], [cid for _, cid in points]

    def owner(self, hashes: list[int], owners: list[str], mq: MessageQueue) -> str:
        i = bisect.bisect_left(hashes, self.hash_function(java_queue_key(mq)))
        return owners[i % len(owners)]

    def allocate(self, group: str, current_id: str, queues: Sequence[MessageQueue],
                 consumer_ids: Sequence[str]) -> list[MessageQueue]:
        prepared = _prepare(current_id, queues, consumer_ids)
        if prepared is None:
            return []
        mqs, ids = prepared
        hashes, owners = self.ring(ids)
        return [mq for mq in mqs if self.owner(hashes, owners, mq) == current_id]

    def __repr__(self) -> str:
        return f"AllocateConsistentHash(virtual_nodes={self.virtual_nodes})"


class AllocateByConfig:
    """A fixed list of queues, whatever the other consumers do (only those of the topic being balanced)."""

    name = "CONFIG"

    def __init__(self, queues: Iterable[MessageQueue]) -> None:
        self.queues = sorted(set(queues))

    def allocate(self, group: str, current_id: str, queues: Sequence[MessageQueue],
                 consumer_ids: Sequence[str]) -> list[MessageQueue]:
        available = set(queues)
        return [mq for mq in self.queues if mq in available]

    def __repr__(self) -> str:
        return f"AllocateByConfig({self.queues!r})"


class RouteSource(Protocol):
    """What the rebalancer needs from a ClientInstance."""

    client_id: str

    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]: ...

    async def consumer_ids(self, group: str, broker_name: str) -> list[str]: ...

    async def heartbeat(self) -> None: ...


#: ``apply(topic, queues)`` hands the consumer its new queues of a topic; it returns False when it could
#: not take them all yet (e.g. a start offset could not be read), so the rebalance is retried soon.
ApplyAssignment = Callable[[str, list[MessageQueue]], Awaitable[bool]]


class Rebalancer:
    """Runs allocation for a consumer: at :meth:`rebalance`, every ``period`` s, and soon after :meth:`request`.

    A run that could not finish (no route for a topic yet, the group's consumer list not yet showing this
    client, an offset lookup failing) is retried after ``retry_delay`` s, doubling up to ``period``.
    """

    def __init__(self, instance: RouteSource, group: str, *, strategy: AllocateStrategy, broadcasting: bool,
                 topics: Callable[[], Iterable[str]], apply: ApplyAssignment, period: float = 20.0,
                 debounce: float = 0.05, retry_delay: float = 0.5) -> None:
        self.instance = instance
        self.group = group
        self.strategy = strategy
        self.broadcasting = broadcasting
        self.topics = topics
        self.apply = apply
        self.period = period
        self.debounce = debounce
        self.retry_delay = retry_delay
        self.runs = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._next_retry = retry_delay
        self._complete = True

    # -- scheduling ---------------------------------------------------------------------------------------
    def request(self) -> None:
        """Ask for a run soon (called when the group's membership changed); bursts fold into one run."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"rebalance-{self.group}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])

    async def _loop(self) -> None:
        while True:
            timeout = self.period if self._complete else min(self._next_retry, self.period)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
                await asyncio.sleep(self.debounce)  # let the rest of a burst of notices arrive
            except TimeoutError:
                pass
            self._wake.clear()
            complete = await self.rebalance()
            self._next_retry = self.retry_delay if complete else min(self._next_retry * 2, self.period)

    # -- one run --------------------------------------------------------------------------------------------
    async def rebalance(self) -> bool:
        """Allocate every subscribed topic once; True when every topic got its assignment."""
        async with self._lock:
            self.runs += 1
            complete = True
            for topic in list(self.topics()):
                try:
                    complete &= await self._rebalance_topic(topic)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    complete = False
                    log.warning("rebalance of %s for group %s failed: %s", topic, self.group, exc)
            self._complete = complete
            return complete

    async def _rebalance_topic(self, topic: str) -> bool:
        queues = sorted(await self.instance.subscribe_queues(topic))
        if not queues:
            # No route yet (a topic about to be created, or the retry topic the broker makes on our first
            # heartbeat): keep what we have and look again soon.
            log.debug("no readable queues for %s yet (group %s)", topic, self.group)
            return False
        if self.broadcasting:
            return await self.apply(topic, queues)
        ids = await self._consumer_ids(queues)
        me = self.instance.client_id
        if me not in ids:
            # The brokers have not seen our heartbeat (yet, or any more): announce ourselves, keep our queues.
            log.info("consumer %s is not yet listed in group %s (%d listed); sending a heartbeat", me, self.group,
                     len(ids))
            await self.instance.heartbeat()
            return False
        assigned = self.strategy.allocate(self.group, me, queues, sorted(ids))
        known = set(queues)
        return await self.apply(topic, [mq for mq in assigned if mq in known])

    async def _consumer_ids(self, queues: list[MessageQueue]) -> list[str]:
        """The group's consumers as the first broker of the topic that answers reports them."""
        for broker_name in dict.fromkeys(mq.broker_name for mq in queues):
            try:
                ids = await self.instance.consumer_ids(self.group, broker_name)
            except Exception as exc:
                log.info("cannot list the consumers of %s on %s: %s", self.group, broker_name, exc)
                continue
            if ids:
                return ids
        return []
