"""`cometmq controller` and `cometmq namesrv --controller-data` as processes: the ready line, requests, the admin
commands, SIGTERM → exit 0 and the process gone."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit.procs import reap
from tests.test_cli import cometmq, free_port


@contextmanager
def running(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The process and its ready line; on exit, SIGTERM and the checks that it stopped cleanly."""
    proc = subprocess.Popen(cometmq(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield proc, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError(f"process {proc.pid} still exists")
    finally:
        reap(proc)


def request(addr: str, code: int, **fields: object) -> RemotingCommand:
    async def main() -> RemotingCommand:
        async with RemotingClient() as client:
            return await client.invoke(addr, make_request(code, fields), 5)

    return asyncio.run(main())


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cometmq.cli", "admin", *args], capture_output=True, text=True,
                          timeout=60)


def test_controller_command(tmp_path: Path) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    with running("controller", "--port", str(port), "--data", str(tmp_path / "ctl")) as (_, line):
        assert line.strip().startswith(f"cometmq controller listening on {addr} (node n0, log in ")
        assert (tmp_path / "ctl" / "controller.log").exists()
        reply = request(addr, RequestCode.CONTROLLER_APPLY_BROKER_ID, clusterName="c", brokerName="g",
                        appliedBrokerId=1, registerCheckCode="127.0.0.1:1;1")
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        out = admin("controller-metadata", "-c", addr)
        assert out.returncode == 0, out.stderr
        assert "#IsLeader\ttrue" in out.stdout and addr in out.stdout
        out = admin("sync-state", "-c", addr, "-b", "g", "--json")
        assert out.returncode == 0, out.stderr
        assert '"masterBrokerId": null' in out.stdout
        # the first election of a group elects the broker asked for
        elect = ("elect-master", "-c", addr, "--cluster", "c", "--broker-name", "g", "--broker-id", "1")
        out = admin(*elect)
        assert out.returncode == 0, out.stderr
        assert "g: master 1 (127.0.0.1:1) at epoch 1" in out.stdout
        out = admin(*elect)  # no heartbeat from broker 1: no candidate (the controller's code, as an error)
        assert out.returncode == 1 and "(2012)" in out.stderr


def test_controller_in_namesrv(tmp_path: Path) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    with running("namesrv", "--port", str(port), "--controller-data", str(tmp_path / "ctl")) as (_, line):
        assert line.strip() == f"cometmq namesrv listening on {addr}"
        assert request(addr, RequestCode.GET_BROKER_CLUSTER_INFO).code == ResponseCode.SUCCESS
        reply = request(addr, RequestCode.CONTROLLER_GET_METADATA_INFO)
        assert reply.code == ResponseCode.SUCCESS
        assert reply.ext_fields["isLeader"] == "true" and reply.ext_fields["controllerLeaderAddress"] == addr
        reply = request(addr, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, clusterName="c", brokerName="g")
        assert reply.ext_fields["nextBrokerId"] == "1"


def test_clean_broker_data_empty_id_list_changes_nothing(tmp_path: Path) -> None:
    """An empty id list (-b '' or -b ';') is a usage error, not "the whole group": the group is left as it was."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    with running("controller", "--port", str(port), "--data", str(tmp_path / "ctl")):
        for broker_id in (1, 2):
            reply = request(addr, RequestCode.CONTROLLER_APPLY_BROKER_ID, clusterName="c", brokerName="g",
                            appliedBrokerId=broker_id, registerCheckCode=f"127.0.0.1:{broker_id};1")
            assert reply.code == ResponseCode.SUCCESS, reply.remark
        out = admin("elect-master", "-c", addr, "--cluster", "c", "--broker-name", "g", "--broker-id", "1")
        assert out.returncode == 0, out.stderr
        before = admin("sync-state", "-c", addr, "-b", "g", "--json")
        assert before.returncode == 0, before.stderr
        clean = ("clean-broker-data", "-c", addr, "--cluster", "c", "--broker-name", "g", "--clean-living")
        for ids in ("", ";", " ; "):
            out = admin(*clean, "-b", ids)
            assert out.returncode == 2, (ids, out.stdout, out.stderr)
            assert "Traceback" not in out.stderr and "--broker-ids" in out.stderr
        for ids in ("7", "2;7"):  # ids the group does not hold: refused by the controller, nothing forgotten
            out = admin(*clean, "-b", ids)
            assert out.returncode == 1 and "(2009)" in out.stderr and "[7]" in out.stderr, out.stderr
        after = admin("sync-state", "-c", addr, "-b", "g", "--json")
        assert after.stdout == before.stdout
