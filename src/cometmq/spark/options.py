"""The options of the cometmq Spark source and sink: parsed once, checked once, with errors that name them.

Spark hands a data source its options case-insensitively; so does this module. An unknown option, a bad value,
or two options that contradict each other raise :class:`OptionError` before any task runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from cometmq.client.admin import check_group, check_topic
from cometmq.client.errors import InvalidArgumentError
from cometmq.client.instance import parse_namesrv

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "parse_read",
    "parse_write",
    "queue_key",
    "split_queue_key",
]

#: the JSON offsets' stand-ins for "the queue's first offset" and "its end", as Spark's Kafka source has them
EARLIEST = -2
LATEST = -1

#: options Spark itself may pass down with a query's options; they mean nothing to cometmq
_SPARK_OWN = frozenset({"checkpointlocation", "queryname", "path"})

_READ_OPTIONS = ("namesrv", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                 "startingTimestamp", "endingTimestamp", "maxOffsetsPerTrigger", "minPartitions",
                 "failOnDataLoss", "subExpression", "expressionType", "includeProperties", "commitToGroup",
                 "consumerGroup", "requestTimeoutMs", "accessKey", "secretKey")
_WRITE_OPTIONS = ("namesrv", "topic", "producerGroup", "batchSize", "maxInFlight", "sendTimeoutMs", "retries",
                  "requestTimeoutMs", "accessKey", "secretKey")


class OptionError(ValueError):
    """A cometmq source or sink option that cannot be used; the message names it."""


def queue_key(broker_name: str, queue_id: int) -> str:
    """The key of a queue in offsets JSON: ``"brokerName:queueId"``."""
    return f"{broker_name}:{queue_id}"


def split_queue_key(key: str) -> tuple[str, int]:
    broker, sep, qid = key.rpartition(":")
    if not sep or not broker or not qid.isdigit():
        raise OptionError(f"queue {key!r} in offsets JSON is not 'brokerName:queueId'")
    return broker, int(qid)


@dataclass(frozen=True)
class Bound:
    """Where reading starts or ends: ``earliest``, ``latest``, a timestamp (epoch ms) or per-queue offsets
    ``{topic: {"broker:queueId": offset}}`` (offset -2 = earliest, -1 = latest)."""

    kind: Literal["earliest", "latest", "timestamp", "offsets"]
    timestamp: int = 0
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp}"
        if self.kind == "offsets":
            return json.dumps(self.offsets, sort_keys=True)
        return self.kind


@dataclass(frozen=True)
class ReadOptions:
    namesrv: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    #: topic -> queue selectors (an int: that queue id on every broker; "broker:id": one queue)
    assign: Mapping[str, tuple[int | str, ...]] | None = None
    starting: Bound = Bound("earliest")
    ending: Bound = Bound("latest")
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    expression: str = "*"
    expression_type: str = "TAG"
    include_properties: bool = True
    commit_to_group: str | None = None
    group: str = "cometmq-spark"
    timeout: float = 10.0
    #: (accessKey, secretKey): every request is signed (brokers with aclEnable=true; docs/security.md)
    credentials: tuple[str, str] | None = None

    @property
    def filtered(self) -> bool:
        return self.expression_type != "TAG" or self.expression.strip() not in ("", "*")

    def topic_matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign is not None:
            return topic in self.assign
        return topic in self.subscribe


@dataclass(frozen=True)
class WriteOptions:
    namesrv: str
    topic: str | None = None
    producer_group: str = "cometmq-spark-writer"
    batch_size: int = 256
    max_in_flight: int = 8
    send_timeout: float = 10.0
    retries: int = 2
    credentials: tuple[str, str] | None = None


# -- parsing --------------------------------------------------------------------------------------------------
def _normalize(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """{canonical name: value}; an unknown option raises, naming it and the known ones."""
    canon = {k.lower(): k for k in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in _SPARK_OWN:
            continue
        name = canon.get(low)
        if name is None:
            raise OptionError(f"unknown cometmq {what} option {key!r} (known: {', '.join(known)})")
        if value is None:
            continue
        out[name] = str(value)
    return out


def _int(opts: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option {name}={raw!r} must be at least {minimum}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={raw!r} is not true or false")


def _namesrv(opts: Mapping[str, str]) -> str:
    raw = opts.get("namesrv")
    if not raw or not raw.strip():
        raise OptionError("option namesrv is required (the nameserver address, 'host:port;host:port')")
    try:
        return ";".join(parse_namesrv(raw))
    except InvalidArgumentError as exc:
        raise OptionError(f"option namesrv={raw!r}: {exc}") from None


def _credentials(opts: Mapping[str, str]) -> tuple[str, str] | None:
    """Options accessKey and secretKey: both or neither."""
    ak, sk = (opts.get("accessKey") or "").strip(), (opts.get("secretKey") or "").strip()
    if bool(ak) != bool(sk):
        raise OptionError("options accessKey and secretKey go together (an ACL account; docs/security.md)")
    return (ak, sk) if ak else None


def _topic(name: str, topic: str) -> str:
    try:
        return check_topic(topic)
    except InvalidArgumentError as exc:
        raise OptionError(f"option {name}: {exc}") from None


def _json(name: str, raw: str) -> object:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name} is neither earliest, latest nor valid JSON: {exc}") from None


def _bound(opts: Mapping[str, str], offsets_name: str, ts_name: str, *, default: str,
           allowed: frozenset[str], allowed_json: frozenset[int], streaming: bool) -> Bound:
    raw, ts = opts.get(offsets_name), opts.get(ts_name)
    if raw is not None and ts is not None:
        raise OptionError(f"options {offsets_name} and {ts_name} contradict each other: give one")
    if ts is not None:
        try:
            millis = int(ts.strip())
        except ValueError:
            raise OptionError(f"option {ts_name}={ts!r} is not epoch milliseconds") from None
        if millis < 0:
            raise OptionError(f"option {ts_name}={ts!r} is negative")
        return Bound("timestamp", timestamp=millis)
    if raw is None:
        return Bound(default)  # type: ignore[arg-type]
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if word not in allowed:
            mode = "a streaming" if streaming else "a batch"
            raise OptionError(f"option {offsets_name}={word} makes no sense for {mode} read")
        return Bound(word)  # type: ignore[arg-type]
    data = _json(offsets_name, raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {offsets_name} must be earliest, latest or JSON "
                          '{"topic": {"brokerName:queueId": offset}}')
    offsets: dict[str, dict[str, int]] = {}
    for topic, queues in data.items():
        _topic(offsets_name, topic)
        if not isinstance(queues, dict):
            raise OptionError(f"option {offsets_name}: the offsets of {topic} must be an object "
                              '{"brokerName:queueId": offset}')
        per: dict[str, int] = {}
        for key, off in queues.items():
            broker, qid = split_queue_key(key)
            if isinstance(off, bool) or not isinstance(off, int):
                raise OptionError(f"option {offsets_name}: offset of {topic} {key} is not an integer: {off!r}")
            if off < 0 and off not in allowed_json:
                names = {EARLIEST: "-2 (earliest)", LATEST: "-1 (latest)"}
                raise OptionError(f"option {offsets_name}: offset {names.get(off, off)} of {topic} {key} "
                                  "is not allowed here")
            per[queue_key(broker, qid)] = off
        offsets[topic] = per
    return Bound("offsets", offsets=offsets)


def _assign(raw: str) -> dict[str, tuple[int | str, ...]]:
    data = _json("assign", raw)
    if not isinstance(data, dict) or not data:
        raise OptionError('option assign must be JSON {"topic": [queueId, ...]} '
                          '(a queue id, or "brokerName:queueId")')
    out: dict[str, tuple[int | str, ...]] = {}
    for topic, queues in data.items():
        _topic("assign", topic)
        if not isinstance(queues, list) or not queues:
            raise OptionError(f"option assign: {topic} needs a non-empty list of queue ids")
        sel: list[int | str] = []
        for q in queues:
            if isinstance(q, bool) or not isinstance(q, int | str):
                raise OptionError(f"option assign: {q!r} of {topic} is not a queue id")
            if isinstance(q, int):
                if q < 0:
                    raise OptionError(f"option assign: queue id {q} of {topic} is negative")
                sel.append(q)
            else:
                broker, qid = split_queue_key(q)
                sel.append(queue_key(broker, qid))
        out[topic] = tuple(sel)
    return out


def parse_read(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """The read options, checked; ``streaming`` for ``readStream``."""
    opts = _normalize(options, _READ_OPTIONS, "read")
    namesrv = _namesrv(opts)
    given = [n for n in ("subscribe", "subscribePattern", "assign") if opts.get(n, "").strip()]
    if len(given) != 1:
        if not given:
            raise OptionError("say what to read: one of the options subscribe, subscribePattern or assign")
        raise OptionError(f"options {' and '.join(given)} contradict each other: give exactly one")
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign = None
    if given[0] == "subscribe":
        subscribe = tuple(dict.fromkeys(_topic("subscribe", t.strip())
                                        for t in opts["subscribe"].split(",") if t.strip()))
    elif given[0] == "subscribePattern":
        pattern = opts["subscribePattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern={pattern!r} is not a regular expression: {exc}") from None
    else:
        assign = _assign(opts["assign"])

    if streaming:
        for name in ("endingOffsets", "endingTimestamp"):
            if name in opts:
                raise OptionError(f"option {name} is for batch reads; a stream has no end")
        starting = _bound(opts, "startingOffsets", "startingTimestamp", default="latest",
                          allowed=frozenset({"earliest", "latest"}), allowed_json=frozenset({EARLIEST, LATEST}),
                          streaming=True)
        ending = Bound("latest")
    else:
        for name in ("maxOffsetsPerTrigger", "commitToGroup"):
            if name in opts:
                raise OptionError(f"option {name} is for streaming reads (readStream)")
        starting = _bound(opts, "startingOffsets", "startingTimestamp", default="earliest",
                          allowed=frozenset({"earliest"}), allowed_json=frozenset({EARLIEST}), streaming=False)
        ending = _bound(opts, "endingOffsets", "endingTimestamp", default="latest",
                        allowed=frozenset({"latest"}), allowed_json=frozenset({LATEST}), streaming=False)
    for bound, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        if bound.kind == "offsets":
            stray = [t for t in bound.offsets if not _selects(t, subscribe, pattern, assign)]
            if stray:
                raise OptionError(f"option {name} names topics that are not read: {', '.join(sorted(stray))}")

    expression_type = opts.get("expressionType", "TAG").strip().upper()
    if expression_type not in ("TAG", "SQL92"):
        raise OptionError(f"option expressionType={opts['expressionType']!r} must be TAG or SQL92")
    expression = opts.get("subExpression", "*").strip() or "*"
    if expression_type == "SQL92" and expression == "*":
        raise OptionError("option expressionType=SQL92 needs a subExpression (a SQL92 condition on properties)")

    group = opts.get("consumerGroup", "cometmq-spark").strip()
    commit_to = opts.get("commitToGroup")
    for name, value in (("consumerGroup", group), ("commitToGroup", commit_to)):
        if value is not None:
            try:
                check_group(value.strip())
            except InvalidArgumentError as exc:
                raise OptionError(f"option {name}: {exc}") from None
    timeout_ms = _int(opts, "requestTimeoutMs", minimum=100)
    return ReadOptions(
        namesrv=namesrv, subscribe=subscribe, pattern=pattern, assign=assign, starting=starting, ending=ending,
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        min_partitions=_int(opts, "minPartitions", minimum=1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        expression=expression, expression_type=expression_type,
        include_properties=_bool(opts, "includeProperties", True),
        commit_to_group=commit_to.strip() if commit_to else None,
        group=commit_to.strip() if commit_to and "consumerGroup" not in opts else group,
        timeout=(timeout_ms or 10_000) / 1000, credentials=_credentials(opts))


def _selects(topic: str, subscribe: tuple[str, ...], pattern: str | None,
             assign: Mapping[str, tuple[int | str, ...]] | None) -> bool:
    if pattern is not None:
        return re.fullmatch(pattern, topic) is not None
    if assign is not None:
        return topic in assign
    return topic in subscribe


def parse_write(options: Mapping[str, str]) -> WriteOptions:
    """The write options, checked."""
    opts = _normalize(options, _WRITE_OPTIONS, "write")
    namesrv = _namesrv(opts)
    topic = opts.get("topic")
    if topic is not None:
        topic = _topic("topic", topic.strip())
    group = opts.get("producerGroup", "cometmq-spark-writer").strip()
    try:
        check_group(group)
    except InvalidArgumentError as exc:
        raise OptionError(f"option producerGroup: {exc}") from None
    timeout_ms = _int(opts, "sendTimeoutMs", minimum=100) or _int(opts, "requestTimeoutMs", minimum=100)
    retries = _int(opts, "retries", minimum=0)
    return WriteOptions(
        namesrv=namesrv, topic=topic, producer_group=group,
        batch_size=_int(opts, "batchSize", minimum=1) or 256,
        max_in_flight=_int(opts, "maxInFlight", minimum=1) or 8,
        send_timeout=(timeout_ms or 10_000) / 1000,
        retries=2 if retries is None else retries, credentials=_credentials(opts))
