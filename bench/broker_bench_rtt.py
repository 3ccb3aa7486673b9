"""bench_broker.py part 4: per-request cost, a raw asyncio TCP echo vs RemotingClient round trips against the
broker, pinned to one vCPU and to two, with the server CPU per request."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
from broker_bench_common import DRIVER, PY, Broker, HostSampler, _cpu, pin, report
from cpp_bench_client import lat_stats, pct

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.properties import encode_properties
from cometmq.protocol.remoting import FrameDecoder, encode, make_request, make_response

# ------------------------------------------------------------------------------------------------ 4. rtt


class _EchoClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) >= 4:
            n = int.from_bytes(buf[:4], "big")
            if len(buf) >= 4 + n:
                frame = bytes(buf[:4 + n])
                del buf[:4 + n]
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(frame)


def _cpu_fn(ps: psutil.Process) -> Any:
    return lambda: _cpu(ps)


def _max_offset_req() -> Any:
    return make_request(RequestCode.GET_MAX_OFFSET, {"topic": "BenchSend", "queueId": 0})


def _send_req(i: int) -> Any:
    """SEND_MESSAGE as the C++ client sends it: 100 B body, TAGS/UNIQ_KEY/WAIT properties, batch "0"."""
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": f"{os.getpid():08X}{i:024X}", "WAIT": "true"})
    return make_request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_bench_rtt", "topic": "BenchRtt", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": i % 4, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
        "properties": props.decode(), "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}, b"x" * 100)


def _client_codec_us(mk: Any, reply_ext: dict[str, str], reps: int = 5000) -> float:
    """Our client's own codec work per round trip: encode the request + decode the reply (in-process)."""
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        req = mk()
        encode(req)
        FrameDecoder().feed(encode(make_response(req, 0, None, reply_ext)))
    both = (time.perf_counter_ns() - t0) / reps / 1e3
    req = mk()
    t0 = time.perf_counter_ns()
    for _ in range(reps):  # the reply's encoding is the broker's job: subtract it
        encode(make_response(req, 0, None, reply_ext))
    return both - (time.perf_counter_ns() - t0) / reps / 1e3


async def _rtt(broker: Broker, echo_port: int, echo_ps: psutil.Process, n: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds (echo block, GET_MAX_OFFSET block, SEND block) so that noise from other work on the
    machine hits all three alike; per-round medians are kept for a paired comparison."""
    loop = asyncio.get_running_loop()
    frame = (196).to_bytes(4, "big") + b"r" * 196  # 200-byte frame: 4-byte length + 196 payload bytes
    transport, proto = await loop.create_connection(_EchoClient, "127.0.0.1", echo_port)
    sock = transport.get_extra_info("socket")
    nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) if sock is not None else None
    kinds = ("raw_tcp_echo", "get_max_offset", "send_message")
    samples: dict[str, list[int]] = {k: [] for k in kinds}
    round_p50: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, float] = {k: 0.0 for k in kinds}
    per = {"raw_tcp_echo": n // rounds, "get_max_offset": n // rounds, "send_message": n // 2 // rounds}
    seq = 0

    async def echo_once() -> int:
        proto.waiter = loop.create_future()
        t0 = time.perf_counter_ns()
        transport.write(frame)
        await proto.waiter
        return time.perf_counter_ns() - t0

    async with RemotingClient() as cli:
        async def broker_once(kind: str) -> int:
            nonlocal seq
            seq += 1
            req = _max_offset_req() if kind == "get_max_offset" else _send_req(seq)
            t0 = time.perf_counter_ns()
            rep = await cli.invoke(broker.addr, req, 5)
            dt = time.perf_counter_ns() - t0
            if rep.code != 0:
                raise RuntimeError(f"{kind} failed: {rep.code} {rep.remark}")
            return dt

        async def max_once() -> int:
            return await broker_once("get_max_offset")

        async def send_once() -> int:
            return await broker_once("send_message")

        ops: dict[str, Callable[[], Awaitable[int]]] = {
            "raw_tcp_echo": echo_once, "get_max_offset": max_once, "send_message": send_once}
        sizes = {"raw_tcp_echo": 200, "get_max_offset": len(encode(_max_offset_req())),
                 "send_message": len(encode(_send_req(0)))}
        reply_sizes = {"get_max_offset": len(encode(await cli.invoke(broker.addr, _max_offset_req(), 5))),
                       "send_message": len(encode(await cli.invoke(broker.addr, _send_req(0), 5)))}
        for kind in kinds:  # warm-up
            for _ in range(min(500, per[kind])):
                await ops[kind]()
        for _ in range(rounds):
            for kind in kinds:
                op = ops[kind]
                block = []
                server_cpu = _cpu_fn(echo_ps) if kind == "raw_tcp_echo" else broker.cpu
                c0 = server_cpu()
                for _ in range(per[kind]):
                    block.append(await op())
                cpu[kind] += server_cpu() - c0
                samples[kind] += block
                round_p50[kind].append(pct(sorted(block), 0.5) / 1e3)
    transport.close()
    return {"samples": samples, "round_p50": round_p50, "cpu": cpu, "sizes": sizes, "reply_sizes": reply_sizes,
            "nodelay": nodelay}



def bench_rtt(broker: Broker, quick: bool) -> None:
    """Round trips, in two placements: client and server on one CPU (a wake-up is a context switch), and on
    two CPUs (a wake-up crosses CPUs: on this VM that alone costs tens of µs). Unpinned runs land in either,
    which makes raw TCP round trips bimodal (~14 µs vs ~100 µs here)."""
    n = 5000 if quick else 30000
    rounds = 5 if quick else 10
    all_cpus = os.sched_getaffinity(0)
    placements = [("same_cpu", {0}, {0})]
    if len(all_cpus) >= 2:
        a, b = sorted(all_cpus)[:2]
        placements = [("same_cpu", {a}, {a}), ("cross_cpu", {a}, {b})]
    echo = subprocess.Popen([PY, str(DRIVER), "echo-server", "--uvloop"], stdout=subprocess.PIPE, text=True)
    codec = {"get_max_offset": _client_codec_us(_max_offset_req, {"offset": "12345"}),
             "send_message": _client_codec_us(lambda: _send_req(1), {"msgId": "7F00000100002A9F0000000000001234",
                                                                      "queueId": "1", "queueOffset": "42"})}
    try:
        info = json.loads(echo.stdout.readline())  # type: ignore[union-attr]
        from cometmq.net.loop import run

        for placement, client_cpus, server_cpus in placements:
            os.sched_setaffinity(0, client_cpus)  # this (main) thread runs the client loop
            pin(broker.pid, server_cpus)
            pin(echo.pid, server_cpus)
            try:
                with HostSampler(broker, 0.1) as hs:
                    res = run(_rtt(broker, info["port"], psutil.Process(echo.pid), n, rounds))
                res["host_busy_cpus"] = hs.mean_host()
            finally:
                os.sched_setaffinity(0, all_cpus)
                pin(broker.pid, all_cpus)
            _report_rtt(res, placement, rounds, codec)
    finally:
        os.kill(echo.pid, signal.SIGTERM)
        echo.wait(10)


def _report_rtt(res: dict[str, Any], placement: str, rounds: int, codec: dict[str, float]) -> None:
    raw_rounds = res["round_p50"]["raw_tcp_echo"]
    raw_cpu = res["cpu"]["raw_tcp_echo"] / len(res["samples"]["raw_tcp_echo"]) * 1e6
    for kind, samples in res["samples"].items():
        row: dict[str, Any] = {"what": kind, "placement": placement, "round_trips": len(samples), "rounds": rounds,
                               "request_bytes": res["sizes"][kind], **lat_stats(samples)}
        if kind == "raw_tcp_echo":
            row["client_nodelay"] = res["nodelay"]
            row["loop"] = "uvloop both sides (as the broker)"
            row["server_cpu_us_per_req"] = round(raw_cpu, 1)
            row["host_busy_cpus"] = res.get("host_busy_cpus")  # includes this client and the servers (~1)
        else:
            diffs = sorted(b - r for b, r in zip(res["round_p50"][kind], raw_rounds, strict=True))
            row.update({
                "reply_bytes": res["reply_sizes"][kind],
                "added_vs_raw_us_p50": round(row["p50"] - pct(sorted(res["samples"]["raw_tcp_echo"]), 0.5) / 1e3, 1),
                "added_vs_raw_us_paired": round(pct(diffs, 0.5), 1),  # median over rounds of (p50 - raw p50)
                "client_codec_us": round(codec[kind], 1),
                "broker_cpu_us_per_req": round(res["cpu"][kind] / len(samples) * 1e6, 1)})
            row["broker_cpu_minus_echo_server_us"] = round(row["broker_cpu_us_per_req"] - raw_cpu, 1)
            row["added_minus_client_codec_us"] = round(row["added_vs_raw_us_paired"] - codec[kind], 1)
        report(bench="rtt", **row)
