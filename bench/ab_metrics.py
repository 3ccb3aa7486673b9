"""The cost of metrics ([13]): batched produce throughput of a fresh ``cometmq serve`` with metrics off
(metricsExporterType=DISABLE, the default: nothing counted) and on (PROM: every counter kept, /metrics served),
alternating in every round (off/on, then on/off) so that the machine's drift hits both alike.

    .venv/bin/python bench/ab_metrics.py --rounds 5
    .venv/bin/python bench/ab_metrics.py --once off    # one run, one JSON line

Per round and mode: ``cometmq bench produce --batch 128 --concurrency 4`` (acknowledged msg/s) against its own
broker, and the broker process's CPU time per message during the run (user + system, from /proc: less noisy
than the throughput on a shared machine). With metrics on, /metrics is scraped once after the run and its
rocketmq_messages_in_total checked against the count sent. One JSON line per run, then the medians and the
on/off ratio per round.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import CometServer, free_port  # noqa: E402


def _cpu_s(pid: int | None) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(mode: str, count: int) -> dict[str, object]:
    conf: dict[str, str] = {}
    port = 0
    if mode == "on":
        port = free_port()
        conf = {"metricsExporterType": "PROM", "metricsPrometheusPort": str(port)}
    with tempfile.TemporaryDirectory(prefix="cometmq-abm-") as tmp:
        server = CometServer(Path(tmp), conf, env={**os.environ})
        server.start()
        try:
            cpu0 = _cpu_s(server.pid)
            out = subprocess.run([sys.executable, "-m", "cometmq.cli", "bench", "produce", "--namesrv", server.namesrv,
                                  "--count", str(count), "--batch", "128", "--concurrency", "4"],
                                 capture_output=True, text=True, timeout=300, check=True).stdout
            got: dict[str, object] = [json.loads(x) for x in out.splitlines() if x.startswith("{")][-1]
            got["broker_cpu_us_per_msg"] = round((_cpu_s(server.pid) - cpu0) / count * 1e6, 3)
            if port:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
                counted = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("rocketmq_messages_in_total{") and 'topic="BenchTopic"' in line)
                got["counted"] = counted
            return got
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--once", choices=("off", "on"), help="one run in this mode, its JSON line only (for "
                        "runs pairing two trees: PYTHONPATH=TREE/src:TREE picks the broker's code)")
    args = parser.parse_args()
    if args.once:
        print(json.dumps({"metrics": args.once, "at": time.strftime("%H:%M:%S"), **run(args.once, args.count)}))
        return
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for rnd in range(args.rounds):
        for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):  # ABBA: neither always runs first
            started = time.strftime("%H:%M:%S")
            got = run(mode, args.count)
            print(json.dumps({"round": rnd, "metrics": mode, "at": started, **got}), flush=True)
            rates[mode].append(float(str(got["msgs_per_s"])))
            cpu[mode].append(float(str(got["broker_cpu_us_per_msg"])))
    ratios = [on / off for off, on in zip(rates["off"], rates["on"], strict=True)]
    print(json.dumps({"summary": "produce", "off": rates["off"], "on": rates["on"],
                      "median_off": statistics.median(rates["off"]), "median_on": statistics.median(rates["on"]),
                      "on_over_off_per_round": [round(r, 3) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 3),
                      "broker_cpu_us_per_msg_off": cpu["off"], "broker_cpu_us_per_msg_on": cpu["on"],
                      "median_cpu_off": statistics.median(cpu["off"]), "median_cpu_on": statistics.median(cpu["on"])}))


if __name__ == "__main__":
    main()
