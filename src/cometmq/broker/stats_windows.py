"""Rates and recent sums of the broker's counters: VIEW_BROKER_STATS_DATA (315), the TPS and today/yesterday keys of
GET_BROKER_RUNTIME_INFO (28), and so mqadmin ``statsAll``/``clusterList -m`` and the dashboards that read them.

RocketMQ's StatsItem samples every counter every 10 s (its minute window: the last 7 samples), every 10 min (hour:
7) and every hour (day: 25), and answers a window as (last - first) of its samples. The same here, with one
difference: the window ends at the counter's value *now*, not at the last sample, so a broker up for 20 s already
answers what it took in those 20 s (RocketMQ answers 0 until two samples exist). A window starts at its oldest
sample, and a broker's first sample is taken at start (every counter 0).

The counters are ``BrokerStats``' (cometmq.broker.stats), which the broker keeps whether metrics are exported or
not; a sample is a dict of every item's (value, times), ``times`` being the requests that added to it (RocketMQ's
``avgpt`` is value / times over the window). Memory: 39 samples of each item (7 + 7 + 25), as RocketMQ's.

Items (RocketMQ's BrokerStatsManager names and keys): TOPIC_PUT_NUMS / TOPIC_PUT_SIZE by topic, GROUP_GET_NUMS /
GROUP_GET_SIZE by ``topic@group``, SNDBCK_PUT_NUMS by ``topic@group``, DLQ_PUT_NUMS by group, BROKER_PUT_NUMS /
BROKER_GET_NUMS by cluster name. Other RocketMQ item names are not counted here; asked for them, 315 answers
RocketMQ's "not exist" error, as it does for a key it never saw.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cometmq.broker.stats import IN_BUCKETS, IN_BYTES, IN_COUNT, MESSAGE_TYPES, BrokerStats
from cometmq.common.periodic import Periodic

SAMPLE_INTERVAL_S = 10.0
#: (samples kept, one kept every N samples): minute, hour, day windows (RocketMQ: 10 s x 7, 10 min x 7, 1 h x 25)
_MINUTE, _HOUR, _DAY = (7, 1), (7, 60), (25, 360)
#: the broker totals' own ring, for GET_BROKER_RUNTIME_INFO's "putTps": TPS over 10 s, 1 min and 10 min
_TOTALS_KEEP = 61
TPS_SPANS_S = (10, 60, 600)

TOPIC_PUT_NUMS, TOPIC_PUT_SIZE = "TOPIC_PUT_NUMS", "TOPIC_PUT_SIZE"
GROUP_GET_NUMS, GROUP_GET_SIZE = "GROUP_GET_NUMS", "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS, DLQ_PUT_NUMS = "SNDBCK_PUT_NUMS", "DLQ_PUT_NUMS"
BROKER_PUT_NUMS, BROKER_GET_NUMS = "BROKER_PUT_NUMS", "BROKER_GET_NUMS"
#: the item names kept here
KEPT = frozenset({TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, SNDBCK_PUT_NUMS, DLQ_PUT_NUMS,
                  BROKER_PUT_NUMS, BROKER_GET_NUMS})

Item = tuple[str, str]  # (stats name, stats key)
Point = tuple[int, int]  # (value, times)


@dataclass(frozen=True, slots=True)
class Window:
    """One window of one item: RocketMQ's StatsSnapshot (sum, tps, avgpt)."""
    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0


@dataclass(frozen=True, slots=True)
class ItemWindows:
    minute: Window
    hour: Window
    day: Window


def read_items(stats: BrokerStats, cluster: str) -> dict[Item, Point]:
    """Every item's (value, times) now."""
    out: dict[Item, Point] = {}
    for (topic, _type), entry in list(stats.messages_in.items()):
        times = sum(entry[IN_BUCKETS:])
        count, size = out.get((TOPIC_PUT_NUMS, topic), (0, 0)), out.get((TOPIC_PUT_SIZE, topic), (0, 0))
        out[(TOPIC_PUT_NUMS, topic)] = (count[0] + entry[IN_COUNT], count[1] + times)
        out[(TOPIC_PUT_SIZE, topic)] = (size[0] + entry[IN_BYTES], size[1] + times)
    for (topic, group, _retry), entry in list(stats.messages_out.items()):
        key = f"{topic}@{group}"
        count, size = out.get((GROUP_GET_NUMS, key), (0, 0)), out.get((GROUP_GET_SIZE, key), (0, 0))
        out[(GROUP_GET_NUMS, key)] = (count[0] + entry[0], count[1] + entry[2])
        out[(GROUP_GET_SIZE, key)] = (size[0] + entry[1], size[1] + entry[2])
    put, _, put_times = stats.total_in()
    got, _, got_times = stats.total_out()
    for (group, topic), n in list(stats.retry.items()):
        out[(SNDBCK_PUT_NUMS, f"{topic}@{group}")] = (n, n)
    for (group, _topic), n in list(stats.dlq.items()):
        value, times = out.get((DLQ_PUT_NUMS, group), (0, 0))
        out[(DLQ_PUT_NUMS, group)] = (value + n, times + n)
    out[(BROKER_PUT_NUMS, cluster)] = (put, put_times)
    out[(BROKER_GET_NUMS, cluster)] = (got, got_times)
    return out


def read_item(stats: BrokerStats, cluster: str, name: str, key: str) -> Point | None:
    """One item's (value, times) now, or None when it was never counted (without reading every item)."""
    if name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
        entries = [e for kind in MESSAGE_TYPES if (e := stats.messages_in.get((key, kind))) is not None]
        if not entries:
            return None
        field = IN_COUNT if name == TOPIC_PUT_NUMS else IN_BYTES
        return sum(e[field] for e in entries), sum(sum(e[IN_BUCKETS:]) for e in entries)
    if name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
        topic, _, group = key.partition("@")
        found = [e for retry in (False, True) if (e := stats.messages_out.get((topic, group, retry))) is not None]
        if not found:
            return None
        field = 0 if name == GROUP_GET_NUMS else 1
        return sum(e[field] for e in found), sum(e[2] for e in found)
    if name == SNDBCK_PUT_NUMS:
        topic, _, group = key.partition("@")
        n = stats.retry.get((group, topic))
        return None if n is None else (n, n)
    if name == DLQ_PUT_NUMS:
        counts = [n for (group, _t), n in list(stats.dlq.items()) if group == key]
        return (sum(counts), sum(counts)) if counts else None
    if name in (BROKER_PUT_NUMS, BROKER_GET_NUMS) and key == cluster:
        return read_items(stats, cluster)[(name, key)]
    return None


def _window(first_at: float, first: Point, now_at: float, now: Point) -> Window:
    total = max(now[0] - first[0], 0)
    elapsed = now_at - first_at
    times = now[1] - first[1]
    return Window(total, total / elapsed if elapsed > 0 else 0.0, total / times if times > 0 else 0.0)


class StatsWindows:
    """The broker's sampled windows (see the module's text). ``start`` takes the first sample and samples every
    ``SAMPLE_INTERVAL_S`` after it on the event loop; ``sample`` may also be called by hand (tests)."""

    def __init__(self, stats: BrokerStats, cluster: str, *, clock: Callable[[], float] = time.time) -> None:
        self.stats = stats
        self.cluster = cluster
        self._clock = clock
        self._rings: tuple[deque[tuple[float, dict[Item, Point]]], ...] = (
            deque(maxlen=_MINUTE[0]), deque(maxlen=_HOUR[0]), deque(maxlen=_DAY[0]))
        self._every = (_MINUTE[1], _HOUR[1], _DAY[1])
        self._samples = 0
        #: (time, messages put, messages got) every sample, for the runtime info's TPS over 10 s / 1 min / 10 min
        self._totals: deque[tuple[float, int, int]] = deque(maxlen=_TOTALS_KEEP)
        #: RocketMQ's msg{Put,Get}TotalTodayMorning / YesterdayMorning: the totals when the local day began
        self.today_morning = (0, 0)
        self.yesterday_morning = (0, 0)
        self._day = time.localtime(clock()).tm_yday
        self._periodic = Periodic("broker-stats-windows", SAMPLE_INTERVAL_S, self.sample)

    def start(self) -> None:
        self.sample()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def sample(self) -> None:
        now = self._clock()
        items = read_items(self.stats, self.cluster)
        for ring, every in zip(self._rings, self._every, strict=True):
            if self._samples % every == 0:
                ring.append((now, items))
        self._samples += 1
        put, got = items[(BROKER_PUT_NUMS, self.cluster)][0], items[(BROKER_GET_NUMS, self.cluster)][0]
        self._totals.append((now, put, got))
        day = time.localtime(now).tm_yday
        if day != self._day:
            self._day = day
            self.yesterday_morning, self.today_morning = self.today_morning, (put, got)

    def item(self, name: str, key: str) -> ItemWindows | None:
        """The minute, hour and day windows of one item, or None when the broker never counted it."""
        now = read_item(self.stats, self.cluster, name, key)
        if now is None:
            return None
        now_at = self._clock()
        windows = []
        for ring in self._rings:
            if not ring:
                windows.append(Window())
                continue
            first_at, first_items = ring[0]
            windows.append(_window(first_at, first_items.get((name, key), (0, 0)), now_at, now))
        return ItemWindows(*windows)

    def tps(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(put, get) messages per second over the last 10 s, 1 min and 10 min (each over what was sampled of
        it: a broker up 30 s answers its 30 s for the longer spans)."""
        if not self._totals:
            return (0.0,) * len(TPS_SPANS_S), (0.0,) * len(TPS_SPANS_S)
        now_at = self._clock()
        totals = read_items(self.stats, self.cluster)
        put_now, got_now = totals[(BROKER_PUT_NUMS, self.cluster)][0], totals[(BROKER_GET_NUMS, self.cluster)][0]
        puts, gets = [], []
        for span in TPS_SPANS_S:
            # the oldest sample within the span (or the oldest there is)
            first = next((t for t in self._totals if now_at - t[0] <= span + SAMPLE_INTERVAL_S / 2), self._totals[-1])
            elapsed = now_at - first[0]
            puts.append(max(put_now - first[1], 0) / elapsed if elapsed > 0 else 0.0)
            gets.append(max(got_now - first[2], 0) / elapsed if elapsed > 0 else 0.0)
        return tuple(puts), tuple(gets)
