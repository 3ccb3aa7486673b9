"""``cometmq admin timer-status`` against a real ``cometmq serve`` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.client import Message
from cometmq.client.sync import SyncAdmin, SyncProducer
from tests.interop.cometmq_server import CometServer, free_port


def cometmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cometmq.cli", *args], capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    s = CometServer(tmp_path_factory.mktemp("admin"), {"timerPrecisionMs": "100"})
    s.start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def timers(server: CometServer) -> dict[str, Any]:
    """Three timers an hour away (one of them recalled) and two already delivered."""
    with SyncProducer("admin-pg", namesrv=server.namesrv) as p:
        later = [p.send(Message("AT", f"later{i}".encode(), delay=3600)) for i in range(3)]
        soon = [p.send(Message("AT", f"soon{i}".encode(), delay=0.2)) for i in range(2)]
        assert later[0].recall_handle is not None
        p.recall("AT", later[0].recall_handle)
    with SyncAdmin(namesrv=server.namesrv) as admin:
        deadline = time.monotonic() + 15
        while True:
            [metrics] = admin.timer_metrics().values()
            if metrics["delivered"] == len(soon):
                return metrics
            assert time.monotonic() < deadline, metrics
            time.sleep(0.1)


def test_timer_status_json_through_the_nameserver(server: CometServer, timers: dict[str, Any]) -> None:
    out = cometmq("admin", "timer-status", "--namesrv", server.namesrv, "--json")
    assert out.returncode == 0, out.stderr
    [(name, m)] = json.loads(out.stdout).items()
    assert name == "broker-a"  # the broker's name, as the nameserver has it
    # 3 scheduled, less the recall's delete marker (cancelled counts once their slot comes, in an hour)
    assert (m["scheduled"], m["delivered"], m["enqueued"], m["dueUndelivered"]) == (2, 2, 6, 0)
    assert m["lateness"]["count"] == 2 and sum(m["lateness"]["counts"]) == 2
    assert m["enqueueLag"] == 0 and m["enqueueOffset"] == 6


def test_timer_status_table_from_a_broker_address(server: CometServer, timers: dict[str, Any]) -> None:
    out = cometmq("admin", "timer-status", "--broker", server.broker_addr)
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.stdout.splitlines() if line.count("│") >= 3}
    assert rows["scheduled (pending)"] == ["2"]
    assert rows["delivered"] == ["2"]
    assert rows["due but undelivered"] == ["0"] and rows["delivery behind by (ms)"] == ["0"]
    assert rows["enqueue offset"] == ["6"]
    assert rows["lateness: delivered"] == ["2"]
    assert rows["lateness: p99 (ms)"][0].startswith("<= ")
    assert server.broker_addr in out.stdout  # the column is named by the address asked
    assert "delivery lateness histogram" in out.stdout


def test_timer_status_errors_are_clear(server: CometServer) -> None:
    out = cometmq("admin", "timer-status")
    assert out.returncode == 2 and "--namesrv" in out.stderr
    out = cometmq("admin", "timer-status", "--namesrv", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert out.returncode == 1 and out.stderr.startswith("error:")
    out = cometmq("admin", "timer-status", "--namesrv", server.namesrv, "--broker", "no-such-broker")
    assert out.returncode == 1 and "no-such-broker" in out.stderr


def test_timer_status_with_timers_off(tmp_path: Path) -> None:
    s = CometServer(tmp_path / "off", {"timerWheelEnable": "false"})
    s.start()
    try:
        out = cometmq("admin", "timer-status", "--namesrv", s.namesrv)
        assert out.returncode == 0, out.stderr
        assert "off (timerWheelEnable=false)" in out.stdout
        out = cometmq("admin", "timer-status", "--broker", s.broker_addr, "--json")
        assert json.loads(out.stdout) == {s.broker_addr: {"enabled": False}}
    finally:
        s.close()
