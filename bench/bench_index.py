"""Micro-benchmark of the key index: puts/s and queries/s on a temporary folder (not a test).

Run: .venv/bin/python bench/bench_index.py [--puts N] [--slots S] [--entries E]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from cometmq.store.index import IndexService


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--puts", type=int, default=500_000)
    parser.add_argument("--slots", type=int, default=5_000_000)
    parser.add_argument("--entries", type=int, default=20_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    args = parser.parse_args()
    # Keys are built up front so the loop times the index, not string formatting.
    keys = [f"TopicTest#ORDER_{i:012d}" for i in range(args.puts)]
    with tempfile.TemporaryDirectory() as tmp:
        index = IndexService(Path(tmp) / "index", args.slots, args.entries)
        index.load()
        ts = 1_700_000_000_000
        put = index.put
        start = time.perf_counter()
        for i, key in enumerate(keys):
            put(key, i * 200, ts + i // 100)
        put_s = time.perf_counter() - start
        n = min(args.queries, args.puts)
        query = index.query
        start = time.perf_counter()
        for i in range(n):
            query(keys[(i * 7919) % args.puts], 32, 0, 2**62)
        query_s = time.perf_counter() - start
        start = time.perf_counter()
        index.flush()
        flush_s = time.perf_counter() - start
        index.close()
    print(f"put:   {args.puts / put_s:>12,.0f} puts/s    ({put_s / args.puts * 1e6:.2f} us/put)")
    print(f"query: {n / query_s:>12,.0f} queries/s ({query_s / n * 1e6:.2f} us/query)")
    print(f"flush: {flush_s * 1000:.1f} ms; files of {args.slots:,} slots x {args.entries:,} entries")


if __name__ == "__main__":
    main()
