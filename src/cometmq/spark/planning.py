"""Offset ranges: the JSON form Spark checkpoints, splitting ranges into tasks, and read limits.

Everything here is a pure function of its arguments, so that a micro-batch planned again from the same
checkpointed (start, end) pair is cut into exactly the same ranges: that is what makes the streaming read
exactly-once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cometmq.client.message import MessageQueue
from cometmq.spark.options import OptionError, queue_key, split_queue_key

__all__ = [
    "QueueRange",
    "from_json",
    "limit_rows",
    "should_wait",
    "split_ranges",
    "to_json",
]

Offsets = dict[MessageQueue, int]


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Offsets ``[start, end)`` of one queue."""

    queue: MessageQueue
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def _order(q: MessageQueue) -> tuple[str, str, int]:
    return (q.topic, q.broker_name, q.queue_id)


def to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, int]]:
    """``{topic: {"broker:queueId": offset}}``, sorted, so equal offsets always serialize alike."""
    out: dict[str, dict[str, int]] = {}
    for q in sorted(offsets, key=_order):
        out.setdefault(q.topic, {})[queue_key(q.broker_name, q.queue_id)] = int(offsets[q])
    return out


def from_json(data: object, what: str = "offsets") -> Offsets:
    """Inverse of :func:`to_json`; anything else raises OptionError naming ``what``."""
    if not isinstance(data, dict):
        raise OptionError(f"{what} must be a JSON object {{topic: {{'broker:queueId': offset}}}}, got {data!r}")
    out: Offsets = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{what}: the offsets of {topic!r} are not an object")
        for key, off in queues.items():
            broker, qid = split_queue_key(key)
            if isinstance(off, bool) or not isinstance(off, int):
                raise OptionError(f"{what}: offset of {topic} {key} is not an integer: {off!r}")
            out[MessageQueue(topic, broker, qid)] = off
    return out


def split_ranges(ranges: Iterable[QueueRange], min_partitions: int | None,
                 max_records: int | None = None) -> list[QueueRange]:
    """Non-empty ranges, the large ones cut into pieces so that there are at least ``min_partitions`` of
    them when the offsets allow it, and none holds more than ``max_records`` offsets. Pieces of one queue are
    contiguous and about equal; the result is in queue order."""
    rs = sorted((r for r in ranges if r.size > 0), key=lambda r: _order(r.queue))
    if min_partitions and len(rs) < min_partitions:
        total = sum(r.size for r in rs)
        # As Spark's Kafka source: each range gets pieces in proportion to its share of all offsets.
        rs = [piece for r in rs
              for piece in _cut(r, max(1, min(r.size, math.ceil(r.size * min_partitions / total))))]
    if max_records:
        # maxRecordsPerPartition: the fewest equal pieces of at most max_records each
        rs = [piece for r in rs for piece in _cut(r, math.ceil(r.size / max_records))]
    return rs


def _cut(r: QueueRange, pieces: int) -> list[QueueRange]:
    """``r`` in ``pieces`` contiguous parts whose sizes differ by one at most (the larger ones first)."""
    if pieces <= 1:
        return [r]
    step, extra = divmod(r.size, pieces)
    out: list[QueueRange] = []
    at = r.start
    for i in range(pieces):
        n = step + (1 if i < extra else 0)
        out.append(QueueRange(r.queue, at, at + n))
        at += n
    return out


def should_wait(start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int], min_rows: int,
                max_delay: float, last_trigger: float, now: float) -> bool:
    """minOffsetsPerTrigger / maxTriggerDelay, as Spark's Kafka source decides them: wait (plan no batch) while
    fewer than ``min_rows`` offsets are waiting in all, unless ``max_delay`` seconds have passed since
    ``last_trigger`` (the time of the last trigger that did not wait; 0 before the first, which therefore
    never waits). The caller sets ``last_trigger = now`` whenever this returns False."""
    if now - last_trigger >= max_delay:
        return False
    waiting = sum(max(0, off - start.get(q, 0)) for q, off in latest.items())
    return waiting < min_rows


def limit_rows(start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int],
               max_rows: int) -> Offsets:
    """End offsets that admit at most ``max_rows`` offsets in all, shared among the queues in proportion to
    what each has waiting (then one more each by largest remainder, ties in queue order). ``start`` must
    hold every queue of ``latest``; a queue whose latest is below its start stays where it is."""
    waiting = {q: max(0, latest[q] - start[q]) for q in latest}
    total = sum(waiting.values())
    if total <= max_rows:
        return {q: start[q] + waiting[q] for q in latest}
    shares = {q: waiting[q] * max_rows / total for q in latest}
    granted = {q: min(waiting[q], int(shares[q])) for q in latest}
    left = max_rows - sum(granted.values())
    for q in sorted(latest, key=lambda q: (-(shares[q] - int(shares[q])), _order(q))):
        if left <= 0:
            break
        if granted[q] < waiting[q]:
            granted[q] += 1
            left -= 1
    return {q: start[q] + granted[q] for q in latest}
