"""Receipt handles, transaction ids and message conversion (pure functions)."""

from __future__ import annotations

import gzip
import hashlib
import zlib

import pytest

from cometmq.grpc.convert import record_to_message, send_properties, timestamp_ms
from cometmq.grpc.handles import ReceiptHandle, TransactionRef, recall_broker_name
from cometmq.grpc.status import GrpcError, from_remoting
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MessageRecord, SysFlag
from cometmq.protocol.pop import ExtraInfo


def test_handles_round_trip_and_reject_garbage() -> None:
    rh = ReceiptHandle("broker-a", "Topic|With%Odd-Chars", ExtraInfo(3, 1700000000000, 30000, 0, "0", "broker-a", 2, 7),
                       123456)
    assert ReceiptHandle.decode(rh.encode()) == rh
    assert rh.queue_id == 2 and rh.offset == 7
    renewed = rh.renewed(1700000000500, 1000)
    assert renewed.extra_info.pop_time == 1700000000500 and renewed.encode() != rh.encode()
    tx = TransactionRef("127.0.0.1:10911", 4096, 12, "7F000001000027AF0000000000001000", "TXID", "PG")
    assert TransactionRef.decode(tx.encode()) == tx
    for bad in ("", "!!!", "aGVsbG8", tx.encode()):
        with pytest.raises(ProtocolError):
            ReceiptHandle.decode(bad)
    with pytest.raises(ProtocolError):
        TransactionRef.decode(rh.encode())


def test_recall_broker_name() -> None:
    import base64

    handle = base64.urlsafe_b64encode(b"v1 T broker-b 1700000000000 01AB").decode().rstrip("=")
    assert recall_broker_name(handle) == "broker-b"
    for bad in ("", "###", base64.urlsafe_b64encode(b"v2 T b 1 x").decode()):
        with pytest.raises(ProtocolError):
            recall_broker_name(bad)


def _msg(**sp: object) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="T"), body=b"body", system_properties=pb.SystemProperties(
        message_id="01ABC", **sp))  # type: ignore[arg-type]
    return m


def test_send_properties_map_system_fields() -> None:
    m = _msg(tag="A", keys=["k1", "k2"], message_group="g1", message_type=pb.FIFO)
    m.user_properties["color"] = "red"
    props, body = send_properties(m, 1024)
    assert body == b"body"
    assert props["TAGS"] == "A" and props["KEYS"] == "k1 k2" and props["__SHARDINGKEY"] == "g1"
    assert props["UNIQ_KEY"] == "01ABC" and props["color"] == "red"


def test_delivery_timestamp_in_seconds_or_milliseconds() -> None:
    m = _msg(message_type=pb.DELAY)
    m.system_properties.delivery_timestamp.seconds = 1_800_000_000
    m.system_properties.delivery_timestamp.nanos = 250_000_000
    assert send_properties(m, 1024)[0]["TIMER_DELIVER_MS"] == "1800000000250"
    m.system_properties.delivery_timestamp.seconds = 1_800_000_000_123  # the Python client's milliseconds
    m.system_properties.delivery_timestamp.nanos = 0
    assert timestamp_ms(m.system_properties.delivery_timestamp) == 1_800_000_000_123


def test_gzip_bodies_are_stored_inflated() -> None:
    m = _msg(body_encoding=pb.GZIP)
    m.body = gzip.compress(b"x" * 1000)
    assert send_properties(m, 4096)[1] == b"x" * 1000
    m.body = b"not gzip"
    with pytest.raises(GrpcError) as info:
        send_properties(m, 4096)
    assert info.value.code == pb.Code.MESSAGE_CORRUPTED


@pytest.mark.parametrize(("sp", "user", "code"), [
    ({}, {"UNIQ_KEY": "x"}, pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ({"tag": ""}, {}, pb.Code.ILLEGAL_MESSAGE_TAG),
    ({"keys": ["a b"]}, {}, pb.Code.ILLEGAL_MESSAGE_KEY),
    ({"message_group": ""}, {}, pb.Code.ILLEGAL_MESSAGE_GROUP),
    ({"message_type": pb.DELAY}, {}, pb.Code.ILLEGAL_DELIVERY_TIME),
    ({}, {"big": "v" * 40000}, pb.Code.MESSAGE_PROPERTIES_TOO_LARGE),
])
def test_bad_messages(sp: dict[str, object], user: dict[str, str], code: int) -> None:
    m = _msg(**sp)
    m.user_properties.update(user)
    with pytest.raises(GrpcError) as info:
        send_properties(m, 1024)
    assert info.value.code == code


def test_no_message_id_and_too_large_body() -> None:
    m = pb.Message(topic=pb.Resource(name="T"), body=b"b")
    with pytest.raises(GrpcError) as info:
        send_properties(m, 1024)
    assert info.value.code == pb.Code.ILLEGAL_MESSAGE_ID
    with pytest.raises(GrpcError) as info:
        send_properties(_msg(), 3)
    assert info.value.code == pb.Code.MESSAGE_BODY_TOO_LARGE


def test_record_to_message() -> None:
    body = b"payload" * 100
    rec = MessageRecord(topic="T", body=zlib.compress(body), queue_id=2, queue_offset=9, physical_offset=4096,
                        sys_flag=SysFlag.COMPRESSED, born_timestamp=1_700_000_000_123,
                        store_timestamp=1_700_000_000_456,
                        store_host=("127.0.0.1", 10911), reconsume_times=2,
                        properties={"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "01FF", "__SHARDINGKEY": "g",
                                    "color": "red", "POP_CK": "x", "TIMER_DELIVER_MS": "1700000001000"})
    m = record_to_message(rec, receipt_handle="h", invisible_ms=1500)
    sp = m.system_properties
    assert m.body == body and sp.body_encoding == pb.IDENTITY
    assert sp.body_digest.type == pb.MD5 and sp.body_digest.checksum == hashlib.md5(body).hexdigest().upper()
    assert sp.message_id == "01FF" and sp.tag == "A" and list(sp.keys) == ["k1", "k2"] and sp.message_group == "g"
    assert sp.message_type == pb.FIFO and sp.delivery_attempt == 3 and sp.queue_id == 2 and sp.queue_offset == 9
    assert sp.born_timestamp.seconds == 1_700_000_000 and sp.born_timestamp.nanos == 123_000_000
    assert sp.delivery_timestamp.seconds == 1_700_000_001
    assert sp.receipt_handle == "h" and sp.invisible_duration.seconds == 1 and sp.invisible_duration.nanos == 5 * 10**8
    assert dict(m.user_properties) == {"color": "red"}  # system properties stay hidden
    no_uniq = record_to_message(MessageRecord(topic="T", body=b"", physical_offset=16, store_host=("10.0.0.1", 1)))
    assert no_uniq.system_properties.message_id == "0A000001000000010000000000000010"


def test_remoting_codes_map_to_grpc_codes() -> None:
    assert from_remoting(ResponseCode.SUCCESS) == pb.Code.OK
    assert from_remoting(ResponseCode.TOPIC_NOT_EXIST) == pb.Code.TOPIC_NOT_FOUND
    assert from_remoting(ResponseCode.NO_MESSAGE) == pb.Code.INVALID_RECEIPT_HANDLE
    assert from_remoting(ResponseCode.SYSTEM_BUSY) == pb.Code.TOO_MANY_REQUESTS
    # replication ([11]): stored but not acknowledged by the in-sync replicas; a replica refusing a send
    assert from_remoting(ResponseCode.FLUSH_SLAVE_TIMEOUT) == pb.Code.SLAVE_PERSISTENCE_TIMEOUT
    assert from_remoting(ResponseCode.FLUSH_DISK_TIMEOUT) == pb.Code.MASTER_PERSISTENCE_TIMEOUT
    assert from_remoting(99999) == pb.Code.INTERNAL_SERVER_ERROR


def test_send_v2_fields_match_the_header_codec() -> None:
    """The endpoint builds SEND_MESSAGE_V2's header by hand (hot path); it must be what the codec would make."""
    from cometmq.grpc.backend import PROXY_PRODUCER_GROUP
    from cometmq.grpc.producer_rpcs import send_v2_fields
    from cometmq.protocol.headers import SendMessageRequestHeader, send_header_from_v2, send_header_to_v2

    header = SendMessageRequestHeader(producer_group=PROXY_PRODUCER_GROUP, topic="T", queue_id=3, sys_flag=4,
                                      born_timestamp=1_700_000_000_123, properties="UNIQ_KEY\x01x\x02")
    fields = send_v2_fields("T", 3, 4, 1_700_000_000_123, "UNIQ_KEY\x01x\x02")
    assert fields == send_header_to_v2(header)
    assert send_header_from_v2(fields) == header
