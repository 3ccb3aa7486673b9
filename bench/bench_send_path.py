"""The broker's Python cost of one SEND_MESSAGE_V2, with no sockets: what a request costs above the kernel.

    .venv/bin/python bench/bench_send_path.py [--count 20000] [--profile]

Starts a BrokerController in this process (a temporary data folder, message index off as in bench/compare),
creates topic T, builds ``--count`` requests with the SDK's own encoder (``Producer._request``: 100-byte bodies,
a UNIQ_KEY each), and feeds each frame to a server connection's ``data_received`` with a transport that drops the
replies, one loop turn per request (as a lone producer's requests arrive). Prints one JSON line: wall and CPU µs per
send, and the bare loop turn's cost, which is included. ``--profile`` adds a cProfile listing (sorted by
$SORT, default tottime; $TOP rows). The running broker pays about twice this per request: the same code runs on
cold caches between wake-ups (docs/benchmarks.md, "[16] one request at a time").
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.kit

from tests.kit.transport import MemoryTransport

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client.message import Message
from cometmq.client.producer import Producer
from cometmq.net.loop import run
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.remoting import encode_parts
from cometmq.protocol.route import TopicConfig


async def measure(count: int, profile: bool) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="bench-send-path-"))
    cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1")
    broker = BrokerController(cfg.replace(store=cfg.store.replace(store_path=data, message_index_enable=False)))
    await broker.start()
    try:
        broker.topics.put(TopicConfig("T", read_queue_nums=4, write_queue_nums=4))
        sink = MemoryTransport(keep=False)  # replies dropped, counted
        conn = broker.server._new_connection()
        conn.connection_made(sink)  # type: ignore[arg-type]
        producer = Producer("bench-send-path", namesrv="127.0.0.1:1")  # never started: only its encoder is used
        queue = MessageQueue("T", cfg.broker_name, 0)
        frames = []
        for _ in range(count + 500):
            head, body = encode_parts(producer._request(queue, Message("T", b"x" * 100))[0])
            frames.append(head + body)
        for frame in frames[:500]:  # warm-up
            conn.data_received(frame)
            await asyncio.sleep(0)
        frames = frames[500:]
        t0 = time.perf_counter()
        for _ in frames:
            await asyncio.sleep(0)
        turn_us = (time.perf_counter() - t0) / count * 1e6
        profiler = cProfile.Profile() if profile else None
        t0, c0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        for frame in frames:
            conn.data_received(frame)
            await asyncio.sleep(0)
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(os.environ.get("SORT", "tottime")).print_stats(
                int(os.environ.get("TOP", "30")))
        assert sink.writes == count + 500, f"{sink.writes} replies for {count + 500} requests"
        return {"bench": "send_path", "sends": count, "wall_us_per_send": round(wall / count * 1e6, 1),
                "cpu_us_per_send": round(cpu / count * 1e6, 1), "loop_turn_us": round(turn_us, 1),
                "profiled": profile}
    finally:
        await broker.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(json.dumps(run(measure(args.count, args.profile))))


if __name__ == "__main__":
    main()
