"""Live figures for the charts: every ``interval`` seconds the sampler reads the cluster (each broker's runtime
info, its Prometheus endpoint when it has one, the timer metrics, the lag of the groups and the size of the topics
being watched) and keeps the last ``window`` seconds of each series in a ring buffer: memory is bounded by
(series x window / interval) points, and a series with no new point for a window (a deleted topic) is dropped.

Which topics and groups are sampled: all of them while there are at most ``sample_all`` of each (the usual small
cluster), else those whose page was opened in the last window (a cluster of thousands is not read in full every
few seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.request
from collections import deque
from typing import Any

from cometmq.dashboard import promtext
from cometmq.dashboard.data import ClusterData, is_system_group, is_system_topic

log = logging.getLogger(__name__)


class Series:
    """One ring buffer of (epoch ms, value)."""

    __slots__ = ("points",)

    def __init__(self, size: int) -> None:
        self.points: deque[tuple[int, float]] = deque(maxlen=size)


class Sampler:
    def __init__(self, data: ClusterData, *, interval: float = 5.0, window: float = 600.0,
                 sample_all: int = 100) -> None:
        self.data = data
        self.interval = interval
        self.window = window
        self.sample_all = sample_all
        self.size = max(2, int(window / interval))
        self.series: dict[str, Series] = {}
        self._last: dict[str, tuple[float, float]] = {}  # counter -> (monotonic time, value) for rates
        self.watched: dict[str, float] = {}  # "topic:T" / "group:G" -> monotonic time last looked at
        self.last_sample_ms = 0
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None
        #: POP messages in flight per group, from the last scrape (brokers with a Prometheus endpoint)
        self.pop_by_group: dict[str, float] = {}

    # -- the ring buffers ---------------------------------------------------------------------------------
    def add(self, name: str, value: float, at_ms: int) -> None:
        s = self.series.get(name)
        if s is None:
            s = self.series[name] = Series(self.size)
        s.points.append((at_ms, value))

    def rate(self, name: str, counter: float, at_ms: int, now: float) -> None:
        """Add the per-second rate of a counter since its last sample (none on the first; a reset gives 0)."""
        prev = self._last.get(name)
        self._last[name] = (now, counter)
        if prev is not None and now > prev[0]:
            self.add(name, max(0.0, (counter - prev[1]) / (now - prev[0])), at_ms)

    def get(self, names: list[str]) -> dict[str, list[tuple[int, float]]]:
        out = {}
        for name in names:
            s = self.series.get(name)
            out[name] = list(s.points) if s is not None else []
        return out

    def watch(self, kind: str, name: str) -> None:
        self.watched[f"{kind}:{name}"] = time.monotonic()

    # -- the loop -------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dashboard-sampler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.sample()
                self.last_error = ""
            except Exception as exc:  # the cluster may be down for a while: keep sampling
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("dashboard sample failed", exc_info=True)
            await asyncio.sleep(max(0.2, self.interval - (loop.time() - started)))

    async def sample(self) -> None:
        now = time.monotonic()
        at = int(time.time() * 1000)
        self.last_sample_ms = at
        self._expire(now, at)
        brokers = await self.data.brokers()
        pop: dict[str, float] = {}
        await asyncio.gather(*(self._broker(b, at, now, pop) for b in brokers),
                             self._timers(at), self._topics(at, now), self._groups(at))
        self.pop_by_group = pop

    def _expire(self, now: float, at: int) -> None:
        for key in [k for k, t in self.watched.items() if now - t > self.window]:
            del self.watched[key]
        old = at - int(self.window * 1000)
        for name in [n for n, s in self.series.items() if not s.points or s.points[-1][0] < old]:
            del self.series[name]
            self._last.pop(name, None)
        # a counter read once (a topic deleted before its second sample) has no series: its last value goes here
        for name in [n for n, (t, _) in self._last.items() if now - t > self.window]:
            del self._last[name]

    async def _broker(self, b: dict[str, Any], at: int, now: float, pop: dict[str, float]) -> None:
        addr = b["addr"]
        rt = await self.data.admin.broker_runtime_info(addr)
        label = f"{b['name']}/{b['id']}"
        commitlog = float(rt.get("commitLogMaxOffset") or 0)
        self.rate(f"broker:{label}:bytes_in", commitlog, at, now)
        try:
            self.add(f"broker:{label}:disk", round(100 * float(rt.get("commitLogDiskRatio") or 0), 2), at)
        except ValueError:
            pass
        url = await self.data.metrics_url(addr)
        if url is None:
            put = float(rt.get("msgPutTotalTodayNow") or 0)
            got = float(rt.get("msgGetTotalTodayNow") or 0)
            self.rate(f"broker:{label}:msgs_in", put, at, now)
            self.rate(f"broker:{label}:msgs_out", got, at, now)
            return
        samples = promtext.parse(await asyncio.to_thread(_fetch, url))
        self.rate(f"broker:{label}:msgs_in", promtext.total(samples, "rocketmq_messages_in_total"), at, now)
        self.rate(f"broker:{label}:msgs_out", promtext.total(samples, "rocketmq_messages_out_total"), at, now)
        self.add(f"broker:{label}:dispatch_behind",
                 promtext.total(samples, "rocketmq_storage_dispatch_behind_bytes"), at)
        self.add(f"broker:{label}:flush_behind", promtext.total(samples, "rocketmq_storage_flush_behind_bytes"), at)
        for topic, n in promtext.by_label(samples, "rocketmq_messages_in_total", "topic").items():
            self.rate(f"topic:{topic}:in", n, at, now)
        for group, n in promtext.by_label(samples, "rocketmq_messages_out_total", "consumer_group").items():
            self.rate(f"group:{group}:out", n, at, now)
        self.add(f"pop:{label}:inflight", promtext.total(samples, "rocketmq_consumer_inflight_messages"), at)
        self.add(f"pop:{label}:redelivered", promtext.total(samples, "rocketmq_pop_revive_retry_messages_total"), at)
        self.add(f"pop:{label}:held", promtext.total(samples, "cometmq_long_polling_holds", request_type="pop"), at)
        for group, n in promtext.by_label(samples, "rocketmq_consumer_inflight_messages", "consumer_group").items():
            pop[group] = pop.get(group, 0.0) + n

    async def _timers(self, at: int) -> None:
        try:
            table = await self.data.admin.timer_metrics()
        except Exception:
            return
        for name, m in table.items():
            if m.get("enabled") is False:
                continue
            self.add(f"timer:{name}:scheduled", float(m.get("scheduled", 0)), at)
            self.add(f"timer:{name}:due", float(m.get("dueUndelivered", 0)), at)

    def _chosen(self, kind: str, names: list[str]) -> list[str]:
        if len(names) <= self.sample_all:
            return names
        return [n for n in names if f"{kind}:{n}" in self.watched]

    async def _topics(self, at: int, now: float) -> None:
        names = [t for t in await self.data.topic_names() if not is_system_topic(t)]
        chosen = self._chosen("topic", names)
        totals = await asyncio.gather(*(self.data.topic_totals(t) for t in chosen), return_exceptions=True)
        for t, tot in zip(chosen, totals, strict=True):
            if not isinstance(tot, BaseException):
                self.rate(f"topic:{t}:written", float(tot["written"]), at, now)
                self.add(f"topic:{t}:held", float(tot["held"]), at)

    async def _groups(self, at: int) -> None:
        names = [g for g in await self.data.group_configs() if not is_system_group(g)]
        chosen = self._chosen("group", names)
        lags = await asyncio.gather(*(self.data.group_lag(g) for g in chosen), return_exceptions=True)
        for g, lag in zip(chosen, lags, strict=True):
            if not isinstance(lag, BaseException):
                self.add(f"group:{g}:lag", float(lag["lag"]), at)


def _fetch(url: str) -> str:
    """GET a broker's /metrics (loopback or the cluster's network; a few KB)."""
    with urllib.request.urlopen(url, timeout=3) as r:  # http://, from the broker's config
        body: bytes = r.read()
    return body.decode("utf-8", "replace")
