"""Where an exactly-once Spark write's time goes, without Spark: one task's rows, then the driver's commit.

    .venv/bin/python bench/bench_eos_split.py --rows 200000 --rounds 2

Starts ``cometmq serve`` (tests/interop/cometmq_server.py) and, per round, sends ``--rows`` rows of
``--body-size`` bytes as one task of the sink would: ``writer.send_batches`` (at-least-once), then
``exactly_once.send_halves`` (the packed halves) and ``exactly_once.commit_halves`` (the driver: marker,
END_TRANSACTION_BATCH). Prints, per step, the wall time, this process's CPU and the broker's CPU (psutil on its
PID); one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer  # noqa: E402

from cometmq.spark import exactly_once, writer  # noqa: E402
from cometmq.spark.options import parse_write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a broker.conf key for the server")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cometmq-bench-eos-split-") as tmp:
        conf = {"mappedFileSizeCommitLog": str(256 << 20), **dict(kv.split("=", 1) for kv in args.conf)}
        server = CometServer(Path(tmp) / "server", conf)
        server.start()
        try:
            assert server.pid is not None
            broker = psutil.Process(server.pid)
            step = 8192
            batches = [pa.RecordBatch.from_pydict({"body": [b"x" * args.body_size] * min(step, args.rows - k)})
                       for k in range(0, args.rows, step)]
            res: dict[str, Any] = {"bench": "eos_split", "rows": args.rows, "body_size": args.body_size}

            def measure(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
                b0, c0, t0 = sum(broker.cpu_times()[:2]), time.process_time(), time.perf_counter()
                out = fn(*fn_args)
                wall, cpu, bcpu = (time.perf_counter() - t0, time.process_time() - c0,
                                   sum(broker.cpu_times()[:2]) - b0)
                res.setdefault(name, []).append({"wall_s": round(wall, 3), "client_cpu_s": round(cpu, 3),
                                                 "broker_cpu_s": round(bcpu, 3)})
                print(f"# {name}: wall {wall:.2f} s, client CPU {cpu:.2f} s, broker CPU {bcpu:.2f} s",
                      file=sys.stderr, flush=True)
                return out

            for r in range(args.rounds):
                alo_topic, eos_topic = f"SplitAlo{r}", f"SplitEos{r}"
                server.create_topic(alo_topic, 4)
                server.create_topic(eos_topic, 4)
                alo = parse_write({"namesrv": server.namesrv, "topic": alo_topic})
                eos = parse_write({"namesrv": server.namesrv, "topic": eos_topic, "transactional": "true"})
                measure("alo_task", writer.send_batches, iter(batches), alo)
                sent = measure("eos_task", exactly_once.send_halves, iter(batches), eos, f"split-{r}", 0)
                measure("eos_commit", exactly_once.commit_halves, eos, [sent], 0)
        finally:
            server.close()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
