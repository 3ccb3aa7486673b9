"""TransactionProducer's batches (cometmq's half batch, packed half and END_TRANSACTION_BATCH) against real brokers: an
in-process cluster, and a ``cometmq serve`` process killed -9 between the halves and their commit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from cometmq.client import LocalTransactionState, Message, MessageExt, TransactionClientInstance, TransactionProducer
from cometmq.client.errors import BrokerError, InvalidArgumentError, MQClientError
from cometmq.client.transaction_producer import EndEntry, EndOutcome
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.msgid import decode_offset_msg_id
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


@contextlib.asynccontextmanager
async def killable(tmp_path: Path, topic: str, group: str) -> AsyncIterator[tuple[CometServer, TransactionProducer]]:
    """``cometmq serve`` with ``topic`` (2 queues) and a started transaction producer of ``group`` on it."""
    server = CometServer(tmp_path / "serve", {"transactionTimeOut": "60000"})
    await asyncio.to_thread(server.start)
    try:
        await asyncio.to_thread(server.create_topic, topic, 2)
        instance = TransactionClientInstance(server.namesrv, heartbeat_interval=0.5)
        async with TransactionProducer(group, instance=instance) as p:
            yield server, p
    finally:
        await asyncio.to_thread(server.close)


async def once_back(call: Callable[[], Awaitable[list[EndOutcome]]]) -> list[EndOutcome]:
    """``call()``'s outcomes once the restarted broker answers (the client reconnects meanwhile)."""
    async with asyncio.timeout(60):
        while True:
            try:
                return list(await call())
            except MQClientError:
                await asyncio.sleep(0.2)


async def test_batched_halves_survive_kill_9_of_the_broker(tmp_path: Path) -> None:
    async with killable(tmp_path, "TxSdkK", "tx-batch-kill") as (server, p):
        results = await p.send_half_batch([Message("TxSdkK", f"r{i}".encode()) for i in range(20)])
        await asyncio.to_thread(server.restart, hard=True)
        outcomes = await once_back(lambda: p.end_transactions([(r, S.COMMIT) for r in results]))
        assert all(o.code == 0 for o in outcomes), outcomes
        got = await consume_all(server.namesrv, "TxSdkK", 20)
        assert sorted(m.msg_id for m in got) == sorted(r.msg_id for r in results)


async def test_packed_halves_commit_their_rows_and_are_checked_back_as_one(fast_cluster: Cluster) -> None:
    """send_packed_half: one half per body (the broker tracks one transaction), its commit delivers each row with
    its own properties; an undecided one is checked back once, with the half's properties, and its answer
    commits or rolls back all its rows."""
    def checker(msg: MessageExt) -> LocalTransactionState:
        return S.COMMIT if msg.properties.get("decide") == "yes" else S.ROLLBACK

    def rows(tag: str, n: int) -> bytes:
        return encode_batch([(f"{tag}{i}".encode(), {"UNIQ_KEY": f"{tag.upper()}{i:04d}", "n": str(i)}, 0)
                             for i in range(n)])

    async with TransactionProducer("tx-packed", namesrv=fast_cluster.namesrv_addr, checker=checker) as p:
        [q] = [q for q in await p.queues("TxSdkP") if q.queue_id == 1]
        b = broker(fast_cluster)
        decided = await p.send_packed_half(q, rows("a", 50), 50, "A0000")
        assert decided.ok and decided.count == 1 and decided.queue == q
        assert len(b.transactions.table) == 1 and b.store.max_offset("TxSdkP", 1) == 0
        entry = EndEntry(decode_offset_msg_id(decided.offset_msg_id).offset, decided.queue_offset, S.COMMIT.value,
                         decided.msg_id)
        [outcome] = await p.end_transaction_batch(q.broker_name, [entry])
        assert outcome.ok, outcome
        got = await consume(fast_cluster, "TxSdkP", 50)
        assert [m.body for m in got] == [f"a{i}".encode() for i in range(50)]
        assert [m.properties["n"] for m in got] == [str(i) for i in range(50)]
        assert [m.msg_id for m in got] == [f"A{i:04d}" for i in range(50)]
        # Left undecided: the broker asks the checker once per half, not once per row.
        await p.send_packed_half(q, rows("y", 3), 3, "Y0000", {"decide": "yes"})
        await p.send_packed_half(q, rows("n", 4), 4, "N0000", {"decide": "no"})
        await eventually(lambda: not b.transactions.table, 20, what="both packed halves checked back", step=0.05)
        assert p.checks_answered[S.COMMIT] == 1 and p.checks_answered[S.ROLLBACK] == 1
        with pytest.raises(BrokerError, match="holds 3 messages, not cometmqPacked=5"):
            await p.send_packed_half(q, rows("z", 3), 5, "Z0000")
    got = await consume(fast_cluster, "TxSdkP", 53, group="cg-tx-2")
    assert sorted(m.body for m in got) == sorted([f"a{i}".encode() for i in range(50)] + [b"y0", b"y1", b"y2"])


async def test_packed_halves_survive_kill_9_of_the_broker(tmp_path: Path) -> None:
    """Packed halves stored, ``cometmq serve`` killed -9, restarted: the halves are pending again (one transaction
    each), and their commit delivers every row once."""
    async with killable(tmp_path, "TxSdkPK", "tx-packed-kill") as (server, p):
        qs = await p.queues("TxSdkPK")
        stored = []
        for k, q in enumerate(qs):
            body = encode_batch([(f"q{k}-{i}".encode(), {"UNIQ_KEY": f"K{k}{i:04d}"}, 0) for i in range(300)])
            stored.append(await p.send_packed_half(q, body, 300, f"K{k}0000"))
        assert all(s.ok for s in stored)
        await asyncio.to_thread(server.restart, hard=True)
        entries = [EndEntry(decode_offset_msg_id(s.offset_msg_id).offset, s.queue_offset, S.COMMIT.value, s.msg_id)
                   for s in stored]
        outcomes = await once_back(lambda: p.end_transaction_batch(qs[0].broker_name, entries))
        assert all(o.ok for o in outcomes), outcomes
        got = await consume_all(server.namesrv, "TxSdkPK", 600)
        assert sorted(m.body for m in got) == sorted(f"q{k}-{i}".encode() for k in range(2) for i in range(300))
