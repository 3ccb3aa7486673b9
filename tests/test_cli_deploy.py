"""Running cometmq as a service (issue [13]): --broker-ip (brokerIP1), namesrv -c namesrv.properties, JSON logs
to a file with the broker's stats line."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import pytest

from cometmq.namesrv.config import load_namesrv_conf
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request
from cometmq.protocol.route import ClusterInfo
from cometmq.server_main import UsageError, _broker_config
from cometmq.store.config import ConfigError
from tests.kit.procs import reap
from tests.test_cli import cometmq, free_port


def _ready(proc: subprocess.Popen[str], marker: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert marker in line, line + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
    return line


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        reap(proc)


def test_broker_ip_on_a_wildcard_bind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cometmq.net.addr as addr

    monkeypatch.setattr(addr, "local_address", lambda: "10.1.2.3")
    assert _broker_config(None, tmp_path, "0.0.0.0", 10911, None).advertised_addr == "10.1.2.3:10911"
    assert _broker_config(None, tmp_path, "0.0.0.0", 10911, None, "192.0.2.7").advertised_addr == "192.0.2.7:10911"
    assert _broker_config(None, tmp_path, "127.0.0.1", 10911, None).advertised_addr == "127.0.0.1:10911"
    for bad in ("0.0.0.0", "::", "broker.example"):
        with pytest.raises(UsageError, match=r"not an address clients can reach|not an IP address"):
            _broker_config(None, tmp_path, "0.0.0.0", 10911, None, bad)
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerIP1=0.0.0.0\n")
    with pytest.raises(UsageError, match=r"0\.0\.0\.0 is not an address clients can reach"):
        _broker_config(conf, tmp_path, "127.0.0.1", 10911, None)
    monkeypatch.setattr(addr, "local_address", lambda: None)
    with pytest.raises(UsageError, match="give --broker-ip"):
        _broker_config(None, tmp_path, "0.0.0.0", 10911, None)
    out = subprocess.run(cometmq("broker", "--host", "0.0.0.0", "--broker-ip", "0.0.0.0", "--data",
                                 str(tmp_path / "d")), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "brokerIP1" in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()


def test_serve_registers_the_broker_ip(tmp_path: Path) -> None:
    ns, bp = free_port(), free_port()
    proc = subprocess.Popen(cometmq("serve", "--data", str(tmp_path / "data"), "--namesrv-port", str(ns),
                                    "--broker-port", str(bp), "--grpc-port", "0", "--broker-ip", "127.0.0.3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert f"broker 127.0.0.3:{bp}" in _ready(proc, "cometmq serving")

        async def cluster_info() -> ClusterInfo:
            client = RemotingClient()
            try:
                reply = await client.invoke(f"127.0.0.1:{ns}", make_request(RequestCode.GET_BROKER_CLUSTER_INFO), 5)
                return ClusterInfo.decode(reply.body)
            finally:
                await client.close()

        info = asyncio.run(cluster_info())
        assert info.broker_addr_table["broker-a"].broker_addrs == {0: f"127.0.0.3:{bp}"}
    finally:
        assert _stop(proc) == 0


def test_namesrv_properties(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.properties"
    conf.write_text("listenPort=9999\nbindAddress=127.0.0.1\nscanNotActiveBrokerInterval=2000\n"
                    "rocketmqHome=/opt/rocketmq\nserverWorkerThreads=8\n")
    loaded = load_namesrv_conf(conf)
    assert (loaded.namesrv.port, loaded.namesrv.host, loaded.namesrv.scan_interval_s) == (9999, "127.0.0.1", 2.0)
    assert loaded.controller_store_path is None
    conf.write_text(f"enableControllerInNamesrv=true\ncontrollerStorePath={tmp_path / 'ctl'}\n")
    assert load_namesrv_conf(conf).controller_store_path == tmp_path / "ctl"
    for text, match in (("listenPortt=1\n", "listenPortt"), ("listenPort=x\n", "listenPort"),
                        ("enableControllerInNamesrv=true\n", "controllerStorePath")):
        conf.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_namesrv_conf(conf)


def test_namesrv_runs_from_its_properties_file(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.properties"
    conf.write_text("listenPort=1\nlistenPortt=2\n")
    out = subprocess.run(cometmq("namesrv", "-c", str(conf)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "listenPortt" in out.stderr
    port = free_port()
    conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
    proc = subprocess.Popen(cometmq("namesrv", "-c", str(conf)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _ready(proc, f"cometmq namesrv listening on 127.0.0.1:{port}")
    finally:
        assert _stop(proc) == 0


def test_json_log_file_with_per_logger_levels_and_the_stats_line(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("statsLogIntervalSec=0.5\n")
    log = tmp_path / "logs" / "serve.log"
    ns, bp = free_port(), free_port()
    proc = subprocess.Popen(cometmq("serve", "-c", str(conf), "--data", str(tmp_path / "data"), "--namesrv-port",
                                    str(ns), "--broker-port", str(bp), "--grpc-port", "0", "--log-format", "json",
                                    "--log-file", str(log), "--log-level", "WARNING,cometmq.broker.stats=INFO"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _ready(proc, "cometmq serving")
        deadline = 100
        while deadline and "[BROKER]" not in (log.read_text() if log.exists() else ""):
            deadline -= 1
            subprocess.run(["sleep", "0.05"], check=True)
    finally:
        assert _stop(proc) == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries and all(set(e) == {"time", "level", "logger", "message", "exc"} for e in entries)
    stats = [e for e in entries if e["message"].startswith("[BROKER] broker-a putTps")]
    assert stats and stats[0]["logger"] == "cometmq.broker.stats" and stats[0]["level"] == "INFO"
    assert not [e for e in entries if e["level"] == "INFO" and e["logger"] != "cometmq.broker.stats"]


def test_cluster_hands_level_and_format_to_its_processes(tmp_path: Path) -> None:
    """--log-level goes to the children as given; --log-format through COMETMQ_LOG_FORMAT."""
    bp, ns = free_port(), free_port()
    proc = subprocess.Popen(cometmq("cluster", "--data", str(tmp_path), "--replicas", "0", "--base-port", str(bp),
                                    "--namesrv-port", str(ns), "--log-format", "json",
                                    "--log-level", "INFO,cometmq.net=WARNING"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) and "cometmq cluster ready" not in line:
            pass
        assert "cometmq cluster ready" in line
    finally:
        assert _stop(proc) == 0
    lines = (tmp_path / "namesrv.log").read_text().splitlines()
    assert any(json.loads(line)["logger"].startswith("cometmq.namesrv") for line in lines if line.startswith("{"))
