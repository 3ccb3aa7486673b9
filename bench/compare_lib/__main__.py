"""``bench/compare [--quick] [--systems a,b] [--repeats N] [--docs | --no-docs]`` (see bench/compare)."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from compare_lib import report
from compare_lib.run import FULL, QUICK, WORKLOADS, mode_dict, run_all
from compare_lib.servers import SERVERS

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT_MODULES = {"cometmq": ("compare_lib.clients.comet", "CometClient"),
                  "redis": ("compare_lib.clients.redis_streams", "RedisClient"),
                  "nats": ("compare_lib.clients.nats_js", "NatsClient"),
                  "rabbitmq": ("compare_lib.clients.rabbit_streams", "RabbitClient")}
CLIENT_PACKAGES = ("redis", "hiredis", "nats-py", "rstream", "uvloop", "matplotlib", "psutil")


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through every try/finally that stops a server


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/compare", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small counts and short runs (about 2 minutes)")
    p.add_argument("--systems", default=",".join(report.SYSTEMS),
                   help=f"comma-separated, from {', '.join(SERVERS)} (default: all)")
    p.add_argument("--workloads", default=None, help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    p.add_argument("--repeats", type=int, default=None, help="repeats per system (default 3)")
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--docs", dest="docs", action="store_true", default=None,
                      help="write plots to docs/img and the table into docs/benchmarks.md (default in full mode)")
    docs.add_argument("--no-docs", dest="docs", action="store_false")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results file (default: bench/results/compare-full-*.json; "
                        "quick runs: the scratch folder)")
    p.add_argument("--scratch", type=Path, default=None, help="folder for data and logs (default: a temp folder)")
    p.add_argument("--note", default="", help="a line about this run for the report (e.g. which cometmq commit)")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="run nothing: publish an earlier results file (plots, table, docs unless --no-docs)")
    return p.parse_args(argv)


def versions(systems: list[str]) -> dict[str, str]:
    # (a variant's version is its system's: listed under the variant only when that ran alone)
    variant_of = {"cometmq-sync": "cometmq", "nats-sync": "nats"}
    out = {s: SERVERS[s].version() for s in systems if variant_of.get(s) not in systems}
    out["python"] = platform.python_version()
    for pkg in CLIENT_PACKAGES:
        try:
            out["redis-py" if pkg == "redis" else pkg] = metadata.version(pkg)  # "redis" is the server's key
        except metadata.PackageNotFoundError:
            pass
    return out


def client_settings(systems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in systems:
        key = s.split("-")[0]  # (cometmq-sync: cometmq's client, nats-sync: NATS's)
        if key in out:
            continue
        mod, cls = CLIENT_MODULES[key]
        try:
            out[key] = getattr(importlib.import_module(mod), cls).settings
        except ImportError as exc:
            out[key] = f"(client not importable: {exc})"
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.render is not None:
        return render(args.render, args.docs is not False)
    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Python then leaves it ignored
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, _sigterm)
    mode = QUICK if args.quick else FULL
    if args.repeats is not None:
        if args.repeats < 1:
            print("--repeats must be at least 1", file=sys.stderr)
            return 2
        mode = type(mode)(**{**mode_dict(mode), "repeats": args.repeats})
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SERVERS]
    if unknown:
        print(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SERVERS)}", file=sys.stderr)
        return 2
    workloads = None
    if args.workloads:
        workloads = tuple(w.strip() for w in args.workloads.split(","))
        bad = [w for w in workloads if w not in WORKLOADS]
        if bad:
            print(f"unknown workload(s) {', '.join(bad)}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
            return 2
    skipped = {s: why for s in wanted if (why := SERVERS[s].available())}
    systems = [s for s in wanted if s not in skipped]
    for s, why in skipped.items():
        log(f"skipping {s}: {why}")
    if not systems:
        print("nothing to run", file=sys.stderr)
        return 1
    write_docs = (mode.name == "full") if args.docs is None else args.docs

    started = dt.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="cometmq-compare-"))
    scratch.mkdir(parents=True, exist_ok=True)
    # a recorded (full) run goes to bench/results; a quick one stays in the scratch folder unless --out
    results_dir = ROOT / "bench" / "results" if mode.name == "full" or write_docs else scratch
    out = args.out or results_dir / f"compare-{mode.name}-{stamp}.json"
    log(f"{mode.name} mode, systems {', '.join(systems)}, {mode.repeats} repeats; scratch {scratch}")
    t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    rows = run_all(systems, mode, scratch, log, workloads)
    meta: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M"), "duration_s": round(time.perf_counter() - t0, 1),
        "mode": mode_dict(mode), "systems": systems, "skipped": skipped,
        "machine": {"cpus": _cpus(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": versions(systems),
        "server_config": {s: SERVERS[s](scratch / f"describe-{s}").config_text() for s in systems},
        "client_settings": client_settings(systems),
        "json": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out), "note": args.note,
        "loadavg_start": load_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    result: dict[str, Any] = {"meta": meta, "runs": rows, "summary": report.summarize(rows)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    log(f"results: {out}")
    publish(result, write_docs, scratch / "img")
    return 0


def publish(result: dict[str, Any], write_docs: bool, img_fallback: Path) -> None:
    """Plots (docs/img, or ``img_fallback``), the markdown block on stdout and, with ``write_docs``, in
    docs/benchmarks.md."""
    name = result["meta"]["mode"]["name"]
    img_dir = ROOT / "docs" / "img" if write_docs else img_fallback
    try:
        written = report.plots(result["summary"], img_dir, f" ({name} mode)" if name != "full" else "")
        log("plots: " + ", ".join(str(p) for p in written))
    except ImportError as exc:
        log(f"no plots: {exc}")
    block = report.markdown_block(result, "img/" if write_docs else None)
    if write_docs:
        report.update_docs(ROOT / "docs" / "benchmarks.md", block)
        log("docs/benchmarks.md updated")
    print(block)


def render(path: Path, write_docs: bool) -> int:
    """Publish a results file again (plots, table, docs) without running anything."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        result["meta"]["mode"]["name"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{path}: not a bench/compare results file ({exc})", file=sys.stderr)
        return 2
    path = path.resolve()
    result["meta"]["json"] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    result["summary"] = report.summarize(result["runs"])
    publish(result, write_docs, Path(tempfile.mkdtemp(prefix="cometmq-compare-")) / "img")
    return 0


def _cpus() -> int:
    return os.cpu_count() or 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
