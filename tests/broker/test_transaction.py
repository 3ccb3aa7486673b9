"""Transactional messages over real sockets: halves, END_TRANSACTION, check-back, check-max, restart."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.broker.transaction import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC
from cometmq.broker.transaction import progress as tx_progress
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.client_bodies import HeartbeatData
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import MessageRecord, decode_record, iter_records
from cometmq.protocol.msgid import decode_offset_msg_id, offset_msg_id
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit import eventually

from .conftest import StartBroker, props, pull_request, send_request

GROUP = "txg"


@dataclass
class Producer:
    """A raw remoting producer of GROUP that records the broker's CHECK_TRANSACTION_STATE requests."""

    broker: BrokerController
    client: RemotingClient = field(init=False)
    checks: asyncio.Queue[tuple[RemotingConnection, RemotingCommand]] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.client = RemotingClient({RequestCode.CHECK_TRANSACTION_STATE: self._on_check})

    async def _on_check(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        await self.checks.put((conn, cmd))

    async def heartbeat(self, client_id: str = "tx-client-1") -> None:
        body = HeartbeatData(client_id, (GROUP,)).encode()
        r = await self.client.invoke(self.broker.addr, make_request(RequestCode.HEART_BEAT, {}, body))
        assert r.code == ResponseCode.SUCCESS, r.remark

    async def half(self, topic: str, body: bytes, queue_id: int = 0, uniq: str = "U1", **extra_props: str
                   ) -> RemotingCommand:
        p = props(TAGS="tag-a", KEYS="k1 k2", UNIQ_KEY=uniq, TRAN_MSG="true", PGROUP=GROUP, color="blue",
                  **extra_props)
        r = await self.client.invoke(self.broker.addr, send_request(topic, body, queue_id, p, producerGroup=GROUP,
                                                                    sysFlag=4))
        assert r.code == ResponseCode.SUCCESS, r.remark
        return r

    async def end(self, sent: RemotingCommand, state: int, *, group: str = GROUP, from_check: bool = False,
                  **override: Any) -> RemotingCommand:
        ext = end_fields(sent, state, group=group, from_check=from_check)
        ext.update(override)
        return await self.client.invoke(self.broker.addr, make_request(RequestCode.END_TRANSACTION, ext))

    async def next_check(self, timeout: float = 20.0) -> tuple[RemotingConnection, RemotingCommand]:
        return await asyncio.wait_for(self.checks.get(), timeout)


def end_fields(sent: RemotingCommand, state: int, *, group: str = GROUP, from_check: bool = False) -> dict[str, Any]:
    """END_TRANSACTION fields as RocketMQ's producers derive them from the send reply."""
    return {"producerGroup": group, "tranStateTableOffset": sent.ext_fields["queueOffset"],
            "commitLogOffset": decode_offset_msg_id(sent.ext_fields["msgId"]).offset,
            "commitOrRollback": state, "msgId": "U1", "transactionId": "U1",
            "fromTransactionCheck": "true" if from_check else "false"}


@pytest.fixture
async def producer_factory() -> AsyncIterator[list[Producer]]:
    made: list[Producer] = []
    yield made
    for p in made:
        await p.client.close()


def make_producer(made: list[Producer], broker: BrokerController) -> Producer:
    p = Producer(broker)
    made.append(p)
    return p


async def pull_all(client: RemotingClient, broker: BrokerController, topic: str, queue_id: int = 0,
                   offset: int = 0) -> list[MessageRecord]:
    r = await client.invoke(broker.addr, pull_request(topic, offset, queue_id, sys_flag=4, suspend_ms=0))
    if r.code != ResponseCode.SUCCESS:
        return []
    return list(iter_records(r.body))


# -- visibility, commit, rollback -------------------------------------------------------------------------------
async def test_half_is_invisible_until_commit_then_delivered_once(start_broker: StartBroker,
                                                                  producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    # the engine is built at the first half (broker/transaction/front.py); a plain send does not build it
    assert (await p.client.invoke(b.addr, send_request("TxT", b"plain", 1))).code == ResponseCode.SUCCESS
    assert not b.transactions.built and b.transactions.counts() == (0, 0, 0)
    assert {HALF_TOPIC, OP_TOPIC} <= set(b.topics.topics)  # its topics exist from the start
    sent = await p.half("TxT", b"order-1", queue_id=2)
    assert sent.ext_fields["queueId"] == "2"
    assert b.transactions.built and b.transactions.counts() == (1, 0, 0)
    assert await pull_all(p.client, b, "TxT", 2) == []
    # Nobody reads or writes the half topic directly.
    r = await p.client.invoke(b.addr, pull_request(HALF_TOPIC, 0, 0))
    assert r.code == ResponseCode.NO_PERMISSION
    r = await p.client.invoke(b.addr, send_request(HALF_TOPIC, b"forged", 0))
    assert r.code == ResponseCode.NO_PERMISSION

    r = await p.end(sent, 8)
    assert r.code == ResponseCode.SUCCESS, r.remark
    [rec] = await pull_all(p.client, b, "TxT", 2)
    assert (rec.topic, rec.queue_id, rec.queue_offset, rec.body) == ("TxT", 2, 0, b"order-1")
    assert rec.sys_flag & 0xC == 8  # TRANSACTION_COMMIT_TYPE
    assert rec.properties["UNIQ_KEY"] == "U1" and rec.keys == ["k1", "k2"] and rec.tags == "tag-a"
    assert rec.properties["color"] == "blue" and rec.properties["PGROUP"] == GROUP
    for bookkeeping in ("REAL_TOPIC", "REAL_QID", "TRAN_MSG", "TRAN_PREPARED_QUEUE_OFFSET"):
        assert bookkeeping not in rec.properties
    assert rec.prepared_transaction_offset == decode_offset_msg_id(sent.ext_fields["msgId"]).offset

    # The same decision again (a retried oneway, a check answer) delivers nothing more.
    for from_check in (False, True):
        r = await p.end(sent, 8, from_check=from_check)
        assert r.code == ResponseCode.SUCCESS and "already resolved" in (r.remark or "")
    assert len(await pull_all(p.client, b, "TxT", 2)) == 1
    assert b.transactions.metrics.committed == 1 and b.transactions.metrics.already_resolved == 2
    assert len(b.transactions.table) == 0


async def test_rollback_is_never_delivered(start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    sent = await p.half("TxR", b"nope")
    r = await p.end(sent, 12)
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await p.end(sent, 8)  # a late commit cannot resurrect it, and is told so
    assert r.code == ResponseCode.TRANSACTION_FAILED and "was rolled back already" in (r.remark or ""), r.remark
    r = await p.end(sent, 12)  # the same decision again is answered as done
    assert r.code == ResponseCode.SUCCESS and "already resolved" in (r.remark or "")
    assert await pull_all(p.client, b, "TxR", 0) == []
    assert b.store.max_offset("TxR", 0) == 0
    # The op record says which half it resolved, as RocketMQ's does: the half queue offset, tag "d".
    [op] = [decode_record(v)[0] for v in b.store.get_messages(OP_TOPIC, 0, 0, 10).buffers]
    assert op.body == sent.ext_fields["queueOffset"].encode() and op.tags == "d"


async def test_unknown_state_leaves_it_pending(start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    sent = await p.half("TxU", b"later")
    r = await p.end(sent, 0)
    assert r.code == ResponseCode.SUCCESS
    assert len(b.transactions.table) == 1 and b.transactions.metrics.unknown == 1
    assert await pull_all(p.client, b, "TxU", 0) == []


async def test_bad_end_transaction_requests_are_refused(start_broker: StartBroker,
                                                        producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    sent = await p.half("TxB", b"x")
    r = await p.end(sent, 8, group="other-group")
    assert r.code == ResponseCode.SYSTEM_ERROR and "producer group wrong" in (r.remark or "")
    r = await p.end(sent, 8, tranStateTableOffset="7")
    assert r.code == ResponseCode.SYSTEM_ERROR and "state table offset" in (r.remark or "")
    r = await p.end(sent, 8, commitLogOffset="5")  # not the start of a record
    assert r.code == ResponseCode.SYSTEM_ERROR and "Find prepared transaction message failed" in (r.remark or "")
    normal = await p.client.invoke(b.addr, send_request("TxB", b"plain", 0))
    r = await p.end(sent, 8, commitLogOffset=str(decode_offset_msg_id(normal.ext_fields["msgId"]).offset))
    assert r.code == ResponseCode.SYSTEM_ERROR  # a normal message is no half
    r = await p.end(sent, 5)
    assert r.code == ResponseCode.SYSTEM_ERROR and "5" in (r.remark or "")
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, {"producerGroup": GROUP}))
    assert r.code == ResponseCode.SYSTEM_ERROR and "tranStateTableOffset" in (r.remark or "")
    r = await p.end(sent, 8, commitLogOffset="not-a-number")
    assert r.code == ResponseCode.SYSTEM_ERROR
    # None of that resolved or delivered anything.
    assert len(b.transactions.table) == 1
    [plain] = await pull_all(p.client, b, "TxB", 0)
    assert plain.body == b"plain"
    assert (await p.end(sent, 8)).code == ResponseCode.SUCCESS
    assert [m.body for m in await pull_all(p.client, b, "TxB", 0)] == [b"plain", b"x"]


async def test_transactional_batch_is_refused(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    body = encode_batch([(b"a", {"UNIQ_KEY": "B0", "TRAN_MSG": "true"}, 0), (b"b", {"UNIQ_KEY": "B1"}, 0)])
    r = await client.invoke(b.addr, send_request("TxBatch", body, 0, batch="1"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "batch" in (r.remark or "")
    assert b.store.max_offset("TxBatch", 0) == 0 and b.store.max_offset(HALF_TOPIC, 0) == 0


# -- check-back -------------------------------------------------------------------------------------------------
async def test_check_back_reaches_a_live_producer_and_its_answer_commits(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker(transaction_timeout_ms=200, transaction_check_interval_ms=300)
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    sent = await p.half("TxC", b"ask-me", queue_id=1)
    conn, check = await p.next_check()
    h = check.ext_fields
    assert check.flag & 2  # oneway, as RocketMQ sends it
    assert h["msgId"] == "U1" and h["transactionId"] == "U1" and h["topic"] == "TxC"
    half_offset = int(sent.ext_fields["queueOffset"])
    # The check names the re-appended half (its check count is durable) ...
    copy, _ = decode_record(b.store.read_record(int(h["commitLogOffset"])))  # type: ignore[arg-type]
    assert copy.topic == HALF_TOPIC and str(copy.queue_offset) == h["tranStateTableOffset"]
    assert copy.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == str(half_offset)
    assert h["offsetMsgId"] == offset_msg_id(b.store.commitlog.store_host, copy.physical_offset)
    # ... and carries the message as the producer sent it, in its real topic and queue.
    msg, _ = decode_record(check.body)
    assert (msg.topic, msg.queue_id, msg.body, msg.properties["UNIQ_KEY"]) == ("TxC", 1, b"ask-me", "U1")
    assert msg.properties["PGROUP"] == GROUP

    answer = {"producerGroup": GROUP, "tranStateTableOffset": h["tranStateTableOffset"],
              "commitLogOffset": h["commitLogOffset"], "commitOrRollback": 8, "msgId": "U1",
              "transactionId": h["transactionId"], "fromTransactionCheck": "true"}
    conn.send_oneway(make_request(RequestCode.END_TRANSACTION, answer, oneway=True))
    await eventually(lambda: b.store.max_offset("TxC", 1) == 1, 20.0, what="the committed message in TxC")
    # The producer's own (late) commit naming the original half is now a no-op.
    assert (await p.end(sent, 8)).remark == "the transaction is already resolved"
    await asyncio.sleep(0.5)
    assert b.store.max_offset("TxC", 1) == 1 and len(b.transactions.table) == 0
    assert p.checks.empty()


async def test_unanswered_checks_end_in_the_check_max_topic(start_broker: StartBroker,
                                                            producer_factory: list[Producer]) -> None:
    b = await start_broker(transaction_timeout_ms=100, transaction_check_interval_ms=100, transaction_check_max=3)
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    sent = await p.half("TxM", b"forever-unknown")
    counts = []
    for _ in range(3):
        _, check = await p.next_check()
        counts.append(decode_record(check.body)[0].properties["TRANSACTION_CHECK_TIMES"])
    assert counts == ["1", "2", "3"]
    await eventually(lambda: b.transactions.metrics.discarded == 1, 20.0, what="the half message discarded")
    [kept] = await pull_all(p.client, b, CHECK_MAX_TOPIC, 0)
    assert kept.body == b"forever-unknown" and kept.properties["REAL_TOPIC"] == "TxM"
    assert b.store.max_offset("TxM", 0) == 0 and len(b.transactions.table) == 0
    # A commit that comes after the discard delivers nothing, and is refused saying why (an exactly-once writer
    # must not take it for done); a rollback is answered as done.
    r = await p.end(sent, 8)
    assert r.code == ResponseCode.TRANSACTION_FAILED and "discarded" in (r.remark or ""), r.remark
    assert CHECK_MAX_TOPIC in (r.remark or "")
    assert "already resolved" in ((await p.end(sent, 12)).remark or "")
    assert b.store.max_offset("TxM", 0) == 0
    assert p.checks.empty()


async def test_checks_without_a_producer_are_counted(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(transaction_timeout_ms=100, transaction_check_interval_ms=100, transaction_check_max=2)
    r = await client.invoke(b.addr, send_request("TxN", b"orphan", 0, props(UNIQ_KEY="O1", TRAN_MSG="true")))
    assert r.code == ResponseCode.SUCCESS
    await eventually(lambda: b.transactions.metrics.discarded == 1, 20.0, what="the half message discarded")
    assert b.transactions.metrics.checks_without_producer == 2 and b.transactions.metrics.checks_sent == 0
    # PGROUP was missing: the broker filled it from the request header's producerGroup.
    [kept] = await pull_all(client, b, CHECK_MAX_TOPIC, 0)
    assert kept.properties["PGROUP"] == "pg"


async def test_check_immunity_time_postpones_the_first_check(start_broker: StartBroker,
                                                             producer_factory: list[Producer]) -> None:
    b = await start_broker(transaction_timeout_ms=100, transaction_check_interval_ms=100)
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    t0 = b.clock()
    await p.half("TxI", b"immune", CHECK_IMMUNITY_TIME_IN_SECONDS="1")
    await p.next_check()
    assert b.clock() - t0 >= 1000


async def test_checks_take_turns_among_the_groups_producers(start_broker: StartBroker,
                                                           producer_factory: list[Producer]) -> None:
    b = await start_broker(transaction_timeout_ms=100, transaction_check_interval_ms=100, transaction_check_max=4)
    p1, p2 = make_producer(producer_factory, b), make_producer(producer_factory, b)
    await p1.heartbeat("client-1")
    await p2.heartbeat("client-2")
    await p1.half("TxTurns", b"x")
    await eventually(lambda: b.transactions.metrics.checks_sent >= 4, 20.0, what="four check-backs sent")
    assert p1.checks.qsize() >= 1 and p2.checks.qsize() >= 1


# -- restart ----------------------------------------------------------------------------------------------------
async def test_pending_halves_survive_a_restart_and_commits_are_not_redelivered(
        start_broker: StartBroker, producer_factory: list[Producer], tmp_path: Path) -> None:
    data = tmp_path / "b1"
    b = await start_broker(data, transaction_timeout_ms=300, transaction_check_interval_ms=200)
    port = int(b.addr.rsplit(":", 1)[1])
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    done = await p.half("TxS", b"committed-before", uniq="U0")
    assert (await p.end(done, 8)).code == ResponseCode.SUCCESS
    await p.half("TxS", b"pending", uniq="U1")
    _, first = await p.next_check()  # one check before the restart: the count must survive
    assert decode_record(first.body)[0].properties["TRANSACTION_CHECK_TIMES"] == "1"
    await b.stop()
    progress = json.loads((data / "config" / "transactionProgress.json").read_bytes())
    assert progress["halfOffset"] >= 1  # the committed half is behind the progress point

    b2 = await start_broker(data, listen_port=port, transaction_timeout_ms=300, transaction_check_interval_ms=200)
    assert b2.transactions.built  # the store holds halves: the engine is built and loaded at the start
    assert b2.transactions.counts() == (1, 0, 0)
    p2 = make_producer(producer_factory, b2)
    await p2.heartbeat()
    conn, check = await p2.next_check()
    msg = decode_record(check.body)[0]
    assert msg.body == b"pending" and msg.properties["TRANSACTION_CHECK_TIMES"] == "2"
    h = check.ext_fields
    conn.send_oneway(make_request(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": h["tranStateTableOffset"],
        "commitLogOffset": h["commitLogOffset"], "commitOrRollback": 8, "fromTransactionCheck": "true"},
        oneway=True))
    await eventually(lambda: len(b2.transactions.table) == 0, 20.0, what="the restarted broker's table to empty")
    assert [m.body for m in await pull_all(p2.client, b2, "TxS", 0)] == [b"committed-before", b"pending"]


async def test_restart_rebuild_reads_only_from_the_progress_point(start_broker: StartBroker,
                                                                 producer_factory: list[Producer],
                                                                 tmp_path: Path) -> None:
    data = tmp_path / "b2"
    b = await start_broker(data)
    p = make_producer(producer_factory, b)
    sent = [await p.half("TxP", f"m{i}".encode(), uniq=f"U{i}") for i in range(3)]
    for i in (0, 1, 2):
        assert (await p.end(sent[i], 8 if i % 2 == 0 else 12)).code == ResponseCode.SUCCESS
    sent += [await p.half("TxP", f"m{i}".encode(), uniq=f"U{i}") for i in range(3, 6)]
    assert (await p.end(sent[4], 12)).code == ResponseCode.SUCCESS
    await b.stop()
    progress = json.loads((data / "config" / "transactionProgress.json").read_bytes())
    assert progress == {"halfOffset": 3, "opOffset": 3}  # half 3 is the oldest pending; 3 ops came before it
    b2 = await start_broker(data)
    assert sorted(b2.transactions.table.pending) == [3, 5]
    # Commits of the pending ones still work after the restart; resolved ones stay resolved.
    p2 = make_producer(producer_factory, b2)
    assert (await p2.end(sent[3], 8)).code == ResponseCode.SUCCESS
    assert "already resolved" in ((await p2.end(sent[0], 8)).remark or "")
    assert "already resolved" in ((await p2.end(sent[1], 8)).remark or "")
    bodies = [m.body for m in await pull_all(p2.client, b2, "TxP", 0)]
    assert bodies == [b"m0", b"m2", b"m3"]


async def test_a_long_immune_half_does_not_hold_the_restart_progress_back(
        start_broker: StartBroker, producer_factory: list[Producer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A half immune from checks for a day, then 300 transactions: the half is renewed (re-appended, as RocketMQ
    puts a half still immune back into the half queue) once they are more than RENEW_LAG records past it, so the
    restart progress moves on. Before, it stayed at the half (0, not even written): every restart read every half
    and op record since. The restarted broker reads only the last ones, keeps the half's due time, and a commit
    naming its first record delivers it once, without the broker's TRAN_CHECK_FROM_MS."""
    monkeypatch.setattr(tx_progress, "RENEW_LAG", 64)
    data = tmp_path / "b3"
    b = await start_broker(data)
    p = make_producer(producer_factory, b)
    immune = await p.half("TxPin", b"immune", uniq="U-immune", CHECK_IMMUNITY_TIME_IN_SECONDS="86400")
    due = b.transactions.table.pending[0].next_check_ms
    for i in range(300):
        sent = await p.half("TxPin", b"m%d" % i, uniq=f"U{i}")
        assert (await p.end(sent, 8)).code == ResponseCode.SUCCESS
    tx = b.transactions

    def caught_up() -> bool:
        return tx.metrics.renewed > 0 and tx.store.max_offset(HALF_TOPIC, 0) - tx.table.pending[0].latest_offset <= 64

    await eventually(caught_up, 20.0, what="the immune half renewed near the half queue's end")
    latest = tx.table.pending[0].latest_offset
    assert tx.table.pending[0].next_check_ms == due  # (renewing does not postpone, nor advance, its check)
    await b.stop()
    progress = json.loads((data / "config" / "transactionProgress.json").read_bytes())
    assert progress["halfOffset"] == latest > 300 - 64

    caplog.set_level(logging.INFO, logger="cometmq.broker.transaction.service")
    b2 = await start_broker(data)
    [loaded] = [r.getMessage() for r in caplog.records if "unresolved after reading" in r.getMessage()]
    read = int(loaded.split("after reading ")[1].split()[0])
    assert read <= 64 + 2, loaded  # (before: all 301 half records and 300 op records)
    assert sorted(b2.transactions.table.pending) == [0] and b2.transactions.table.pending[0].next_check_ms == due
    p2 = make_producer(producer_factory, b2)
    r = await p2.end(immune, 8)
    assert r.code == ResponseCode.SUCCESS and not r.remark
    assert b2.transactions.metrics.committed == 1 and len(b2.transactions.table) == 0
    got = b2.store.get_messages("TxPin", 0, 0, 1000)
    delivered = [decode_record(v)[0] for v in got.buffers]
    assert [m.body for m in delivered] == [b"m%d" % i for i in range(300)] + [b"immune"]
    assert "TRAN_CHECK_FROM_MS" not in delivered[-1].properties
    assert delivered[-1].properties["UNIQ_KEY"] == "U-immune"


async def test_the_restart_progress_is_written_only_over_a_flushed_log(
        start_broker: StartBroker, producer_factory: list[Producer], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress pair may point past a renewal's copy. With an async flush the log's tail is not on disk yet: a
    power cut would take the copy back and leave a pair past the surviving original (that transaction lost at the
    restart). So a pair is written once the log is flushed past what it was computed on."""
    monkeypatch.setattr(tx_progress, "RENEW_LAG", 64)
    data = tmp_path / "b4"
    b = await start_broker(data, store_flush_interval_commitlog_ms=3_600_000,
                           store_flush_commitlog_thorough_interval_ms=3_600_000)
    p = make_producer(producer_factory, b)
    await p.half("TxFl", b"immune", uniq="U-immune", CHECK_IMMUNITY_TIME_IN_SECONDS="86400")
    for i in range(200):
        sent = await p.half("TxFl", b"m%d" % i, uniq=f"U{i}")
        assert (await p.end(sent, 8)).code == ResponseCode.SUCCESS
    tx = b.transactions
    await eventually(lambda: tx.metrics.renewed > 0, 20.0, what="the immune half renewed")
    path = data / "config" / "transactionProgress.json"
    await asyncio.sleep(2.5)  # two persist passes
    assert b.store.flushed_offset < b.store.commitlog.max_offset
    assert not path.exists()  # nothing flushed: no pair written
    await asyncio.to_thread(b.store.flush_service._flush_now)
    await eventually(path.exists, 10.0, what="the pair written once the log is flushed")
    assert json.loads(path.read_bytes())["halfOffset"] > 0
