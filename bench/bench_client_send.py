"""The SDK producer's CPU per single send: ``await producer.send(Message(...))``, one at a time, against a real broker.

    .venv/bin/python bench/bench_client_send.py [--count 20000] [--warmup 2000] [--profile]
    .venv/bin/python bench/bench_client_send.py --tree old=/tmp/old/src --tree new=src --rounds 5

Starts ``cometmq serve`` (tests/interop/cometmq_server.py: free 127.0.0.1 ports, a temporary data folder,
``messageIndexEnable=false``) from this tree, creates topic ``T`` (4 queues), and runs the client in a child
process per measurement: a started ``Producer``, ``--warmup`` sends, then ``--count`` sequential
``await producer.send(Message("T", 100 bytes))`` (no queue given: the route lookup, queue selection and retry
loop are in). The child's ``time.process_time`` (and user/sys from ``os.times``) over the timed sends gives the
client's CPU per send; the broker's CPU over the same span comes from psutil. Prints one JSON line per
measurement. With ``--tree NAME=SRC`` (two or more), the client runs from each source tree in turn, alternating
in every round against the same broker, and a summary line per tree gives the medians. ``--profile`` runs the
first measurement's timed sends under cProfile and prints the listing (sorted by $SORT, default tottime; $TOP
rows) on stderr. The broker is stopped by its PID and the temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


async def _client(namesrv: str, count: int, warmup: int, broker_pid: int, profile: bool) -> dict[str, Any]:
    import psutil

    from cometmq.client import Message, Producer

    broker = psutil.Process(broker_pid) if broker_pid else None
    body = b"x" * 100
    async with Producer("bench-client-send", namesrv=namesrv) as producer:
        send = producer.send
        for _ in range(warmup):
            await send(Message("T", body))
        prof = cProfile.Profile() if profile else None
        b0 = broker.cpu_times() if broker is not None else None
        t0, c0, w0 = os.times(), time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        for _ in range(count):
            await send(Message("T", body))
        if prof is not None:
            prof.disable()
        w1, c1, t1 = time.perf_counter(), time.process_time(), os.times()
        b1 = broker.cpu_times() if broker is not None else None
    out: dict[str, Any] = {
        "sends": count,
        "client_cpu_us": round((c1 - c0) / count * 1e6, 2),
        "client_user_us": round((t1.user - t0.user) / count * 1e6, 2),
        "client_sys_us": round((t1.system - t0.system) / count * 1e6, 2),
        "wall_us": round((w1 - w0) / count * 1e6, 2),
        "msgs_per_s": round(count / (w1 - w0)),
    }
    if b0 is not None and b1 is not None:
        out["broker_cpu_us"] = round((b1.user + b1.system - b0.user - b0.system) / count * 1e6, 2)
    if prof is not None:
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "40")))
        print(text.getvalue(), file=sys.stderr)
    return out


def _run_child(src: str, namesrv: str, args: argparse.Namespace, broker_pid: int, profile: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, __file__, "--child", namesrv, "--count", str(args.count), "--warmup", str(args.warmup),
           "--broker-pid", str(broker_pid)] + (["--profile"] if profile else [])
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=600, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", action="append", default=[], help="NAME=SRC_DIR: a client source tree")
    parser.add_argument("--profile", action="store_true", help="cProfile of the first measurement's client, on stderr")
    parser.add_argument("--child", metavar="NAMESRV", help=argparse.SUPPRESS)
    parser.add_argument("--broker-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from cometmq.net.loop import run

        result = run(_client(args.child, args.count, args.warmup, args.broker_pid, args.profile))
        print(json.dumps(result), flush=True)
        return

    sys.path.insert(0, str(ROOT))
    from tests.interop.cometmq_server import CometServer

    trees = [t.split("=", 1) for t in args.tree] or [["this", str(ROOT / "src")]]
    with tempfile.TemporaryDirectory(prefix="bench-client-send-") as tmp:
        server = CometServer(Path(tmp), {"messageIndexEnable": "false", "mappedFileSizeCommitLog": str(256 << 20)},
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        server.start()
        try:
            assert server.pid is not None
            server.create_topic("T", 4)
            runs: dict[str, list[dict[str, Any]]] = {}
            for rnd in range(args.rounds):
                for name, src in trees:
                    got = _run_child(str(Path(src).resolve()), server.namesrv, args, server.pid,
                                     args.profile and rnd == 0)
                    runs.setdefault(name, []).append(got)
                    print(json.dumps({"bench": "client_send", "round": rnd, "tree": name,
                                      "at": time.strftime("%H:%M:%S"), **got}), flush=True)
            if args.rounds > 1 or len(trees) > 1:
                for name, got_runs in runs.items():
                    print(json.dumps({"summary": "client_send", "tree": name, **{
                        key: statistics.median(r[key] for r in got_runs)
                        for key in ("client_cpu_us", "client_user_us", "client_sys_us", "broker_cpu_us", "wall_us",
                                    "msgs_per_s")}}), flush=True)
        finally:
            server.close()


if __name__ == "__main__":
    main()
