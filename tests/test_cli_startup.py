"""Start-up checks of the server commands: a data folder in use, bad ports, unreadable or ambiguous files and
values out of range stop the start with one message naming the key or option, before the data folder is
touched, and without a traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.ports import free_port
from tests.kit.procs import reap


def cometmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "cometmq.cli", *args]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cometmq(*args), capture_output=True, text=True, timeout=60)


def serving(data: Path, ns: int, bp: int) -> subprocess.Popen[str]:
    """``cometmq serve`` on ``data`` and those ports, once it says it serves (stopped by the caller: ``reap``)."""
    proc = subprocess.Popen(cometmq("serve", "--data", str(data), "--namesrv-port", str(ns), "--broker-port", str(bp),
                                    "--grpc-port", "0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert "cometmq serving" in proc.stdout.readline()
    except BaseException:
        reap(proc)
        raise
    return proc


def test_a_second_serve_on_the_same_data_folder_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ns, bp = free_port(), free_port()
    first = serving(data, ns, bp)
    try:
        ns2, bp2 = free_port(), free_port()
        second = run("serve", "--data", str(data), "--namesrv-port", str(ns2), "--broker-port", str(bp2),
                     "--grpc-port", "0")
        assert second.returncode != 0
        assert "in use" in second.stderr and str(data) in second.stderr and str(first.pid) in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None
        with socket.create_connection(("127.0.0.1", bp), timeout=5):
            pass
    finally:
        reap(first)
    # once the first one is gone (even killed), the folder can be used again
    reap(serving(data, ns, bp))


BAD_FILES = [
    # (file bytes, what the message names)
    (b"listenPort=0\nbrokerName=\xff\xfe\n", "line 2 is not UTF-8"),
    (b"listenPort=0\nlistenPort=1\n", "listenPort is given twice"),
    (b"registerBrokerInterval=1000\nregisterNameServerPeriod=2000\n",
     "registerBrokerInterval and registerNameServerPeriod"),
]


#: each bad file for each command that reads such a file (the alias pair is a broker key: not the others')
BAD_FILE_CASES = [pytest.param(command, content, named, id=f"{command}-{name}")
                  for (content, named), name in zip(BAD_FILES, ["not-utf8", "duplicate", "alias-twice"], strict=True)
                  for command in ("broker", "serve", "namesrv", "controller")
                  if name != "alias-twice" or command in ("broker", "serve")]


@pytest.mark.parametrize(("command", "content", "named"), BAD_FILE_CASES)
def test_an_unreadable_or_ambiguous_config_file_stops_the_start(tmp_path: Path, command: str, content: bytes,
                                                                named: str) -> None:
    conf = tmp_path / "x.conf"
    conf.write_bytes(content)
    data = tmp_path / "d"
    args = ["-c", str(conf)] + ([] if command == "namesrv" else ["--data", str(data)])
    out = run(command, *args)
    assert out.returncode != 0
    assert named in " ".join(out.stderr.replace("│", " ").split())
    assert "Traceback" not in out.stderr
    assert not data.exists()


BAD_VALUES = [
    # a busy loop, a wait that never ends or overflows, nothing to flush with, a queue count that breaks routes
    ("flushIntervalCommitLog", "0"), ("flushIntervalCommitLog", "-1"), ("flushIntervalCommitLog", "99999999999"),
    ("flushIntervalConsumeQueue", "0"), ("syncFlushTimeout", "0"), ("cleanResourceInterval", "0"),
    ("flushConsumerOffsetInterval", "0"), ("shortPollingTimeMills", "0"), ("registerBrokerInterval", "0"),
    ("channelExpiredTimeout", "0"), ("lockMaxLiveTime", "0"), ("popReviveIntervalMs", "0"),
    ("transactionCheckInterval", "0"), ("slaveTimeout", "0"), ("haSendHeartbeatInterval", "0"),
    ("defaultTopicQueueNums", "0"), ("defaultTopicQueueNums", "100000"), ("brokerPermission", "9"),
    ("brokerId", "-1"), ("minInSyncReplicas", "0"), ("maxTransferCountOnMessageInMemory", "0"),
    ("listenPort", "70000"), ("listenPort", "-5"), ("listenPort", "65535"), ("haListenPort", "65536"),
    ("mappedFileSizeCommitLog", "100"), ("maxMessageSize", "0"), ("mappedFileSizeConsumeQueue", "0"),
    ("deleteWhen", "abc"), ("deleteWhen", "25"), ("fileReservedTime", "-1"), ("fileReservedTime", "nan"),
    ("diskMaxUsedSpaceRatio", "99"), ("statsLogIntervalSec", "-1"), ("serverMaxConnections", "-1"),
    ("timerPrecisionMs", "0"), ("timerRollWindowSlot", "3"),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES, ids=[f"{k}={v}" for k, v in BAD_VALUES])
def test_a_value_out_of_range_stops_the_start(tmp_path: Path, key: str, value: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(("" if key == "listenPort" else "listenPort=0\n") + f"{key}={value}\n")
    data = tmp_path / "d"
    out = run("broker", "-c", str(conf), "--data", str(data), "--grpc-port", "0")
    message = " ".join(out.stderr.replace("│", " ").split())
    assert out.returncode != 0, message
    assert key in message and value in message
    assert "Traceback" not in out.stderr
    assert not data.exists()


@pytest.mark.parametrize(("command", "option"), [("broker", "--port"), ("serve", "--broker-port"),
                                                 ("broker", "--grpc-port"), ("serve", "--grpc-port")])
def test_a_busy_port_stops_the_start_before_the_data_folder_is_touched(tmp_path: Path, command: str,
                                                                       option: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        data = tmp_path / "d"
        ports = {"--port" if command == "broker" else "--broker-port": str(free_port()), "--grpc-port": "0",
                 option: str(port)}
        # (a broker's gRPC endpoint needs a nameserver: one that does not answer, as nothing starts)
        extra = ["--namesrv", f"127.0.0.1:{free_port()}"] if command == "broker" else ["--namesrv-port",
                                                                                       str(free_port())]
        out = run(command, "--data", str(data), *[x for pair in ports.items() for x in pair], *extra)
    message = " ".join(out.stderr.replace("│", " ").split())
    assert out.returncode != 0
    assert f"127.0.0.1:{port}" in message and option in message
    assert "Traceback" not in out.stderr
    assert not data.exists()


@pytest.mark.parametrize(("command", "option"), [("broker", "--port"), ("serve", "--broker-port"),
                                                 ("serve", "--namesrv-port"), ("namesrv", "--port"),
                                                 ("broker", "--grpc-port")])
def test_a_port_option_over_65535_is_refused(tmp_path: Path, command: str, option: str) -> None:
    data = tmp_path / "d"
    out = run(command, option, "70000", *([] if command == "namesrv" else ["--data", str(data)]))
    assert out.returncode == 2
    assert option in out.stderr and "70000" in out.stderr
    assert "Traceback" not in out.stderr
    assert not data.exists()


def test_a_server_that_fails_after_the_broker_started_stops_it_cleanly(tmp_path: Path) -> None:
    """The dashboard starts after the nameserver and the broker: its port taken, the start stops with a message
    naming it, the broker's store shut down cleanly (no abort file), and the next start is not a crash recovery."""
    data = tmp_path / "d"
    ns, bp = free_port(), free_port()
    first = serving(data, ns, bp)  # a clean run first: with its checkpoint, a left abort file would mean a crash
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    reap(first)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run("serve", "--data", str(data), "--namesrv-port", str(ns), "--broker-port", str(bp),
                  "--grpc-port", "0", "--dashboard-port", str(port))
    assert out.returncode != 0
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (data / "abort").exists()
    again = subprocess.Popen(cometmq("serve", "--data", str(data), "--namesrv-port", str(ns), "--broker-port", str(bp),
                                     "--grpc-port", "0", "--log-level", "INFO"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert again.stdout is not None and "cometmq serving" in again.stdout.readline()
        again.send_signal(signal.SIGTERM)
        _, logged = again.communicate(timeout=30)
    finally:
        reap(again)
    assert "recovery after a clean stop" in logged and "after a crash" not in logged
