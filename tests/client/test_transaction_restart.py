"""Transactions survive a broker restart — clean (SIGTERM) and kill -9 — of a real ``cometmq serve`` process:
a pending half is still checked and committed afterwards, and nothing committed is delivered twice."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cometmq.broker.transaction.progress import RENEW_LAG
from cometmq.client import (
    LitePullConsumer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionClientInstance,
    TransactionProducer,
)
from tests.interop.cometmq_server import CometServer
from tests.kit import eventually

S = LocalTransactionState


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CometServer]:
    srv = CometServer(tmp_path / "serve", {"transactionTimeOut": "1000", "transactionCheckInterval": "500",
                                           "transactionCheckMax": "30"})
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


async def consume_all(namesrv: str, topic: str, want: int, settle: float = 2.0) -> list[MessageExt]:
    consumer = LitePullConsumer("cg-restart", namesrv=namesrv, consume_from="first")
    await consumer.start()
    await consumer.subscribe(topic)
    got: list[MessageExt] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < want:
                got += await consumer.poll(timeout=0.3)
        got += await consumer.poll(timeout=settle)
    finally:
        await consumer.close()
    return got


@pytest.mark.parametrize("hard", [True, False], ids=["kill-9", "clean"])
async def test_pending_half_is_checked_after_a_restart(server: CometServer, hard: bool) -> None:
    await asyncio.to_thread(server.create_topic, "TxRestart", 2)
    decided = asyncio.Event()
    asked: list[str] = []

    def checker(msg: MessageExt) -> LocalTransactionState:
        asked.append(msg.msg_id)
        return S.COMMIT if decided.is_set() else S.UNKNOW

    instance = TransactionClientInstance(server.namesrv, heartbeat_interval=0.5)
    async with TransactionProducer("tx-restart", instance=instance, checker=checker) as p:
        before = await p.send_in_transaction(Message("TxRestart", b"committed-before"), lambda m, a: S.COMMIT)
        pending = await p.send_in_transaction(Message("TxRestart", b"pending"), lambda m, a: S.UNKNOW)
        # checked (and answered UNKNOW) at least once before the restart
        await eventually(lambda: bool(asked), 30, what="a check-back before the restart", step=0.05)
        await asyncio.to_thread(server.restart, hard=hard)
        asked.clear()
        decided.set()
        async with asyncio.timeout(60):
            while p.checks_answered[S.COMMIT] == 0:
                await asyncio.sleep(0.05)
        assert set(asked) == {pending.msg_id}
    got = await consume_all(server.namesrv, "TxRestart", 2)
    assert sorted((m.body, m.msg_id) for m in got) == sorted(
        [(b"committed-before", before.msg_id), (b"pending", pending.msg_id)])
    log = server.all_logs()
    assert "transactions: 1 unresolved" in log


async def test_a_long_immune_half_is_checked_on_time_after_a_kill_and_restart_reads_little(
        server: CometServer) -> None:
    """A half immune from checks for 15 s, then 10,000 transactions: the broker renews the half (re-appends it) so
    its restart progress moves past it. SIGKILL: the restarted broker reads at most about RENEW_LAG half records
    (before: all 10,001, and their op records, whatever the immunity), still checks the half when its immunity
    ends (not before), and the commit of that check delivers it once, without the broker's property, and every
    committed message once."""
    await asyncio.to_thread(server.create_topic, "TxPinKill", 1)
    asked: list[tuple[int, MessageExt]] = []

    def checker(msg: MessageExt) -> LocalTransactionState:
        asked.append((int(time.time() * 1000), msg))
        return S.COMMIT

    progress_file = server.data_dir / "config" / "transactionProgress.json"

    def half_progress() -> int:
        return int(json.loads(progress_file.read_bytes())["halfOffset"]) if progress_file.exists() else 0

    instance = TransactionClientInstance(server.namesrv, heartbeat_interval=0.5)
    async with TransactionProducer("tx-pin", instance=instance, checker=checker) as p:
        sent_at = int(time.time() * 1000)
        immune = await p.send_half(Message("TxPinKill", b"immune",
                                           properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "15"}))
        for k in range(10):
            results = await p.send_half_batch([Message("TxPinKill", b"m%d" % (k * 1000 + i)) for i in range(1000)])
            assert all(o.ok for o in await p.end_transactions([(r, S.COMMIT) for r in results]))
        await eventually(lambda: half_progress() >= 10_001 - RENEW_LAG, 20,
                         what="the restart progress past the immune half", step=0.1)
        assert not asked  # (still immune)
        await asyncio.to_thread(server.restart, hard=True)
        loaded = [line for line in server.log_text().splitlines() if "unresolved after reading" in line]
        assert len(loaded) == 1 and "transactions: 1 unresolved" in loaded[0], loaded
        assert int(loaded[0].split("after reading ")[1].split()[0]) <= RENEW_LAG + 4, loaded[0]
        await eventually(lambda: bool(asked), 40, what="the immune half's check", step=0.05)
        async with asyncio.timeout(30):
            while p.checks_answered[S.COMMIT] == 0:
                await asyncio.sleep(0.05)
    checked_at, msg = asked[0]
    assert msg.msg_id == immune.msg_id and checked_at >= sent_at + 15_000
    got = await consume_all(server.namesrv, "TxPinKill", 10_001)
    assert len(got) == 10_001 and len({m.msg_id for m in got}) == 10_001
    [delivered] = [m for m in got if m.body == b"immune"]
    assert delivered.msg_id == immune.msg_id and "TRAN_CHECK_FROM_MS" not in delivered.properties
