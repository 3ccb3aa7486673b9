"""Timer benchmarks: scheduling rate, delivery lateness, a burst in one second, memory, precision.

    .venv/bin/python bench/bench_timer.py all --quick    # every part, scaled down (about 2 minutes)
    .venv/bin/python bench/bench_timer.py spread         # 1,000,000 messages due over 60 s (100-byte bodies)
    .venv/bin/python bench/bench_timer.py burst          # 200,000 messages due in the same second
    .venv/bin/python bench/bench_timer.py burst --same-instant-only --broker   # all at one ms, in a broker
    .venv/bin/python bench/bench_timer.py precision      # lateness and cost for several timerPrecisionMs
    .venv/bin/python bench/bench_timer.py enqueue        # the enqueue pipeline alone (TimerLog + wheel)

The store and the timer service run in one process on one event loop (uvloop), as in the broker; the
producer is that loop too, putting batches of 64 through the broker's send-path rewrite, so the
enqueue rate includes sharing the loop with the sends. Lateness is read back from the delivered
records: store time minus TIMER_OUT_MS (never negative: nothing is delivered early).
With ``--broker`` the store and timer run inside a BrokerController instead (its put path and all its
arrival listeners). The burst lines also give the event loop's CPU time for the delivery, the garbage
collections during it, and how many CPUs other processes kept busy meanwhile.
Prints one JSON object per measurement. Data goes to a temporary folder (BENCH_DIR to choose).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from cometmq.net.loop import run
from cometmq.protocol.message import STORE_TIMESTAMP_POS
from cometmq.protocol.properties import decode_properties, encode_properties
from cometmq.store.config import StoreConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.config import TimerConfig
from cometmq.timer.message import TIMER_OUT_MS, Rewrite, rewrite_for_timer
from cometmq.timer.service import TimerMessageService
from cometmq.timer.wheel import wheel_size

TOPIC = "BenchTimer"
QUEUES = 8
BATCH = 64


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rss_mib() -> float:
    return round(float(psutil.Process().memory_info().rss) / 2**20, 1)


class GcPauses:
    """Time spent in garbage collection per generation while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.ms = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            gen = info["generation"]
            self.ms[gen] += (time.perf_counter() - self._t0) * 1000
            self.count[gen] += 1

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)

    def as_dict(self) -> dict[str, object]:
        return {"gc_ms": [round(x, 1) for x in self.ms], "gc_collections": self.count}


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="cometmq-bench-timer-", dir=os.environ.get("BENCH_DIR")))


class Bench:
    def __init__(self, path: Path, index: bool, **timer_cfg: Any) -> None:
        self.path = path
        self.store = MessageStore(StoreConfig(store_path=path, message_index_enable=index))
        self.config = TimerConfig(**timer_cfg)
        self.service = TimerMessageService(self.store, self.config, self.put)

    async def put(self, msgs: list[MessageInner]) -> PutResult:
        return self.store.put_messages(msgs)

    async def start(self) -> float:
        started = time.monotonic()
        await asyncio.to_thread(self.store.start)
        self.store.add_arrival_listener(self.service.on_arrival)
        await asyncio.to_thread(self.service.load)
        await self.service.start()
        return time.monotonic() - started

    async def stop(self) -> None:
        await self.service.stop()
        self.store.shutdown()

    async def schedule(self, dues: list[int], body: bytes) -> tuple[float, float]:
        """Put timer messages as the broker's send path does; returns (put seconds, indexed seconds)."""
        svc = self.service
        start = time.monotonic()
        base_offset = svc.enqueue_offset
        batch: list[MessageInner] = []
        max_delay = self.config.max_delay_ms
        for i, due in enumerate(dues):
            props = {"UNIQ_KEY": f"{i:032X}", "TAGS": "T", "TIMER_DELIVER_MS": str(due)}
            m = MessageInner(topic=TOPIC, body=body, queue_id=i % QUEUES, properties=props,
                             properties_raw=encode_properties(props))
            if rewrite_for_timer(m, now_ms(), max_delay).outcome is not Rewrite.SCHEDULED:
                raise SystemExit(f"message {i} is not in the future: raise --lead")
            batch.append(m)
            if len(batch) == BATCH:
                if not self.store.put_messages(batch).ok:
                    raise SystemExit("put failed")
                batch = []
                await asyncio.sleep(0)  # the broker's loop interleaves sends with the timer's work
        if batch:
            self.store.put_messages(batch)
        put_s = time.monotonic() - start
        while svc.enqueue_offset - base_offset < len(dues):
            await asyncio.sleep(0.001)
        return put_s, time.monotonic() - start

    async def index_caught_up(self, timeout_s: float = 60) -> None:
        """Wait until the store's key-index thread has drained what scheduling queued (its backlog is
        memory of the store, not of the timer), then collect garbage."""
        builder = self.store.index_builder
        deadline = time.monotonic() + timeout_s
        while builder is not None and builder._queue and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        gc.collect()

    def lateness(self) -> list[int]:
        out = []
        for q in range(QUEUES):
            off = 0
            while True:
                r = self.store.get_messages(TOPIC, q, off, 10_000, max_bytes=256 << 20)
                if not r.buffers:
                    break
                for v in r.buffers:
                    out.append(_late_of(v))
                off = r.next_begin_offset
        return out


class BrokerBench(Bench):
    """The store and timer inside a BrokerController (port 0, no nameserver): the broker's put path and every
    arrival listener it registers (long polling, POP, delay levels, timer) run for each delivered record."""

    def __init__(self, path: Path, index: bool, **timer_cfg: Any) -> None:
        from cometmq.broker.config import BrokerConfig
        from cometmq.broker.controller import BrokerController

        self.path = path
        changes = {"timer_precision_ms": timer_cfg.pop("precision_ms")} if "precision_ms" in timer_cfg else {}
        if timer_cfg:
            raise SystemExit(f"--broker takes no timer settings but the precision: {sorted(timer_cfg)}")
        cfg = BrokerConfig(listen_port=0)
        cfg = cfg.replace(store=cfg.store.replace(store_path=path, message_index_enable=index), **changes)
        self.broker = BrokerController(cfg)
        self.store = self.broker.store
        assert self.broker.timer.service is not None
        self.service = self.broker.timer.service
        self.config = self.service.config

    async def start(self) -> float:
        started = time.monotonic()
        await self.broker.start()
        return time.monotonic() - started

    async def stop(self) -> None:
        await self.broker.stop()


def make_bench(path: Path, index: bool, in_broker: bool, **timer_cfg: Any) -> Bench:
    return BrokerBench(path, index, **timer_cfg) if in_broker else Bench(path, index, **timer_cfg)


def _late_of(view: memoryview) -> int:
    store_ts = int.from_bytes(view[STORE_TIMESTAMP_POS:STORE_TIMESTAMP_POS + 8], "big")
    body_len = int.from_bytes(view[84:88], "big")
    p = 88 + body_len
    p += 1 + view[p]
    props_len = int.from_bytes(view[p:p + 2], "big")
    props = decode_properties(view[p + 2:p + 2 + props_len])
    return store_ts - int(props[TIMER_OUT_MS])


def _host_busy_s() -> float:
    """CPU seconds every process on the machine has used (all CPUs, idle and iowait excluded)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def quantiles(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def q(x: float) -> int:
        return v[min(len(v) - 1, int(x * len(v)))]

    return {"p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "p999_ms": q(0.999), "max_ms": v[-1],
            "min_ms": v[0], "mean_ms": round(sum(v) / len(v), 2)}


async def wait_delivered(b: Bench, total: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while b.service.stats.delivered < total:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {b.service.stats.delivered} of {total} delivered in time")
        await asyncio.sleep(0.05)


async def spread(n: int, window_s: float, lead_s: float, index: bool, precision_ms: int, label: str,
                 in_broker: bool = False) -> None:
    path = workdir()
    try:
        b = make_bench(path, index, in_broker, precision_ms=precision_ms)
        load_s = await b.start()
        rss0 = rss_mib()
        t0 = now_ms() + int(lead_s * 1000)
        dues = [t0 + int(i * window_s * 1000 / n) for i in range(n)]
        put_s, indexed_s = await b.schedule(dues, b"x" * 100)
        scheduled_rss = rss_mib()
        await b.index_caught_up()
        pending_rss = rss_mib()
        late_start = max(0, now_ms() - t0)
        cpu0 = psutil.Process().cpu_times()
        await wait_delivered(b, n, window_s + lead_s + 120)
        cpu1 = psutil.Process().cpu_times()
        delivered_rss = rss_mib()
        metrics = b.service.metrics()
        lat = b.lateness()
        await b.stop()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        report(bench=label, messages=n, window_s=window_s, precision_ms=precision_ms, index=index, in_broker=in_broker,
               schedule_put_per_s=round(n / put_s), enqueue_per_s=round(n / indexed_s),
               scheduling_overran_window_ms=late_start, load_s=round(load_s, 3),
               rss_before_mib=rss0, rss_end_of_scheduling_mib=scheduled_rss, rss_pending_mib=pending_rss,
               rss_after_mib=delivered_rss,
               cpu_s_delivery=round(cpu, 1), delivered=len(lat), duplicates=len(lat) - n,
               wheel_file_mib=round(wheel_size(b.config.wheel_slots) / 2**20, 1),
               service_p99_bucket_ms=metrics["lateness"]["p99Ms"], **quantiles(lat))
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def enqueue_only(n: int, index: bool) -> None:
    """The enqueue pipeline alone: records already stored (and announced), indexed in one go."""
    path = workdir()
    try:
        b = Bench(path, index)
        await asyncio.to_thread(b.store.start)
        b.store.add_arrival_listener(b.service.on_arrival)
        await asyncio.to_thread(b.service.load)
        due = now_ms() + 3_600_000
        total = 0.0
        done = 0
        while done < n:
            chunk = min(60_000, n - done)  # what the arrival cache holds
            batch: list[MessageInner] = []
            for i in range(chunk):
                props = {"UNIQ_KEY": f"{done + i:032X}", "TAGS": "T", "TIMER_DELIVER_MS": str(due + i % 60_000)}
                m = MessageInner(topic=TOPIC, body=b"x" * 100, queue_id=i % QUEUES, properties=props,
                                 properties_raw=encode_properties(props))
                rewrite_for_timer(m, now_ms(), b.config.max_delay_ms)
                batch.append(m)
                if len(batch) == BATCH:
                    b.store.put_messages(batch)
                    batch = []
            if batch:
                b.store.put_messages(batch)
            started = time.perf_counter()
            got = b.service.enqueue_available()
            total += time.perf_counter() - started
            assert got == chunk, (got, chunk)
            done += chunk
        report(bench="enqueue_only", messages=n, index=index, enqueue_per_s=round(n / total),
               us_per_message=round(total / n * 1e6, 2))
        await b.service.start()
        await b.stop()
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def burst(n: int, lead_s: float, index: bool, same_instant: bool, in_broker: bool = False) -> None:
    path = workdir()
    try:
        b = make_bench(path, index, in_broker)
        await b.start()
        due = (now_ms() + int(lead_s * 1000)) // 1000 * 1000 + 1000
        dues = [due if same_instant else due + i * 1000 // n for i in range(n)]
        _, indexed_s = await b.schedule(dues, b"x" * 100)
        if now_ms() > due - 1000:
            report(bench="burst", warning="scheduling ran into the last second before the burst; raise --lead")
        while now_ms() < due - 50:
            await asyncio.sleep(0.01)
        ready_at_due = b.service.metrics()["prefetched"]
        cpu0, proc0, host0, wall0 = time.thread_time(), time.process_time(), _host_busy_s(), time.monotonic()
        with GcPauses() as pauses:
            await wait_delivered(b, n, lead_s + 120)
        last = now_ms()
        loop_cpu_ms, process_cpu_ms = (time.thread_time() - cpu0) * 1000, (time.process_time() - proc0) * 1000
        # CPUs kept busy by other processes meanwhile (the machine is shared): 0 = an idle machine
        others_busy_cpus = (_host_busy_s() - host0 - process_cpu_ms / 1000) / max(1e-3, time.monotonic() - wall0)
        lat = b.lateness()
        await b.stop()
        within_1s = sum(1 for x in lat if x <= 1000)
        report(bench="burst", messages=n, same_instant=same_instant, index=index, in_broker=in_broker,
               enqueue_per_s=round(n / indexed_s), read_ahead_at_due=ready_at_due, all_delivered_after_ms=last - due,
               delivered_within_1s=within_1s, fraction_within_1s=round(within_1s / n, 4),
               delivery_rate_per_s=round(n / max(0.001, (max(lat) + (0 if same_instant else 1000)) / 1000)),
               loop_cpu_ms=round(loop_cpu_ms), process_cpu_ms=round(process_cpu_ms),
               others_busy_cpus=round(max(0.0, others_busy_cpus), 2), **pauses.as_dict(),
               **quantiles(lat))
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> None:
    quick = args.quick
    report(bench="env", python=sys.version.split()[0], platform=platform.platform(), cpus=os.cpu_count(),
           quick=quick, index=args.index, in_broker=args.broker)
    parts = ["enqueue", "spread", "burst", "precision"] if args.part == "all" else [args.part]
    if "enqueue" in parts:
        await enqueue_only(args.messages or (120_000 if quick else 600_000), args.index)
    if "spread" in parts:
        n = args.messages or (100_000 if quick else 1_000_000)
        window = args.window or (20.0 if quick else 60.0)
        lead = args.lead or (n / 25_000 + 5)
        await spread(n, window, lead, args.index, args.precision, "spread", args.broker)
    if "burst" in parts:
        n = args.messages or (50_000 if quick else 200_000)
        lead = args.lead or (n / 15_000 + 7)  # scheduled, then read ahead (5 s) before they are due
        await burst(n, lead, args.index, same_instant=True, in_broker=args.broker)
        if not args.same_instant_only:
            await burst(n, lead, args.index, same_instant=False, in_broker=args.broker)
    if "precision" in parts:
        n = 50_000 if quick else 200_000
        window = 10.0 if quick else 30.0
        for p in (1000, 100, 20):
            await spread(n, window, n / 25_000 + 4, args.index, p, "precision")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["all", "enqueue", "spread", "burst", "precision"])
    ap.add_argument("--quick", action="store_true", help="scaled-down sizes (minutes, not tens of minutes)")
    ap.add_argument("--messages", type=int, default=0)
    ap.add_argument("--window", type=float, default=0.0, help="seconds the due times are spread over")
    ap.add_argument("--lead", type=float, default=0.0, help="seconds from the start to the first due time")
    ap.add_argument("--precision", type=int, default=TimerConfig().precision_ms)
    ap.add_argument("--same-instant-only", action="store_true",
                    help="burst: only the case of every message due at the same millisecond")
    ap.add_argument("--broker", action="store_true",
                    help="spread/burst: run inside a BrokerController (its put path and arrival listeners)")
    ap.add_argument("--no-index", dest="index", action="store_false", help="messageIndexEnable=false")
    run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
