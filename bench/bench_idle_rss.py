"""Idle memory of ``cometmq serve`` (issue [16]: an idle broker imports only what its configuration uses).

    .venv/bin/python bench/bench_idle_rss.py                       # 5 runs of this checkout's src
    .venv/bin/python bench/bench_idle_rss.py --src OTHER/src --src src -n 5   # two trees, runs alternating

Each run starts ``python -m cometmq.cli serve --data TMP --grpc-port 0 --broker-port 0 --namesrv-port 0`` (PYTHONPATH
= the --src folder), times it to its "cometmq serving" line, waits --idle seconds, reads VmRSS, RssAnon and RssFile
of its PID from /proc (the same PID throughout: the command may exec itself into its server process), counts the
modules the process holds (a sitecustomize in a temporary folder writes ``len(sys.modules)`` on SIGUSR1), then
stops it with SIGTERM. Prints one JSON object per tree: the medians, in MiB and seconds. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: installed as sitecustomize.py: on SIGUSR1, the process writes how many modules it holds to $BENCH_MODULES_DIR/PID
_SITECUSTOMIZE = """\
import os, signal, sys
def _count(signum, frame):
    with open(os.path.join(os.environ["BENCH_MODULES_DIR"], str(os.getpid())), "w") as f:
        f.write(str(len(sys.modules)))
signal.signal(signal.SIGUSR1, _count)
"""


def _status(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return out


def run_once(src: Path, idle: float, work: Path) -> dict[str, Any]:
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    data = Path(tempfile.mkdtemp(dir=work))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(site)]), "BENCH_MODULES_DIR": str(work)}
    cmd = [sys.executable, "-m", "cometmq.cli", "serve", "--data", str(data), "--grpc-port", "0",
           "--broker-port", "0", "--namesrv-port", "0"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        ready = time.perf_counter() - start
        if "cometmq serving" not in line:
            raise RuntimeError(f"{src}: no ready line: {line!r} (exit {proc.wait(10)})")
        time.sleep(idle)
        row: dict[str, Any] = {**_status(proc.pid), "startup_s": ready}
        proc.send_signal(signal.SIGUSR1)
        count = work / str(proc.pid)
        deadline = time.monotonic() + 5
        while not count.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.05)
        row["modules"] = int(count.read_text()) if count.exists() else None
        count.unlink(missing_ok=True)
        proc.send_signal(signal.SIGTERM)
        row["exit"] = proc.wait(30)
        return row
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", type=Path, help="a src folder (repeat to compare; default: src)")
    parser.add_argument("-n", "--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle after the ready line")
    args = parser.parse_args()
    srcs = [p.resolve() for p in args.src or [Path(__file__).resolve().parents[1] / "src"]]
    rows: dict[Path, list[dict[str, Any]]] = {src: [] for src in srcs}
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        for i in range(args.runs):
            for src in srcs:  # alternating, so a busy moment of the shared machine hits every tree alike
                row = run_once(src, args.idle, Path(tmp))
                rows[src].append(row)
                print(f"# {src} run {i + 1}: {json.dumps(row)}", file=sys.stderr, flush=True)
    for src, runs in rows.items():
        summary: dict[str, Any] = {"src": str(src), "runs": len(runs)}
        for key in ("VmRSS", "RssAnon", "RssFile", "startup_s", "modules"):
            values = [r[key] for r in runs if r.get(key) is not None]
            summary[key] = round(statistics.median(values), 3) if values else None
        summary["exits"] = sorted({r["exit"] for r in runs})
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
