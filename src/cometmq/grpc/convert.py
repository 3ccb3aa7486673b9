"""Messages between the two protocols: a gRPC ``Message`` becomes a remoting send (header fields, properties,
body), and a stored record (a POP or PULL body) becomes a gRPC ``Message``."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from cometmq.grpc.status import GrpcError
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol import properties as P
from cometmq.protocol.message import MessageRecord, SysFlag, inflate_body
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, encode_properties

#: RocketMQ's property names the 5.x protocol carries as system properties
SHARDING_KEY = "__SHARDINGKEY"
TRACE_CONTEXT = "TRACE_CONTEXT"
TRANSACTION_ID = "__transactionId__"
BORN_HOST = "BORN_HOST"
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"

#: properties that are RocketMQ's own: never shown as user properties, never accepted from them
SYSTEM_PROPERTIES = frozenset({
    P.TAGS, P.KEYS, P.WAIT, P.DELAY, P.UNIQ_KEY, P.RETRY_TOPIC, P.REAL_TOPIC, P.REAL_QID, P.TRAN_MSG, P.PGROUP,
    P.MIN_OFFSET, P.MAX_OFFSET, P.ORIGIN_MESSAGE_ID, P.RECONSUME_TIME, P.MAX_RECONSUME_TIMES, P.TIMER_DELIVER_MS,
    P.TIMER_DELAY_SEC, P.TIMER_DELAY_MS, "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
    "TIMER_DEL_UNIQKEY", "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "MSG_REGION", "TRACE_ON", "POP_CK", "1ST_POP_TIME", "INNER_NUM",
    "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET", SHARDING_KEY, TRACE_CONTEXT, TRANSACTION_ID, BORN_HOST,
    DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID, "CORRECTION_FLAG", "MSG_TYPE", "CLUSTER", "UNIQ_KEY",
    "TRAN_CHECK_FROM_MS",  # (cometmq's: on a renewed half, broker/transaction/messages.py)
})

#: a delivery timestamp above this many seconds is taken to be in milliseconds (year 5138 in seconds)
_MS_THRESHOLD = 10**11


def timestamp_ms(ts: Timestamp) -> int:
    """Milliseconds since the epoch. The Python 5.x client puts whatever the caller passed into ``seconds``;
    its docs say milliseconds and its example passes seconds, so a huge ``seconds`` is read as milliseconds."""
    if ts.seconds > _MS_THRESHOLD:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def to_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def to_duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def message_type_of(msg: pb.Message) -> int:
    sp = msg.system_properties
    if sp.message_type:
        return int(sp.message_type)
    if sp.HasField("message_group"):
        return pb.FIFO
    if sp.HasField("delivery_timestamp"):
        return pb.DELAY
    return pb.NORMAL


def send_properties(msg: pb.Message, max_body_size: int) -> tuple[dict[str, str], bytes]:
    """Properties and body for SEND_MESSAGE from one gRPC message; bad input raises GrpcError."""
    sp = msg.system_properties
    body = bytes(msg.body)
    if sp.body_encoding == pb.GZIP:
        body = gunzip(body, max_body_size)
    if len(body) > max_body_size:
        raise GrpcError(pb.Code.MESSAGE_BODY_TOO_LARGE, f"body of {len(body)} bytes exceeds {max_body_size}")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in SYSTEM_PROPERTIES:
            raise GrpcError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is a system property")
        if not key:
            raise GrpcError(pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "a user property has an empty key")
        props[key] = value
    if not sp.message_id:
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_ID, "the message carries no message_id")
    props[P.UNIQ_KEY] = sp.message_id
    props[P.WAIT] = "true"
    if sp.HasField("tag"):
        if not sp.tag or "|" in sp.tag or any(c.isspace() for c in sp.tag):
            raise GrpcError(pb.Code.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} is empty or has '|' or blanks")
        props[P.TAGS] = sp.tag
    keys = [k for k in sp.keys]
    if any(not k or any(c.isspace() for c in k) for k in keys):
        raise GrpcError(pb.Code.ILLEGAL_MESSAGE_KEY, "a message key is empty or has blanks")
    if keys:
        props[P.KEYS] = " ".join(keys)
    mtype = message_type_of(msg)
    if sp.HasField("message_group"):
        if not sp.message_group:
            raise GrpcError(pb.Code.ILLEGAL_MESSAGE_GROUP, "the message group is empty")
        props[SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        props[P.TIMER_DELIVER_MS] = str(timestamp_ms(sp.delivery_timestamp))
    elif mtype == pb.DELAY:
        raise GrpcError(pb.Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery_timestamp")
    if sp.HasField("trace_context") and sp.trace_context:
        props[TRACE_CONTEXT] = sp.trace_context
    if sp.born_host:
        props[BORN_HOST] = sp.born_host
    if len(encode_properties(props)) > MAX_PROPERTIES_LENGTH:
        raise GrpcError(pb.Code.MESSAGE_PROPERTIES_TOO_LARGE, "the message's properties exceed 32767 bytes")
    return props, body


def gunzip(data: bytes, limit: int) -> bytes:
    """A GZIP body expanded, but never past ``limit`` + 1 bytes: a small body can expand a thousandfold.
    MESSAGE_CORRUPTED when it is not gzip; the caller refuses what is longer than ``limit``."""
    out = bytearray()
    try:
        while data and len(out) <= limit:  # one gzip member after another, as gzip.decompress reads them
            d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out += d.decompress(data, limit + 1 - len(out))
            if not d.eof:
                if len(out) <= limit:
                    raise GrpcError(pb.Code.MESSAGE_CORRUPTED, "body is not gzip: it ends before its gzip stream")
                break
            data = d.unused_data.lstrip(b"\0")  # gzip allows zero padding after a member
    except zlib.error as exc:
        raise GrpcError(pb.Code.MESSAGE_CORRUPTED, f"body is not gzip: {exc}") from None
    return bytes(out)


def body_digest(body: bytes) -> pb.Digest:
    """MD5 as uppercase hex. Not CRC32: the clients disagree on its text (Python: 8 hex digits, Node: decimal),
    and a mismatch makes the Node push consumer drop the message as corrupted; both check MD5 the same way."""
    return pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def _type_of_record(props: Mapping[str, str]) -> int:
    if props.get(P.TRAN_MSG) == "true":
        return pb.TRANSACTION
    if SHARDING_KEY in props:
        return pb.FIFO
    if P.TIMER_DELIVER_MS in props or "TIMER_OUT_MS" in props or P.DELAY in props:
        return pb.DELAY
    return pb.NORMAL


def record_to_message(rec: MessageRecord, *, namespace: str = "", topic: str | None = None,
                      receipt_handle: str | None = None, invisible_ms: int | None = None,
                      max_body_size: int = 4 * 1024 * 1024) -> pb.Message:
    """A stored message as the 5.x clients expect it: identity-encoded body with an MD5 digest. A compressed body
    is inflated when it inflates to at most ``max_body_size`` bytes (the endpoint's limit on bodies)."""
    props = rec.properties
    body = rec.body
    if rec.sys_flag & SysFlag.COMPRESSED:
        inflated = inflate_body(body, max_body_size)
        if inflated is not None:
            body = inflated
        # else not ours to fix: hand it over as stored, the digest still matches what is sent
    sp = pb.SystemProperties(
        message_id=props.get(P.UNIQ_KEY) or offset_msg_id(rec.store_host, rec.physical_offset),
        body_digest=body_digest(body),
        body_encoding=pb.IDENTITY,
        message_type=_type_of_record(props),  # type: ignore[arg-type]
        born_timestamp=to_timestamp(rec.born_timestamp),
        born_host=props.get(BORN_HOST) or rec.born_host[0],
        store_timestamp=to_timestamp(rec.store_timestamp),
        store_host=f"{rec.store_host[0]}:{rec.store_host[1]}",
        queue_id=rec.queue_id,
        queue_offset=rec.queue_offset,
        delivery_attempt=rec.reconsume_times + 1,
    )
    tag = props.get(P.TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(P.KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    if SHARDING_KEY in props:
        sp.message_group = props[SHARDING_KEY]
    deliver = props.get(P.TIMER_DELIVER_MS) or props.get("TIMER_OUT_MS")
    if deliver and deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(to_timestamp(int(deliver)))
    if TRACE_CONTEXT in props:
        sp.trace_context = props[TRACE_CONTEXT]
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.CopyFrom(to_duration(invisible_ms))
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    return pb.Message(topic=pb.Resource(resource_namespace=namespace, name=topic or props.get(P.REAL_TOPIC)
                                        or rec.topic),
                      user_properties=user, system_properties=sp, body=body)
