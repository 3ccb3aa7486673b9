"""kill -9 of a broker (a real subprocess) while timer messages are being indexed and while they are
being delivered: after a restart every acknowledged message is delivered, exactly once, and no later
than the restart allows."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import MessageRecord, decode_record
from cometmq.protocol.remoting import make_request
from cometmq.store.message_store import MessageStore
from cometmq.timer.message import TIMER_OUT_MS
from tests.broker.conftest import StartBroker, send_request
from tests.kit import eventually

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "TK"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def spawn(path: Path) -> tuple[asyncio.subprocess.Process, str]:
    errlog = open(path.parent / f"{path.name}.stderr", "ab")  # noqa: SIM115 - handed to the child
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.timer.broker_proc", str(path),
                                                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=errlog)
    errlog.close()
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"READY "), line
    return proc, line.split()[1].decode()


def kill9(proc: asyncio.subprocess.Process) -> None:
    os.kill(proc.pid, signal.SIGKILL)


def delivered(store: MessageStore, topic: str = TOPIC) -> list[MessageRecord]:
    out: list[MessageRecord] = []
    off = 0
    while True:
        r = store.get_messages(topic, 0, off, 4096, max_bytes=64 << 20)
        if not r.buffers:
            return out
        out.extend(decode_record(v)[0] for v in r.buffers)
        off = r.next_begin_offset


async def send_batches(client: RemotingClient, addr: str, batches: list[list[tuple[str, int]]],
                       acked: set[str], concurrency: int = 8) -> None:
    queue = list(batches)

    async def worker() -> None:
        while queue:
            batch = queue.pop(0)
            body = encode_batch([(k.encode(), {"UNIQ_KEY": k, "TIMER_DELIVER_MS": str(due)}, 0) for k, due in batch])
            try:
                r = await client.invoke(addr, send_request(TOPIC, body, 0, batch="1"), timeout=5)
            except Exception:
                return  # the broker was killed
            if r.code == ResponseCode.SUCCESS:
                acked.update(k for k, _ in batch)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def max_offset(client: RemotingClient, addr: str) -> int:
    r = await client.invoke(addr, make_request(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0}))
    return int(r.ext_fields.get("offset", "0")) if r.code == ResponseCode.SUCCESS else 0


def check(records: list[MessageRecord], acked: set[str], ready_ms: int, slack_ms: int = 1500) -> None:
    keys = Counter(r.properties["UNIQ_KEY"] for r in records)
    assert not acked - set(keys), f"{len(acked - set(keys))} acknowledged messages never delivered"
    dup = [k for k, c in keys.items() if c > 1]
    assert not dup, f"{len(dup)} messages delivered twice, e.g. {dup[:3]}"
    for r in records:
        due = int(r.properties[TIMER_OUT_MS])
        assert r.store_timestamp >= due, "delivered early"
        assert r.store_timestamp <= max(due, ready_ms) + slack_ms, (due, ready_ms, r.store_timestamp)


async def test_kill_during_enqueue(tmp_path: Path, start_broker: StartBroker, client: RemotingClient) -> None:
    path = tmp_path / "enq"
    proc, addr = await spawn(path)
    base = now_ms() + 4000
    batches = [[(f"E{b}-{i}", base + (b * 100 + i) % 1500) for i in range(100)] for b in range(200)]
    acked: set[str] = set()
    sender = asyncio.create_task(send_batches(client, addr, batches, acked))
    await eventually(lambda: len(acked) >= 5000, 20, what="5000 acknowledged sends", step=0.002)
    kill9(proc)
    await proc.wait()
    await sender
    assert 5000 <= len(acked) < 20_000
    b = await start_broker(path)
    ready = now_ms()
    await eventually(lambda: b.store.max_offset(TOPIC, 0) >= len(acked), 20,
                     what="every acknowledged message delivered", step=0.05)
    await asyncio.sleep(0.5)
    check(delivered(b.store), acked, ready)
    assert b.timer.service is not None and b.timer.service.recovered_abnormally


async def test_kill_during_dequeue(tmp_path: Path, start_broker: StartBroker, client: RemotingClient) -> None:
    path = tmp_path / "deq"
    proc, addr = await spawn(path)
    base = now_ms() + 3000
    n = 20_000
    batches = [[(f"D{b}-{i}", base + (b * 200 + i) * 2000 // n) for i in range(200)] for b in range(n // 200)]
    acked: set[str] = set()
    await send_batches(client, addr, batches, acked)
    assert len(acked) == n
    assert now_ms() < base, "sending took longer than the lead time"
    seen = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        seen = await max_offset(client, addr)
        if seen >= n // 4:
            break
        await asyncio.sleep(0.005)
    kill9(proc)
    await proc.wait()
    assert 0 < seen < n, seen
    b = await start_broker(path)
    ready = now_ms()
    await eventually(lambda: b.store.max_offset(TOPIC, 0) >= n, 20, what="every message delivered", step=0.05)
    await asyncio.sleep(0.5)
    records = delivered(b.store)
    check(records, acked, ready)
    assert len(records) == n
