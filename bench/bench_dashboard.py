"""Dashboard page loads with 1,000 topics and 1,000 consumer groups (docs/benchmarks.md, "Dashboard").

Starts ``cometmq serve`` and ``cometmq dashboard`` (subprocesses, free loopback ports), creates the topics and groups
through the SDK, sends a message to each of 100 topics, then times the Topics and Groups pages (first page of 50,
and a search), each N times:

* server: the HTTP GET from request to last byte (urllib, keep-alive off), and the app's own time (Server-Timing);
* browser: Navigation Timing of headless Chromium (Debian's chromium + chromium-driver, Selenium with the driver's
  path given): responseEnd and loadEventEnd from navigation start, charts and scripts included.

    .venv/bin/python bench/bench_dashboard.py [--topics 1000] [--groups 1000] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], ready: str, log: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-m", "cometmq.cli", *args], stdout=subprocess.PIPE,
                         stderr=log.open("w"), text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if ready not in line:
        p.kill()
        raise SystemExit(f"{args[0]} did not start: {line!r}; see {log}")
    return p


def stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def populate(ns: str, topics: int, groups: int) -> None:
    from cometmq.client import Admin, Message, Producer

    async with Admin(namesrv=ns, timeout=30) as admin:
        names = [f"BenchTopic{i:04d}" for i in range(topics)]
        for i in range(0, topics, 50):
            await asyncio.gather(*(admin.create_topic(t, read_queues=4, wait=0) for t in names[i:i + 50]))
        for i in range(0, groups, 50):
            await asyncio.gather(*(admin.create_subscription_group(f"BenchGroup{j:04d}")
                                   for j in range(i, min(groups, i + 50))))
        await asyncio.sleep(1)
    async with Producer("BenchDashProducer", namesrv=ns) as producer:
        for t in names[:100]:
            await producer.send(Message(t, b"x" * 100))


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 1), "max": round(max(xs), 1), "n": len(xs)}


def time_http(url: str, runs: int) -> dict[str, Any]:
    wall: list[float] = []
    app: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            timing = r.headers.get("Server-Timing", "")
        wall.append((time.perf_counter() - t0) * 1000)
        if "dur=" in timing:
            app.append(float(timing.split("dur=")[1]))
    return {"http_ms": stats(wall), "app_ms": stats(app)}


def time_browser(urls: dict[str, str], runs: int) -> dict[str, Any]:
    if not (shutil.which("/usr/bin/chromium") and shutil.which("/usr/bin/chromedriver")):
        return {"skipped": "chromium/chromium-driver not installed"}
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path="/usr/bin/chromedriver"))
    out: dict[str, Any] = {}
    try:
        for name, url in urls.items():
            driver.get(url)  # warm: static files cached as a returning user has them
            response, load = [], []
            for _ in range(runs):
                driver.get(url)
                nav = driver.execute_script("const n = performance.getEntriesByType('navigation')[0];"
                                            "return [n.responseEnd - n.startTime, n.loadEventEnd - n.startTime];")
                response.append(float(nav[0]))
                load.append(float(nav[1]))
            out[name] = {"response_ms": stats(response), "load_ms": stats(load)}
    finally:
        driver.quit()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dash-") as tmp:
        d = Path(tmp)
        ns, bp, port = free_port(), free_port(), free_port()
        serve = start(["serve", "--data", str(d / "data"), "--namesrv-port", str(ns), "--broker-port", str(bp),
                       "--grpc-port", "0"], "cometmq serving", d / "serve.log")
        board = None
        try:
            t0 = time.perf_counter()
            asyncio.run(populate(f"127.0.0.1:{ns}", a.topics, a.groups))
            setup_s = time.perf_counter() - t0
            board = start(["dashboard", "--namesrv", f"127.0.0.1:{ns}", "--port", str(port)], "cometmq dashboard on",
                          d / "dashboard.log")
            time.sleep(2)
            base = f"http://127.0.0.1:{port}"
            urls = {"topics": f"{base}/topics", "groups": f"{base}/groups",
                    "topics_search": f"{base}/topics?search=Topic09", "groups_search": f"{base}/groups?search=Group09",
                    "cluster": f"{base}/cluster", "topic_detail": f"{base}/topics/BenchTopic0001",
                    "group_detail": f"{base}/groups/BenchGroup0001"}
            result: dict[str, Any] = {"topics": a.topics, "groups": a.groups, "runs": a.runs,
                                      "setup_s": round(setup_s, 1)}
            result["server"] = {name: time_http(url, a.runs) for name, url in urls.items()}
            result["browser"] = time_browser(urls, a.runs)
            print(json.dumps(result, indent=1))
        finally:
            if board is not None:
                stop(board)
            stop(serve)


if __name__ == "__main__":
    main()
