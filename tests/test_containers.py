"""deploy/Containerfile and deploy/compose.yaml, built and run (issue [13]): the image from this tree's wheel, then
nameserver + broker + gRPC endpoint as three containers; a message sent over remoting and one over gRPC are both
received. Skipped without podman and podman-compose (Debian: apt-get install podman podman-compose).

With no registry the base image is made locally (deploy/build-base: mmdebstrap, ~1-2 minutes, once); set
COMETMQ_TEST_BASE to use another base. On a host with cgroups v1/hybrid (crun refuses it) the test runs podman
with runc when runc is installed, and with ulimits no higher than this process's (podman would raise them).
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli import free_port

ROOT = Path(__file__).resolve().parents[1]
BASE = os.environ.get("COMETMQ_TEST_BASE", "localhost/cometmq-base:bookworm")
IMAGE = "localhost/cometmq:test"

pytestmark = pytest.mark.skipif(not (shutil.which("podman") and shutil.which("podman-compose")),
                                reason="podman and podman-compose are not installed")


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[0], 4096)
    lines = ["[containers]", f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]']
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    conf.write_text("\n".join(lines) + "\n")
    env["CONTAINERS_CONF"] = str(conf)
    return env


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str]) -> Iterator[str]:
    if _run(["podman", "image", "exists", BASE], podman_env, 60).returncode != 0:
        if BASE != "localhost/cometmq-base:bookworm" or not shutil.which("mmdebstrap"):
            pytest.skip(f"no base image {BASE} (deploy/build-base needs mmdebstrap)")
        out = _run([str(ROOT / "deploy" / "build-base"), BASE], podman_env, 600)
        assert out.returncode == 0, out.stdout + out.stderr
    out = _run([str(ROOT / "deploy" / "build-image"), IMAGE], {**podman_env, "BASE": BASE}, 600)
    assert out.returncode == 0, out.stdout + out.stderr
    yield IMAGE
    _run(["podman", "rmi", "-f", IMAGE], podman_env, 120)


@pytest.mark.timeout(900)
def test_compose_runs_namesrv_broker_and_grpc_endpoint(image: str, podman_env: dict[str, str]) -> None:
    ns, bp, gp = free_port(), free_port(), free_port()
    project = f"cometmq-test-{uuid.uuid4().hex[:8]}"
    env = {**podman_env, "COMETMQ_IMAGE": image, "NAMESRV_PORT": str(ns), "BROKER_PORT": str(bp),
           "GRPC_PORT": str(gp)}
    compose = ["podman-compose", "-p", project, "-f", str(ROOT / "deploy" / "compose.yaml")]
    try:
        out = _run([*compose, "up", "-d"], env, 300)
        assert out.returncode == 0, out.stdout + out.stderr
        asyncio.run(_send_and_receive(f"127.0.0.1:{ns}", f"127.0.0.1:{gp}"))
        out = _run(["podman", "logs", f"{project}_broker_1"], env, 60)
        logs = out.stdout + out.stderr
        assert '"logger": "cometmq.broker.controller"' in logs  # --log-format json
        assert "brokerIP1 is not set: advertising" in logs  # its address on the compose network
    except BaseException:
        for service in ("namesrv", "broker", "proxy"):
            logs = _run(["podman", "logs", f"{project}_{service}_1"], env, 60)
            print(f"--- {service}\n{logs.stdout}{logs.stderr}")
        raise
    finally:
        down = _run([*compose, "down", "-v", "-t", "20"], env, 300)
        _run(["podman", "network", "rm", "-f", f"{project}_default"], env, 60)  # podman-compose 1.0 leaves it
        assert down.returncode == 0, down.stdout + down.stderr
    left = _run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "-q"], env, 60)
    assert not left.stdout.strip()


async def _send_and_receive(namesrv: str, grpc_addr: str) -> None:
    import grpc

    from cometmq.client import LitePullConsumer, Message, Producer
    from cometmq.grpc.v2 import definition_pb2 as pb
    from cometmq.grpc.v2 import service_pb2 as spb
    from cometmq.grpc.v2 import service_pb2_grpc

    topic = "ContainerTopic"
    by_remoting, by_grpc = b"remoting-" + uuid.uuid4().hex.encode(), b"grpc-" + uuid.uuid4().hex.encode()
    async with Producer("container-producer", namesrv=namesrv) as producer:
        for attempt in range(60):  # the broker registers with the nameserver a moment after the start
            try:
                await producer.send(Message(topic, by_remoting))
                break
            except Exception:
                if attempt == 59:
                    raise
                await asyncio.sleep(1)
    md = [("x-mq-client-id", "container-test"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"),
          ("x-mq-client-version", "test")]
    async with grpc.aio.insecure_channel(grpc_addr) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        route = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=md, timeout=10)
        assert route.status.code == pb.OK and route.message_queues, route
        sp = pb.SystemProperties(message_id="01" + os.urandom(16).hex().upper(), message_type=pb.NORMAL,
                                 body_encoding=pb.IDENTITY)
        sent = await stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name=topic), body=by_grpc, system_properties=sp)]), metadata=md, timeout=10)
        assert sent.status.code == pb.OK, sent
    got: set[bytes] = set()
    async with LitePullConsumer("container-consumer", namesrv=namesrv, consume_from="first") as consumer:
        await consumer.subscribe(topic)
        for _ in range(30):
            got |= {m.body for m in await consumer.poll(timeout=1.0)}
            if {by_remoting, by_grpc} <= got:
                break
    assert {by_remoting, by_grpc} <= got
