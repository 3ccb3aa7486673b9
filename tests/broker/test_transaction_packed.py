"""cometmq's packed half over real sockets: one transactional message whose body is a batch
(protocol/transaction_batch.py, "Packed half"), stored as one half, its messages delivered by its commit."""

from __future__ import annotations

import time

from cometmq.broker.transaction import HALF_TOPIC
from cometmq.broker.transaction import messages as tm
from cometmq.broker.transaction import service as service_module
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import decode_record
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import make_request
from cometmq.protocol.transaction_batch import (
    HALF_BATCH_FIELD,
    PACKED_HALF,
    PACKED_PROPERTY,
    EndEntry,
    encode_end_entries,
)
from cometmq.store.batch_codec import plain_batch_messages_py

from .conftest import StartBroker, props, send_request
from .test_transaction import GROUP, Producer, end_fields, make_producer, producer_factory, pull_all
from .test_transaction_batch import COMMIT, ROLLBACK, codes, end_ranges, half_batch_request, half_items

__all__ = ["producer_factory"]  # the fixture, used by name


def items(n: int, prefix: str = "p", **extra: str) -> list[tuple[bytes, dict[str, str], int]]:
    """A packed half's messages: plain ones, each with its own id, tag and properties."""
    return [(f"{prefix}{i}".encode(), {"UNIQ_KEY": f"{prefix.upper()}{i}", "TAGS": f"t{i % 2}", "row": str(i),
                                       **extra}, i) for i in range(n)]


def clo_qo(sent: object) -> tuple[int, int]:
    ext = sent.ext_fields  # type: ignore[attr-defined]
    return decode_offset_msg_id(ext["msgId"]).offset, int(ext["queueOffset"])


async def test_a_packed_half_is_one_half_and_its_commit_delivers_each_message(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    before = b.store.commitlog.max_offset
    sent = await p.half("TxPacked", encode_batch(items(5)), queue_id=1, **{PACKED_PROPERTY: "5"})
    clo, qo = clo_qo(sent)
    # One record in the half queue, one pending transaction; nothing in the real topic.
    assert b.store.max_offset(HALF_TOPIC, 0) == qo + 1 and list(b.transactions.table.pending) == [qo]
    assert b.store.max_offset("TxPacked", 1) == 0 and await pull_all(p.client, b, "TxPacked", 1) == []
    rec, size = decode_record(b.store.read_record(clo))  # type: ignore[arg-type]
    assert rec.topic == HALF_TOPIC and rec.body == encode_batch(items(5)) and rec.properties[PACKED_PROPERTY] == "5"
    assert b.store.commitlog.max_offset - before == size
    # The size a batched END counts for its appends: what it would count message by message.
    msg, cost = tm.commit_messages(tm.read_half(b.store.read_record(clo)), clo)  # type: ignore[arg-type]
    msgs = plain_batch_messages_py(msg.body, msg.topic, msg.queue_id, msg.sys_flag, msg.born_timestamp, msg.born_host,
                                   msg.reconsume_times)
    assert msg.batch_items == 5 and msgs is not None and len(msgs) == 5
    assert cost == sum(len(m.body) + len(m.topic) + tm.RECORD_OVERHEAD + len(m.properties_raw or b"") for m in msgs)

    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, end_fields(sent, COMMIT)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    got = await pull_all(p.client, b, "TxPacked", 1)
    assert [m.body for m in got] == [b"p0", b"p1", b"p2", b"p3", b"p4"]
    assert [(m.properties["UNIQ_KEY"], m.properties["row"], m.tags, m.flag) for m in got] == [
        (f"P{i}", str(i), f"t{i % 2}", i) for i in range(5)]
    # As a half's own commit delivers it: the COMMIT sys flag, the half's offset; none of the half's properties.
    assert all(m.sys_flag & 0xC == 8 and m.prepared_transaction_offset == clo for m in got)
    assert all(PACKED_PROPERTY not in m.properties and "PGROUP" not in m.properties for m in got)
    assert len(b.transactions.table) == 0
    # Decided once: a second commit delivers nothing more.
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, end_fields(sent, COMMIT)))
    assert r.code == ResponseCode.SUCCESS and "already" in (r.remark or "")
    assert len(await pull_all(p.client, b, "TxPacked", 1)) == 5


async def test_batched_ends_commit_and_roll_back_packed_halves(start_broker: StartBroker,
                                                               producer_factory: list[Producer]) -> None:
    """Single entries and a range entry over packed halves: each commit delivers its messages (never the packed
    body as one message), each rollback none."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    sent = [clo_qo(await p.half("TxPackedB", encode_batch(items(3, k)), **{PACKED_PROPERTY: "3"}))
            for k in ("a", "b", "c", "d")]
    body = encode_end_entries_of([(sent[0], COMMIT), (sent[1], ROLLBACK)])
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION_BATCH, {"producerGroup": GROUP}, body))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert [m.body for m in await pull_all(p.client, b, "TxPackedB")] == [b"a0", b"a1", b"a2"]
    # A range entry naming the last two (consecutive half-queue offsets) unpacks each.
    out = await end_ranges(p.client, b, [EndEntry(sent[2][0], sent[2][1], COMMIT, "c", 2)])
    assert codes(out) == [0], out
    assert [m.body for m in await pull_all(p.client, b, "TxPackedB")] == [
        b"a0", b"a1", b"a2", b"c0", b"c1", b"c2", b"d0", b"d1", b"d2"]
    m = b.transactions.metrics  # transactions, not messages
    assert len(b.transactions.table) == 0 and (m.committed, m.rolled_back) == (3, 1)


async def test_a_large_batched_end_defers_the_key_index_and_keys_still_find_its_messages(
        start_broker: StartBroker, producer_factory: list[Producer]) -> None:
    """A batched END whose commits append many records leaves the key index to after its appends (the index builder
    is deferred, as during the timer's bursts); a lookup by key right after it still finds every committed message.
    A rollback of as many appends no record: nothing deferred."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    per = service_module._DEFER_INDEX_RECORDS // 4
    sent = [clo_qo(await p.half("TxPackedIdx", encode_batch(items(per, f"k{k}-")), **{PACKED_PROPERTY: str(per)}))
            for k in range(6)]
    builder = b.store.index_builder
    assert builder is not None
    before = time.monotonic()
    out = await end_ranges(p.client, b, [EndEntry(sent[4][0], sent[4][1], ROLLBACK, "r", 2)])
    assert codes(out) == [0], out
    assert builder._defer_since < before  # a rollback appends only its op record
    out = await end_ranges(p.client, b, [EndEntry(sent[0][0], sent[0][1], COMMIT, "c", 4)])
    assert codes(out) == [0], out
    assert builder._defer_since >= before  # deferred by this request
    for k in range(4):
        for i in (0, per - 1):
            [view] = b.store.query_by_key("TxPackedIdx", f"K{k}-{i}")
            assert decode_record(view)[0].body == f"k{k}-{i}".encode()  # type: ignore[arg-type]
    assert b.store.max_offset("TxPackedIdx", 0) == 4 * per


def encode_end_entries_of(decisions: list[tuple[tuple[int, int], int]]) -> bytes:
    return encode_end_entries([EndEntry(clo, qo, state, f"m{clo}") for (clo, qo), state in decisions])


async def test_bad_packed_halves_are_refused_and_store_nothing(start_broker: StartBroker,
                                                               producer_factory: list[Producer]) -> None:
    b = await start_broker()
    p = make_producer(producer_factory, b)
    end = b.store.commitlog.max_offset
    good = encode_batch(items(3))
    cases = [
        (good, {PACKED_PROPERTY: "4"}, 4, "holds 3 messages, not cometmqPacked=4"),
        (good, {PACKED_PROPERTY: "three"}, 4, "is not a count"),
        (good, {PACKED_PROPERTY: "0"}, 4, "is not a count"),
        (b"not a batch at all", {PACKED_PROPERTY: "1"}, 4, "not a batch"),
        (encode_batch(items(2, DELAY="3")), {PACKED_PROPERTY: "2"}, 4, "delay or timer"),
        (encode_batch(items(2, TIMER_DELAY_SEC="3")), {PACKED_PROPERTY: "2"}, 4, "delay or timer"),
        (good, {PACKED_PROPERTY: "3"}, 4 | 1, "may not be compressed"),
    ]
    for body, extra, sys_flag, why in cases:
        req = send_request("TxPackedBad", body, 0, props(UNIQ_KEY="U", TRAN_MSG="true", PGROUP=GROUP, **extra),
                           producerGroup=GROUP, sysFlag=sys_flag)
        r = await p.client.invoke(b.addr, req)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and why in (r.remark or ""), (why, r.code, r.remark)
    # Small enough to send, too large once unpacked: 10,000 one-byte messages take ~1.4 MB as records, more than
    # this broker's 1 MiB segment (the commit could never be appended).
    tiny = encode_batch([(b"x", {}, 0)] * 10_000)
    assert len(tiny) <= b.config.store.max_message_size
    r = await p.client.invoke(b.addr, send_request("TxPackedBad", tiny, 0, props(
        UNIQ_KEY="U", TRAN_MSG="true", PGROUP=GROUP, **{PACKED_PROPERTY: "10000"}), producerGroup=GROUP, sysFlag=4))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "more than a commit-log segment" in (r.remark or ""), r.remark
    # A half batch's item may not be a packed half.
    r = await p.client.invoke(b.addr, half_batch_request("TxPackedBad", half_items(2, **{PACKED_PROPERTY: "1"})))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "packed half" in (r.remark or ""), r.remark
    assert b.store.commitlog.max_offset == end and len(b.transactions.table) == 0
    # The same property on a message that is no transaction's is only a property.
    r = await p.client.invoke(b.addr, send_request("TxPackedBad", b"x", 0, props(**{PACKED_PROPERTY: "9"}),
                                                   producerGroup=GROUP))
    assert r.code == ResponseCode.SUCCESS, r.remark
    [m] = await pull_all(p.client, b, "TxPackedBad")
    assert m.body == b"x" and m.properties[PACKED_PROPERTY] == "9"


async def test_a_packed_half_sent_as_a_batch_request(start_broker: StartBroker,
                                                    producer_factory: list[Producer]) -> None:
    """The SDK's form: a batch request with cometmqHalfBatch=packed (a broker without the extension refuses it),
    the half's properties in its header; without the property the field is refused, nothing stored."""
    b = await start_broker()
    p = make_producer(producer_factory, b)
    half_props = props(UNIQ_KEY="PK", TRAN_MSG="true", PGROUP=GROUP, **{PACKED_PROPERTY: "3"})
    r = await p.client.invoke(b.addr, half_batch_request("TxPackedR", items(3), 2, properties=half_props,
                                                         **{HALF_BATCH_FIELD: PACKED_HALF}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert "," not in r.ext_fields["msgId"] and list(b.transactions.table.pending) == [int(r.ext_fields["queueOffset"])]
    r = await p.client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, end_fields(r, COMMIT)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert [m.body for m in await pull_all(p.client, b, "TxPackedR", 2)] == [b"p0", b"p1", b"p2"]
    end = b.store.commitlog.max_offset
    plain = props(UNIQ_KEY="PK2", TRAN_MSG="true", PGROUP=GROUP, note="cometmqPacked is not a property here")
    r = await p.client.invoke(b.addr, half_batch_request("TxPackedR", items(3), 2, properties=plain,
                                                         **{HALF_BATCH_FIELD: PACKED_HALF}))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "needs the property cometmqPacked" in (r.remark or "")
    assert b.store.commitlog.max_offset == end and len(b.transactions.table) == 0
