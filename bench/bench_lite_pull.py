"""Consume a backlog with the lite-pull consumer: client and broker in separate processes.

    .venv/bin/python bench/bench_lite_pull.py                         # 1M messages, stock broker limits
    .venv/bin/python bench/bench_lite_pull.py --max-transfer-count 1024 --max-transfer-bytes 1048576
    .venv/bin/python bench/bench_lite_pull.py --messages 200000 --queues 4 --profile out.txt

Starts ``python -m cometmq.cli serve`` on free 127.0.0.1 ports with a temporary data folder (and, when the
``--max-transfer-*`` options are given, a broker.conf setting ``maxTransferCountOnMessageInMemory`` /
``maxTransferBytesOnMessageInMemory``), creates a topic with ``--queues`` queues, produces ``--messages``
100-byte messages with ``Producer.send_batch``, then times a ``LitePullConsumer`` (consume_from="first")
polling all of them back (each message's body is touched). Prints one JSON object with the results.
``--profile FILE`` runs py-spy (if installed) on the consumer phase of this process and writes its top
functions to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cometmq.client import Message, Producer  # noqa: E402
from cometmq.client.admin import Admin  # noqa: E402
from cometmq.client.lite_pull_consumer import LitePullConsumer  # noqa: E402
from cometmq.net.loop import run  # noqa: E402


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), 0.0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Server:
    def __init__(self, data: Path, conf: dict[str, str]) -> None:
        self.ns_port, self.broker_port = free_port(), free_port()
        args = [sys.executable, "-m", "cometmq.cli", "serve", "--data", str(data), "--namesrv-port",
                str(self.ns_port), "--broker-port", str(self.broker_port), "--log-level", "WARNING"]
        if conf:
            path = data.parent / "broker.conf"
            path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
            args += ["-c", str(path)]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        for line in self.proc.stdout:
            if "cometmq serving" in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in 30 s")
        else:
            raise RuntimeError(f"the server exited with {self.proc.wait()}")

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def produce(namesrv: str, topic: str, total: int, queues: int, body_size: int) -> dict[str, Any]:
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(topic, read_queues=queues)
    body = b"x" * body_size
    per_batch = 2000
    t0 = time.perf_counter()
    sent = 0
    async with Producer("bench-producer", namesrv=namesrv, max_batch_bytes=512 * 1024) as p:
        qs = await p.queues(topic)
        sem = asyncio.Semaphore(4)

        async def one(i: int, n: int) -> None:
            nonlocal sent
            async with sem:
                res = await p.send_batch([Message(topic, body) for _ in range(n)], queue=qs[i % len(qs)])
                sent += len(res)

        jobs = []
        i = 0
        left = total
        while left > 0:
            n = min(per_batch, left)
            jobs.append(one(i, n))
            left -= n
            i += 1
        await asyncio.gather(*jobs)
    dt = time.perf_counter() - t0
    return {"produced": sent, "produce_s": round(dt, 3), "produce_msg_s": round(sent / dt)}


async def consume(namesrv: str, topic: str, total: int, batch: int, poll_max: int, server_pid: int
                  ) -> dict[str, Any]:
    got = 0
    nbytes = 0
    polls = 0
    async with LitePullConsumer("bench-lite", namesrv=namesrv, consume_from="first", pull_batch_size=batch,
                                auto_commit=True, pull_threshold_for_all=max(10_000, 8 * batch),
                                pull_threshold_for_queue=max(1_000, 2 * batch)) as c:
        await c.subscribe(topic)
        b0, c0 = cpu_of(server_pid), own_cpu()
        t0 = time.perf_counter()
        first = None
        while got < total:
            msgs = await c.poll(10.0, poll_max)
            if not msgs:
                raise RuntimeError(f"no message for 10 s after {got}")
            if first is None:
                first = time.perf_counter()
            polls += 1
            got += len(msgs)
            for m in msgs:
                nbytes += len(m.body)
        dt = time.perf_counter() - t0
        b1, c1 = cpu_of(server_pid), own_cpu()
    return {"consumed": got, "body_bytes": nbytes, "consume_s": round(dt, 3), "consume_msg_s": round(got / dt),
            "first_message_ms": round(((first or t0) - t0) * 1000, 1), "polls": polls,
            "msgs_per_poll": round(got / max(polls, 1), 1), "client_cpu_s": round(c1 - c0, 2),
            "broker_cpu_s": round(b1 - b0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=1024, help="the consumer's pull_batch_size")
    ap.add_argument("--poll-max", type=int, default=1024, help="max_messages of each poll")
    ap.add_argument("--max-transfer-count", type=int, default=None,
                    help="broker maxTransferCountOnMessageInMemory (stock: 32)")
    ap.add_argument("--max-transfer-bytes", type=int, default=None,
                    help="broker maxTransferBytesOnMessageInMemory (stock: 262144)")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy top functions of the consumer phase")
    args = ap.parse_args()

    conf: dict[str, str] = {}
    if args.max_transfer_count is not None:
        conf["maxTransferCountOnMessageInMemory"] = str(args.max_transfer_count)
    if args.max_transfer_bytes is not None:
        conf["maxTransferBytesOnMessageInMemory"] = str(args.max_transfer_bytes)
    tmp = Path(tempfile.mkdtemp(prefix="cometmq-bench-lite-"))
    server = Server(tmp / "data", conf)
    topic = "BenchLite"
    try:
        log(f"server pid {server.proc.pid}, namesrv {server.namesrv}; producing {args.messages} messages")
        res: dict[str, Any] = {"bench": "lite_pull_consume", "python": platform.python_version(),
                               "cpus": os.cpu_count(), "messages": args.messages, "queues": args.queues,
                               "body_size": args.body_size, "pull_batch_size": args.batch_size,
                               "poll_max": args.poll_max,
                               "broker_max_transfer_count": args.max_transfer_count or 32,
                               "broker_max_transfer_bytes": args.max_transfer_bytes or 262144}
        res.update(run(produce(server.namesrv, topic, args.messages, args.queues, args.body_size)))
        log(f"produced at {res['produce_msg_s']} msg/s; consuming")
        spy = None
        if args.profile is not None and shutil.which("py-spy"):
            spy = subprocess.Popen(["py-spy", "record", "-p", str(os.getpid()), "-r", "200", "-f", "raw", "-o",
                                    str(args.profile.with_suffix(".raw"))], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            bspy = subprocess.Popen(["py-spy", "record", "-p", str(server.proc.pid), "-r", "200", "-f", "raw", "-o",
                                     str(args.profile.with_suffix(".broker.raw"))], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        res.update(run(consume(server.namesrv, topic, args.messages, args.batch_size, args.poll_max,
                               server.proc.pid)))
        if spy is not None:
            for p in (spy, bspy):
                p.send_signal(signal.SIGINT)
                p.wait(30)
        print(json.dumps(res), flush=True)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
