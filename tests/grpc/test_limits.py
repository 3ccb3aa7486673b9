"""RocketMQ 5 proxy's limits on what clients send (grpc/limits.py; ProxyConfig keys with RocketMQ's defaults), each
at its boundary through a real endpoint: at the limit accepted, one past refused with RocketMQ's status code and a
message naming the limit, and nothing stored (the commit log did not grow)."""

from __future__ import annotations

import hashlib
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol.codes import RequestCode
from tests.broker.conftest import send_request
from tests.grpc.kit import TRANSPORTS, Endpoint, new_message_id, start_endpoint, stop_endpoint

OK = pb.Code.OK


def _message(topic: str, body: bytes = b"x", user: dict[str, str] | None = None, **system: object) -> pb.Message:
    sp = pb.SystemProperties(message_id=new_message_id(), **system)  # type: ignore[arg-type]
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp, user_properties=user or {})


async def _send(endpoint: Endpoint, msg: pb.Message) -> spb.SendMessageResponse:
    r: spb.SendMessageResponse = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[msg]))
    return r


async def _accepted(endpoint: Endpoint, msg: pb.Message) -> None:
    r = await _send(endpoint, msg)
    assert r.status.code == OK, r.status


async def _refused(endpoint: Endpoint, msg: pb.Message, code: int, names: str) -> None:
    """``msg`` is refused with ``code``, a message that contains ``names`` (the limit), and nothing stored."""
    before = endpoint.broker.store.commitlog.max_offset
    r = await _send(endpoint, msg)
    assert r.status.code == code, r.status
    assert names in r.status.message, r.status
    assert endpoint.broker.store.commitlog.max_offset == before


async def test_user_property_count(endpoint: Endpoint) -> None:
    """RocketMQ: userPropertyMaxNum 128, MESSAGE_PROPERTIES_TOO_LARGE."""
    await endpoint.create_topic("Props", queues=1)
    await _accepted(endpoint, _message("Props", user={f"p{i}": "v" for i in range(128)}))
    await _refused(endpoint, _message("Props", user={f"p{i}": "v" for i in range(129)}),
                   pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, "max_user_properties (128)")
    assert len(endpoint.broker.store.get_messages("Props", 0, 0, 10).buffers) == 1


async def test_user_property_size(endpoint: Endpoint) -> None:
    """RocketMQ: maxUserPropertySize 16 KiB: the UTF-8 bytes of user property keys and values, tag and keys."""
    await endpoint.create_topic("PropSize", queues=1)
    # "k" + "é…" (2 + 16379 bytes) + tag "T" + key "K" = 16384 bytes
    fits = "é" + "v" * 16379
    await _accepted(endpoint, _message("PropSize", user={"k": fits}, tag="T", keys=["K"]))
    await _refused(endpoint, _message("PropSize", user={"k": fits + "v"}, tag="T", keys=["K"]),
                   pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, "max_user_property_size (16384)")
    await _refused(endpoint, _message("PropSize", user={"k": fits}, tag="TT", keys=["K"]),
                   pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, "max_user_property_size (16384)")
    got = endpoint.broker.store.get_messages("PropSize", 0, 0, 10).buffers
    assert len(got) == 1


async def test_message_group_size(endpoint: Endpoint) -> None:
    """RocketMQ: maxMessageGroupSize 64, and a group of 64 UTF-8 bytes or more is refused (``>=``), as are a
    group of whitespace and one with a control character: ILLEGAL_MESSAGE_GROUP."""
    await endpoint.create_topic("Groups", queues=1)
    await _accepted(endpoint, _message("Groups", message_group="é" + "g" * 61, message_type=pb.FIFO))  # 63 bytes
    await _refused(endpoint, _message("Groups", message_group="é" + "g" * 62, message_type=pb.FIFO),
                   pb.Code.ILLEGAL_MESSAGE_GROUP, "max_message_group_size (64)")
    await _refused(endpoint, _message("Groups", message_group="  ", message_type=pb.FIFO),
                   pb.Code.ILLEGAL_MESSAGE_GROUP, "whitespace")
    await _refused(endpoint, _message("Groups", message_group="a\x01b", message_type=pb.FIFO),
                   pb.Code.ILLEGAL_MESSAGE_GROUP, "control character")
    assert len(endpoint.broker.store.get_messages("Groups", 0, 0, 10).buffers) == 1


def _at(ms: int) -> dict[str, Any]:
    return {"delivery_timestamp": {"seconds": ms // 1000, "nanos": ms % 1000 * 1_000_000},
            "message_type": pb.DELAY}


async def test_delivery_timestamp_at_most_a_day_ahead(endpoint: Endpoint) -> None:
    """RocketMQ: maxDelayTimeMills 24 h, ILLEGAL_DELIVERY_TIME (a timestamp in the past is fine)."""
    await endpoint.create_topic("Later", queues=1)
    day = 24 * 3600 * 1000
    now = int(time.time() * 1000)
    await _accepted(endpoint, _message("Later", **_at(now + day - 5_000)))
    await _accepted(endpoint, _message("Later", **_at(now - 60_000)))
    await _refused(endpoint, _message("Later", **_at(int(time.time() * 1000) + day + 5_000)),
                   pb.Code.ILLEGAL_DELIVERY_TIME, "max_delay_ms (86400000 ms)")


async def test_transaction_recovery_duration_at_most_an_hour(endpoint: Endpoint) -> None:
    """RocketMQ: maxTransactionRecoverySecond 3600, BAD_REQUEST."""
    await endpoint.create_topic("Tx", queues=1)
    await _accepted(endpoint, _message("Tx", message_type=pb.TRANSACTION,
                                       orphaned_transaction_recovery_duration=Duration(seconds=3600)))
    await _refused(endpoint, _message("Tx", message_type=pb.TRANSACTION,
                                      orphaned_transaction_recovery_duration=Duration(seconds=3601)),
                   pb.Code.BAD_REQUEST, "max_transaction_recovery_s (3600 s)")


async def test_empty_body(endpoint: Endpoint) -> None:
    """RocketMQ (5.3.2+): enableMessageBodyEmptyCheck on, MESSAGE_BODY_EMPTY."""
    await endpoint.create_topic("Empty", queues=1)
    await _accepted(endpoint, _message("Empty", b"1"))
    await _refused(endpoint, _message("Empty", b""), pb.Code.MESSAGE_BODY_EMPTY, "empty")
    assert len(endpoint.broker.store.get_messages("Empty", 0, 0, 10).buffers) == 1


async def test_body_size(endpoint: Endpoint) -> None:
    """RocketMQ: maxMessageSize 4 MiB, MESSAGE_BODY_TOO_LARGE (cometmq checked it already; here at the edge)."""
    await endpoint.create_topic("Big", queues=1)
    await _accepted(endpoint, _message("Big", b"b" * (4 << 20)))
    await _refused(endpoint, _message("Big", b"b" * ((4 << 20) + 1)), pb.Code.MESSAGE_BODY_TOO_LARGE, "4194304")


async def test_control_characters(endpoint: Endpoint) -> None:
    """RocketMQ refuses control characters (U+0000..U+001F, U+007F..U+009F) in tags (ILLEGAL_MESSAGE_TAG), keys
    (ILLEGAL_MESSAGE_KEY) and user property keys and values (ILLEGAL_MESSAGE_PROPERTY_KEY); the characters just
    outside those ranges are fine."""
    await endpoint.create_topic("Ctl", queues=1)
    await _accepted(endpoint, _message("Ctl", tag="~é\xa1", keys=["~é\xa1"], user={"~é\xa1": "~é\xa1 "}))
    for bad in ("\x00", "\x1f", "\x7f", "\x9f"):
        await _refused(endpoint, _message("Ctl", tag=f"t{bad}"), pb.Code.ILLEGAL_MESSAGE_TAG, "control character")
        await _refused(endpoint, _message("Ctl", keys=["ok", f"k{bad}"]), pb.Code.ILLEGAL_MESSAGE_KEY,
                       "control character")
        await _refused(endpoint, _message("Ctl", user={f"k{bad}": "v"}), pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                       "control character")
        await _refused(endpoint, _message("Ctl", user={"k": f"v{bad}"}), pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                       "control character")
    assert len(endpoint.broker.store.get_messages("Ctl", 0, 0, 10).buffers) == 1


async def test_limit_keys_change_and_turn_off_the_limits(tmp_path: Path) -> None:
    """Each limit is a ProxyConfig key: lower it and less is accepted; 0 turns it off (as in RocketMQ)."""
    ep = await start_endpoint(tmp_path / "low", max_user_properties=1, max_user_property_size=8,
                              max_message_group_size=4, max_delay_ms=60_000, max_transaction_recovery_s=10,
                              empty_body_check=False, max_body_size=10)
    try:
        await ep.create_topic("Low", queues=1)
        now = int(time.time() * 1000)
        await _accepted(ep, _message("Low", b"", user={"a": "1234567"}, message_group="abc"))
        await _refused(ep, _message("Low", user={"a": "1", "b": "2"}), pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                       "max_user_properties (1)")
        await _refused(ep, _message("Low", user={"a": "12345678"}), pb.Code.MESSAGE_PROPERTIES_TOO_LARGE,
                       "max_user_property_size (8)")
        await _refused(ep, _message("Low", message_group="abcd"), pb.Code.ILLEGAL_MESSAGE_GROUP,
                       "max_message_group_size (4)")
        await _refused(ep, _message("Low", **_at(now + 120_000)), pb.Code.ILLEGAL_DELIVERY_TIME, "max_delay_ms")
        await _refused(ep, _message("Low", message_type=pb.TRANSACTION,
                                    orphaned_transaction_recovery_duration=Duration(seconds=11)),
                       pb.Code.BAD_REQUEST, "max_transaction_recovery_s (10 s)")
    finally:
        await stop_endpoint(ep)
    ep = await start_endpoint(tmp_path / "off", max_user_properties=0, max_user_property_size=0,
                              max_message_group_size=0, max_delay_ms=0, max_transaction_recovery_s=0)
    try:
        await ep.create_topic("Off", queues=1)
        await _accepted(ep, _message("Off", user={f"p{i}": "v" * 200 for i in range(129)},
                                     message_group="g" * 100, **_at(int(time.time() * 1000) + 48 * 3600 * 1000)))
        await _accepted(ep, _message("Off", message_type=pb.TRANSACTION,
                                     orphaned_transaction_recovery_duration=Duration(seconds=7200)))
    finally:
        await stop_endpoint(ep)


def _receive_request(endpoint: Endpoint, topic: str, invisible_ms: int, **extra: object) -> spb.ReceiveMessageRequest:
    req = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=endpoint.queue(topic), batch_size=1,
                                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                                    **extra)  # type: ignore[arg-type]
    req.invisible_duration.FromMilliseconds(invisible_ms)
    req.long_polling_timeout.FromMilliseconds(0)
    return req


async def _receive(endpoint: Endpoint, req: spb.ReceiveMessageRequest) -> tuple[pb.Status, list[pb.Message]]:
    items = await endpoint.stream("ReceiveMessage", req)
    statuses = [i.status for i in items if i.HasField("status")]
    assert len(statuses) == 1, items
    return statuses[0], [i.message for i in items if i.HasField("message")]


async def test_receive_invisible_duration_at_least_ten_seconds(endpoint: Endpoint) -> None:
    """RocketMQ: minInvisibleTimeMillsForRecv 10 s, ILLEGAL_INVISIBLE_TIME; a refused receive takes nothing (the
    message is still there, first delivery). An auto-renewing receive is not held to it: RocketMQ's proxy then
    ignores the request's duration and uses its default (60 s)."""
    await endpoint.create_topic("Short", queues=1)
    await endpoint.send("Short", b"s")
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Short", 9_999))
    assert status.code == pb.Code.ILLEGAL_INVISIBLE_TIME and msgs == [], status
    assert "min_receive_invisible_ms (10000 ms)" in status.message
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Short", 10_000))
    assert status.code == OK and [m.system_properties.delivery_attempt for m in msgs] == [1], status
    assert msgs[0].system_properties.invisible_duration.ToMilliseconds() == 10_000
    assert (await endpoint.ack("Short", "G", *msgs)).status.code == OK
    await endpoint.send("Short", b"renewed")
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Short", 1_000, auto_renew=True))
    assert status.code == OK and msgs[0].system_properties.invisible_duration.ToMilliseconds() == 60_000, status


async def test_invisible_duration_at_most_twelve_hours(endpoint: Endpoint) -> None:
    """RocketMQ: maxInvisibleTimeMills 12 h, ILLEGAL_INVISIBLE_TIME, for ReceiveMessage and ChangeInvisibleDuration;
    a refused change leaves the delivery as it was (its handle still acks)."""
    await endpoint.create_topic("Long", queues=1)
    await endpoint.send("Long", b"l")
    twelve_hours = 12 * 3600 * 1000
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Long", twelve_hours + 1))
    assert status.code == pb.Code.ILLEGAL_INVISIBLE_TIME and msgs == [], status
    assert "max_invisible_ms (43200000 ms)" in status.message
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Long", twelve_hours))
    assert status.code == OK and len(msgs) == 1, status
    m = msgs[0]

    async def change(ms: int) -> spb.ChangeInvisibleDurationResponse:
        r: spb.ChangeInvisibleDurationResponse = await endpoint.call(
            "ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name="G"), topic=pb.Resource(name="Long"), message_id=m.system_properties.message_id,
                receipt_handle=m.system_properties.receipt_handle, invisible_duration=Duration(
                    seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)))
        return r

    r = await change(twelve_hours + 1)
    assert r.status.code == pb.Code.ILLEGAL_INVISIBLE_TIME and "max_invisible_ms" in r.status.message, r.status
    assert (await endpoint.ack("Long", "G", m)).status.code == OK  # the handle was not renewed: still current
    await endpoint.send("Long", b"l2")
    status, msgs = await _receive(endpoint, _receive_request(endpoint, "Long", 10_000))
    assert status.code == OK, status
    m = msgs[0]
    r = await change(twelve_hours)
    assert r.status.code == OK, r.status


async def test_invisible_limit_keys(tmp_path: Path) -> None:
    """min_receive_invisible_ms and max_invisible_ms are keys; 0 turns them off (the broker's own 12 h cap stays)."""
    ep = await start_endpoint(tmp_path / "keys", min_receive_invisible_ms=500, max_invisible_ms=20_000)
    try:
        await ep.create_topic("Keys", queues=1)
        await ep.send("Keys", b"k")
        status, _ = await _receive(ep, _receive_request(ep, "Keys", 499))
        assert status.code == pb.Code.ILLEGAL_INVISIBLE_TIME and "(500 ms)" in status.message, status
        status, _ = await _receive(ep, _receive_request(ep, "Keys", 20_001))
        assert status.code == pb.Code.ILLEGAL_INVISIBLE_TIME and "(20000 ms)" in status.message, status
        status, msgs = await _receive(ep, _receive_request(ep, "Keys", 500))
        assert status.code == OK and len(msgs) == 1, status
    finally:
        await stop_endpoint(ep)
    ep = await start_endpoint(tmp_path / "off", min_receive_invisible_ms=0, max_invisible_ms=0)
    try:
        await ep.create_topic("Off", queues=1)
        await ep.send("Off", b"o")
        status, _ = await _receive(ep, _receive_request(ep, "Off", 0))
        assert status.code == pb.Code.ILLEGAL_INVISIBLE_TIME, status  # 0 never: it would hide nothing
        status, _ = await _receive(ep, _receive_request(ep, "Off", 12 * 3600 * 1000 + 1))
        assert status.code == pb.Code.BAD_REQUEST, status  # the broker's cap
        status, msgs = await _receive(ep, _receive_request(ep, "Off", 1))
        assert status.code == OK and len(msgs) == 1, status
    finally:
        await stop_endpoint(ep)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_compressed_4x_body_is_inflated_to_max_body_size_at_most(tmp_path: Path, transport: str) -> None:
    """A 4.x producer's COMPRESSED body (zlib) is inflated for the 5.x consumers, but never past max_body_size: a
    stored body of a few KiB can inflate a thousandfold (4 MiB to 4 GiB), in the endpoint's memory, at each
    receive. Past the limit it goes as stored (as a body that does not inflate does), the digest its own."""
    limit = 64 << 10
    ep = await start_endpoint(tmp_path, transport=transport, max_body_size=limit)
    try:
        await ep.create_topic("Zip", queues=1)
        at_limit, over, bomb = b"a" * limit, b"o" * (limit + 1), bytes(64 << 20)
        stored = [zlib.compress(body) for body in (at_limit, over, bomb)]
        for body in stored:
            r = await ep.remoting(RequestCode.SEND_MESSAGE, send_request("Zip", body, sysFlag=1).ext_fields, body)
            assert r.code == 0, r.remark
        code, got = await ep.receive("Zip", "cg")
        assert code == OK
        assert [m.body for m in got] == [at_limit, stored[1], stored[2]]
        for m in got:
            sp = m.system_properties
            assert sp.body_encoding == pb.IDENTITY
            assert sp.body_digest.checksum == hashlib.md5(m.body).hexdigest().upper()
    finally:
        await stop_endpoint(ep)
