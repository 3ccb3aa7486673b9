"""POP consumption on the wire (RocketMQ 5): request/response headers, the "extra info" string that
identifies one delivery of one message (the receipt handle), and the offset-info strings of a POP answer.

Extra info is RocketMQ's space-separated string::

    ckQueueOffset popTime invisibleTime reviveQid retryFlag brokerName queueId queueOffset

``popTime`` names the delivery: a later delivery of the same message (after its invisible time, or after a
change of invisible time) has a later pop time, so a handle from an earlier delivery is recognisably stale.
A POP answer carries ``startOffsetInfo`` / ``msgOffsetInfo`` / ``orderCountInfo`` (``retryFlag queueId
value`` items joined by ``;``) from which a client builds the extra info of each message with
:func:`extra_info_for`, as RocketMQ's Java client does. (The broker does not rewrite each record to add a
``POP_CK`` property: the records go out exactly as stored, apart from the reconsume count of a redelivery.)
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError
from cometmq.protocol.headers import Header, JInt, JLong

#: Property carrying a popped message's extra info (RocketMQ's MessageConst.PROPERTY_POP_CK).
POP_CK = "POP_CK"
#: Property with the time of a message's first delivery by POP.
FIRST_POP_TIME = "1ST_POP_TIME"

NORMAL_TOPIC_FLAG = "0"
RETRY_TOPIC_FLAG = "1"
RETRY_TOPIC_V2_FLAG = "2"

#: The longest invisible time a POP or a change of invisible time may ask for: 12 hours (RocketMQ's proxy refuses
#: longer ones, ProxyConfig.maxInvisibleTimeMills, with ILLEGAL_INVISIBLE_TIME; the broker and the gRPC endpoint
#: both refuse them here).
MAX_INVISIBLE_MS = 12 * 3600 * 1000

#: ConsumeInitMode: where a group with no offset starts.
INIT_MODE_MIN = 0
INIT_MODE_MAX = 1


@dataclass(frozen=True, slots=True)
class PopMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt  # -1: any queue of the topic, the broker picks
    max_msg_nums: JInt
    invisible_time: JLong  # ms
    poll_time: JLong  # ms to hold the request when nothing is there (0: answer at once)
    born_time: JLong
    init_mode: JInt
    exp_type: str | None = None
    exp: str | None = None
    order: bool | None = None
    attempt_id: str | None = None


@dataclass(frozen=True, slots=True)
class PopMessageResponseHeader(Header):
    pop_time: JLong
    invisible_time: JLong
    revive_qid: JInt
    rest_num: JLong
    start_offset_info: str | None = None
    msg_offset_info: str | None = None
    order_count_info: str | None = None


@dataclass(frozen=True, slots=True)
class AckMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    extra_info: str
    offset: JLong


@dataclass(frozen=True, slots=True)
class ChangeInvisibleTimeRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    extra_info: str
    offset: JLong
    invisible_time: JLong


@dataclass(frozen=True, slots=True)
class ChangeInvisibleTimeResponseHeader(Header):
    pop_time: JLong
    invisible_time: JLong
    revive_qid: JInt


@dataclass(frozen=True, slots=True)
class PeekMessageRequestHeader(Header):
    topic: str
    queue_id: JInt
    max_msg_nums: JInt
    consumer_group: str


@dataclass(frozen=True, slots=True)
class NotificationRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    poll_time: JLong
    born_time: JLong
    order: bool | None = None
    attempt_id: str | None = None


@dataclass(frozen=True, slots=True)
class NotificationResponseHeader(Header):
    has_msg: bool
    polling_full: bool | None = None


# -- extra info ------------------------------------------------------------------------------------------
class ExtraInfo(NamedTuple):
    """One delivery of one message. ``str()`` gives the wire form; ``ExtraInfo.parse`` reads it back.
    (A named tuple: a POP answer makes one per message, and tuples are the cheapest to build.)"""

    ck_queue_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry_flag: str
    broker_name: str
    queue_id: int
    queue_offset: int

    def __str__(self) -> str:
        return (f"{self.ck_queue_offset} {self.pop_time} {self.invisible_time} {self.revive_qid} "
                f"{self.retry_flag} {self.broker_name} {self.queue_id} {self.queue_offset}")

    @classmethod
    def parse(cls, text: str) -> ExtraInfo:
        parts = text.split(" ") if isinstance(text, str) else []
        if len(parts) != 8:
            raise RemoteProtocolError(f"extra info {text!r} has {len(parts)} fields, expected 8")
        try:
            return cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5],
                       int(parts[6]), int(parts[7]))
        except ValueError:
            raise RemoteProtocolError(f"extra info {text!r} has a non-numeric field") from None

    @property
    def visible_at(self) -> int:
        """When this delivery's invisible time ends (ms)."""
        return self.pop_time + self.invisible_time

    def renewed(self, pop_time: int, invisible_time: int) -> ExtraInfo:
        """The handle after CHANGE_MESSAGE_INVISIBLETIME answered with this pop time and invisible time."""
        return self._replace(pop_time=pop_time, invisible_time=invisible_time)


def retry_flag_of(topic: str) -> str:
    if topic.startswith("%RETRY%"):
        return RETRY_TOPIC_V2_FLAG if "+" in topic else RETRY_TOPIC_FLAG
    return NORMAL_TOPIC_FLAG


def build_offset_info(items: list[tuple[str, int, str]]) -> str:
    """``[(retryFlag, queueId, value)]`` -> ``"0 1 5;0 2 7"`` (value is an offset or a comma list of them)."""
    return ";".join(f"{flag} {qid} {value}" for flag, qid, value in items)


def parse_offset_info(text: str | None) -> dict[tuple[str, int], list[int]]:
    """Parse startOffsetInfo / msgOffsetInfo / orderCountInfo: ``{(retryFlag, queueId): [values]}``."""
    out: dict[tuple[str, int], list[int]] = {}
    if not text:
        return out
    for item in text.split(";"):
        parts = item.split(" ")
        if len(parts) != 3:
            raise RemoteProtocolError(f"offset info item {item!r} is not 'retryFlag queueId values'")
        try:
            key = (parts[0], int(parts[1]))
            values = [int(v) for v in parts[2].split(",") if v]
        except ValueError:
            raise RemoteProtocolError(f"offset info item {item!r} is not numeric") from None
        if key in out:
            raise RemoteProtocolError(f"offset info names queue {key[1]} twice")
        out[key] = values
    return out


def extra_info_for(header: PopMessageResponseHeader, topic: str, queue_id: int, queue_offset: int,
                   broker_name: str) -> ExtraInfo:
    """The extra info of one message of a POP answer, built from the answer's header (Java client's way)."""
    flag = retry_flag_of(topic)
    starts = parse_offset_info(header.start_offset_info)
    ck = starts.get((flag, queue_id), [queue_offset])[0]
    return ExtraInfo(ck, header.pop_time, header.invisible_time, header.revive_qid, flag, broker_name, queue_id,
                     queue_offset)


# -- BATCH_ACK_MESSAGE body ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BatchAck:
    """Acks of several messages of one queue popped together (RocketMQ's BatchAck; JSON keys c/t/r/so/q/rq/pt/it/b).
    ``offsets`` are the acked queue offsets; on the wire they are a Java BitSet relative to ``start_offset``."""

    consumer_group: str
    topic: str
    retry: str
    start_offset: int
    queue_id: int
    revive_queue_id: int
    pop_time: int
    invisible_time: int
    offsets: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        bits = 0
        for off in self.offsets:
            if off < self.start_offset:
                raise LocalProtocolError(f"acked offset {off} is below the batch start {self.start_offset}")
            bits |= 1 << (off - self.start_offset)
        return {"c": self.consumer_group, "t": self.topic, "r": self.retry, "so": self.start_offset,
                "q": self.queue_id, "rq": self.revive_queue_id, "pt": self.pop_time, "it": self.invisible_time,
                "b": _bits_to_base64(bits)}

    @classmethod
    def from_json(cls, raw: Any) -> BatchAck:
        if not isinstance(raw, dict):
            raise RemoteProtocolError("a batch ack must be a JSON object")

        def get(short: str, long: str) -> Any:
            return raw[short] if short in raw else raw.get(long)

        try:
            start = int(get("so", "startOffset"))
            bits = _base64_to_bits(get("b", "bitSet") or "")
            offsets = tuple(start + i for i in range(bits.bit_length()) if bits >> i & 1)
            return cls(str(get("c", "consumerGroup")), str(get("t", "topic")), str(get("r", "retry") or "0"), start,
                       int(get("q", "queueId")), int(get("rq", "reviveQueueId") or 0), int(get("pt", "popTime")),
                       int(get("it", "invisibleTime")), offsets)
        except (TypeError, ValueError, KeyError, binascii.Error) as exc:
            raise RemoteProtocolError(f"bad batch ack: {exc}") from None


def encode_batch_ack_body(broker_name: str, acks: list[BatchAck]) -> bytes:
    return json.dumps({"brokerName": broker_name, "acks": [a.to_json() for a in acks]},
                      separators=(",", ":")).encode()


def decode_batch_ack_body(body: bytes | None) -> tuple[str | None, list[BatchAck]]:
    if not body:
        raise RemoteProtocolError("BATCH_ACK_MESSAGE needs a body")
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"batch ack body is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("acks"), list):
        raise RemoteProtocolError("batch ack body needs an 'acks' list")
    return raw.get("brokerName"), [BatchAck.from_json(a) for a in raw["acks"]]


def _bits_to_base64(bits: int) -> str:
    """A Java BitSet goes on the wire as fastjson writes ``BitSet.toByteArray()``: base64 of little-endian bytes."""
    return binascii.b2a_base64(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), newline=False).decode()


def _base64_to_bits(text: Any) -> int:
    if not isinstance(text, str):
        raise ValueError("bit set must be a base64 string")
    return int.from_bytes(binascii.a2b_base64(text, strict_mode=True), "little")  # base64.b64decode(validate=True)
