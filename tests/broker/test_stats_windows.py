"""The broker's sampled windows (cometmq.broker.stats_windows) on a clock the test moves: what RocketMQ's StatsItem
answers for the minute, hour and day, and the runtime info's TPS spans."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cometmq.broker.stats import NORMAL, BrokerStats
from cometmq.broker.stats_windows import SAMPLE_INTERVAL_S, StatsWindows
from cometmq.store.status import PutResult, PutStatus


class Clock:
    def __init__(self) -> None:
        # a local midnight plus one hour: the test crosses into the next day on purpose, later
        lt = time.localtime()
        self.now = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 1, 0, 0, 0, 0, -1))

    def __call__(self) -> float:
        return self.now


class Record:
    def __init__(self, phy_offset: int) -> None:
        self.phy_offset = phy_offset


def put(stats: BrokerStats, topic: str, count: int, size: int = 100) -> None:
    """One send request of ``count`` records of ``size`` bytes each."""
    records: list[Any] = [Record(i * size) for i in range(count)]
    stats.put(topic, NORMAL, PutResult(PutStatus.PUT_OK, records, end_offset=count * size))


def run(windows: StatsWindows, clock: Clock, seconds: float) -> None:
    """Let ``seconds`` pass, sampling as the broker's periodic task would."""
    for _ in range(round(seconds / SAMPLE_INTERVAL_S)):
        clock.now += SAMPLE_INTERVAL_S
        windows.sample()


def test_windows_rate_the_counters_as_rocketmq_stats_items() -> None:
    clock, stats = Clock(), BrokerStats()
    windows = StatsWindows(stats, "C", clock=clock)
    windows.sample()  # start
    assert windows.item("TOPIC_PUT_NUMS", "T") is None  # never counted: "not exist"
    put(stats, "T", 10)
    put(stats, "T", 20)
    clock.now += 5
    w = windows.item("TOPIC_PUT_NUMS", "T")
    assert w is not None
    # 30 messages in 2 requests, 5 s after the first sample: every window is that young
    for window in (w.minute, w.hour, w.day):
        assert window.sum == 30 and window.tps == pytest.approx(6.0) and window.avgpt == pytest.approx(15.0)
    size = windows.item("TOPIC_PUT_SIZE", "T")
    assert size is not None and size.minute.sum == 3000

    run(windows, clock, 120)  # two quiet minutes: the minute window moves past the sends, the hour does not
    w = windows.item("TOPIC_PUT_NUMS", "T")
    assert w is not None and w.minute.sum == 0 and w.minute.tps == 0.0
    assert w.hour.sum == 30 and w.day.sum == 30

    stats.got("T", "G", 0, 7, 700, 7)
    stats.got("T", "G", 0, 3, 300, 10)
    clock.now += 10
    g = windows.item("GROUP_GET_NUMS", "T@G")
    assert g is not None and g.minute.sum == 10 and g.minute.avgpt == pytest.approx(5.0)
    assert windows.item("GROUP_GET_NUMS", "T@other") is None
    b = windows.item("BROKER_GET_NUMS", "C")
    assert b is not None and b.day.sum == 10
    assert windows.item("BROKER_PUT_NUMS", "other-cluster") is None

    run(windows, clock, 3600 + 600)  # past an hour
    w = windows.item("TOPIC_PUT_NUMS", "T")
    assert w is not None and w.hour.sum == 0 and w.day.sum == 30


def test_tps_spans_and_the_mornings() -> None:
    clock, stats = Clock(), BrokerStats()
    windows = StatsWindows(stats, "C", clock=clock)
    windows.sample()
    assert windows.tps() == ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    run(windows, clock, 600)  # ten quiet minutes
    put(stats, "T", 600)  # then 600 messages in the last 10 s
    run(windows, clock, 10)
    puts, gets = windows.tps()
    assert puts[0] == pytest.approx(600 / 10, rel=0.1)
    assert puts[1] == pytest.approx(600 / 60, rel=0.2)
    assert puts[2] == pytest.approx(600 / 600, rel=0.1)
    assert gets == (0.0, 0.0, 0.0)

    assert windows.today_morning == (0, 0) and windows.yesterday_morning == (0, 0)
    clock.now += 24 * 3600  # the next day
    windows.sample()
    assert windows.today_morning == (600, 0) and windows.yesterday_morning == (0, 0)
    put(stats, "T", 5)
    clock.now += 24 * 3600
    windows.sample()
    assert windows.today_morning == (605, 0) and windows.yesterday_morning == (600, 0)
