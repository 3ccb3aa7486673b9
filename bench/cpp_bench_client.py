"""Lean drivers of the official RocketMQ C++ client (wheel ``rocketmq==0.4.4``) for bench_broker.py.

Unlike tests/interop/clients/*.py these print no line per message (a JSON line per message would cost
the client more than the broker's work), only ``ready`` / ``started`` / ``summary`` / ``closed`` lines::

    python bench/cpp_bench_client.py produce --namesrv H:P --topic T --count 20000 --body-size 100 [--wait-go]
    python bench/cpp_bench_client.py consume --namesrv H:P --topic T --group G --count 100000 [--latency]
    python bench/cpp_bench_client.py echo-server          # raw TCP echo of length-prefixed frames (no wheel)

``produce --stamp`` puts ``time.time_ns()`` (taken right before send_sync) in the body; ``consume --latency``
subtracts it from its own ``time.time_ns()`` at callback entry (same machine, same clock). Warm-up messages
have bodies starting with ``w`` and are not measured. With ``--wait-go`` the producer prints ``ready`` after
its warm-up and waits for a line on stdin, so several producer processes can start together.

Shutdown goes through tests/interop/clients/_common.py (waits out the C++ client's route-timer abort window).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "interop" / "clients"))


_emit_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _emit_lock:  # consumer callbacks run on several C++ threads
        sys.stdout.write(line)
        sys.stdout.flush()


def pct(sorted_vals: list[float] | list[int], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return float(sorted_vals[k])


def lat_stats(values_ns: list[int] | array.array[int], unit: float = 1e3) -> dict[str, Any]:
    """p50/p90/p99/max of nanosecond samples in µs (unit 1e3) or ms (unit 1e6)."""
    vals = sorted(values_ns)
    if not vals:
        return {"n": 0}
    return {"n": len(vals), "p50": round(pct(vals, 0.5) / unit, 3), "p90": round(pct(vals, 0.9) / unit, 3),
            "p99": round(pct(vals, 0.99) / unit, 3), "max": round(vals[-1] / unit, 3),
            "min": round(vals[0] / unit, 3)}


# --------------------------------------------------------------------------------------------- producer


def cmd_produce(args: argparse.Namespace) -> int:
    import _common as c

    client = c.load_wheel()
    dll = c.dll()
    producer = client.Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    if args.instance_name:
        dll.SetProducerInstanceName(producer._handle, c.c_str(args.instance_name))
    t_start = time.monotonic()
    try:
        producer.start()
    except Exception as exc:
        c.fatal(f"producer start failed: {exc}")
    emit({"event": "started", "pid": os.getpid()})

    pad = b"x" * args.body_size

    def body_for(i: int, warm: bool) -> bytes:
        if args.stamp:
            head = b"w|" if warm else f"{time.time_ns()}|{i}|".encode()
            return bytes(head + pad[: max(0, args.body_size - len(head))])
        return bytes(pad) if args.body_size else f"m-{i}".encode()

    def one_message(i: int, warm: bool = False) -> Any:
        msg = client.Message(args.topic)
        body = body_for(i, warm)
        dll.SetByteMessageBody(msg._handle, body, len(body))
        if args.tags:
            msg.set_tags(args.tags)
        return msg

    failures: list[str] = []
    lat = array.array("q")
    at = array.array("q")  # start of each send, ns after the measured part began
    sent = 0
    try:
        for i in range(args.warmup):  # route lookup, connection, topic auto-creation
            producer.send_sync(one_message(i, warm=True))
            if args.stamp and args.warmup_interval_ms:
                time.sleep(args.warmup_interval_ms / 1000)
        emit({"event": "ready"})
        if args.wait_go:
            sys.stdin.readline()
        t0_wall = time.time()
        t0 = time.perf_counter()
        t0_ns = time.perf_counter_ns()
        if args.mode == "batch":
            size = max(1, args.batch_size)
            for start in range(0, args.count, size):
                msgs = [one_message(i) for i in range(start, min(start + size, args.count))]
                s = time.perf_counter_ns()
                try:
                    producer.send_batch(msgs)
                    sent += len(msgs)
                except Exception as exc:
                    failures.append(repr(exc))
                lat.append(time.perf_counter_ns() - s)
        else:
            interval = args.interval_ms / 1000
            for i in range(args.count):
                if interval:
                    due = t0 + i * interval
                    delay = due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                msg = one_message(i)  # (with --stamp the body's timestamp is taken here)
                s = time.perf_counter_ns()
                at.append(s - t0_ns)
                try:
                    producer.send_sync(msg)
                    sent += 1
                except Exception as exc:
                    failures.append(repr(exc))
                    if len(failures) > 50:
                        break
                lat.append(time.perf_counter_ns() - s)
        elapsed = time.perf_counter() - t0
        t1_wall = time.time()
    except BaseException as exc:  # still shut down cleanly
        failures.append(repr(exc))
        elapsed, t0_wall, t1_wall = 0.0, time.time(), time.time()
    emit({"event": "summary", "mode": args.mode, "requested": args.count, "sent": sent, "failed": len(failures),
          "errors": failures[:3], "elapsed_s": round(elapsed, 4), "t0": t0_wall, "t1": t1_wall,
          "msgs_per_s": round(sent / elapsed, 1) if elapsed > 0 else None,
          "send_us": lat_stats(lat),
          **({"all_send_ns": list(lat)} if args.stamp else {}),
          "worst_sends": [{"us": round(lat[k] / 1e3, 1), "at_s": round(at[k] / 1e9, 3), "index": k}
                          for k in sorted(range(len(at)), key=lambda k: -lat[k])[:5]]})
    c.shutdown_and_destroy(producer, "Producer", t_start, emit_closed=False)
    emit({"event": "closed"})
    return 0 if not failures and sent == args.count else 1


# --------------------------------------------------------------------------------------------- consumer


def cmd_consume(args: argparse.Namespace) -> int:
    import _common as c

    client = c.load_wheel()
    dll = c.dll()
    from rocketmq.exceptions import ffi_check

    consumer = client.PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.thread_count:
        consumer.set_thread_count(args.thread_count)

    lock = threading.Lock()
    done = threading.Event()
    st = {"received": 0, "warm": 0, "first_ns": 0, "last_ns": 0, "bad": 0}
    lat: list[int] = []
    recv_at: list[int] = []  # with --latency: receive time of each measured message (for outlier timing)
    index: list[int] = []  # with --latency: the producer's message index
    get_body = dll.GetMessageBody

    def on_message(_consumer: Any, handle: Any) -> int:
        now = time.time_ns()
        try:
            if args.latency:
                body = get_body(handle) or b""
                head, _, rest = body.partition(b"|")
                if head.startswith(b"w"):
                    with lock:
                        st["warm"] += 1
                        k = st["warm"]
                    emit({"event": "warm", "n": k, "recv_ns": now})  # few: the bench waits for these
                    return 0
                with lock:
                    try:
                        lat.append(now - int(head))
                        recv_at.append(now)
                        index.append(int(rest.partition(b"|")[0]))
                    except ValueError:
                        st["bad"] += 1
                    st["received"] += 1
                    n = st["received"]
                    if not st["first_ns"]:
                        st["first_ns"] = now
                    st["last_ns"] = now
            else:
                with lock:
                    st["received"] += 1
                    n = st["received"]
                    if not st["first_ns"]:
                        st["first_ns"] = now
                    st["last_ns"] = now
            if args.count and n >= args.count:
                done.set()
        except Exception as exc:  # never raise into the C++ thread
            emit({"event": "callback_error", "error": repr(exc)})
        return 0

    ffi_check(dll.Subscribe(consumer._handle, c.c_str(args.topic), b"*"))
    consumer._register_callback(on_message)
    t_start = time.monotonic()
    start_ns = time.time_ns()
    try:
        consumer.start()
    except Exception as exc:
        c.fatal(f"push consumer start failed: {exc}")
    started_ns = time.time_ns()
    emit({"event": "started", "pid": os.getpid(), "start_ns": start_ns, "started_ns": started_ns})
    done.wait(args.timeout)
    with lock:
        summary = {"event": "summary", "received": st["received"], "warm": st["warm"], "bad_bodies": st["bad"],
                   "count": args.count, "complete": st["received"] >= args.count, "start_ns": start_ns,
                   "first_ns": st["first_ns"], "last_ns": st["last_ns"]}
        if args.latency:
            summary["latency_ms"] = lat_stats(lat, unit=1e6)
            summary["samples_ns"] = list(zip(recv_at, lat, index, strict=True))
    emit(summary)
    c.shutdown_and_destroy(consumer, "PushConsumer", t_start, emit_closed=False)
    emit({"event": "closed"})
    return 0 if summary["complete"] else 2


# ------------------------------------------------------------------------------------------ echo server


class _Echo(asyncio.Protocol):
    """Echoes length-prefixed frames whole (as a remoting server answers whole frames)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            n = int.from_bytes(buf[pos:pos + 4], "big")
            if len(buf) - pos - 4 < n:
                break
            self.t.write(bytes(buf[pos:pos + 4 + n]))  # type: ignore[attr-defined]
            pos += 4 + n
        del buf[:pos]


def cmd_echo_server(args: argparse.Namespace) -> int:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Echo, "127.0.0.1", 0)
        emit({"event": "listening", "port": server.sockets[0].getsockname()[1], "loop": type(loop).__module__})
        await asyncio.Event().wait()

    if args.uvloop:
        from cometmq.net.loop import run
        run(main())
    else:
        asyncio.run(main())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="PG_bench")
    p.add_argument("--instance-name", default=None)
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--tags", default="TagA")
    p.add_argument("--mode", choices=["sync", "batch"], default="sync")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--interval-ms", type=float, default=0, help="pace sends on a fixed schedule")
    p.add_argument("--stamp", action="store_true", help="body starts with time.time_ns() then '|'")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured sends first (bodies start with 'w')")
    p.add_argument("--warmup-interval-ms", type=float, default=0)
    p.add_argument("--wait-go", action="store_true", help="after warm-up print 'ready', wait for a stdin line")
    p.add_argument("--timeout-ms", type=int, default=3000)
    p = sub.add_parser("consume")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="CG_bench")
    p.add_argument("--count", type=int, required=True, help="stop after this many (measured) messages")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--latency", action="store_true")
    p.add_argument("--thread-count", type=int, default=0)
    p = sub.add_parser("echo-server")
    p.add_argument("--uvloop", action="store_true")
    args = ap.parse_args(argv)
    return {"produce": cmd_produce, "consume": cmd_consume, "echo-server": cmd_echo_server}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
