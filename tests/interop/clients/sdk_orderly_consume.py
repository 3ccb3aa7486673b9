"""An orderly push consumer built on the cometmq SDK (``OrderlyPushConsumer``), for multi-process tests.

Prints JSON lines like push_consume.py (the C++ client's script), so one checker reads both::

    {"event":"started","client_id":"127.0.0.1@1234#1","pid":1234}
    {"event":"locked","queues":[0,3],"t_ns":...}         whenever the set of queues it consumes changes
    {"event":"msg","n":1,"topic":"T","queue_id":0,"queue_offset":0,"body":"k1:0","reconsume_times":0,
     "recv_ns":...,"status":"CONSUME_SUCCESS"}
    {"event":"stopping",...} {"event":"summary",...stats} {"event":"closed"}

With ``--quiet``: ``{"event":"progress","consumed":n,"t_ns":...}`` every 0.1 s instead of msg lines.

Every line is flushed before the listener returns, so a consumer killed with SIGKILL leaves a record of
everything it consumed. Stops (cleanly: commit, unlock, unregister) on SIGTERM/SIGINT or after ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from cometmq.client import ConsumeOrderlyStatus, MessageExt, OrderlyPushConsumer


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Consume orderly with the cometmq SDK.")
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="CG_sdk_orderly")
    ap.add_argument("--batch-max-size", type=int, default=1)
    ap.add_argument("--sleep-ms", type=float, default=0, help="sleep in the listener per batch")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--quiet", action="store_true",
                    help="no msg lines: a progress line every 0.1 s instead (for benchmarks)")
    ap.add_argument("--log-level", default="WARNING")
    return ap.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    n = 0

    async def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        nonlocal n
        for m in msgs:
            n += 1
            if not args.quiet:
                emit({"event": "msg", "n": n, "topic": m.topic, "queue_id": m.queue.queue_id,
                      "queue_offset": m.queue_offset, "body": m.body.decode(errors="replace"),
                      "reconsume_times": m.reconsume_times, "recv_ns": time.time_ns(), "status": "CONSUME_SUCCESS"})
        if args.sleep_ms:
            await asyncio.sleep(args.sleep_ms / 1000)
        return ConsumeOrderlyStatus.SUCCESS

    consumer = OrderlyPushConsumer(args.group, namesrv=args.namesrv, listener=listener, consume_from="first",
                                   batch_max_size=args.batch_max_size)
    consumer.subscribe(args.topic)
    t0 = time.monotonic()
    await consumer.start()
    emit({"event": "started", "client_id": consumer.instance.client_id, "pid": os.getpid()})
    reason = "time"
    last: list[int] | None = None
    last_progress = 0.0
    while True:
        locked = sorted(q.queue_id for q in consumer.locked_queues if q.topic == args.topic)
        if locked != last:
            emit({"event": "locked", "queues": locked, "t_ns": time.time_ns(), "consumed": n})
            last = locked
        if args.quiet and time.monotonic() - last_progress >= 0.1:
            last_progress = time.monotonic()
            emit({"event": "progress", "consumed": n, "t_ns": time.time_ns()})
        if stop.is_set():
            reason = "signal"
            break
        if time.monotonic() - t0 > args.seconds:
            break
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    emit({"event": "stopping", "received": n, "reason": reason})
    await consumer.close()
    emit({"event": "summary", "received": n, "reason": reason, **dataclasses.asdict(consumer.stats)})
    emit({"event": "closed"})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
