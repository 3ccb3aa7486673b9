"""Hostile clients (issue [15]): a broker keeps serving a producer and a consumer while 10,000 idle connections
and 100 connections sending malformed frames are attached to it; its RSS and the good clients' throughput are
reported against a quiet baseline.

    .venv/bin/python bench/bench_hostile.py                       # 10,000 idle + 100 hostile, 10 s per phase
    .venv/bin/python bench/bench_hostile.py --idle 2000 --seconds 5   # a smoke run

The broker runs in its own process (its RSS is read from /proc), on 127.0.0.1 and a free port, with its default
limits except ``serverMaxConnectionsPerIp`` (every connection here comes from 127.0.0.1, so the per-IP cap, 2048 by
default, is raised to fit the idle ones; the total cap, 16384, stays). The 100 hostile connections are:

- 60 "garbage": connect, send a frame whose length or header is malformed (random choice), get closed, reconnect;
- 20 "stallers": announce a 16 MiB frame, send 15 MiB and stop (the issue's memory attack). 20 x 15 MiB is more
  than the 256 MiB budget for incomplete frames, so the oldest are closed; the rest close at the 30 s read
  timeout (after the run, unless ``--seconds`` > 30); they reconnect and stall again.
- 20 "slow readers": send pull requests for a full queue and never read the replies (the write hard cap).

Phases: quiet (producer + consumer only), then hostile (the same, plus all the above). The good clients are one
producer sending 1 KiB messages with 32 requests in flight and one consumer pulling 32 at a time from the same
queues, both over cometmq's RemotingClient.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cometmq.net.client import RemotingClient  # noqa: E402
from cometmq.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from cometmq.protocol.message import iter_records  # noqa: E402
from cometmq.protocol.remoting import encode, make_request  # noqa: E402

TOPIC = "HostileBench"
QUEUES = 4
BODY = b"m" * 1024

BROKER_SCRIPT = r"""
import asyncio, resource, sys
from pathlib import Path
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController

async def main() -> None:
    cfg = BrokerConfig(listen_port=0, server_max_connections_per_ip=int(sys.argv[2]), stats_log_interval_s=0)
    cfg = cfg.replace(store=cfg.store.replace(store_path=Path(sys.argv[1]), commitlog_segment_size=256 << 20,
                                              warm_ahead_bytes=0))
    b = BrokerController(cfg)
    await b.start()
    print(b.server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def send_request(topic: str, qid: int) -> object:
    return make_request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": QUEUES,
        "queueId": qid, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
        "reconsumeTimes": 0, "unitMode": False, "batch": False}, BODY)


def pull_request(topic: str, qid: int, offset: int, n: int = 32) -> object:
    return make_request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": topic, "queueId": qid, "queueOffset": str(offset), "maxMsgNums": n,
        "sysFlag": 6, "commitOffset": "0", "subVersion": "0", "suspendTimeoutMillis": "1000", "subscription": "*"})


class Good:
    """One producer and one consumer; counts what each did in the current window."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.sent = self.received = self.errors = 0
        self.latencies: list[float] = []
        self.offsets = [0] * QUEUES

    async def produce(self, client: RemotingClient, stop: asyncio.Event) -> None:
        async def worker(i: int) -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = await client.invoke(self.addr, send_request(TOPIC, i % QUEUES), timeout=5)  # type: ignore[arg-type]
                except Exception:
                    self.errors += 1
                    continue
                self.latencies.append(time.perf_counter() - t0)
                if r.code == ResponseCode.SUCCESS:
                    self.sent += 1
                else:
                    self.errors += 1
        await asyncio.gather(*(worker(i) for i in range(32)))

    async def consume(self, client: RemotingClient, stop: asyncio.Event) -> None:
        async def worker(qid: int) -> None:
            while not stop.is_set():
                try:
                    r = await client.invoke(self.addr, pull_request(TOPIC, qid, self.offsets[qid]), timeout=5)  # type: ignore[arg-type]
                except Exception:
                    self.errors += 1
                    continue
                if r.code == ResponseCode.SUCCESS:
                    n = sum(1 for _ in iter_records(r.body))
                    self.received += n
                    self.offsets[qid] = int(r.ext_fields["nextBeginOffset"])
                elif r.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                    self.offsets[qid] = int(r.ext_fields.get("nextBeginOffset", self.offsets[qid]))
                elif r.code == ResponseCode.PULL_OFFSET_MOVED:
                    self.offsets[qid] = int(r.ext_fields["nextBeginOffset"])
        await asyncio.gather(*(worker(q) for q in range(QUEUES)))

    def window(self) -> dict[str, float]:
        lat = sorted(self.latencies)
        out = {"sent": self.sent, "received": self.received, "errors": self.errors,
               "send_p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else 0.0,
               "send_p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else 0.0}
        self.sent = self.received = self.errors = 0
        self.latencies = []
        return out


async def run_phase(good: Good, seconds: float, pid: int) -> dict[str, float]:
    stop = asyncio.Event()
    peak = 0.0
    async with RemotingClient() as pc, RemotingClient() as cc:
        tasks = [asyncio.create_task(good.produce(pc, stop)), asyncio.create_task(good.consume(cc, stop))]
        await asyncio.sleep(1.0)  # warm-up, not counted
        good.window()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await asyncio.sleep(0.5)
            peak = max(peak, rss_mib(pid))
        elapsed = time.perf_counter() - t0
        stats = good.window()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"send_per_s": round(stats["sent"] / elapsed), "receive_per_s": round(stats["received"] / elapsed),
            "errors": stats["errors"], "send_p50_ms": stats["send_p50_ms"], "send_p99_ms": stats["send_p99_ms"],
            "rss_peak_mib": round(peak, 1), "rss_end_mib": round(rss_mib(pid), 1)}


def open_idle(port: int, count: int) -> list[socket.socket]:
    socks: list[socket.socket] = []
    for i in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        socks.append(s)
        if i % 500 == 499:
            time.sleep(0.05)  # let the broker's accept loop keep up with the 1024 backlog
    return socks


def garbage_frame() -> bytes:
    kind = random.randrange(4)
    if kind == 0:
        return b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"  # a length past the frame limit
    if kind == 1:
        return struct.pack(">II", 10, 0xFF) + b"{}garbage"  # header length beyond the frame
    if kind == 2:
        return struct.pack(">II", 8, 4) + b"\xff\xfe{}"  # header that is not JSON
    return os.urandom(64)


async def hostile(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    async def garbage() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(garbage_frame())
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(reader.read(), 2)
                writer.close()
                counts["garbage"] += 1
            except OSError:
                await asyncio.sleep(0.05)

    async def staller() -> None:
        chunk = b"\x00" * (1 << 20)
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(struct.pack(">I", 16 * 1024 * 1024 - 4))
                for _ in range(15):
                    writer.write(chunk)
                    await writer.drain()
                counts["stalled"] += 1
                with contextlib.suppress(Exception):
                    while await reader.read(65536):  # until the broker closes it
                        pass
                writer.close()
            except OSError:
                await asyncio.sleep(0.05)

    async def slow_reader() -> None:
        while not stop.is_set():
            try:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                reqs = b"".join(encode(pull_request(TOPIC, q % QUEUES, 0, 32)) for q in range(400))  # type: ignore[arg-type]
                await asyncio.get_running_loop().sock_sendall(sock, reqs)
                counts["slow"] += 1
                while not stop.is_set():  # never read; find out when the broker hangs up
                    await asyncio.sleep(0.5)
                    try:
                        sock.send(b"")
                        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            break
                    except OSError:
                        break
                sock.close()
            except OSError:
                await asyncio.sleep(0.05)

    await asyncio.gather(*(garbage() for _ in range(60)), *(staller() for _ in range(20)),
                         *(slow_reader() for _ in range(20)))


async def attack_process(port: int, idle_count: int) -> None:
    """The attackers' own process (so they do not share the good clients' event loop): opens the idle
    connections, says "ready", attacks until its stdin closes, then prints what it did as JSON."""
    t0 = time.perf_counter()
    idle = await asyncio.to_thread(open_idle, port, idle_count)
    print(json.dumps({"idle_open_s": round(time.perf_counter() - t0, 1)}), flush=True)
    stop = asyncio.Event()
    counts = {"garbage": 0, "stalled": 0, "slow": 0}
    attack = asyncio.create_task(hostile(port, stop, counts))
    await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin
    stop.set()
    attack.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await attack
    alive = 0
    for s in idle:
        s.setblocking(False)
        try:
            alive += 1 if s.recv(1) else 0
        except BlockingIOError:
            alive += 1  # still open: nothing to read, no EOF
        except OSError:
            pass
        s.close()
    print(json.dumps({"idle_still_open": alive, "malformed_connections": counts["garbage"],
                      "stalled_frames": counts["stalled"], "slow_readers": counts["slow"]}), flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--attack-port", type=int, default=0, help=argparse.SUPPRESS)  # the attackers' process
    args = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.idle + 500:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is below {args.idle + 500}")
    if args.attack_port:
        await attack_process(args.attack_port, args.idle)
        return
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        proc = subprocess.Popen([sys.executable, "-c", BROKER_SCRIPT, tmp, str(args.idle + 1000)],
                                stdout=subprocess.PIPE, env=env, text=True)
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            addr = f"127.0.0.1:{port}"
            good = Good(addr)
            rss_start = rss_mib(proc.pid)
            quiet = await run_phase(good, args.seconds, proc.pid)
            print(json.dumps({"phase": "quiet", **quiet}), flush=True)
            attacker = subprocess.Popen([sys.executable, __file__, "--attack-port", str(port), "--idle",
                                         str(args.idle)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert attacker.stdout is not None and attacker.stdin is not None
            opened = json.loads(attacker.stdout.readline())  # the idle connections are open, the attack begins
            rss_idle = rss_mib(proc.pid)
            await asyncio.sleep(2.0)
            loud = await run_phase(good, args.seconds, proc.pid)
            attacker.stdin.close()
            done = json.loads(attacker.stdout.readline())
            attacker.wait(30)
            print(json.dumps({"phase": "hostile", "idle_connections": args.idle, **opened,
                              "rss_start_mib": round(rss_start, 1), "rss_with_idle_mib": round(rss_idle, 1), **loud,
                              **done}), flush=True)
            q, h = quiet, loud
            print(f"summary: send {h['send_per_s']}/s vs quiet {q['send_per_s']}/s "
                  f"({100 * h['send_per_s'] / max(q['send_per_s'], 1):.0f}%), receive {h['receive_per_s']}/s vs "
                  f"{q['receive_per_s']}/s; broker RSS {rss_start:.0f} MiB at start, {rss_idle:.0f} MiB with "
                  f"{args.idle} idle connections, peak {h['rss_peak_mib']:.0f} MiB under attack")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    asyncio.run(main())
