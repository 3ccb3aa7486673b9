"""Driver-side planning: which queues a read covers and where, in offsets, it starts and ends."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from cometmq.client.message import MessageQueue
from cometmq.spark.link import Link
from cometmq.spark.options import EARLIEST, LATEST, Bound, OptionError, ReadOptions, queue_key

log = logging.getLogger(__name__)

__all__ = ["DataLossError", "NoOffsetForTimestampError", "check_data_loss", "discover", "resolve_bound", "selects"]


class DataLossError(RuntimeError):
    """Offsets that should be read are gone from the broker (retention deleted them, or it lost them)."""


def discover(link: Link, opts: ReadOptions, *, streaming: bool) -> list[MessageQueue]:
    """The queues the options select, in (topic, broker, queue id) order.

    A batch read fails on a subscribed or assigned topic the nameserver does not know; a stream may start
    before its topics exist and picks their queues up when they appear.
    """
    if opts.pattern is not None:
        topics = link.matching_topics(opts.pattern)
        per_topic = link.queues(topics, missing_ok=True)
    elif opts.assign is not None:
        per_topic = link.queues(opts.assign, missing_ok=streaming)
        for topic, selectors in opts.assign.items():
            per_topic[topic] = _assigned(topic, selectors, per_topic[topic], strict=not streaming)
    else:
        per_topic = link.queues(opts.subscribe, missing_ok=streaming)
    queues = [q for qs in per_topic.values() for q in qs]
    return sorted(set(queues), key=lambda q: (q.topic, q.broker_name, q.queue_id))


def selects(opts: ReadOptions, q: MessageQueue) -> bool:
    """Whether the options name ``q`` (routed or not): its topic subscribed or matching the pattern, or the queue
    assigned."""
    if opts.pattern is not None:
        return re.fullmatch(opts.pattern, q.topic) is not None
    if opts.assign is not None:
        return any(sel == q.queue_id if isinstance(sel, int) else sel == queue_key(q.broker_name, q.queue_id)
                   for sel in opts.assign.get(q.topic, ()))
    return q.topic in opts.subscribe


def _assigned(topic: str, selectors: Iterable[int | str], queues: list[MessageQueue], *,
              strict: bool) -> list[MessageQueue]:
    out: list[MessageQueue] = []
    for sel in selectors:
        if isinstance(sel, int):
            hit = [q for q in queues if q.queue_id == sel]
        else:
            hit = [q for q in queues if queue_key(q.broker_name, q.queue_id) == sel]
        if not hit and strict:
            have = ", ".join(queue_key(q.broker_name, q.queue_id) for q in queues) or "none"
            raise OptionError(f"option assign: {topic} has no queue {sel} (its queues: {have})")
        out.extend(hit)
    return out


class NoOffsetForTimestampError(ValueError):
    """A queue has no message stored at or after the starting timestamp (startingOffsetsByTimestampStrategy=error)."""


def resolve_bound(link: Link, bound: Bound, queues: list[MessageQueue], *, missing: int,
                  strategy: str) -> dict[MessageQueue, int]:
    """Concrete offsets of ``bound`` for ``queues``. In JSON offsets or timestamps, -2/-1 mean the queue's first
    offset / its end; a queue the JSON leaves out gets ``missing`` (-2 or -1) too.

    A timestamp resolves to the first offset stored at or after it (SEARCH_OFFSET_BY_TIMESTAMP). A queue that has
    none (the broker answers its end) follows ``strategy``: ``"error"`` raises NoOffsetForTimestampError naming
    the queues, ``"latest"`` takes the queue's end. Starting bounds pass the option
    startingOffsetsByTimestampStrategy; ending bounds pass "latest" (as Spark's Kafka source, which ends such a
    partition at its latest offset)."""
    if not queues:
        return {}
    if bound.kind == "earliest":
        return link.min_offsets(queues)
    if bound.kind == "latest":
        return link.max_offsets(queues)
    if bound.kind == "timestamp":
        return _by_time(link, bound, {q: bound.timestamp for q in queues}, strategy)
    wanted: dict[MessageQueue, int] = {}
    for q in queues:
        wanted[q] = bound.offsets.get(q.topic, {}).get(queue_key(q.broker_name, q.queue_id), missing)
    known = {(q.topic, queue_key(q.broker_name, q.queue_id)) for q in queues}
    for topic, per in bound.offsets.items():
        for key in per:
            if (topic, key) not in known:
                raise OptionError(f"option {bound.option or 'offsets JSON'} names queue {key} of {topic}, "
                                  f"which is not read (queues read: {_names(queues)})")
    lows = [q for q, off in wanted.items() if off == EARLIEST]
    highs = [q for q, off in wanted.items() if off == LATEST]
    if bound.kind == "timestamps":
        stamps = {q: ts for q, ts in wanted.items() if ts not in (EARLIEST, LATEST)}
        if stamps:
            wanted.update(_by_time(link, bound, stamps, strategy))
    if lows:
        wanted.update(link.min_offsets(lows))
    if highs:
        wanted.update(link.max_offsets(highs))
    return wanted


def _by_time(link: Link, bound: Bound, stamps: Mapping[MessageQueue, int], strategy: str) -> dict[MessageQueue, int]:
    """The first offset at or after each queue's timestamp; for a queue with none, its end, or with
    ``strategy`` "error", NoOffsetForTimestampError."""
    queues = list(stamps)
    found: dict[MessageQueue, int] = {}
    for ts in sorted(set(stamps.values())):
        found.update(link.offsets_for_time([q for q in queues if stamps[q] == ts], ts))
    ends = link.max_offsets(queues)
    none = [q for q in queues if found[q] >= ends[q]]
    if none and strategy == "error":
        what = "; ".join(f"{q.topic} {queue_key(q.broker_name, q.queue_id)} (timestamp {stamps[q]})" for q in none)
        raise NoOffsetForTimestampError(
            f"option {bound.option}: no message stored at or after the timestamp in {what}. "
            "Set startingOffsetsByTimestampStrategy=latest to start such queues at their end.")
    return {q: min(found[q], ends[q]) for q in queues}


def _names(queues: Iterable[MessageQueue]) -> str:
    return ", ".join(f"{q.topic} {queue_key(q.broker_name, q.queue_id)}" for q in queues) or "none"


def check_data_loss(starts: Mapping[MessageQueue, int], minimums: Mapping[MessageQueue, int], *,
                    fail: bool) -> dict[MessageQueue, int]:
    """``starts`` moved up to each queue's first offset where they lie below it; with ``fail`` (the option
    failOnDataLoss) that raises :class:`DataLossError` instead, naming the queues and the lost offsets."""
    lost = {q: (off, minimums[q]) for q, off in starts.items() if q in minimums and off < minimums[q]}
    if not lost:
        return dict(starts)
    what = "; ".join(f"{q.topic} {queue_key(q.broker_name, q.queue_id)}: offsets {a}..{b - 1}"
                     for q, (a, b) in sorted(lost.items(), key=lambda kv: (kv[0].topic, kv[0].broker_name,
                                                                            kv[0].queue_id)))
    if fail:
        raise DataLossError(f"messages were deleted before they were read (retention?): {what}. "
                            "Set failOnDataLoss=false to skip them.")
    log.warning("skipping messages deleted before they were read: %s", what)
    return {q: max(off, minimums.get(q, off)) for q, off in starts.items()}
