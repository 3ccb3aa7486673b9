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


# -- replication: ha-status, promote, demote (a lone master; a real group is in test_cli_cluster.py) ----------
@pytest.fixture
def lone(tmp_path: Path) -> Iterator[CometServer]:
    s = CometServer(tmp_path / "lone")
    s.start()
    try:
        yield s
    finally:
        s.close()


def _rows(stdout: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in stdout.splitlines() if line.count("│") >= 3}


def test_ha_status_of_a_lone_master(lone: CometServer) -> None:
    out = cometmq("admin", "ha-status", "-b", lone.broker_addr)
    assert out.returncode == 0, out.stderr
    rows = _rows(out.stdout)
    assert (rows["role"], rows["broker id"], rows["master epoch"]) == ("master", "0", "1")
    assert rows["SyncStateSet"] == "{0}" and rows["replicas linked"] == "none"
    out = cometmq("admin", "ha-status", "--broker", lone.broker_addr, "--json")
    status = json.loads(out.stdout)
    assert (status["role"], status["syncStateSet"], status["epochs"]) == ("MASTER", [0], [[1, 0]])
    out = cometmq("admin", "ha-status", "-b", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert out.returncode == 1 and out.stderr.startswith("error:")
    assert cometmq("admin", "ha-status").returncode == 2  # -b is required


async def test_sdk_promote_demote_and_epoch_cache(lone: CometServer) -> None:
    from cometmq.client.admin import Admin, EpochRange
    from cometmq.client.errors import BrokerError, ClientConnectionError, InvalidArgumentError
    from cometmq.protocol.codes import ResponseCode

    with SyncProducer("ha-pg", namesrv=lone.namesrv) as p:
        p.send(Message("HAT", b"one"))
    addr = lone.broker_addr
    async with Admin(namesrv=lone.namesrv) as admin:
        status = await admin.ha_status(addr)
        assert status.is_master and (status.broker_id, status.epoch, status.sync_state_set) == (0, 1, (0,))
        assert status.confirm_offset == status.max_offset > 0
        end = status.max_offset
        assert (await admin.promote(addr)).epoch == 2  # its own epoch + 1
        with pytest.raises(BrokerError) as fenced:
            await admin.promote(addr, 2)
        assert fenced.value.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
        cache = await admin.epoch_cache(addr)
        assert (cache.broker_name, cache.broker_id, cache.max_offset) == ("broker-a", 0, end)
        assert cache.epochs == (EpochRange(1, 0, end), EpochRange(2, end, end))
        with pytest.raises(InvalidArgumentError):
            await admin.demote(addr, "127.0.0.1:1", epoch=3, broker_id=0)
        with pytest.raises(ClientConnectionError):  # no epoch given: asked from the (absent) master
            await admin.demote(addr, f"127.0.0.1:{free_port()}")

    # The CLI: follow a master that is not there; the HA address defaults to its port + 1.
    gone = free_port()
    out = cometmq("admin", "demote", "-b", addr, "--master", f"127.0.0.1:{gone}", "--epoch", "2")
    # a master is not demoted at its own epoch
    assert out.returncode == 1 and "CONTROLLER_FENCED_MASTER_EPOCH" in out.stderr
    out = cometmq("admin", "demote", "-b", addr, "--master", f"127.0.0.1:{gone}", "--epoch", "3", "--broker-id", "2")
    assert out.returncode == 0, out.stderr
    assert f"now follows 127.0.0.1:{gone} as replica 2 (its log's last epoch: 2)" in out.stdout  # nothing copied
    status_json = json.loads(cometmq("admin", "ha-status", "-b", addr, "--json").stdout)
    assert (status_json["role"], status_json["brokerId"]) == ("SLAVE", 2)
    assert status_json["masterAddr"] == f"127.0.0.1:{gone + 1}" and status_json["connected"] is False
    rows = _rows(cometmq("admin", "ha-status", "-b", addr).stdout)
    assert rows["role"] == "replica (slave)" and rows["link"] == "not connected"
    out = cometmq("admin", "promote", "-b", addr, "--epoch", "4")
    assert out.returncode == 0 and "at epoch 4" in out.stdout
