"""Before/after for the broker: the same load tools against a fresh ``cometmq serve`` of each tree, alternating
tree by tree in every round, so that the machine's drift hits both alike.

    .venv/bin/python bench/ab_broker.py --tree old=/tmp/old/src --tree new=src --rounds 3

Each tree is a source folder put first on PYTHONPATH (a ``git worktree`` of the old commit, with the C helpers
copied in). Per round and tree: ``cometmq bench produce --batch 128 --concurrency 4`` (acknowledged msg/s) and
``cometmq bench latency`` (idle push latency), each against its own fresh broker, stopped by PID. One JSON line
per measurement, then a summary of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer  # noqa: E402


def _tool(tree: str, args: list[str], timeout: float) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "bench", *args], env=env, capture_output=True,
                         text=True, timeout=timeout, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return lines[-1]


def measure(tree: str, part: str, count: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="cometmq-ab-") as tmp:
        server = CometServer(Path(tmp), env={**os.environ, "PYTHONPATH": tree})
        server.start()
        try:
            if part == "produce":
                return _tool(tree, ["produce", "--namesrv", server.namesrv, "--count", str(count), "--batch", "128",
                                    "--concurrency", "4"], 300)
            return _tool(tree, ["latency", "--namesrv", server.namesrv, "--count", str(count)], 300)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="NAME=SRC_DIR (two or more)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="produce,latency")
    parser.add_argument("--produce-count", type=int, default=300_000)
    parser.add_argument("--latency-count", type=int, default=2000)
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    for rnd in range(args.rounds):
        for part in args.parts.split(","):
            for name, src in trees:
                count = args.produce_count if part == "produce" else args.latency_count
                started = time.strftime("%H:%M:%S")
                got = measure(str(Path(src).resolve()), part, count)
                line = {"round": rnd, "tree": name, "part": part, "at": started, **got}
                print(json.dumps(line), flush=True)
                results.setdefault((name, part), []).append(got)
    for (name, part), runs in sorted(results.items()):
        key = "msgs_per_s" if part == "produce" else "median_ms"
        values = [float(str(r.get(key, "nan"))) for r in runs]
        print(json.dumps({"summary": part, "tree": name, key: values, "median": statistics.median(values)}))


if __name__ == "__main__":
    main()
