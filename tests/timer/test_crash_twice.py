"""kill -9 of a real broker process twice: once after timer messages were delivered, and again soon after the
restart, before the restarted broker wrote a periodic timer checkpoint. The third start must not deliver again
what the first run delivered. And a kill -9 after a producer sent a message naming a pending timer record."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import ResponseCode
from cometmq.timer.message import TIMER_SRC_PHY
from tests.broker.conftest import StartBroker, props, send_request
from tests.kit import eventually
from tests.timer.test_crash import ROOT, TOPIC, check, delivered, kill9, max_offset, now_ms, send_batches


async def spawn(path: Path, timer_flush_interval_ms: int) -> tuple[asyncio.subprocess.Process, str]:
    errlog = open(path.parent / f"{path.name}.stderr", "ab")  # noqa: SIM115 - handed to the child
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.timer.broker_proc", str(path),
                                                str(timer_flush_interval_ms), cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=errlog)
    errlog.close()
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"READY "), line
    return proc, line.split()[1].decode()


async def test_kill_again_soon_after_a_restart_delivers_nothing_twice(
        tmp_path: Path, start_broker: StartBroker, client: RemotingClient) -> None:
    path = tmp_path / "twice"
    # No periodic timer checkpoint during the test (only the one each start writes).
    proc, addr = await spawn(path, 600_000)
    n = 400
    base = now_ms() + 1500
    batches = [[(f"K{b}-{i}", base + (b * 100 + i) * 500 // n) for i in range(100)] for b in range(n // 100)]
    acked: set[str] = set()
    await send_batches(client, addr, batches, acked)
    assert len(acked) == n
    deadline = asyncio.get_running_loop().time() + 15
    while await max_offset(client, addr) < n:
        assert asyncio.get_running_loop().time() < deadline, "not delivered in time"
        await asyncio.sleep(0.05)
    kill9(proc)  # all delivered; the last timer checkpoint is the one written at start
    await proc.wait()

    proc, addr = await spawn(path, 600_000)  # recovers: replay skips what was delivered
    await asyncio.sleep(1.0)
    assert await max_offset(client, addr) == n, "the first restart delivered again"
    kill9(proc)
    await proc.wait()

    b = await start_broker(path)
    ready = now_ms()
    await asyncio.sleep(2.0)
    records = delivered(b.store)
    check(records, acked, ready)
    assert len(records) == n


async def test_a_producer_message_naming_a_timer_record_does_not_cancel_it(
        tmp_path: Path, start_broker: StartBroker, client: RemotingClient) -> None:
    """TIMER_SRC_PHY tells crash recovery which timer records were already put. A producer's message carrying it
    (a consumed timer message forwarded as it is, from this broker or another) must not make recovery skip the
    timer record at that offset: the broker keeps it only on the copies its timer puts."""
    path = tmp_path / "forged"
    proc, addr = await spawn(path, 600_000)  # no periodic checkpoint: recovery scans from the start's one
    r = await client.invoke(addr, send_request(TOPIC, b"due", 0, props(UNIQ_KEY="DUE", TIMER_DELAY_MS="1500")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    src = int(r.ext_fields["msgId"][-16:], 16)  # the timer record's commit-log offset
    r = await client.invoke(addr, send_request("TFWD", b"fwd", 0, props(UNIQ_KEY="FWD", TIMER_SRC_PHY=str(src))))
    assert r.code == ResponseCode.SUCCESS, r.remark
    kill9(proc)
    await proc.wait()
    b = await start_broker(path)
    await eventually(lambda: b.store.max_offset(TOPIC, 0) == 1, 8, what="the timer message delivered after the restart")
    [rec] = delivered(b.store)
    assert rec.properties["UNIQ_KEY"] == "DUE"
    [fwd] = delivered(b.store, "TFWD")
    assert fwd.properties["UNIQ_KEY"] == "FWD" and TIMER_SRC_PHY not in fwd.properties
