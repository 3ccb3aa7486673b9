"""The gRPC endpoint's cost, measured with the official Python 5.x client, against a bare echo server as the floor.

    .venv/bin/python bench/bench_grpc.py                          # 2000 sends, 2000 receive+acks, 3 rounds
    .venv/bin/python bench/bench_grpc.py --sends 500 --receives 500 --rounds 1

Three processes per measurement: the server (``cometmq serve`` with its gRPC endpoint, or the echo server), and
the official client (rocketmq-python-client 5.1.2 from ``.venv-py5``; ``scripts/setup-grpc-clients`` installs it)
running this same file in ``--driver`` mode. The echo server (``--echo`` mode) speaks the same protos
(cometmq.grpc.v2) and answers trivially: routes pointing at itself, OK to every SendMessage, a batch of canned
messages to every ReceiveMessage, OK to every ack. What the client does is the same in both runs:

* sync send: ``producer.send()`` one 100-byte message at a time, one thread;
* receive+ack: ``SimpleConsumer.receive(32, 30s)`` then ``ack()`` each message, one thread.

Cost ratio = echo rate / endpoint rate (the endpoint's time per message over the floor's); the target is <= 1.5.
The rounds alternate endpoint and echo so that machine noise hits both. Prints one JSON line per measurement
and a summary (min / median / max per target, and the cost ratio per round), and appends them to ``--out``
(bench/results/grpc-<time>.jsonl).

``--compare-src DIR`` adds a third server to every round: ``cometmq serve`` run from another source tree (e.g.
``git archive <commit> src | tar -x -C /tmp/base`` then ``--compare-src /tmp/base/src``), reported as target
``baseline``, so a change is measured against its predecessor under the same machine noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY5 = ROOT / ".venv-py5" / "bin" / "python"
TOPIC, GROUP = "BenchGrpc", "BenchGrpcGroup"


# -- the official client (runs under .venv-py5) -----------------------------------------------------------
def driver(endpoints: str, sends: int, receives: int, group: str) -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    cfg = ClientConfiguration(endpoints, Credentials())
    producer = Producer(cfg, (TOPIC,))
    producer.startup()
    body = b"x" * 100
    for _ in range(20):  # warm-up: connections, routes, settings
        m = Message()
        m.topic, m.body = TOPIC, body
        producer.send(m)
    t0 = time.perf_counter()
    for _ in range(sends):
        m = Message()
        m.topic, m.body = TOPIC, body
        producer.send(m)
    send_s = time.perf_counter() - t0
    producer.shutdown()
    consumer = SimpleConsumer(cfg, group, {TOPIC: FilterExpression("*")}, await_duration=5)
    consumer.startup()
    got = 0
    t0 = time.perf_counter()
    while got < receives:
        for m in consumer.receive(32, 30) or []:
            consumer.ack(m)
            got += 1
    recv_s = time.perf_counter() - t0
    consumer.shutdown()
    print(json.dumps({"send_rate": sends / send_s, "receive_ack_rate": got / recv_s}), flush=True)


# -- the floor: a bare echo server on the same protos ----------------------------------------------------------
def echo_server(port: int) -> None:
    import asyncio

    import grpc

    sys.path.insert(0, str(ROOT / "src"))
    from cometmq.grpc.v2 import definition_pb2 as pb
    from cometmq.grpc.v2 import service_pb2 as spb
    from cometmq.grpc.v2 import service_pb2_grpc

    ok = pb.Status(code=pb.Code.OK, message="OK")
    eps = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=port)])
    broker = pb.Broker(name="echo", id=0, endpoints=eps)
    body = b"x" * 100
    digest = pb.Digest(type=pb.MD5, checksum=__import__("hashlib").md5(body).hexdigest().upper())

    class Echo(service_pb2_grpc.MessagingServiceServicer):
        n = 0

        async def QueryRoute(self, request: Any, context: Any) -> Any:
            qs = [pb.MessageQueue(topic=request.topic, id=i, permission=pb.READ_WRITE, broker=broker,
                                  accept_message_types=[pb.NORMAL]) for i in range(4)]
            return spb.QueryRouteResponse(status=ok, message_queues=qs)

        async def Heartbeat(self, request: Any, context: Any) -> Any:
            return spb.HeartbeatResponse(status=ok)

        async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
            return spb.NotifyClientTerminationResponse(status=ok)

        async def Telemetry(self, request_iterator: Any, context: Any) -> Any:
            async for cmd in request_iterator:
                if cmd.HasField("settings"):
                    s = pb.Settings()
                    s.CopyFrom(cmd.settings)
                    s.metric.on = False
                    if s.HasField("publishing"):
                        s.publishing.max_body_size = 4 << 20
                    yield spb.TelemetryCommand(status=ok, settings=s)

        async def SendMessage(self, request: Any, context: Any) -> Any:
            m = request.messages[0]
            return spb.SendMessageResponse(status=ok, entries=[spb.SendResultEntry(
                status=ok, message_id=m.system_properties.message_id, offset=0)])

        async def ReceiveMessage(self, request: Any, context: Any) -> Any:
            yield spb.ReceiveMessageResponse(status=ok)
            for _ in range(request.batch_size or 32):
                Echo.n += 1
                sp = pb.SystemProperties(message_id=f"01{Echo.n:032X}", body_digest=digest,
                                         body_encoding=pb.IDENTITY, message_type=pb.NORMAL,
                                         receipt_handle=f"h{Echo.n}", delivery_attempt=1, queue_id=0)
                sp.born_timestamp.GetCurrentTime()
                yield spb.ReceiveMessageResponse(message=pb.Message(topic=request.message_queue.topic, body=body,
                                                                    system_properties=sp))

        async def AckMessage(self, request: Any, context: Any) -> Any:
            return spb.AckMessageResponse(status=ok, entries=[spb.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=ok) for e in request.entries])

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Echo(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("echo ready", flush=True)
        await server.wait_for_termination()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


# -- orchestration ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def run_driver(endpoints: str, sends: int, receives: int, group: str, home: Path) -> dict[str, float]:
    env = {**os.environ, "HOME": str(home)}
    p = subprocess.run([str(PY5), __file__, "--driver", endpoints, "--sends", str(sends), "--receives",
                        str(receives), "--group", group], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"driver failed: {p.stderr[-3000:]}")
    result: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def summarize(rows: list[dict[str, Any]], servers: list[str]) -> dict[str, Any]:
    """Per target and metric: rates as [min, median, max]; per server: the cost ratio (echo rate / server rate)
    of each round, and the ratio of the medians."""
    summary: dict[str, Any] = {"bench": "grpc-summary", "machine": f"{platform.machine()} {os.cpu_count()} cpu",
                               "python": platform.python_version(), "rounds": len({r["round"] for r in rows})}
    for key in ("send_rate", "receive_ack_rate"):
        for target in [*servers, "echo"]:
            rates = [float(r[key]) for r in rows if r["target"] == target]
            summary[f"{target}_{key}"] = [min(rates), round(statistics.median(rates), 1), max(rates)]
        echo = {r["round"]: float(r[key]) for r in rows if r["target"] == "echo"}
        for target in servers:
            per_round = [round(echo[r["round"]] / float(r[key]), 2) for r in rows if r["target"] == target]
            summary[f"cost_ratio_{target}_{key}_per_round"] = per_round
            summary[f"cost_ratio_{target}_{key}_of_medians"] = round(
                summary[f"echo_{key}"][1] / summary[f"{target}_{key}"][1], 2)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--receives", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare-src", type=Path, metavar="DIR",
                    help="also measure `cometmq serve` run from this source tree (its src/ folder), as 'baseline'")
    ap.add_argument("--driver", metavar="ENDPOINTS", help=argparse.SUPPRESS)
    ap.add_argument("--echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--group", default=GROUP, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        driver(args.driver, args.sends, args.receives, args.group)
        return
    if args.echo:
        echo_server(args.echo)
        return
    if not PY5.exists():
        sys.exit(f"{PY5} is missing: run scripts/setup-grpc-clients")
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))
    from tests.interop.cometmq_server import CometServer

    out = args.out or ROOT / "bench" / "results" / f"grpc-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        work = Path(tmp)
        echo_port = free_port()
        servers: list[tuple[str, CometServer, int]] = []
        trees: list[tuple[str, Path | None]] = [("endpoint", None)]
        if args.compare_src is not None:
            trees.append(("baseline", args.compare_src.resolve()))
        echo = subprocess.Popen([sys.executable, __file__, "--echo", str(echo_port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for target, src in trees:
                grpc_port = free_port()
                env = {**os.environ, "COMETMQ_GRPC_PORT": str(grpc_port)}
                if src is not None:
                    env["PYTHONPATH"] = str(src)
                server = CometServer(work / target, {"flushDiskType": "ASYNC_FLUSH"}, env=env)
                servers.append((target, server, grpc_port))
                server.start()
                server.create_topic(TOPIC, queues=4)
            wait_port(echo_port)
            targets = [(t, port) for t, _, port in servers] + [("echo", echo_port)]
            for rnd in range(args.rounds):
                for target, port in targets[rnd % len(targets):] + targets[:rnd % len(targets)]:  # rotate the order
                    r = run_driver(f"127.0.0.1:{port}", args.sends, args.receives, f"{GROUP}{rnd}",
                                   work / f"home-{target}")
                    row = {"bench": "grpc", "target": target, "round": rnd, "sends": args.sends,
                           "receives": args.receives, **{k: round(v, 1) for k, v in r.items()}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            echo.terminate()
            echo.wait(10)
            for _, server, _ in servers:
                server.close()
    summary = summarize(rows, [t for t, _ in trees])
    print(json.dumps(summary), flush=True)
    with out.open("a") as f:
        for row in [*rows, summary]:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
