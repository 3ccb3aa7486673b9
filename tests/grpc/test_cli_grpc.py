"""The gRPC endpoint from the command line: ``cometmq proxy`` in front of ``cometmq serve``, ``--grpc-port``
on serve, and the core package staying free of gRPC imports."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.grpc.v2 import service_pb2_grpc
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request
from tests.kit.ports import free_port


def cometmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "cometmq.cli", *args]


class Proc:
    def __init__(self, args: list[str], marker: str) -> None:
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.p.stdout is not None
        self.lines: list[str] = []
        for line in self.p.stdout:
            self.lines.append(line)
            if marker in line:
                return
        raise AssertionError("".join(self.lines))

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p.stdout is not None:
            self.p.stdout.close()
        return self.p.returncode


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()


def test_cli_import_does_not_load_grpc() -> None:
    code = "import sys, cometmq.cli; assert not any(m == 'grpc' or m.startswith('cometmq.grpc') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_endpoint_speaks_remoting_only() -> None:
    """The proxy reaches brokers over remoting: it imports no broker, store, nameserver or timer code."""
    import ast

    banned = ("cometmq.broker", "cometmq.store", "cometmq.namesrv", "cometmq.timer")
    src = Path(__file__).resolve().parents[2] / "src" / "cometmq" / "grpc"
    bad = []
    for path in src.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            bad += [f"{path.name}: {n}" for n in names if n.startswith(banned)]
    assert not bad


async def _route(port: int, topic: str) -> spb.QueryRouteResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]
        r: spb.QueryRouteResponse = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)),
                                                          timeout=10)
        return r


async def _create_topic(broker: str, namesrv: str, topic: str) -> None:
    """Create ``topic`` on ``broker`` and wait until ``namesrv`` routes it."""
    async with RemotingClient() as client:
        r = await client.invoke(broker, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}))
        assert r.code == 0, r.remark
        for _ in range(100):
            r = await client.invoke(namesrv, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
            if r.code == 0 and r.body:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"no route for {topic}")


def test_standalone_proxy_and_embedded_endpoint(tmp_path: Path, procs: list[Proc]) -> None:
    ns, bp, gp, pp = free_port(), free_port(), free_port(), free_port()
    serve = Proc(cometmq("serve", "--data", str(tmp_path / "data"), "--namesrv-port", str(ns), "--broker-port",
                         str(bp), "--grpc-port", str(gp)), "cometmq serving")
    procs.append(serve)
    assert f"gRPC 127.0.0.1:{gp}" in serve.lines[-1]
    proxy = Proc(cometmq("proxy", "--namesrv", f"127.0.0.1:{ns}", "--grpc-port", str(pp)), "cometmq proxy listening")
    procs.append(proxy)
    # both endpoints route a topic to the one broker (the topics every broker has are system topics, which
    # RocketMQ's proxy refuses to route: ILLEGAL_TOPIC)
    asyncio.run(_create_topic(f"127.0.0.1:{bp}", f"127.0.0.1:{ns}", "CliRoute"))
    for port in (gp, pp):
        assert asyncio.run(_route(port, "TBW102")).status.code == pb.Code.ILLEGAL_TOPIC
        r = asyncio.run(_route(port, "CliRoute"))
        assert r.status.code == pb.Code.OK, r.status
        assert {q.broker.name for q in r.message_queues} == {"broker-a"}
        assert all(q.broker.endpoints.addresses[0].port == port for q in r.message_queues)
    assert proxy.stop() == 0
    assert serve.stop() == 0


def test_grpc_port_zero_turns_it_off(tmp_path: Path, procs: list[Proc]) -> None:
    ns, bp = free_port(), free_port()
    serve = Proc(cometmq("serve", "--data", str(tmp_path / "data"), "--namesrv-port", str(ns), "--broker-port",
                         str(bp), "--grpc-port", "0"), "cometmq serving")
    procs.append(serve)
    assert "gRPC" not in serve.lines[-1]
    assert any("gRPC endpoint off" in line for line in serve.lines)


def test_explicit_busy_grpc_port_fails_the_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(cometmq("serve", "--data", str(tmp_path / "d"), "--namesrv-port", str(free_port()),
                                   "--broker-port", str(free_port()), "--grpc-port", str(port)),
                           capture_output=True, text=True, timeout=60)
    message = " ".join(r.stderr.replace("│", " ").split())
    assert r.returncode == 2, message
    assert f"cannot listen on 127.0.0.1:{port}" in message and "--grpc-port" in message
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()  # checked with the other ports, before anything starts


async def test_an_explicit_grpc_port_taken_after_the_check_stops_the_start_naming_it() -> None:
    from cometmq.server_main import _start_grpc

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit, match=rf"cannot listen for gRPC on 127\.0\.0\.1:{port}.* \(--grpc-port\)"):
            await _start_grpc(port, f"127.0.0.1:{free_port()}", "127.0.0.1", None)
