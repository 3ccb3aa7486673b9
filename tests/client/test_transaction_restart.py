"""Transactions survive a broker restart — clean (SIGTERM) and kill -9 — of a real ``cometmq serve`` process:
a pending half is still checked and committed afterwards, and nothing committed is delivered twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

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
