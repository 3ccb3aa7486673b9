"""Replication benchmarks ([11]): a master and one replica, each its own process, on this machine.

    .venv/bin/python bench/bench_ha.py produce     # acked batched produce, allAck with 1 replica vs one broker
    .venv/bin/python bench/bench_ha.py latency     # send latency at a fixed 10k msg/s, with and without a replica
    .venv/bin/python bench/bench_ha.py catchup     # a new replica copying a 1 GiB backlog (--gib)
    .venv/bin/python bench/bench_ha.py failover    # kill -9 the master -> admin promote -> first acked send
    .venv/bin/python bench/bench_ha.py all --rounds 3

Every broker is `cometmq broker -c broker.conf` (with `cometmq namesrv`) on free loopback ports, in a fresh data
folder, stopped by PID. The single-broker and the replicated setups alternate round by round, so the machine's
drift hits both. One JSON line per measurement; a summary line per part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.interop.cometmq_server import free_port  # noqa: E402

from cometmq.client import Message, Producer  # noqa: E402
from cometmq.net.client import RemotingClient  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from cometmq.protocol.remoting import make_request  # noqa: E402

#: the HA timings a test would use; --defaults keeps RocketMQ's
FAST = {"haSendHeartbeatInterval": "1000", "haHousekeepingInterval": "500", "haMaxTimeSlaveNotCatchup": "3000"}


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class Proc:
    def __init__(self, args: list[str], log: Path, ready: str) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.p = subprocess.Popen([sys.executable, "-m", "cometmq.cli", *args], stdout=out,
                                      stderr=subprocess.STDOUT, env={**os.environ, "COMETMQ_GRPC_PORT": "0"})
        deadline = time.monotonic() + 30
        while ready not in log.read_text(errors="replace"):
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{args[0]} did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class Group:
    """A nameserver and brokers of one group, in ``root``."""

    def __init__(self, root: Path, conf: dict[str, str]) -> None:
        self.root = root
        self.conf = conf
        self.ns_port = free_port()
        self.namesrv = f"127.0.0.1:{self.ns_port}"
        self.ns = Proc(["namesrv", "--port", str(self.ns_port)], root / "namesrv.log", "cometmq namesrv")
        self.brokers: dict[int, tuple[Proc, str]] = {}

    def broker(self, broker_id: int) -> str:
        port = free_port()
        ha = free_port()
        data = self.root / f"broker-{broker_id}"
        data.mkdir(exist_ok=True)
        conf = {"brokerClusterName": "BenchCluster", "brokerName": "bench-a", "brokerId": str(broker_id),
                "listenPort": str(port), "haListenPort": str(ha), "storePathRootDir": str(data),
                "namesrvAddr": self.namesrv, **self.conf}
        path = data / "broker.conf"
        path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        proc = Proc(["broker", "-c", str(path), "--data", str(data)], data / "broker.log", "cometmq broker")
        addr = f"127.0.0.1:{port}"
        self.brokers[broker_id] = (proc, addr)
        return addr

    def stop(self) -> None:
        for proc, _ in self.brokers.values():
            proc.stop()
        self.ns.stop()


@contextmanager
def group(conf: dict[str, str], replicas: int) -> Iterator[Group]:
    with tempfile.TemporaryDirectory(prefix="cometmq-ha-bench-", dir=os.environ.get("BENCH_DIR")) as tmp:
        g = Group(Path(tmp), conf)
        try:
            g.broker(0)
            for i in range(replicas):
                g.broker(i + 1)
            if replicas:
                asyncio.run(wait_in_sync(g.brokers[0][1], replicas + 1))
            yield g
        finally:
            g.stop()


async def ha_status(client: RemotingClient, addr: str) -> dict[str, Any]:
    reply = await client.invoke(addr, make_request(RequestCode.GET_BROKER_HA_STATUS, {}), 5)
    status: dict[str, Any] = json.loads(reply.body)
    return status


async def wait_in_sync(master: str, members: int, timeout: float = 60) -> float:
    client = RemotingClient()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            try:
                if len((await ha_status(client, master)).get("syncStateSet", [])) >= members:
                    return time.monotonic() - t0
            except Exception:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the SyncStateSet of {master} did not reach {members} members in {timeout}s")
    finally:
        await client.close()


def produce_tool(namesrv: str, count: int, size: int, batch: int, concurrency: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "bench", "produce", "--namesrv", namesrv, "--count",
                          str(count), "--size", str(size), "--batch", str(batch), "--concurrency",
                          str(concurrency)], capture_output=True, text=True, timeout=900, check=True).stdout
    result: dict[str, Any] = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return result


# -- parts ------------------------------------------------------------------------------------------------------
def bench_produce(rounds: int, conf: dict[str, str], count: int) -> None:
    got: dict[str, list[float]] = {"single": [], "replicated": []}
    for r in range(rounds):
        for setup, replicas in (("single", 0), ("replicated", 1)):
            with group(conf, replicas) as g:
                res = produce_tool(g.namesrv, count, 100, 128, 4)
            got[setup].append(res["msgs_per_s"])
            report(part="produce", round=r, setup=setup, msgs_per_s=res["msgs_per_s"], messages=res["messages"])
    ratios = [rep / one for rep, one in zip(got["replicated"], got["single"], strict=True)]
    report(summary="produce", single=got["single"], replicated=got["replicated"],
           ratio_by_round=[round(x, 3) for x in ratios], median_ratio=round(statistics.median(ratios), 3))


async def _paced_sends(namesrv: str, rate: int, seconds: float, batch: int = 1) -> list[float]:
    """``rate`` messages per second, as sends of ``batch`` messages, each started on its due time:
    send-to-ack latencies in ms (a failed or timed-out send counts as infinite)."""
    lat: list[float] = []
    pending: set[asyncio.Task[None]] = set()
    async with Producer("bench-ha-latency", namesrv=namesrv) as producer:
        queues = await producer.queues("BenchLatency")

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                q = queues[i % len(queues)]
                if batch == 1:
                    ok = (await producer.send(Message("BenchLatency", b"x" * 100), queue=q)).ok
                else:
                    sent = await producer.send_batch([Message("BenchLatency", b"x" * 100)] * batch, queue=q)
                    ok = all(r.ok for r in sent)
            except Exception:  # a timeout: counted as the longest latency there is
                lat.append(float("inf"))
                return
            lat.append((time.perf_counter() - t0) * 1000 if ok else float("inf"))

        for i in range(200):  # warm up the route and the connections
            await one(i)
        lat.clear()
        loop = asyncio.get_running_loop()
        start = loop.time()
        sends_per_s = rate / batch
        total = int(sends_per_s * seconds)
        for i in range(total):
            due = start + i / sends_per_s
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    return sorted(lat)


def bench_latency(rounds: int, conf: dict[str, str], rate: int, seconds: float, batch: int) -> None:
    got: dict[str, list[tuple[float, float]]] = {"single": [], "replicated": []}
    for r in range(rounds):
        for setup, replicas in (("single", 0), ("replicated", 1)):
            with group(conf, replicas) as g:
                lat = asyncio.run(_paced_sends(g.namesrv, rate, seconds, batch))
            p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
            got[setup].append((p50, p99))
            report(part="latency", round=r, setup=setup, rate=rate, batch=batch, sends=len(lat), p50_ms=round(p50, 3),
                   p99_ms=round(p99, 3), max_ms=round(lat[-1], 3))
    added = [rep[1] - one[1] for rep, one in zip(got["replicated"], got["single"], strict=True)]
    report(summary="latency", rate=rate, batch=batch, added_p99_ms_by_round=[round(x, 3) for x in added],
           median_added_p99_ms=round(statistics.median(added), 3))


def bench_catchup(rounds: int, conf: dict[str, str], gib: float) -> None:
    for r in range(rounds):
        with group(conf, 0) as g:
            size, batch = 4096, 32
            count = int(gib * (1 << 30)) // size
            produce_tool(g.namesrv, count, size, batch, 4)
            elapsed, nbytes = asyncio.run(_time_catchup(g))
        report(part="catchup", round=r, bytes=nbytes, seconds=round(elapsed, 3),
               mb_per_s=round(nbytes / elapsed / 1e6, 1))


async def _time_catchup(g: Group) -> tuple[float, int]:
    client = RemotingClient()
    try:
        master = g.brokers[0][1]
        end = int((await ha_status(client, master))["maxOffset"])
        t0 = time.monotonic()
        replica = g.broker(1)  # starts from empty; the clock runs from its launch
        while True:
            try:
                if int((await ha_status(client, replica))["maxOffset"]) >= end:
                    return time.monotonic() - t0, end
            except Exception:
                pass
            await asyncio.sleep(0.02)
    finally:
        await client.close()


def bench_failover(rounds: int, conf: dict[str, str]) -> None:
    times = []
    for r in range(rounds):
        with group(conf, 1) as g:
            elapsed = asyncio.run(_time_failover(g))
        times.append(elapsed)
        report(part="failover", round=r, kill_to_first_ack_s=round(elapsed, 3))
    report(summary="failover", seconds=[round(t, 3) for t in times], median=round(statistics.median(times), 3),
           max=round(max(times), 3))


async def _time_failover(g: Group) -> float:
    client = RemotingClient()
    master_proc, master = g.brokers[0]
    replica = g.brokers[1][1]
    from tests.broker.conftest import send_request

    try:
        for i in range(100):
            reply = await client.invoke(master, send_request("BenchFailover", f"m{i}".encode()), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
        epoch = int((await ha_status(client, replica))["epoch"])
        t0 = time.monotonic()
        master_proc.kill()
        promote = make_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                               {"masterEpoch": str(epoch + 1), "toThisBroker": "true"})
        reply = await client.invoke(replica, promote, 10)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        while True:
            reply = await client.invoke(replica, send_request("BenchFailover", b"after"), 5)
            if reply.code == ResponseCode.SUCCESS:
                return time.monotonic() - t0
            await asyncio.sleep(0.01)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["produce", "latency", "catchup", "failover", "all"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=300_000, help="produce: messages per run")
    parser.add_argument("--rate", type=int, default=10_000, help="latency: sends per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: how long")
    parser.add_argument("--batch", type=int, default=1, help="latency: messages per send")
    parser.add_argument("--gib", type=float, default=1.0, help="catchup: backlog size")
    parser.add_argument("--defaults", action="store_true", help="RocketMQ's HA timings instead of the fast ones")
    parser.add_argument("--sync-flush", action="store_true", help="flushDiskType=SYNC_FLUSH on every broker")
    args = parser.parse_args()
    conf = {} if args.defaults else dict(FAST)
    if args.sync_flush:
        conf["flushDiskType"] = "SYNC_FLUSH"
    report(bench="machine", cpus=os.cpu_count(), python=sys.version.split()[0], conf=conf)
    parts = ["produce", "latency", "catchup", "failover"] if args.part == "all" else [args.part]
    if "produce" in parts:
        bench_produce(args.rounds, conf, args.count)
    if "latency" in parts:
        bench_latency(args.rounds, conf, args.rate, args.seconds, args.batch)
    if "catchup" in parts:
        bench_catchup(args.rounds, conf, args.gib)
    if "failover" in parts:
        bench_failover(args.rounds, conf)


if __name__ == "__main__":
    main()
