"""Typed request headers: the extFields of each request, parsed and checked.

Every value arrives as a string (the codec normalises the C++ client's mix of numbers and strings).
A missing required field or a value of the wrong type raises RemoteProtocolError naming the field; the
request dispatch (net/connection.py) answers it with the request's bad-request code and that text as remark.

Each numeric field is annotated with its Java type in RocketMQ's header class: ``JInt`` (``int`` / ``Integer``) or
``JLong`` (``long`` / ``Long``). A value outside that type's range is refused like a malformed one, with a remark
naming the field and the range (RocketMQ's decoder, ``Integer.parseInt`` / ``Long.parseLong``, cannot read it
either), so nothing past the parser sees one: not the store, not an answer a Java peer would have to read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeAlias, TypeVar, cast

from cometmq.protocol.errors import RemoteProtocolError

H = TypeVar("H", bound="Header")

#: A header field that RocketMQ's header class declares ``int`` / ``Integer``: 32 bits, signed.
JInt: TypeAlias = int
#: ... ``long`` / ``Long``: 64 bits, signed.
JLong: TypeAlias = int
#: Each numeric kind's range (both ends included): the values a Java peer can read and write.
RANGES: dict[str, tuple[int, int]] = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
#: annotation (its first name) -> field kind
_KINDS = {"JInt": "int", "JLong": "long", "bool": "bool", "str": "str"}


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
        parse = _PARSERS.get(cls)
        if parse is None:
            parse = _PARSERS[cls] = _compile_parser(cls, {key: (key,) for _, key, _, _ in _spec(cls)})
        return cast(H, parse(ext))

    def to_ext(self) -> dict[str, str]:
        cls = type(self)
        write = _WRITERS.get(cls)
        if write is None:
            write = _WRITERS[cls] = _compile_writer(cls, {key: key for _, key, _, _ in _spec(cls)})
        return write(self)


_SPECS: dict[type, list[tuple[str, str, str, bool]]] = {}
_PARSERS: dict[type, Callable[[Mapping[str, str]], Header]] = {}
_WRITERS: dict[type, Callable[[Any], dict[str, str]]] = {}


def _spec(cls: type) -> list[tuple[str, str, str, bool]]:
    """(field name, wire key, kind, required) per field; computed once per header class. The kind is ``int`` or
    ``long`` (a ``RANGES`` key), ``bool`` or ``str``."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = []
        wire: dict[str, str] = getattr(cls, "WIRE", {})
        for f in fields(cls):
            typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            kind = _KINDS.get(typ.split("|")[0].strip())
            if kind is None:  # (a plain int says nothing of its Java type)
                raise TypeError(f"{cls.__name__}.{f.name}: annotate a header field JInt, JLong, bool or str "
                                f"(optionally | None), not {typ!r}")
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            spec.append((f.name, wire.get(f.name, _camel(f.name)), kind, required))
        _SPECS[cls] = spec
    return spec


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _missing(key: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"header field {key!r} is missing")


def _bad(key: str, raw: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"header field {key!r} has a bad value {raw!r}")


def _out_of_range(key: str, raw: str, kind: str) -> RemoteProtocolError:
    lo, hi = RANGES[kind]
    shown = repr(raw) if len(raw) <= 40 else f"{raw[:40]!r}... ({len(raw)} characters)"
    return RemoteProtocolError(f"header field {key!r} = {shown} is out of range for a Java {kind} [{lo}, {hi}]")


def field_ranges(cls: type) -> dict[str, tuple[int, int]]:
    """The range of each numeric field of header class ``cls``, by wire key."""
    return {key: RANGES[kind] for _, key, kind, _ in _spec(cls) if kind in RANGES}


def _bool(key: str, raw: str) -> bool:
    try:
        return parse_bool(raw)
    except ValueError:
        raise _bad(key, raw) from None


# The parsers and writers are generated per header class, once, the way dataclasses generates __init__: a
# straight-line function with each field's lookup and conversion inlined, writing the frozen instance's slots
# directly. The generic loop they replace (a spec walk, a conversion call per field, ``cls(**values)`` and its
# ``object.__setattr__`` per field) cost ~5 us for a send header on a warm cache and ~20 us on the cold one a
# broker has after a pause. tests/protocol/test_headers.py checks both against that loop.


def _compile_parser(cls: type, keys: Mapping[str, tuple[str, ...]]) -> Callable[[Mapping[str, str]], Header]:
    """``ext`` -> a ``cls`` instance; ``keys[wire key]`` are the extFields names tried in turn for each field."""
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_missing": _missing, "_bad": _bad, "_bool": _bool,
                           "_range": _out_of_range}
    defaults = {f.name: f for f in fields(cls)}
    lines = ["def parse(ext):", " get = ext.get", " obj = _new(_cls)"]
    for i, (name, key, kind, required) in enumerate(_spec(cls)):
        env[f"_set{i}"] = getattr(cls, name).__set__
        names = keys[key]
        lines.append(f" v = get({names[0]!r})")
        for alt in names[1:]:
            lines.append(f" if v is None: v = get({alt!r})")
        f = defaults[name]
        if required:
            lines.append(f" if v is None: raise _missing({key!r})")
            default_expr = ""
        elif f.default is not dataclasses.MISSING:
            env[f"_d{i}"] = f.default
            default_expr = f"_d{i}"
        else:
            env[f"_f{i}"] = f.default_factory
            default_expr = f"_f{i}()"
        if kind in RANGES:
            lo, hi = RANGES[kind]
            convert = [" try: x = int(v)", f" except ValueError: raise _bad({key!r}, v) from None",
                       f" if x < {lo} or x > {hi}: raise _range({key!r}, v, {kind!r})"]
        elif kind == "bool":
            convert = [f" x = _bool({key!r}, v)"]
        else:
            convert = [" x = v"]
        if required:
            lines += convert
        else:
            lines.append(f" if v is None: x = {default_expr}")
            lines.append(" else:")
            lines += [" " + c for c in convert]
        lines.append(f" _set{i}(obj, x)")
    lines.append(" return obj")
    exec("\n".join(lines), env)
    parse: Callable[[Mapping[str, str]], Header] = env["parse"]
    return parse


def _compile_writer(cls: type, keys: Mapping[str, str]) -> Callable[[Any], dict[str, str]]:
    """A ``cls`` instance -> its extFields (``keys[wire key]`` names each); None fields are left out."""
    lines = ["def write(h):", " out = {}"]
    for name, key, kind, _required in _spec(cls):
        lines.append(f" v = h.{name}")
        value = "'true' if v else 'false'" if kind == "bool" else "str(v)"
        lines.append(f" if v is not None: out[{keys[key]!r}] = {value}")
    lines.append(" return out")
    env: dict[str, Any] = {}
    exec("\n".join(lines), env)
    write: Callable[[Any], dict[str, str]] = env["write"]
    return write


# -- producer ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    default_topic: str = "TBW102"
    default_topic_queue_nums: JInt = 4
    queue_id: JInt = -1
    sys_flag: JInt = 0
    born_timestamp: JLong = 0
    flag: JInt = 0
    properties: str = ""
    reconsume_times: JInt = 0
    unit_mode: bool = False
    max_reconsume_times: JInt | None = None
    batch: bool = False


#: SEND_MESSAGE_V2 (310) shortens every field name to one letter.
V2_KEYS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}
#: ... and back: each field name's letter
V2_LETTERS = {v: k for k, v in V2_KEYS.items()}


# V2 takes a field's one-letter key, or its full name when the letter is absent.
_parse_v2 = _compile_parser(SendMessageRequestHeader, {long: (short, long) for short, long in V2_KEYS.items()})
_write_v2 = _compile_writer(SendMessageRequestHeader, V2_LETTERS)


def send_header_from_v2(ext: Mapping[str, str]) -> SendMessageRequestHeader:
    return cast(SendMessageRequestHeader, _parse_v2(ext))


def send_header_to_v2(header: SendMessageRequestHeader) -> dict[str, str]:
    return _write_v2(header)


@dataclass(frozen=True, slots=True)
class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: JInt
    queue_offset: JLong
    transaction_id: str | None = None
    WIRE: ClassVar[dict[str, str]] = {"msg_id": "msgId"}


# -- consumer ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    queue_offset: JLong
    max_msg_nums: JInt = 32
    sys_flag: JInt = 0
    commit_offset: JLong = 0
    suspend_timeout_millis: JLong = 15000
    subscription: str | None = None
    sub_version: JLong = 0
    expression_type: str | None = None
    max_msg_bytes: JInt | None = None


@dataclass(frozen=True, slots=True)
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: JLong
    next_begin_offset: JLong
    min_offset: JLong
    max_offset: JLong


@dataclass(frozen=True, slots=True)
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    set_zero_if_not_found: bool | None = None


@dataclass(frozen=True, slots=True)
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: JInt
    commit_offset: JLong


@dataclass(frozen=True, slots=True)
class TopicQueueHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: JInt


@dataclass(frozen=True, slots=True)
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: JInt
    timestamp: JLong


@dataclass(frozen=True, slots=True)
class ViewMessageRequestHeader(Header):
    offset: JLong
    #: RocketMQ 5's field: the topic the message is of (with ACL on, the account must be allowed it and the broker
    #: answers only a record of it)
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class QueryMessageRequestHeader(Header):
    topic: str
    key: str
    max_num: JInt = 32
    begin_timestamp: JLong = 0
    end_timestamp: JLong = 2**62


@dataclass(frozen=True, slots=True)
class ConsumerSendMsgBackRequestHeader(Header):
    offset: JLong
    group: str
    delay_level: JInt = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: JInt | None = None


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
    tran_state_table_offset: JLong
    commit_log_offset: JLong
    commit_or_rollback: JInt
    msg_id: str | None = None
    transaction_id: str | None = None
    from_transaction_check: bool = False


@dataclass(frozen=True, slots=True)
class CheckTransactionStateRequestHeader(Header):
    """Broker -> producer (oneway); the body is the half message. ``topic`` and ``bname`` are RocketMQ 5's."""

    tran_state_table_offset: JLong
    commit_log_offset: JLong
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
    read_queue_nums: JInt = 4
    write_queue_nums: JInt = 4
    perm: JInt = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: JInt = 0
    order: bool = False
    attributes: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopicRequestHeader(Header):
    topic: str


@dataclass(frozen=True, slots=True)
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str
