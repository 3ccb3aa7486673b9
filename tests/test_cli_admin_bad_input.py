"""``cometmq admin`` verbs given wrong, out-of-range or malformed arguments, against one real ``cometmq serve``:
each exits non-zero with one error naming the argument, no traceback, and the cluster is left as it was. The
verbs run in this process (typer's runner: the same code as the command, without a Python start per case); one
case runs as a subprocess too, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from cometmq.cli import app
from cometmq.client import MessageQueue
from tests.interop.cometmq_server import CometServer
from tests.test_cli_admin_verbs import ok, sdk

HUGE = "99999999999999999999999"  # past a Java long

#: (verb and arguments, with {B} for the broker's address; exit code; words the error names)
CASES: list[tuple[list[str], int, list[str]]] = [
    # timestamps: past a Java long (was a traceback, after the reset was done), before 1970, begin after end
    (["resetOffsetByTime", "-g", "BG", "-t", "BT", "-s", HUGE], 2, ["-s", "largest timestamp"]),
    (["resetOffsetByTime", "-g", "BG", "-t", "BT", "-s", "1969-12-31#00:00:00:000"], 2, ["-s", "before 1970"]),
    (["printMsg", "-t", "BT", "-b", "100", "-e", "50"], 2, ["-b", "after -e"]),
    (["queryMsgByKey", "-t", "BT", "-k", "k", "-b", HUGE], 2, ["-b", "largest timestamp"]),
    (["consumeMessage", "-t", "BT", "-s", "200", "-e", "100"], 2, ["-s", "after -e"]),
    # offsets past a Java long (one was written to the broker)
    (["resetOffsetByTime", "-g", "BG", "-t", "BT", "-s", "now", "-b", "broker-a", "-q", "0", "-o", HUGE], 2, ["-o"]),
    (["consumeMessage", "-t", "BT", "-b", "broker-a", "-i", "0", "-o", HUGE], 2, ["-o"]),
    # an offset msgId of no broker address (was a traceback)
    (["queryMsgById", "-i", "0" * 32], 2, ["names no broker address"]),
    # addresses: a port that is not one, no port (were tracebacks, or named the nameserver for a broker)
    (["brokerStatus", "-b", "host:abc"], 2, ["-b", "host:port"]),
    (["updateTopic", "-t", "BT2", "-b", "127.0.0.1:99999"], 2, ["-b", "host:port"]),
    (["deleteSubGroup", "-g", "BG", "-b", "127.0.0.1:0"], 2, ["-b", "host:port"]),
    (["topicList", "-n", "127.0.0.1"], 2, ["-n", "host:port"]),
    (["ha-status", "-b", "127.0.0.1"], 2, ["-b", "host:port"]),
    (["demote", "-b", "{B}", "--master", "127.0.0.1"], 2, ["--master", "host:port"]),
    (["demote", "-b", "{B}", "--master", "{B}", "--master-ha", "garbage"], 2, ["--master-ha", "host:port"]),
    (["controller-metadata", "-c", "x:abc"], 2, ["-c", "host:port"]),
    (["timer-status", "--broker", "127.0.0.1:99999"], 2, ["--broker", "host:port"]),
    (["timer-status", "--namesrv", "garbage"], 2, ["--namesrv", "host:port"]),
    # values the brokers' Java fields cannot hold, or RocketMQ does not know
    (["updateTopic", "-t", "BT2", "-a", "+message.type=WHAT"], 2, ["message type", "WHAT"]),
    (["updateSubGroup", "-g", "BG2", "-q", "1000000"], 2, ["retry_queue_nums"]),
    (["updateSubGroup", "-g", "BG2", "-r", "99999999999"], 2, ["retry_max_times"]),
    (["updateSubGroup", "-g", "BG2", "-i", HUGE], 2, ["brokerId"]),
    (["updateSubGroup", "-g", "BG2", "-w", HUGE], 2, ["whichBrokerWhenConsumeSlowly"]),
    # a charset Python does not know (the empty-body check let it through)
    (["printMsg", "-t", "BT", "-c", "no-such-charset"], 2, ["-c", "no-such-charset"]),
    (["queryMsgById", "-i", "x", "-f", "no-such-charset"], 2, ["-f", "no-such-charset"]),
    # group names RocketMQ refuses
    (["consumeMessage", "-t", "BT", "-g", "bad group"], 2, ["-g", "not a valid group name"]),
    (["sendMessage", "-t", "BT", "-p", "x", "--group", "bad group"], 2, ["--group", "not a valid group name"]),
    # a broker no nameserver knows: an error, not "OK, 0"
    (["wipeWritePerm", "-b", "no-such-broker"], 1, ["no-such-broker"]),
    (["addWritePerm", "-b", "no-such-broker"], 1, ["no-such-broker"]),
]

_NO_NAMESRV = {"ha-status", "demote", "controller-metadata", "timer-status"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    s = CometServer(tmp_path_factory.mktemp("admin-bad-input"))
    s.start()
    try:
        ok(s, "updateTopic", "-t", "BT", "-r", "2", "-w", "2")
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(("argv", "code", "words"), CASES, ids=[" ".join(c[0][:2]) + f"-{i}"
                                                                 for i, c in enumerate(CASES)])
def test_bad_input_is_one_clear_error(server: CometServer, argv: list[str], code: int, words: list[str]) -> None:
    args = [a.replace("{B}", server.broker_addr) for a in argv]
    if args[0] not in _NO_NAMESRV and "-n" not in args:
        args[1:1] = ["-n", server.namesrv]
    result = CliRunner().invoke(app, ["admin", *args, "--timeout", "3"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    for w in words:
        assert w in result.output, result.output


def test_bad_input_changed_nothing(server: CometServer) -> None:
    """After every case above: no topic or group made, no offset committed, write permission as it was."""
    topics = ok(server, "topicList")
    assert "BT" in topics and "BT2" not in topics
    groups = sdk(server, lambda a: a.subscription_groups("broker-a"))
    assert "BG" not in groups and "BG2" not in groups
    assert sdk(server, lambda a: a.committed_offset("BG", MessageQueue("BT", "broker-a", 0))) is None
    route = server.route("BT")
    assert route is not None and route["queueDatas"][0]["perm"] == 6
    # and as a user runs it: a process that ends with one error line, no traceback
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", "resetOffsetByTime", "-n", server.namesrv,
                          "-g", "BG", "-t", "BT", "-s", HUGE], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "-s" in out.stderr, out.stderr
