"""How much memory a consumer holds when a topic carries compressed bodies that inflate a thousandfold.

An in-process nameserver + broker; a producer sends ``--count`` bodies of zeros that inflate to ``--mib`` MiB
each (stored as ~16 KiB zlib streams with the COMPRESSED sys flag, as a Java producer writes them); then a push
consumer with a slow listener, and a lite-pull consumer polled slowly, read them all. Printed per consumer: the
peak of the process's resident set over its phase (sampled every 2 ms) above the RSS before it, with --trace the
peak of what Python allocated (tracemalloc) above the start, the most bytes its buffers held (the push consumer's
process queue, the lite-pull consumer's buffered bodies), and whether every message arrived, inflated.

    PYTHONPATH=$PWD/src .venv/bin/python bench/bench_inflate_memory.py --count 48 --trace
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client import Admin, ConsumeStatus, LitePullConsumer, Message, MessageExt, Producer, PushConsumer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _Peak:
    """The highest RSS seen by a thread sampling every 2 ms while in the ``with`` block."""

    def __enter__(self) -> _Peak:
        self.base = self.peak = _rss()
        tracemalloc.reset_peak()
        self.traced = tracemalloc.get_traced_memory()[0]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self.traced = tracemalloc.get_traced_memory()[1] - self.traced
        self._stop.set()
        self._t.join()


async def _push(ns: str, topic: str, count: int, size: int) -> None:
    got: dict[int, int] = {}
    done = asyncio.Event()
    held = [0]
    consumer: PushConsumer | None = None

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        assert consumer is not None
        held[0] = max([held[0], *(r.pq.size_bytes for r in consumer._requests.values())])
        await asyncio.sleep(0.02)
        for m in msgs:
            got[m.queue_offset] = len(m.body)
        if len(got) >= count:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("inflate-push", namesrv=ns, listener=listener, consume_from="first", max_concurrency=1)
    consumer.subscribe(topic)
    with _Peak() as p:
        t0 = time.monotonic()
        async with consumer:
            await asyncio.wait_for(done.wait(), 300)
    ok = sorted(got) == list(range(count)) and set(got.values()) == {size}
    print(f"push consumer:      peak RSS +{(p.peak - p.base) >> 20} MiB (traced +{p.traced >> 20}), process queue "
          f"held up to {held[0] >> 20} MiB, {len(got)}/{count} inflated ok={ok}, {time.monotonic() - t0:.1f}s")


async def _lite(ns: str, topic: str, count: int, size: int) -> None:
    got: dict[int, int] = {}
    held = 0
    with _Peak() as p:
        t0 = time.monotonic()
        async with LitePullConsumer("inflate-lite", namesrv=ns, consume_from="first", long_poll_timeout=1.0) as c:
            await c.subscribe(topic)
            while len(got) < count and time.monotonic() - t0 < 300:
                await asyncio.sleep(0.05)  # a slow application: the pull tasks run ahead of it
                held = max(held, sum(len(m.body) for b in c._buffer for m in b.msgs))
                for m in await c.poll(1.0, max_messages=1):
                    got[m.queue_offset] = len(m.body)
    ok = sorted(got) == list(range(count)) and set(got.values()) == {size}
    print(f"lite-pull consumer: peak RSS +{(p.peak - p.base) >> 20} MiB (traced +{p.traced >> 20}), buffer held "
          f"up to {held >> 20} MiB, {len(got)}/{count} inflated ok={ok}, {time.monotonic() - t0:.1f}s")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=48)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--only", choices=("push", "lite"))
    ap.add_argument("--trace", action="store_true", help="also the tracemalloc peak (slower)")
    a = ap.parse_args()
    if a.trace:
        tracemalloc.start()
    size = a.mib << 20
    with tempfile.TemporaryDirectory() as tmp:
        nsc = NamesrvController(NamesrvConfig(port=0))
        await nsc.start()
        ns = f"127.0.0.1:{nsc.port}"
        cfg = BrokerConfig(listen_port=0, broker_name="broker-a", namesrv_addr=ns)
        broker = BrokerController(cfg.replace(store=cfg.store.replace(store_path=Path(tmp))))
        await broker.start()
        try:
            async with Admin(namesrv=ns) as admin:
                await admin.create_topic("Inflate", read_queues=1, write_queues=1)
            body = bytes(size)
            async with Producer("inflate-pg", namesrv=ns, max_message_size=size + 1) as p:
                for _ in range(a.count):
                    assert (await p.send(Message("Inflate", body))).ok
            del body
            print(f"{a.count} bodies of {a.mib} MiB of zeros sent compressed; RSS now {_rss() >> 20} MiB")
            if a.only in (None, "push"):
                await _push(ns, "Inflate", a.count, size)
            if a.only in (None, "lite"):
                await _lite(ns, "Inflate", a.count, size)
        finally:
            await broker.stop()
            await nsc.stop()


if __name__ == "__main__":
    asyncio.run(main())
