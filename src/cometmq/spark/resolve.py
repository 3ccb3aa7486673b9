"""Driver-side planning: which queues a read covers and where, in offsets, it starts and ends."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from cometmq.client.message import MessageQueue
from cometmq.spark.link import Link
from cometmq.spark.options import EARLIEST, LATEST, Bound, OptionError, ReadOptions, queue_key

log = logging.getLogger(__name__)

__all__ = ["DataLossError", "check_data_loss", "discover", "resolve_bound"]


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


def resolve_bound(link: Link, bound: Bound, queues: list[MessageQueue], *, missing: int) -> dict[MessageQueue, int]:
    """Concrete offsets of ``bound`` for ``queues``. In JSON offsets, -2/-1 mean the queue's first offset /
    its end; a queue the JSON leaves out gets ``missing`` (-2 or -1) too."""
    if not queues:
        return {}
    if bound.kind == "earliest":
        return link.min_offsets(queues)
    if bound.kind == "latest":
        return link.max_offsets(queues)
    if bound.kind == "timestamp":
        return link.offsets_for_time(queues, bound.timestamp)
    wanted: dict[MessageQueue, int] = {}
    for q in queues:
        wanted[q] = bound.offsets.get(q.topic, {}).get(queue_key(q.broker_name, q.queue_id), missing)
    known = set(queues)
    for topic, per in bound.offsets.items():
        for key in per:
            if not any(queue_key(q.broker_name, q.queue_id) == key and q.topic == topic for q in known):
                raise OptionError(f"offsets JSON names queue {key} of {topic}, which is not read "
                                  f"(queues read: {_names(queues)})")
    lows = [q for q, off in wanted.items() if off == EARLIEST]
    highs = [q for q, off in wanted.items() if off == LATEST]
    if lows:
        wanted.update(link.min_offsets(lows))
    if highs:
        wanted.update(link.max_offsets(highs))
    return wanted


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
