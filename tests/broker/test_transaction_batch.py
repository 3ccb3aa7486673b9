"""cometmq's batched transactions over real sockets: a batch of halves (SEND_BATCH_MESSAGE with cometmqHalfBatch)
and END_TRANSACTION_BATCH (protocol/transaction_batch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.broker.transaction import HALF_TOPIC, OP_TOPIC
from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import decode_record
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.transaction_batch import (
    HALF_BATCH_FIELD,
    EndEntry,
    EndOutcome,
    decode_end_outcomes,
    encode_end_entries,
)
from cometmq.store.status import PutResult, PutStatus
from tests.kit import eventually

from .conftest import StartBroker, send_request
from .test_transaction import GROUP, Producer, make_producer, producer_factory, pull_all

__all__ = ["producer_factory"]  # the fixture, used by name

COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


def half_items(n: int, prefix: str = "h", size: int = 0, **extra: str) -> list[tuple[bytes, dict[str, str], int]]:
    return [((f"{prefix}{i}".encode() + b"." * size), {"UNIQ_KEY": f"{prefix.upper()}{i}", "TRAN_MSG": "true",
                                                       "PGROUP": GROUP, "TAGS": "t", **extra}, 0)
            for i in range(n)]


def half_batch_request(topic: str, items: list[tuple[bytes, dict[str, str], int]], queue_id: int = 0,
                       **extra: Any) -> RemotingCommand:
    ext: dict[str, Any] = {"producerGroup": GROUP, "topic": topic, "defaultTopic": "TBW102",
                           "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": 4, "bornTimestamp": "1",
                           "flag": 0, "properties": "", "reconsumeTimes": "0", "batch": "true",
                           HALF_BATCH_FIELD: "true"}
    ext.update(extra)
    return make_request(RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch(items))


async def send_halves(p: Producer, topic: str, items: list[tuple[bytes, dict[str, str], int]],
                      queue_id: int = 0) -> list[tuple[int, int]]:
    """Store a half batch; its halves' (commit-log offset, half queue offset)."""
    r = await p.client.invoke(p.broker.addr, half_batch_request(topic, items, queue_id))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields["queueId"] == str(queue_id)
    first = int(r.ext_fields["queueOffset"])
    ids = r.ext_fields["msgId"].split(",")
    assert len(ids) == len(items)
    return [(decode_offset_msg_id(m).offset, first + i) for i, m in enumerate(ids)]


async def end_batch(client: RemotingClient, b: BrokerController, decisions: list[tuple[tuple[int, int], int]],
                    group: str = GROUP) -> list[EndOutcome]:
    body = encode_end_entries([EndEntry(clo, qo, state, f"m{clo}") for (clo, qo), state in decisions])
    r = await client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": group}, body))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return decode_end_outcomes(r.body)


def codes(outcomes: list[EndOutcome]) -> list[int]:
    return [o.code for o in outcomes]


async def test_half_batch_is_stored_as_halves_and_a_batched_end_decides_each(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    halves = await send_halves(p, "TxHB", half_items(5), queue_id=1)
    # Halves: out of sight, in the half topic (one append: consecutive queue offsets), each tracked.
    assert [qo for _, qo in halves] == [0, 1, 2, 3, 4]
    assert await pull_all(p.client, b, "TxHB", 1) == [] and b.store.max_offset("TxHB", 1) == 0
    assert sorted(b.transactions.table.pending) == [0, 1, 2, 3, 4] and b.transactions.metrics.prepared == 5
    for i, (clo, qo) in enumerate(halves):
        rec, _ = decode_record(b.store.read_record(clo))  # type: ignore[arg-type]
        assert (rec.topic, rec.queue_id, rec.queue_offset, rec.body) == (HALF_TOPIC, 0, qo, f"h{i}".encode())
        assert rec.properties["REAL_TOPIC"] == "TxHB" and rec.properties["REAL_QID"] == "1"
        assert rec.properties["PGROUP"] == GROUP and rec.sys_flag & 0xC == 0

    out = await end_batch(p.client, b, [(halves[0], COMMIT), (halves[1], COMMIT), (halves[2], ROLLBACK),
                                        (halves[3], COMMIT), (halves[4], UNKNOWN)])
    assert codes(out) == [0, 0, 0, 0, 0]
    assert "state unknown" in out[4].remark and not any(o.already_resolved for o in out)
    got = await pull_all(p.client, b, "TxHB", 1)
    assert [m.body for m in got] == [b"h0", b"h1", b"h3"]  # in entry order
    assert all(m.sys_flag & 0xC == 8 and "TRAN_MSG" not in m.properties for m in got)
    assert [m.properties["UNIQ_KEY"] for m in got] == ["H0", "H1", "H3"]
    assert got[0].prepared_transaction_offset == halves[0][0]
    assert sorted(b.transactions.table.pending) == [4]
    # One op record resolves the request's four decisions.
    [op] = [decode_record(v)[0] for v in b.store.get_messages(OP_TOPIC, 0, 0, 10).buffers]
    assert op.body == b"0,1,2,3"
    m = b.transactions.metrics
    assert (m.committed, m.rolled_back, m.unknown) == (3, 1, 1)

    # Again: the same decisions are done already; contradicting ones are refused, per entry; within one request a
    # second decision on a transaction is judged against the first.
    out = await end_batch(p.client, b, [(halves[0], COMMIT), (halves[2], COMMIT), (halves[1], ROLLBACK),
                                        (halves[4], ROLLBACK), (halves[4], COMMIT), (halves[4], ROLLBACK)])
    assert codes(out) == [0, ResponseCode.TRANSACTION_FAILED, ResponseCode.TRANSACTION_FAILED, 0,
                          ResponseCode.TRANSACTION_FAILED, 0]
    assert out[0].already_resolved and out[5].already_resolved and not out[3].already_resolved
    assert "was rolled back already" in out[1].remark and "was committed already" in out[2].remark
    assert [m.body for m in await pull_all(p.client, b, "TxHB", 1)] == [b"h0", b"h1", b"h3"]
    assert len(b.transactions.table) == 0
    # The single END_TRANSACTION sees what the batch decided.
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, {
        "producerGroup": GROUP, "tranStateTableOffset": halves[3][1], "commitLogOffset": halves[3][0],
        "commitOrRollback": ROLLBACK, "fromTransactionCheck": "false"}))
    assert r.code == ResponseCode.TRANSACTION_FAILED, r.remark


async def test_a_batched_end_refuses_bad_entries_one_by_one(start_broker: StartBroker,
                                                            producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    [a, c] = await send_halves(p, "TxBE", half_items(2))
    plain = await p.client.invoke(b.addr, send_request("TxBE", b"plain", 0))
    plain_clo = decode_offset_msg_id(plain.ext_fields["msgId"]).offset
    out = await end_batch(p.client, b, [((a[0], a[1] + 7), COMMIT), ((5, 0), COMMIT), ((plain_clo, 0), COMMIT),
                                        (c, COMMIT)])
    assert codes(out) == [1, 1, 1, 0]
    assert "state table offset" in out[0].remark and "Find prepared transaction message failed" in out[1].remark
    out = await end_batch(p.client, b, [(a, COMMIT)], group="other-group")
    assert codes(out) == [1] and "producer group wrong" in out[0].remark
    assert [m.body for m in await pull_all(p.client, b, "TxBE", 0)] == [b"plain", b"h1"]
    assert sorted(b.transactions.table.pending) == [a[1]]


async def test_bad_batched_end_requests_decide_nothing(start_broker: StartBroker,
                                                       producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    [h] = await send_halves(p, "TxBad", half_items(1))
    good = encode_end_entries([EndEntry(h[0], h[1], COMMIT)])
    bad_bodies = [b"not json", b'{"entries": 5}', b'{"entries": [[1, 2, 8]]}', b'{"entries": [[-1, 0, 8, ""]]}',
                  b'{"entries": [[1, 0, true, ""]]}',
                  encode_end_entries([EndEntry(h[0], h[1], COMMIT), EndEntry(h[0], h[1], 5)])]
    for body in bad_bodies:
        r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": GROUP},
                                                       body))
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark, body
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {}, good))
    assert r.code == ResponseCode.SYSTEM_ERROR and "producerGroup" in (r.remark or "")
    assert len(b.transactions.table) == 1 and b.store.max_offset(OP_TOPIC, 0) == 0
    assert await pull_all(p.client, b, "TxBad", 0) == []


async def test_bad_half_batches_store_nothing(start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    r = await p.client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "TxRO", "readQueueNums": 4, "writeQueueNums": 4, "perm": 4}))
    assert r.code == ResponseCode.SUCCESS
    mixed = half_items(3)
    del mixed[1][1]["TRAN_MSG"]
    cases: list[tuple[RemotingCommand, int, str]] = [
        # an item that is no half (and the header's sys flag does not say PREPARED)
        (half_batch_request("TxBadH", mixed, sysFlag=0), ResponseCode.MESSAGE_ILLEGAL, "item 1 of 3"),
        (half_batch_request("TxBadH", [(b"x", {"UNIQ_KEY": "X"}, 0)], sysFlag=0), ResponseCode.MESSAGE_ILLEGAL,
         "holds only transactional messages"),
        # a topic the producer may not write, a retry topic, a system topic
        (half_batch_request("TxRO", half_items(2)), ResponseCode.NO_PERMISSION, "not writable"),
        (half_batch_request("%RETRY%cg", half_items(2)), ResponseCode.MESSAGE_ILLEGAL, "retry"),
        (half_batch_request(HALF_TOPIC, half_items(2)), ResponseCode.NO_PERMISSION, ""),
        (half_batch_request("TxBadH", half_items(2), **{HALF_BATCH_FIELD: "maybe"}), ResponseCode.MESSAGE_ILLEGAL,
         HALF_BATCH_FIELD),
        # without the field, as RocketMQ: a transactional batch is refused
        (half_batch_request("TxBadH", half_items(2), **{HALF_BATCH_FIELD: "false"}), ResponseCode.MESSAGE_ILLEGAL,
         "cannot be sent in a batch"),
    ]
    for cmd, code, remark in cases:
        r = await p.client.invoke(b.addr, cmd)
        assert r.code == code and remark in (r.remark or ""), (cmd.ext_fields["topic"], r.code, r.remark)
    assert b.store.max_offset(HALF_TOPIC, 0) == 0 and len(b.transactions.table) == 0
    assert b.store.max_offset("TxBadH", 0) == 0 and b.store.max_offset("%RETRY%cg", 0) == 0
    # The half-batch field on a single send changes nothing: a single half is a half anyway.
    r = await p.client.invoke(b.addr, send_request("TxBadH", b"one", 0, "TRAN_MSG\x01true\x02UNIQ_KEY\x01S\x02",
                                                   **{HALF_BATCH_FIELD: "true"}))
    assert r.code == ResponseCode.SUCCESS and len(b.transactions.table) == 1


@pytest.mark.parametrize("by_range", [False, True])
async def test_commits_larger_than_one_append_are_split(start_broker: StartBroker, producer_factory: list[Producer],
                                                       by_range: bool) -> None:
    """The test broker's maxMessageSize is 256 KiB: 150 commits of 4 KiB go in several appends, in order (named one by
    one, or as three ranges of 50)."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    halves: list[tuple[int, int]] = []
    for k in range(3):
        halves += await send_halves(p, "TxBig", half_items(50, prefix=f"b{k}-", size=4000))
    if by_range:
        out = await end_ranges(p.client, b, [EndEntry(*halves[50 * k], COMMIT, "", 50) for k in range(3)])
        assert codes(out) == [0] * 3 and all(o.already == 0 for o in out)
    else:
        out = await end_batch(p.client, b, [(h, COMMIT) for h in halves])
        assert codes(out) == [0] * 150
    assert b.store.max_offset(OP_TOPIC, 0) >= 3  # one op record per append
    got = []
    while len(got) < 150:
        got += await pull_all(p.client, b, "TxBig", 0, offset=len(got))
    assert [m.properties["UNIQ_KEY"] for m in got] == [f"B{k}-{i}" for k in range(3) for i in range(50)]
    assert len(b.transactions.table) == 0


async def test_batched_halves_are_checked_back_one_by_one(start_broker: StartBroker,
                                                          producer_factory: list[Producer]) -> None:
    b = await start_broker(transaction_timeout_ms=200, transaction_check_interval_ms=300)
    p = make_producer(producer_factory, b)
    await p.heartbeat()
    await send_halves(p, "TxHC", half_items(2), queue_id=2)
    asked = {}
    for _ in range(2):
        conn, check = await p.next_check()
        msg, _ = decode_record(check.body)
        assert (msg.topic, msg.queue_id) == ("TxHC", 2)
        asked[msg.body] = (conn, check.ext_fields)
    assert sorted(asked) == [b"h0", b"h1"]
    for body, state in ((b"h0", COMMIT), (b"h1", ROLLBACK)):
        conn, h = asked[body]
        conn.send_oneway(make_request(RequestCode.END_TRANSACTION, {
            "producerGroup": GROUP, "tranStateTableOffset": h["tranStateTableOffset"],
            "commitLogOffset": h["commitLogOffset"], "commitOrRollback": state, "fromTransactionCheck": "true"},
            oneway=True))
    await eventually(lambda: len(b.transactions.table) == 0, 20.0, what="both checked halves resolved")
    assert [m.body for m in await pull_all(p.client, b, "TxHC", 2)] == [b"h0"]


async def test_batched_halves_survive_a_restart_before_their_commit(
        start_broker: StartBroker, producer_factory: list[Producer], tmp_path: Path) -> None:
    data = tmp_path / "b1"
    b = await start_broker(data)
    p = make_producer(producer_factory, b)
    items = half_items(3)
    del items[1][1]["PGROUP"]  # filled in from the request's producerGroup, as for a single half
    halves = await send_halves(p, "TxHR", items)
    await b.stop()
    b2 = await start_broker(data)
    assert sorted(b2.transactions.table.pending) == [0, 1, 2]
    p2 = make_producer(producer_factory, b2)
    out = await end_batch(p2.client, b2, [(halves[0], COMMIT), (halves[1], ROLLBACK), (halves[2], COMMIT)])
    assert codes(out) == [0, 0, 0]
    assert [m.body for m in await pull_all(p2.client, b2, "TxHR", 0)] == [b"h0", b"h2"]


async def end_ranges(client: RemotingClient, b: BrokerController, entries: list[EndEntry],
                     group: str = GROUP) -> list[EndOutcome]:
    r = await client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": group},
                                                 encode_end_entries(entries)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return decode_end_outcomes(r.body)


async def test_a_range_entry_decides_each_half_of_a_half_batch(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    """A range entry (the halves of one half batch by their first one and a count) decides each half as a single
    entry would: commits delivered in order, halves decided before counted, contradictions refused per half,
    halves that are not there refused, a range whose first half is elsewhere refused whole."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    first = await send_halves(p, "TxRange", half_items(6, "a"), queue_id=2)
    other = await send_halves(p, "TxRange", half_items(3, "o"), queue_id=2)
    (clo0, qo0), (clo_o, qo_o) = first[0], other[0]
    # One of the first batch rolled back alone before; the range commits the others and counts it as decided.
    [single] = await end_batch(p.client, b, [(first[1], ROLLBACK)])
    assert single.ok
    out = await end_ranges(p.client, b, [EndEntry(clo0, qo0, COMMIT, "a0", 6)])
    assert codes(out) == [ResponseCode.TRANSACTION_FAILED]  # half 1 was rolled back: refused, the rest decided
    assert out[0].already == 0 and "1 of 6 halves not decided" in out[0].remark
    assert "was rolled back already" in out[0].remark
    assert [m.body for m in await pull_all(p.client, b, "TxRange", 2)] == [b"a0", b"a2", b"a3", b"a4", b"a5"]
    again = await end_ranges(p.client, b, [EndEntry(clo0, qo0, COMMIT, "a0", 1), EndEntry(first[2][0], qo0 + 2,
                                                                                          COMMIT, "a2", 4)])
    assert codes(again) == [0, 0] and again[1].already == 4 and again[1].resolved_before == 4
    assert again[0].already_resolved and again[0].already == -1  # a single entry answers as before
    # Wrong first offset: nothing decided.
    out = await end_ranges(p.client, b, [EndEntry(clo0, qo_o, ROLLBACK, "o0", 3)])
    assert codes(out) == [ResponseCode.SYSTEM_ERROR] and "3 of 3 halves not decided" in out[0].remark
    assert sorted(b.transactions.table.pending) == [qo_o, qo_o + 1, qo_o + 2]
    # Another group's halves are refused; a range past the queue's end refuses what is not there.
    out = await end_ranges(p.client, b, [EndEntry(clo_o, qo_o, ROLLBACK, "o0", 3)], group="someone-else")
    assert codes(out) == [ResponseCode.SYSTEM_ERROR] and "producer group wrong" in out[0].remark
    out = await end_ranges(p.client, b, [EndEntry(clo_o, qo_o, ROLLBACK, "o0", 5)])
    assert codes(out) == [ResponseCode.SYSTEM_ERROR] and "2 of 5 halves not decided" in out[0].remark
    assert "no half message at half-queue offset" in out[0].remark
    assert len(b.transactions.table) == 0 and await pull_all(p.client, b, "TxRange", 2) != []
    m = b.transactions.metrics
    assert (m.committed, m.rolled_back) == (5, 4)


async def test_bytes_that_read_as_halves_inside_a_body_are_not_halves(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    """A message whose body is copies of real half records (their position fields set to where the body lands):
    an END naming that position, single or as a range, is refused and decides nothing; the real halves stay
    pending and are committed from their own records."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    halves = await send_halves(p, "TxForged", half_items(2, "v"), queue_id=1)
    records = [bytearray(b.store.read_record(clo)) for clo, _ in halves]  # type: ignore[arg-type]
    for r in records:
        i = r.index(b"v", 80)
        r[i:i + 1] = b"X"  # the forged body: X0, X1
    at = b.store.commitlog.max_offset + 88  # a plain send's body starts 88 bytes into its record (IPv4 hosts)
    records[0][28:36] = at.to_bytes(8, "big")
    records[1][28:36] = (at + len(records[0])).to_bytes(8, "big")
    body = bytes(records[0] + records[1])
    r = await p.client.invoke(b.addr, send_request("Innocent", body))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert bytes(b.store.commitlog.read_upto(at, len(body))) == body  # type: ignore[arg-type]
    out = await end_ranges(p.client, b, [EndEntry(at, halves[0][1], COMMIT, "", 2),
                                         EndEntry(at, halves[0][1], COMMIT, ""),
                                         EndEntry(at + len(records[0]), halves[1][1], COMMIT, "")])
    assert codes(out) == [ResponseCode.SYSTEM_ERROR] * 3, out
    assert "2 of 2 halves not decided" in out[0].remark and "is not the record at" in out[1].remark
    assert sorted(b.transactions.table.pending) == [halves[0][1], halves[1][1]]
    out = await end_ranges(p.client, b, [EndEntry(*halves[0], COMMIT, "", 2)])
    assert codes(out) == [0]
    assert [m.body for m in await pull_all(p.client, b, "TxForged", 1)] == [b"v0", b"v1"]


@pytest.mark.parametrize("failure", ["refused", "raised"])
async def test_an_append_that_fails_after_a_range_is_claimed_decides_nothing_it_held(
        start_broker: StartBroker, producer_factory: list[Producer], failure: str) -> None:
    """Three ranges of 50 commits of 4 KiB (several appends at the test broker's 256 KiB maxMessageSize); the
    second append fails — refused by the store, or an exception. What it held is still undecided (a retry commits
    it: every message once), what the other appends held is committed."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    halves: list[tuple[int, int]] = []
    for k in range(3):
        halves += await send_halves(p, "TxFail", half_items(50, prefix=f"f{k}-", size=4000))
    svc = b.transactions
    real = svc.appender.append
    calls: list[int] = []

    def failing(msgs: Any) -> Any:
        calls.append(len(msgs))
        if len(calls) == 2:
            if failure == "raised":
                raise OSError("the disk went away")
            return PutResult(PutStatus.OS_ERROR, remark="boom")
        return real(msgs)

    svc.appender.append = failing  # type: ignore[method-assign]
    entries = [EndEntry(*halves[50 * k], COMMIT, "", 50) for k in range(3)]
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": GROUP},
                                                   encode_end_entries(entries)))
    svc.appender.append = real  # type: ignore[method-assign]
    undecided = len(svc.table)
    assert 0 < undecided < 150 and len(calls) >= 2
    if failure == "raised":
        assert r.code == ResponseCode.SYSTEM_ERROR  # the request fails as a whole; the first append stays
        assert svc.metrics.committed == 150 - undecided
    else:
        out = decode_end_outcomes(r.body)
        assert sum(int(o.remark.split(" of ")[0]) for o in out if not o.ok) == undecided
    assert b.store.max_offset("TxFail", 0) == 150 - undecided
    again = await end_ranges(p.client, b, entries)
    assert codes(again) == [0] * 3 and sum(o.already for o in again) == 150 - undecided
    assert len(svc.table) == 0 and b.store.max_offset("TxFail", 0) == 150
