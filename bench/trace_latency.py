"""Where the idle-push latency goes: both processes timestamped, step by step, on one clock.

    .venv/bin/python bench/trace_latency.py [--count 2000] [--interval-ms 2]

Runs ``cometmq serve`` in a subprocess and, in this process, the same workload as ``cometmq bench latency``
(one message every ``interval`` ms to an idle push consumer), with the hot functions of both sides wrapped to
log ``perf_counter_ns`` on entry (``>``) and exit (``<``). perf_counter is CLOCK_MONOTONIC on Linux, one clock
for both processes, so each event is placed against the send it follows: the table gives, per step, the
median time after the send started (``c:`` this client, ``b:`` the broker; ``#2`` a second call in the same
window, e.g. the next pull's write). Each wrapper adds ~0.5 us, so the total runs a little above
``cometmq bench latency``. Needs SIGUSR1 (Linux, macOS).

The last line splits the median path by who runs it (``sides``). ``--tails N`` also logs each background pass of
the broker (``run_once`` of its service threads, ``pass:Name``) and prints the N slowest sends event by event,
from 1 ms before the send to the listener, then which passes overlapped the slowest 1.5 %: what a slow send
waited behind. ``--conf FILE``: broker keys for the served broker (e.g. ``messageIndexEnable=false`` as
``bench/compare`` runs it). ``--wrap-broker`` / ``--wrap-client SPEC`` log more steps (``module:attr=label``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVENTS: list[tuple[str, int]] = []
_now = time.perf_counter_ns


def _wrap(owner: Any, name: str, label: str) -> None:
    """Log entry and exit of ``owner.name`` (plain function, method or coroutine function)."""
    orig = getattr(owner, name)
    if asyncio.iscoroutinefunction(orig):
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            EVENTS.append((label + ">", _now()))
            try:
                return await orig(*args, **kwargs)
            finally:
                EVENTS.append((label + "<", _now()))
    else:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            EVENTS.append((label + ">", _now()))
            try:
                return orig(*args, **kwargs)
            finally:
                EVENTS.append((label + "<", _now()))
    if getattr(orig, "eager_start", False):
        wrapper.eager_start = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def _wrap_common() -> None:
    from cometmq.net import connection
    from cometmq.protocol import remoting

    _wrap(connection.RemotingConnection, "data_received", "recv")
    _wrap(connection.RemotingConnection, "_write", "write")
    _wrap(remoting.FrameDecoder, "feed", "decode")
    _wrap(remoting, "encode_parts", "enc")
    connection.encode_parts = remoting.encode_parts  # type: ignore[attr-defined]


def _wrap_passes() -> None:
    """Every background service thread's pass, as ``pass:<class>``."""
    import cometmq.broker.controller  # noqa: F401  (imports the store's services)
    from cometmq.common.service import ServiceThread

    todo = list(ServiceThread.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "run_once" in vars(cls):
            _wrap(cls, "run_once", "pass:" + cls.__name__)


def _wrap_extra(spec: str) -> None:
    """Wrap more steps: ``spec`` is space-separated ``module:attr[.method]=label`` (``--wrap-broker``,
    ``--wrap-client``)."""
    import importlib

    for item in spec.split():
        target, _, label = item.partition("=")
        module_name, _, path = target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        _wrap(owner, name, label or name)


def broker_main(out: str, argv: list[str]) -> None:
    """The traced broker: ``cometmq serve`` with the send, dispatch and pull steps wrapped."""
    _wrap_common()
    from cometmq.broker import long_polling, pull, send
    from cometmq.broker.append_batcher import AppendBatcher
    from cometmq.broker.pull_fast import PullFastPath
    from cometmq.net import connection
    from cometmq.store.message_store import MessageStore

    _wrap(send.SendProcessor, "send", "send")
    _wrap(send, "send_header_from_v2", "v2header")
    _wrap(send.SendProcessor, "_single_message", "message")
    _wrap(AppendBatcher, "_append", "append")
    _wrap(long_polling.PullRequestHoldService, "on_arrivals", "arrivals")
    _wrap(pull.PullProcessor, "replay", "replay")
    _wrap(PullFastPath, "__call__", "pullfast")  # a woken pull answered from a template (replay not run)
    _wrap(MessageStore, "get_messages", "get")
    _wrap(connection.RemotingConnection, "send_frame", "sframe")  # an answer written from bytes (both fast paths)
    if os.environ.get("TRACE_PASSES"):
        _wrap_passes()
    _wrap_extra(os.environ.get("TRACE_WRAP_BROKER", ""))

    def dump(*_: Any) -> None:
        Path(out).write_text(json.dumps(EVENTS))

    signal.signal(signal.SIGUSR1, dump)
    from cometmq import cli
    from cometmq.cli import main

    cli.EXEC_SERVERS = False  # serve here, with the wrappers above (not in a fresh interpreter)
    sys.argv = ["cometmq", *argv]
    main()


async def client(namesrv: str, count: int, interval_ms: float) -> list[float]:
    from cometmq.client import (
        ConsumeStatus,
        Message,
        MessageExt,
        Producer,
        PushConsumer,
        producer,
        pulled,
        push_consumer,
        wire,
    )

    _wrap_common()
    _wrap(producer.Producer, "_request", "request")
    _wrap(push_consumer.PushConsumer, "_on_pull_answer", "answer")
    _wrap(pulled, "decode_pulled", "records")
    _wrap(wire.SdkConnection, "start_request", "startreq")  # the send's frame is ready: written in this call
    _wrap(wire.SdkConnection, "data_received", "crecv")
    push_consumer.decode_pulled = pulled.decode_pulled  # type: ignore[attr-defined]
    _wrap_extra(os.environ.get("TRACE_WRAP_CLIENT", ""))
    samples: list[float] = []
    got_all = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now = _now()
        EVENTS.append(("listener", now))
        samples.extend((now - int(m.body)) / 1e6 for m in msgs)
        if len(samples) >= count:
            got_all.set()
        return ConsumeStatus.CONSUME_SUCCESS

    topic = "TraceLatency"
    async with Producer("trace-latency", namesrv=namesrv) as p:
        await p.send(Message(topic, b"0"))
        consumer = PushConsumer(f"trace-latency-{int(time.time())}", namesrv=namesrv, listener=listener)
        consumer.subscribe(topic)
        async with consumer:
            while not consumer.assignment:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            EVENTS.clear()
            next_at = loop.time()
            for _ in range(count):
                next_at += interval_ms / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                t0 = _now()
                EVENTS.append(("T0", t0))
                await p.send(Message(topic, str(t0).encode()))
            await asyncio.wait_for(got_all.wait(), 30)
    return samples


def steps(client_events: list[tuple[str, int]], broker_events: list[tuple[str, int]],
          window_ns: int) -> list[tuple[float, str, int]]:
    """(median µs after the send, step, how many sends saw it), for steps seen after most sends."""
    events = sorted([("c:" + label, t) for label, t in client_events] +
                    [("b:" + label, t) for label, t in broker_events], key=lambda e: e[1])
    times = [t for _, t in events]
    sends = [t for label, t in events if label == "c:T0"]
    per_step: dict[str, list[int]] = {}
    for t0 in sends:
        seen: dict[str, int] = {}
        i = bisect.bisect_left(times, t0)
        while i < len(events) and events[i][1] < t0 + window_ns:
            label, t = events[i]
            key, n = label, 1
            while key in seen:
                n += 1
                key = f"{label}#{n}"
            seen[key] = t - t0
            i += 1
        for key, dt in seen.items():
            per_step.setdefault(key, []).append(dt)
    rows = [(statistics.median(v) / 1000, k, len(v)) for k, v in per_step.items() if len(v) > len(sends) / 2]
    return sorted(rows)


def sides(rows: list[tuple[float, str, int]]) -> str:
    """The send's path split by who runs it, from the steps' medians: the client until its write, the broker from
    reading the send to writing the pull's answer, the client from reading that answer to its listener, and the
    rest (the two writes, wake-ups and reads in the kernel, and the event loops around them)."""
    at: dict[str, float] = {}
    for us, step, _ in rows:
        at.setdefault(step, us)
    need = ("c:startreq>", "b:recv>", "b:sframe>", "c:crecv>", "c:listener")
    if any(k not in at for k in need):
        return "# sides: a step is missing (" + ", ".join(k for k in need if k not in at) + ")"
    client_send = at["c:startreq>"]
    broker = at["b:sframe>"] - at["b:recv>"]
    client_recv = at["c:listener"] - at["c:crecv>"]
    rest = at["c:listener"] - client_send - broker - client_recv
    return (f"# sides (us): client until its write {client_send:.1f}, broker read -> answer written {broker:.1f}, "
            f"client answer read -> listener {client_recv:.1f}, kernel and wake-ups {rest:.1f}")


def tails(client_events: list[tuple[str, int]], broker_events: list[tuple[str, int]], show: int,
          lead_ns: int = 1_000_000, window_ns: int = 3_000_000, share: float = 0.015
          ) -> tuple[list[tuple[float, list[tuple[str, float]]]], Counter[str], int]:
    """The ``show`` slowest sends (send -> listener), each as (µs, [(event, µs after the send)]) from ``lead_ns``
    before it to its listener; and, over the slowest ``share`` of the sends, how many of them each background
    pass (``pass:`` events) overlapped, with how many sends that share is."""
    events = sorted([("c:" + label, t) for label, t in client_events] +
                    [("b:" + label, t) for label, t in broker_events], key=lambda e: e[1])
    times = [t for _, t in events]
    done: list[tuple[int, int, int]] = []  # (latency ns, index of the send, index of its listener)
    for i, (label, t0) in enumerate(events):
        if label != "c:T0":
            continue
        j = i + 1
        while j < len(events) and events[j][0] != "c:listener" and events[j][1] < t0 + window_ns:
            j += 1
        if j < len(events) and events[j][0] == "c:listener":
            done.append((events[j][1] - t0, i, j))
    done.sort()

    def around(i: int, j: int) -> list[tuple[str, int]]:
        return events[bisect.bisect_left(times, events[i][1] - lead_ns): j + 1]

    slowest = [(ns / 1000, [(label, (t - events[i][1]) / 1000) for label, t in around(i, j)])
               for ns, i, j in done[max(0, len(done) - show):][::-1]] if show > 0 else []
    worst = done[int(len(done) * (1 - share)):]
    passes: Counter[str] = Counter()
    for _, i, j in worst:
        passes.update({label[len("b:pass:"):].rstrip("<>") for label, _ in around(i, j) if label.startswith("b:pass:")})
    return slowest, passes, len(worst)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--show", type=int, default=40, help="rows of the table")
    ap.add_argument("--tails", type=int, default=0, metavar="N",
                    help="log the broker's background passes; print the N slowest sends event by event")
    ap.add_argument("--conf", type=Path, default=None, help="a broker config file for the served broker")
    ap.add_argument("--wrap-broker", default="", metavar="SPEC",
                    help="more broker steps to log: space-separated module:attr[.method]=label")
    ap.add_argument("--wrap-client", default="", metavar="SPEC", help="more client steps to log, the same way")
    args = ap.parse_args(argv)
    from cometmq.net.loop import run

    with tempfile.TemporaryDirectory(prefix="trace-latency-") as tmp:
        out = os.path.join(tmp, "broker.json")
        ns_port, broker_port = _free_port(), _free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        if args.tails:
            env["TRACE_PASSES"] = "1"
        env["TRACE_WRAP_BROKER"] = args.wrap_broker
        os.environ["TRACE_WRAP_CLIENT"] = args.wrap_client
        conf = ["-c", str(args.conf)] if args.conf is not None else []
        server = subprocess.Popen(
            [sys.executable, __file__, "--broker", out, "serve", "--data", os.path.join(tmp, "data"),
             "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--grpc-port", "0",
             "--log-level", "WARNING", *conf], env=env)
        try:
            time.sleep(3)
            samples = run(client(f"127.0.0.1:{ns_port}", args.count, args.interval_ms))
            server.send_signal(signal.SIGUSR1)
            for _ in range(100):
                if os.path.exists(out):
                    break
                time.sleep(0.05)
            time.sleep(0.2)
            broker_events = json.loads(Path(out).read_text())
        finally:
            server.terminate()
            server.wait(10)
    s = sorted(samples)
    print(f"# send -> listener: median {s[len(s) // 2]:.3f} ms, p90 {s[int(len(s) * 0.9)]:.3f} ms "
          f"({len(s)} messages)")
    rows = steps(EVENTS, broker_events, int(args.interval_ms * 0.95e6))
    for median_us, step, n in rows[: args.show]:
        print(f"{median_us:8.1f} us  {step:18s} n={n}")
    print(sides(rows))
    if args.tails:
        slowest, passes, worst = tails(EVENTS, broker_events, args.tails)
        for us, seen in slowest:
            print(f"# {us:7.1f} us: " + " ".join(f"{label}@{at:.0f}" for label, at in seen))
        print(f"# background passes overlapping the slowest {worst} sends: "
              + (", ".join(f"{name} {n}" for name, n in passes.most_common()) or "none"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--broker":
        broker_main(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())

