"""The command line: configuration errors are reported, `serve` starts and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cometmq.broker.config import ConfigError, load_broker_conf, parse_properties
from cometmq.cli import SERVER_MALLOC
from tests.kit.ports import free_port
from tests.kit.procs import reap


def cometmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "cometmq.cli", *args]


def test_unknown_broker_conf_key_is_reported(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b1\nlistenPort=10911\nflushDiskTyp=SYNC_FLUSH\n")
    out = subprocess.run(cometmq("broker", "-c", str(conf), "--data", str(tmp_path / "d")), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "flushDiskTyp" in out.stderr
    assert not (tmp_path / "d").exists()


def test_broker_conf_uses_rocketmq_names(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# a comment\nbrokerName = b7\nbrokerClusterName=C\nnamesrvAddr=127.0.0.1:1;127.0.0.1:2\n"
                    "flushDiskType=SYNC_FLUSH\nlongPollingEnable=false\nshortPollingTimeMills=250\n"
                    f"storePathRootDir={tmp_path / 'store'}\nmessageDelayLevel=1s 2m 1h\nbrokerRole=ASYNC_MASTER\n")
    cfg = load_broker_conf(conf)
    assert (cfg.broker_name, cfg.broker_cluster_name) == ("b7", "C")
    assert cfg.namesrv_addrs == ["127.0.0.1:1", "127.0.0.1:2"]
    assert cfg.store.flush_disk_type.value == "SYNC_FLUSH"
    assert (cfg.long_polling_enable, cfg.short_polling_time_ms) == (False, 250)
    assert cfg.store.store_path == tmp_path / "store"
    assert cfg.message_delay_level == (1000, 120_000, 3_600_000)
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        load_broker_conf_text(tmp_path, "messageDelayLevel=1x\n")
    with pytest.raises(ConfigError, match="line 1"):
        parse_properties("no separator here\n")


def load_broker_conf_text(tmp_path: Path, text: str) -> object:
    p = tmp_path / "x.conf"
    p.write_text(text)
    return load_broker_conf(p)


def test_serve_starts_and_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ns, bp = free_port(), free_port()
    proc = subprocess.Popen(cometmq("serve", "--data", str(data), "--namesrv-port", str(ns), "--broker-port", str(bp)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "cometmq serving" in line and f"127.0.0.1:{bp}" in line
        assert (data / "abort").exists()
        # no TLS in its settings: OpenSSL is not loaded (cometmq.net.no_openssl)
        assert "/_ssl." not in Path(f"/proc/{proc.pid}/maps").read_text()
        with socket.create_connection(("127.0.0.1", ns), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        reap(proc)
    assert not (data / "abort").exists()
    checkpoint = json.loads((data / "checkpoint").read_text())
    assert checkpoint["clean_end_offset"] >= 0
    assert (data / "config" / "topics.json").exists()


def test_a_server_command_becomes_the_server_process(tmp_path: Path) -> None:
    """`cometmq namesrv` parses its options, then execs `python -m cometmq.server_main` (issue [16]): the same PID
    serves, and options read from the environment (secrets) are not on its command line."""
    proc = subprocess.Popen(cometmq("namesrv", "--port", "0", "--log-file", str(tmp_path / "ns.log")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COMETMQ_INNER_CREDENTIALS": "someAdmin:notOnTheCommandLine"})
    try:
        assert proc.stdout is not None
        assert "cometmq namesrv listening on 127.0.0.1:" in proc.stdout.readline()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        at = cmdline.index(b"-m")  # after the interpreter's own flags (-B, -X…), handed on
        assert cmdline[at:at + 4] == [b"-m", b"cometmq.server_main", b"namesrv", b"--port"], cmdline
        assert b"notOnTheCommandLine" not in b" ".join(cmdline)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert {f"{k}={v}".encode() for k, v in SERVER_MALLOC.items()} <= set(environ)  # glibc's malloc settings
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        reap(proc)
    assert "nameserver serving on" in (tmp_path / "ns.log").read_text()


def test_the_server_commands_take_what_cli_declares() -> None:
    """cometmq.cli's typer signatures are the one definition of the options; server_main's functions take them."""
    import inspect

    from cometmq import cli, server_main

    for name, run in server_main.COMMANDS.items():
        declared = [p for p in inspect.signature(getattr(cli, name)).parameters
                    if not p.startswith("log_") and p != "typer_context"]
        assert declared == list(inspect.signature(run).parameters), name


def test_a_mistake_found_by_the_server_process_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(cometmq("serve", "--data", str(tmp_path / "d"), "--tls-mode", "enforcing"),
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
    assert out.returncode == 2, out.stderr
    assert "Usage: " in out.stderr and "serve [OPTIONS]" in out.stderr
    assert "Invalid value for --tls-mode/--tls-cert/--tls-key (tls.server.*):" in out.stderr
    assert not (tmp_path / "d").exists()
