"""Which side each codec blames: decoding what a peer sent raises RemoteProtocolError (answered with a response
code), encoding what we built raises LocalProtocolError (our bug, logged loudly)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cometmq.protocol.batch import decode_batch, encode_batch_raw
from cometmq.protocol.client_bodies import HeartbeatData, LockBatchBody, decode_consumer_list
from cometmq.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from cometmq.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader, send_header_from_v2
from cometmq.protocol.pop import BatchAck, ExtraInfo, decode_batch_ack_body, parse_offset_info
from cometmq.protocol.properties import check_utf8, decode_properties, encode_properties
from cometmq.protocol.remoting import RemotingCommand, SerializeType, encode
from cometmq.protocol.route import RegisterBrokerBody, TopicRouteData

DECODERS: dict[str, Callable[[], object]] = {
    "header missing": lambda: SendMessageRequestHeader.from_ext({"topic": "T"}),
    "header bad int": lambda: PullMessageRequestHeader.from_ext(
        {"consumerGroup": "G", "topic": "T", "queueId": "x", "queueOffset": "0"}),
    "v2 header bad bool": lambda: send_header_from_v2({"a": "P", "b": "T", "k": "maybe"}),
    "batch": lambda: decode_batch(b"junk"),
    "properties": lambda: decode_properties(b"\xff\x01\x02"),
    "properties utf-8": lambda: check_utf8(b"\xff"),
    "heartbeat": lambda: HeartbeatData.decode(b"{not json"),
    "lock body": lambda: LockBatchBody.decode(b"{}"),
    "consumer list": lambda: decode_consumer_list(b'{"consumerIdList": 5}'),
    "extra info": lambda: ExtraInfo.parse("garbage"),
    "offset info": lambda: parse_offset_info("x"),
    "batch ack": lambda: decode_batch_ack_body(b"[]"),
    "route": lambda: TopicRouteData.decode(b"[]"),
    "register body": lambda: RegisterBrokerBody.decode(b"\x00", compressed=True),
}


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoding_a_peers_bytes_raises_remote_protocol_error(name: str) -> None:
    with pytest.raises(RemoteProtocolError):
        DECODERS[name]()


ENCODERS: dict[str, Callable[[], object]] = {
    "property name with a separator": lambda: encode_properties({"a\x01b": "v"}),
    "empty property name": lambda: encode_properties({"": "v"}),
    "batch item out of range": lambda: encode_batch_raw([(b"x", b"", 2**40)]),
    "batch ack below its start": lambda: BatchAck("G", "T", "0", 10, 1, 0, 0, 0, (5,)).to_json(),
    "binary header code": lambda: encode(RemotingCommand(2**20, serialize_type=SerializeType.ROCKETMQ)),
    "non-scalar ext field": lambda: encode(RemotingCommand(1, ext_fields={"a": [1]})),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoding_something_invalid_raises_local_protocol_error(name: str) -> None:
    with pytest.raises(LocalProtocolError):
        ENCODERS[name]()


def test_both_are_protocol_errors() -> None:
    assert issubclass(LocalProtocolError, ProtocolError) and issubclass(RemoteProtocolError, ProtocolError)
