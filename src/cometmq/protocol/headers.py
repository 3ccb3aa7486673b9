"""Typed request headers: the extFields of each request, parsed and checked.

Every value arrives as a string (the codec normalises the C++ client's mix of numbers and strings).
A missing required field or a value of the wrong type raises ProtocolError naming the field; the
broker turns that into a response code with the same remark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from cometmq.protocol.errors import ProtocolError

H = TypeVar("H", bound="Header")


def parse_bool(value: str) -> bool:
    """RocketMQ clients send booleans as "true"/"false", and the C++ batch flag as "1"/"0"."""
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


@dataclass(frozen=True, slots=True)
class Header:
    """Base of typed headers. Field names are snake_case; ``WIRE`` maps them to extFields keys."""

    WIRE: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_ext(cls: type[H], ext: Mapping[str, str]) -> H:
        values: dict[str, Any] = {}
        for name, key, kind, required in _spec(cls):
            raw = ext.get(key)
            if raw is None:
                if required:
                    raise ProtocolError(f"header field {key!r} is missing")
                continue
            values[name] = _convert(key, raw, kind)
        return cls(**values)

    def to_ext(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, key, kind, _required in _spec(type(self)):
            value = getattr(self, name)
            if value is None:
                continue
            out[key] = ("true" if value else "false") if kind == "bool" else str(value)
        return out


_SPECS: dict[type, list[tuple[str, str, str, bool]]] = {}


def _spec(cls: type) -> list[tuple[str, str, str, bool]]:
    """(field name, wire key, kind, required) per field; computed once per header class."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = []
        wire: dict[str, str] = getattr(cls, "WIRE", {})
        for f in fields(cls):
            typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            kind = "int" if typ.startswith("int") else "bool" if typ.startswith("bool") else "str"
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            spec.append((f.name, wire.get(f.name, _camel(f.name)), kind, required))
        _SPECS[cls] = spec
    return spec


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _convert(key: str, raw: str, kind: str) -> Any:
    try:
        if kind == "int":
            return int(raw.strip())
        if kind == "bool":
            return parse_bool(raw)
        return raw
    except ValueError:
        raise ProtocolError(f"header field {key!r} has a bad value {raw!r}") from None


# -- producer ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    default_topic: str = "TBW102"
    default_topic_queue_nums: int = 4
    queue_id: int = -1
    sys_flag: int = 0
    born_timestamp: int = 0
    flag: int = 0
    properties: str = ""
    reconsume_times: int = 0
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False


#: SEND_MESSAGE_V2 (310) shortens every field name to one letter.
_V2_KEYS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}
_V2_REVERSE = {v: k for k, v in _V2_KEYS.items()}


def send_header_from_v2(ext: Mapping[str, str]) -> SendMessageRequestHeader:
    return SendMessageRequestHeader.from_ext({_V2_KEYS.get(k, k): v for k, v in ext.items()})


def send_header_to_v2(header: SendMessageRequestHeader) -> dict[str, str]:
    return {_V2_REVERSE.get(k, k): v for k, v in header.to_ext().items()}


@dataclass(frozen=True, slots=True)
class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    WIRE: ClassVar[dict[str, str]] = {"msg_id": "msgId"}


# -- consumer ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    sys_flag: int = 0
    commit_offset: int = 0
    suspend_timeout_millis: int = 15000
    subscription: str | None = None
    sub_version: int = 0
    expression_type: str | None = None
    max_msg_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None


@dataclass(frozen=True, slots=True)
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


@dataclass(frozen=True, slots=True)
class TopicQueueHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ViewMessageRequestHeader(Header):
    offset: int


@dataclass(frozen=True, slots=True)
class QueryMessageRequestHeader(Header):
    topic: str
    key: str
    max_num: int = 32
    begin_timestamp: int = 0
    end_timestamp: int = 2**62


@dataclass(frozen=True, slots=True)
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int
    group: str
    delay_level: int = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


@dataclass(frozen=True, slots=True)
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str


@dataclass(frozen=True, slots=True)
class UnregisterClientRequestHeader(Header):
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None
    WIRE: ClassVar[dict[str, str]] = {"client_id": "clientID"}


@dataclass(frozen=True, slots=True)
class EndTransactionRequestHeader(Header):
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    msg_id: str | None = None
    transaction_id: str | None = None
    from_transaction_check: bool = False


@dataclass(frozen=True, slots=True)
class CheckTransactionStateRequestHeader(Header):
    """Broker -> producer (oneway); the body is the half message. ``topic`` and ``bname`` are RocketMQ 5's."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
    topic: str | None = None
    broker_name: str | None = None
    WIRE: ClassVar[dict[str, str]] = {"broker_name": "bname"}


# -- admin ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CreateTopicRequestHeader(Header):
    topic: str
    default_topic: str = "TBW102"
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicRequestHeader(Header):
    topic: str


@dataclass(frozen=True, slots=True)
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str
