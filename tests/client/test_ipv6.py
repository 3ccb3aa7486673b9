"""End to end over IPv6: a nameserver and a broker listening on ::1, the SDK sending and pulling, the Spark decoder
reading a pull answer. The records carry 20-byte IPv6 born and store hosts (BORNHOST_V6 / STOREHOST_V6)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client import Admin, LitePullConsumer, Message, MessageExt, MessageQueue, Producer
from cometmq.client.pulled import decode_pulled
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import SysFlag, decode_record, encode_record, iter_records
from cometmq.protocol.msgid import decode_offset_msg_id, offset_msg_id
from cometmq.spark import decode
from cometmq.spark.schema import arrow_schema, read_schema
from tests.broker.conftest import pull_request, send_request


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
V6_HOSTS = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[NamesrvController, BrokerController]]:
    ns = NamesrvController(NamesrvConfig(host="::1", port=0))
    await ns.start()
    try:
        cfg = BrokerConfig(listen_host="::1", listen_port=0, broker_name="broker-6", namesrv_addr=f"[::1]:{ns.port}")
        b = BrokerController(cfg.replace(store=cfg.store.replace(
            store_path=tmp_path / "broker", commitlog_segment_size=1 << 20, consume_queue_units_per_file=1000,
            max_hash_slot_num=1024, max_index_num=8192, max_message_size=256 * 1024)))
        await b.start()
        try:
            yield ns, b
        finally:
            await b.stop()
    finally:
        await ns.stop()


async def _poll(c: LitePullConsumer, n: int) -> list[MessageExt]:
    got: list[MessageExt] = []
    for _ in range(40):
        got += await c.poll(0.5)
        if len(got) >= n:
            break
    return got


async def test_send_pull_and_spark_decode_over_ipv6(broker: tuple[NamesrvController, BrokerController]) -> None:
    ns, b = broker
    port = b.config.listen_port
    namesrv = f"[::1]:{ns.port}"
    assert b.addr == f"::1:{port}"
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic("V6", read_queues=1, write_queues=1)
    q = MessageQueue("V6", "broker-6", 0)
    async with Producer("pg6", namesrv=namesrv) as p:
        sent = [await p.send(Message("V6", f"m{i}".encode(), tags="t", keys=f"k{i}"), queue=q) for i in range(3)]
    assert all(r.ok for r in sent)

    async with LitePullConsumer("cg6", namesrv=namesrv, consume_from="first", long_poll_timeout=2.0) as c:
        await c.assign([q])
        got = await _poll(c, 3)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
    store = b.store
    for m, r in zip(got, sent, strict=True):
        assert m.msg_id == r.msg_id  # the UNIQ_KEY the producer set
        host, client_port = m.born_host.rsplit(":", 1)
        assert host == "[::1]" and int(client_port) > 0  # the producer's IPv6 connection
        assert m.store_host == f"[::1]:{port}"
        assert m.sys_flag & V6_HOSTS == V6_HOSTS
        assert m.offset_msg_id == offset_msg_id(("::1", port), m.commit_log_offset)
        assert len(m.offset_msg_id) == 56
        assert decode_offset_msg_id(m.offset_msg_id) == ("::1", port, m.commit_log_offset)
        assert (m.queue_offset, m.tags, m.keys) == (r.queue_offset, "t", [f"k{m.body.decode()[1:]}"])
        # Every lazily decoded field equals what the eager decoder makes of the stored record.
        view = store.read_record(m.commit_log_offset)
        assert view is not None
        [rec] = list(iter_records(bytes(view)))
        assert m == MessageExt.from_record(rec, "broker-6")
        assert rec.born_host == ("::1", int(client_port)) and rec.store_host == ("::1", port)

    # A message without a UNIQ_KEY (its msgId is then the offset id), and a pull answer for the Spark decoder,
    # both over IPv6 with the broker's own protocol.
    client = RemotingClient()
    try:
        reply = await client.invoke(b.addr, send_request("V6", b"raw", properties="TAGS\x01r\x02"))
        assert reply.code == ResponseCode.SUCCESS
        answer = await client.invoke(b.addr, pull_request("V6", 0, suspend_ms=0))
        assert answer.code == ResponseCode.SUCCESS and answer.body
    finally:
        await client.close()
    body = answer.body
    recs = list(iter_records(body))
    assert len(recs) == 4 and all(r.born_host[0] == "::1" and r.store_host == ("::1", port) for r in recs)
    raw_id = offset_msg_id(recs[3].store_host, recs[3].physical_offset)
    # the SDK's decoder of the same answer
    pulled = decode_pulled(body, q)
    assert [m.msg_id for m in pulled] == [r.msg_id for r in sent] + [raw_id]
    assert [m.store_host for m in pulled] == [f"[::1]:{port}"] * 4
    for schema in (arrow_schema(read_schema()), arrow_schema(read_schema(include_properties=False))):
        reference = decode._decode_py(body, "V6", "broker-6", schema)
        rows = reference.to_pylist()
        assert [row["msgId"] for row in rows] == [r.msg_id for r in sent] + [raw_id]
        assert [row["body"] for row in rows] == [b"m0", b"m1", b"m2", b"raw"]
        assert [row["tags"] for row in rows] == ["t", "t", "t", "r"]
        assert [row["queueOffset"] for row in rows] == [0, 1, 2, 3]
        assert [int(row["storeTimestamp"].timestamp() * 1000) for row in rows] == [r.store_timestamp for r in recs]
        assert [int(row["bornTimestamp"].timestamp() * 1000) for row in rows] == [r.born_timestamp for r in recs]
        if decode.C_HELPER is not None:  # the C path decodes IPv6 records itself, to the same batch
            assert decode.C_HELPER.decode([body], "properties" in schema.names, decode._WANTED, decode._HIDDEN)
            assert decode.decode_answers([body], "V6", "broker-6", schema).equals(reference)


async def test_a_pop_redelivery_counts_in_a_record_with_ipv6_hosts(
        broker: tuple[NamesrvController, BrokerController]) -> None:
    """POP raises the reconsume count of a redelivered record in place: where it is depends on the hosts."""
    _, b = broker
    client = RemotingClient()
    try:
        b.topics.create_system_topic("V6P", 1)
        reply = await client.invoke(b.addr, send_request("V6P", b"x"))
        assert reply.code == ResponseCode.SUCCESS
    finally:
        await client.close()
    [record] = b.store.get_messages("V6P", 0, 0, 1).buffers
    bumped = b.pop.with_attempts(record, 3)
    rec, _ = decode_record(bumped)
    assert rec.reconsume_times == 3 and rec.born_host[0] == "::1" and rec.store_host[0] == "::1"
    assert bytes(bumped) == encode_record(rec)


async def test_the_send_reply_msg_id_has_the_ipv6_store_host(
        broker: tuple[NamesrvController, BrokerController]) -> None:
    _, b = broker
    client = RemotingClient()
    try:
        b.topics.create_system_topic("V6R", 1)
        reply = await client.invoke(b.addr, send_request("V6R", b"x"))
    finally:
        await client.close()
    assert reply.code == ResponseCode.SUCCESS
    [record] = b.store.get_messages("V6R", 0, 0, 1).buffers
    rec, _ = decode_record(record)
    assert reply.ext_fields["msgId"] == offset_msg_id(rec.store_host, rec.physical_offset)
