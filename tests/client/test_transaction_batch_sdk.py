"""TransactionProducer's batches (cometmq's half batch and END_TRANSACTION_BATCH) against real brokers: an
in-process cluster, and a ``cometmq serve`` process killed -9 between the halves and their commit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cometmq.client import LocalTransactionState, Message, MessageExt, TransactionClientInstance, TransactionProducer
from cometmq.client.errors import InvalidArgumentError, MQClientError
from cometmq.protocol.codes import ResponseCode
from tests.interop.cometmq_server import CometServer
from tests.kit import eventually

from .conftest import Cluster
from .test_transaction_producer import FAST, broker, consume, fast_cluster
from .test_transaction_restart import consume_all

__all__ = ["fast_cluster"]  # the fixture, used by name

S = LocalTransactionState


async def test_half_batches_then_a_batched_end(cluster: Cluster) -> None:
    async with TransactionProducer("tx-batch", namesrv=cluster.namesrv_addr, max_batch_bytes=20_000) as p:
        msgs = [Message("TxSdkB", f"m{i}".encode() + b"." * 300, keys=f"k{i}", properties={"n": str(i)})
                for i in range(120)]
        results = await p.send_half_batch(msgs)
        assert len(results) == 120 and all(r.ok for r in results)
        assert len({r.queue.queue_id for r in results}) > 1  # 500-byte rows, 20 kB requests: several requests
        b = broker(cluster)
        assert len(b.transactions.table) == 120 and b.transactions.metrics.prepared == 120
        assert all(b.store.max_offset("TxSdkB", q) == 0 for q in range(4))  # invisible
        decisions = [(r, S.ROLLBACK if i % 10 == 0 else S.COMMIT) for i, r in enumerate(results)]
        outcomes = await p.end_transactions(decisions)
        assert [o.code for o in outcomes] == [0] * 120 and not any(o.already_resolved for o in outcomes)
        got = await consume(cluster, "TxSdkB", 108)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for i, r in enumerate(results) if i % 10)
        m = next(m for m in got if m.msg_id == results[1].msg_id)
        assert m.keys == ["k1"] and m.properties["n"] == "1" and "TRAN_MSG" not in m.properties
        # Told twice: done already; told the opposite: refused, for that half only.
        again = await p.end_transactions([(results[1], S.COMMIT), (results[0], S.COMMIT), (results[2], S.ROLLBACK)])
        assert [o.code for o in again] == [0, ResponseCode.TRANSACTION_FAILED, ResponseCode.TRANSACTION_FAILED]
        assert again[0].already_resolved and "rolled back already" in again[1].remark
        assert len(b.transactions.table) == 0
        with pytest.raises(InvalidArgumentError, match="one topic"):
            await p.send_half_batch([Message("TxSdkB", b"a"), Message("Other", b"b")])
        with pytest.raises(InvalidArgumentError, match="scheduled"):
            await p.send_half_batch([Message("TxSdkB", b"a", delay_level=2)])
        assert await p.send_half_batch([]) == [] and await p.end_transactions([]) == []


async def test_an_undecided_batched_half_is_checked_back(fast_cluster: Cluster) -> None:
    def checker(msg: MessageExt) -> LocalTransactionState:
        return S.COMMIT if msg.body == b"yes" else S.ROLLBACK

    async with TransactionProducer("tx-batch-check", namesrv=fast_cluster.namesrv_addr, checker=checker) as p:
        results = await p.send_half_batch([Message("TxSdkC", b"yes"), Message("TxSdkC", b"no")])
        b = broker(fast_cluster)
        await eventually(lambda: not b.transactions.table, 20, what="both halves checked back", step=0.05)
        assert p.checks_answered[S.COMMIT] == 1 and p.checks_answered[S.ROLLBACK] == 1
    got = await consume(fast_cluster, "TxSdkC", 1)
    assert [m.msg_id for m in got] == [results[0].msg_id]
    assert FAST["transaction_timeout_ms"] == 200


async def test_batched_halves_survive_kill_9_of_the_broker(tmp_path: Path) -> None:
    server = CometServer(tmp_path / "serve", {"transactionTimeOut": "60000"})
    await asyncio.to_thread(server.start)
    try:
        await asyncio.to_thread(server.create_topic, "TxSdkK", 2)
        instance = TransactionClientInstance(server.namesrv, heartbeat_interval=0.5)
        async with TransactionProducer("tx-batch-kill", instance=instance) as p:
            results = await p.send_half_batch([Message("TxSdkK", f"r{i}".encode()) for i in range(20)])
            await asyncio.to_thread(server.restart, hard=True)
            outcomes: list[object] = []
            async with asyncio.timeout(60):
                while not outcomes:
                    try:
                        outcomes = list(await p.end_transactions([(r, S.COMMIT) for r in results]))
                    except MQClientError:  # the client reconnects once the broker is back
                        await asyncio.sleep(0.2)
            assert all(getattr(o, "code", None) == 0 for o in outcomes), outcomes
        got = await consume_all(server.namesrv, "TxSdkK", 20)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)
    finally:
        await asyncio.to_thread(server.close)
