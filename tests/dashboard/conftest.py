"""A real cluster (``cometmq serve``, metrics on, its own dashboard on) and ``cometmq dashboard`` as subprocesses,
and a headless Chromium from Debian's packages driven by Selenium (no driver download: the paths are given)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.ports import free_port

CHROMIUM = os.environ.get("COMETMQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("COMETMQ_CHROMEDRIVER", "/usr/bin/chromedriver")
#: where the screenshots go: docs/img when COMETMQ_DASHBOARD_SCREENSHOTS=docs (to refresh the docs' pictures),
#: else a temporary folder (a test run leaves the work tree as it was)
_DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
IMG = _DOCS_IMG if os.environ.get("COMETMQ_DASHBOARD_SCREENSHOTS") == "docs" \
    else Path(os.environ.get("TMPDIR", "/tmp")) / f"cometmq-dashboard-shots-{os.getpid()}"


class Proc:
    """A cometmq subprocess whose first stdout line says it is ready; stopped by its PID."""

    def __init__(self, args: list[str], ready: str, log: Path, timeout: float = 90.0) -> None:
        self.log = log
        self.out = log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", "cometmq.cli", *args], stdout=subprocess.PIPE,
                                  stderr=self.out, text=True)
        assert self.p.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.p.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or ready not in line[0]:
            self.stop()
            raise RuntimeError(f"{args[0]} did not start: {line} {log.read_text()[-2000:]}")
        self.line = line[0]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p.stdout is not None:
            self.p.stdout.close()
        self.out.close()


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("aiohttp")
    pytest.importorskip("prometheus_client")
    d = tmp_path_factory.mktemp("dash")
    ns, bp, metrics, inbroker, dash = (free_port() for _ in range(5))
    conf = d / "broker.conf"
    conf.write_text(f"metricsExporterType=PROM\nmetricsPrometheusPort={metrics}\n")
    serve = Proc(["serve", "--data", str(d / "data"), "--namesrv-port", str(ns), "--broker-port", str(bp),
                  "--grpc-port", "0", "-c", str(conf), "--dashboard-port", str(inbroker)],
                 "cometmq serving", d / "serve.log")
    try:
        board = Proc(["dashboard", "--namesrv", f"127.0.0.1:{ns}", "--port", str(dash), "--interval", "1"],
                     "cometmq dashboard on", d / "dashboard.log")
    except BaseException:
        serve.stop()
        raise
    try:
        yield {"namesrv": f"127.0.0.1:{ns}", "url": f"http://127.0.0.1:{dash}", "inbroker": f"http://127.0.0.1:{inbroker}",
               "dir": d}
    finally:
        board.stop()
        serve.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/test installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    # An explicit driver path: Selenium Manager has nothing to look up or download.
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shoot(driver: Any, name: str) -> None:
    """IMG/dashboard-NAME.png: the viewport (1280x900)."""
    IMG.mkdir(parents=True, exist_ok=True)
    time.sleep(0.2)
    driver.save_screenshot(str(IMG / f"dashboard-{name}.png"))


@contextlib.asynccontextmanager
async def in_process_cluster(tmp_path: Path) -> AsyncIterator[str]:
    """A nameserver and one broker in this process (data under ``tmp_path``), stopped at the end; yields the
    nameserver's address."""
    from cometmq.broker.controller import BrokerController
    from cometmq.namesrv.server import NamesrvConfig, NamesrvController
    from tests.broker.conftest import broker_config

    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    try:
        broker = BrokerController(broker_config(tmp_path / "broker", namesrv_addr=ns.addr))
        await broker.start()
        try:
            yield ns.addr
        finally:
            await broker.stop()
    finally:
        await ns.stop()
