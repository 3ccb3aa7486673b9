"""The admin bodies RocketMQ's Java tools exchange, in the exact form fastjson gives them (sans-I/O).

mqadmin, rocketmq-dashboard and rocketmq-exporter read the bodies of the admin requests with fastjson
(``RemotingSerializable``), so this module writes them as fastjson 1.x writes the Java classes:

* a bean's properties in alphabetical order, nulls left out, enums by name, ``double`` in Java's
  ``Double.toString`` form (``0.0``, ``1.5``, ``1.0E-4``), strings with only ``"``, ``\\`` and control characters
  escaped (non-ASCII written as UTF-8);
* a map keyed by ``String`` as a JSON object; keyed by ``Integer``/``Long`` with bare numbers as keys
  (``{0:5}``); keyed by ``MessageQueue`` with the *serialized queue* as key::

      {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":0,"maxOffset":5,...}}}

  which is not JSON. Java maps iterate in hash order; we write map entries sorted (keys of a ``MessageQueue``
  map in ``MessageQueue.compareTo`` order), which any reader accepts.

The decoders read those bodies with ``parse_fastjson`` (a small, bounded parser that also takes objects and
bare numbers as keys) and, where cometmq answered differently before (``offsetTable`` as a JSON list of
objects that name their queue), that shape too, so ``Admin`` works against both cometmq and Apache brokers.
Every malformed body raises ``RemoteProtocolError`` naming the body and where it went wrong.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cometmq.protocol.client_bodies import MessageQueue, SubscriptionData
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.fastjson import (
    MAX_DEPTH,
    Bean,
    ObjectKey,
    bean,
    fastjson_dumps,
    java_double,
    parse_fastjson,
    sorted_queue_map,
)
from cometmq.protocol.taghash import java_string_hash

__all__ = [
    "MAX_DEPTH",
    "BrokerStatsData",
    "BrokerStatsItem",
    "Connection",
    "ConsumeStats",
    "ConsumeStatsList",
    "ConsumerConnection",
    "GroupList",
    "KVTable",
    "ObjectKey",
    "OffsetWrapper",
    "ProducerConnection",
    "ProducerInfo",
    "QueueTimeSpan",
    "ResetOffsetBody",
    "TopicOffset",
    "TopicStatsTable",
    "bean",
    "fastjson_dumps",
    "java_double",
    "parse_fastjson",
]

def _object(raw: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(raw, Mapping):
        raise RemoteProtocolError(f"{what} must be an object, got {_kind(raw)}")
    return raw


def _kind(raw: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(raw), type(raw).__name__)


def _member(obj: Mapping[Any, Any], key: str, what: str) -> Mapping[Any, Any]:
    value = obj.get(key)
    return {} if value is None else _object(value, f"{what} {key!r}")


def _int(raw: Any, what: str, default: int = 0) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise RemoteProtocolError(f"{what} must be an integer, got {_kind(raw)}")
    try:
        return int(raw)
    except ValueError:
        raise RemoteProtocolError(f"{what} must be an integer, got {str(raw)[:40]!r}") from None


def _float(raw: Any, what: str) -> float:
    if raw is None:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise RemoteProtocolError(f"{what} must be a number, got {_kind(raw)}")
    try:
        return float(raw)
    except ValueError:
        raise RemoteProtocolError(f"{what} must be a number, got {str(raw)[:40]!r}") from None


def _str(raw: Any, what: str, default: str = "") -> str:
    if raw is None:
        return default
    if not isinstance(raw, str):
        raise RemoteProtocolError(f"{what} must be a string, got {_kind(raw)}")
    return raw


def _strings(raw: Any, what: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise RemoteProtocolError(f"{what} must be a list of strings")
    return tuple(raw)


def _queue(raw: Any, what: str) -> MessageQueue:
    """A MessageQueue from an object key, a plain object, or a string holding one (fastjson2's
    WriteNonStringKeyAsString form)."""
    if isinstance(raw, str) and raw.startswith("{"):
        raw = parse_fastjson(raw, what)
    obj = _object(raw, what)
    topic, broker = obj.get("topic"), obj.get("brokerName")
    if not isinstance(topic, str) or not isinstance(broker, str):
        raise RemoteProtocolError(f"{what}: a message queue needs a topic and a brokerName")
    return MessageQueue(topic, broker, _int(obj.get("queueId"), f"{what} queueId"))


def _queue_table(raw: Any, what: str, default_broker: str | None = None) -> Iterator[tuple[MessageQueue, Any]]:
    """(queue, value) of an ``offsetTable``: fastjson's map keyed by queue, or cometmq's older list of objects
    each naming its queue (the value is then the object itself)."""
    if raw is None:
        return
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            obj = _object(item, f"{what} entry {i}")
            if default_broker is not None and "brokerName" not in obj:
                obj = {**obj, "brokerName": default_broker}
            yield _queue(obj, f"{what} entry {i}"), obj
        return
    for key, value in _object(raw, what).items():
        yield _queue(key, f"{what} key"), value


# -- TopicStatsTable (GET_TOPIC_STATS_INFO 202) ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TopicOffset:
    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0

    def to_bean(self) -> Bean:
        return bean(minOffset=self.min_offset, maxOffset=self.max_offset,
                    lastUpdateTimestamp=self.last_update_timestamp)

    @classmethod
    def from_json(cls, raw: Any, what: str) -> TopicOffset:
        obj = _object(raw, what)
        return cls(_int(obj.get("minOffset"), f"{what} minOffset"), _int(obj.get("maxOffset"), f"{what} maxOffset"),
                   _int(obj.get("lastUpdateTimestamp"), f"{what} lastUpdateTimestamp"))


@dataclass(frozen=True, slots=True)
class TopicStatsTable:
    offset_table: Mapping[MessageQueue, TopicOffset] = field(default_factory=dict)
    topic_put_tps: float = 0.0

    def encode(self) -> bytes:
        return fastjson_dumps(bean(offsetTable={q: o.to_bean() for q, o in sorted_queue_map(self.offset_table).items()},
                                   topicPutTps=float(self.topic_put_tps)))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview, default_broker: str | None = None) -> TopicStatsTable:
        what = "topic stats"
        obj = _object(parse_fastjson(body, what), what)
        table = {q: TopicOffset.from_json(v, f"{what} of {q.topic}/{q.queue_id}")
                 for q, v in _queue_table(obj.get("offsetTable"), f"{what} offsetTable", default_broker)}
        return cls(sorted_queue_map(table), _float(obj.get("topicPutTps"), f"{what} topicPutTps"))


# -- ConsumeStats (GET_CONSUME_STATS 208) -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OffsetWrapper:
    broker_offset: int = 0
    consumer_offset: int = 0
    pull_offset: int = 0
    last_timestamp: int = 0

    def to_bean(self) -> Bean:
        return bean(brokerOffset=self.broker_offset, consumerOffset=self.consumer_offset,
                    lastTimestamp=self.last_timestamp, pullOffset=self.pull_offset)

    @classmethod
    def from_json(cls, raw: Any, what: str) -> OffsetWrapper:
        obj = _object(raw, what)
        return cls(_int(obj.get("brokerOffset"), f"{what} brokerOffset"),
                   _int(obj.get("consumerOffset"), f"{what} consumerOffset"),
                   _int(obj.get("pullOffset"), f"{what} pullOffset"),
                   _int(obj.get("lastTimestamp"), f"{what} lastTimestamp"))


@dataclass(frozen=True, slots=True)
class ConsumeStats:
    offset_table: Mapping[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    def to_bean(self) -> Bean:
        return bean(consumeTps=float(self.consume_tps),
                    offsetTable={q: w.to_bean() for q, w in sorted_queue_map(self.offset_table).items()})

    def encode(self) -> bytes:
        return fastjson_dumps(self.to_bean())

    def total_diff(self) -> int:
        return sum(w.broker_offset - w.consumer_offset for w in self.offset_table.values())

    def inflight_total_diff(self) -> int:
        return sum(w.pull_offset - w.consumer_offset for w in self.offset_table.values())

    @classmethod
    def from_json(cls, raw: Any, what: str, default_broker: str | None = None) -> ConsumeStats:
        obj = _object(raw, what)
        table = {q: OffsetWrapper.from_json(v, f"{what} of {q.topic}/{q.queue_id}")
                 for q, v in _queue_table(obj.get("offsetTable"), f"{what} offsetTable", default_broker)}
        return cls(sorted_queue_map(table), _float(obj.get("consumeTps"), f"{what} consumeTps"))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview, default_broker: str | None = None) -> ConsumeStats:
        return cls.from_json(parse_fastjson(body, "consume stats"), "consume stats", default_broker)


@dataclass(frozen=True, slots=True)
class ConsumeStatsList:
    """GET_BROKER_CONSUME_STATS (317): per group, the ConsumeStats of each topic it consumes."""

    consume_stats_list: tuple[tuple[str, tuple[ConsumeStats, ...]], ...] = ()
    broker_addr: str | None = None
    total_diff: int = 0
    total_inflight_diff: int = 0

    def encode(self) -> bytes:
        return fastjson_dumps(bean(brokerAddr=self.broker_addr,
                                   consumeStatsList=[{g: [s.to_bean() for s in stats]}
                                                     for g, stats in self.consume_stats_list],
                                   totalDiff=self.total_diff, totalInflightDiff=self.total_inflight_diff))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> ConsumeStatsList:
        what = "broker consume stats"
        obj = _object(parse_fastjson(body, what), what)
        items = obj.get("consumeStatsList") or []
        if not isinstance(items, list):
            raise RemoteProtocolError(f"{what}: consumeStatsList must be a list")
        out = []
        for item in items:
            for group, stats in _object(item, f"{what} entry").items():
                if not isinstance(stats, list):
                    raise RemoteProtocolError(f"{what}: the stats of {group} must be a list")
                out.append((str(group), tuple(ConsumeStats.from_json(s, f"{what} of {group}") for s in stats)))
        return cls(tuple(out), _str(obj.get("brokerAddr"), f"{what} brokerAddr") or None,
                   _int(obj.get("totalDiff"), f"{what} totalDiff"),
                   _int(obj.get("totalInflightDiff"), f"{what} totalInflightDiff"))


# -- connections (GET_CONSUMER_CONNECTION_LIST 203, GET_PRODUCER_CONNECTION_LIST 204) ----------------------------
@dataclass(frozen=True, slots=True, order=True)
class Connection:
    client_id: str
    client_addr: str = ""
    language: str = "JAVA"
    version: int = 0

    def to_bean(self) -> Bean:
        return bean(clientAddr=self.client_addr, clientId=self.client_id, language=self.language,
                    version=self.version)

    @classmethod
    def from_json(cls, raw: Any, what: str) -> Connection:
        obj = _object(raw, what)
        language = obj.get("language")
        return cls(_str(obj.get("clientId"), f"{what} clientId"), _str(obj.get("clientAddr"), f"{what} clientAddr"),
                   str(language) if language is not None else "", _int(obj.get("version"), f"{what} version"))


def _connections(raw: Any, what: str) -> tuple[Connection, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RemoteProtocolError(f"{what}: connectionSet must be a list")
    return tuple(sorted(Connection.from_json(c, f"{what} connection") for c in raw))


def subscription_bean(sub: SubscriptionData) -> Bean:
    """Java's SubscriptionData as fastjson writes it (filterClassSource is not serialized)."""
    return bean(classFilterMode=False, codeSet=sorted(java_string_hash(t) for t in sub.tags),
                expressionType=sub.expression_type, subString=sub.sub_string, subVersion=sub.sub_version,
                tagsSet=sorted(sub.tags), topic=sub.topic)




@dataclass(frozen=True, slots=True)
class ConsumerConnection:
    connections: tuple[Connection, ...] = ()
    subscription_table: Mapping[str, SubscriptionData] = field(default_factory=dict)
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None

    def encode(self) -> bytes:
        return fastjson_dumps(bean(
            connectionSet=[c.to_bean() for c in sorted(self.connections)],
            consumeFromWhere=self.consume_from_where, consumeType=self.consume_type, messageModel=self.message_model,
            subscriptionTable={t: subscription_bean(self.subscription_table[t])
                               for t in sorted(self.subscription_table)}))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> ConsumerConnection:
        what = "consumer connection"
        obj = _object(parse_fastjson(body, what), what)
        subs = {str(t): SubscriptionData.from_json(s)
                for t, s in _member(obj, "subscriptionTable", what).items()}

        def enum(key: str) -> str | None:
            value = obj.get(key)
            return None if value is None else str(value)

        return cls(_connections(obj.get("connectionSet"), what), subs, enum("consumeType"), enum("messageModel"),
                   enum("consumeFromWhere"))


@dataclass(frozen=True, slots=True)
class ProducerConnection:
    connections: tuple[Connection, ...] = ()

    def encode(self) -> bytes:
        return fastjson_dumps(bean(connectionSet=[c.to_bean() for c in sorted(self.connections)]))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> ProducerConnection:
        what = "producer connection"
        obj = _object(parse_fastjson(body, what), what)
        return cls(_connections(obj.get("connectionSet"), what))


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """One producer of GET_ALL_PRODUCER_INFO (328)'s ProducerTableInfo."""

    client_id: str
    remote_ip: str
    language: str
    version: int
    last_update_timestamp: int

    def to_bean(self) -> Bean:
        return bean(clientId=self.client_id, language=self.language, lastUpdateTimestamp=self.last_update_timestamp,
                    remoteIP=self.remote_ip, version=self.version)


def encode_producer_table(data: Mapping[str, Iterable[ProducerInfo]]) -> bytes:
    return fastjson_dumps(bean(data={g: [p.to_bean() for p in data[g]] for g in sorted(data)}))


# -- KVTable (GET_BROKER_RUNTIME_INFO 28, name server KV lists) ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class KVTable:
    table: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return fastjson_dumps(bean(table={k: self.table[k] for k in sorted(self.table)}))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> KVTable:
        what = "KV table"
        obj = _object(parse_fastjson(body, what), what)
        table: dict[str, str] = {}
        for k, v in _member(obj, "table", what).items():
            if v is not None and not isinstance(v, (str, int, float)):
                raise RemoteProtocolError(f"{what}: the value of {k!r} must be a string")
            table[str(k)] = "" if v is None else str(v)
        return cls(table)


# -- GroupList (QUERY_TOPIC_CONSUME_BY_WHO 300), TopicList -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GroupList:
    groups: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return fastjson_dumps(bean(groupList=sorted(set(self.groups))))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> GroupList:
        what = "group list"
        obj = _object(parse_fastjson(body, what), what)
        return cls(tuple(sorted(set(_strings(obj.get("groupList"), f"{what} groupList")))))


def encode_topic_list(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    """Java's TopicList (decode with ``cometmq.protocol.route.TopicList.decode``)."""
    return fastjson_dumps(bean(brokerAddr=broker_addr, topicList=sorted(set(topics))))


# -- BrokerStatsData (VIEW_BROKER_STATS_DATA 315) ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BrokerStatsItem:
    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0

    def to_bean(self) -> Bean:
        return bean(avgpt=float(self.avgpt), sum=self.sum, tps=float(self.tps))

    @classmethod
    def from_json(cls, raw: Any, what: str) -> BrokerStatsItem:
        if raw is None:
            return cls()
        obj = _object(raw, what)
        return cls(_int(obj.get("sum"), f"{what} sum"), _float(obj.get("tps"), f"{what} tps"),
                   _float(obj.get("avgpt"), f"{what} avgpt"))


@dataclass(frozen=True, slots=True)
class BrokerStatsData:
    stats_minute: BrokerStatsItem = BrokerStatsItem()
    stats_hour: BrokerStatsItem = BrokerStatsItem()
    stats_day: BrokerStatsItem = BrokerStatsItem()

    def encode(self) -> bytes:
        return fastjson_dumps(bean(statsDay=self.stats_day.to_bean(), statsHour=self.stats_hour.to_bean(),
                                   statsMinute=self.stats_minute.to_bean()))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> BrokerStatsData:
        what = "broker stats"
        obj = _object(parse_fastjson(body, what), what)
        return cls(BrokerStatsItem.from_json(obj.get("statsMinute"), f"{what} statsMinute"),
                   BrokerStatsItem.from_json(obj.get("statsHour"), f"{what} statsHour"),
                   BrokerStatsItem.from_json(obj.get("statsDay"), f"{what} statsDay"))


# -- ResetOffsetBody (INVOKE_BROKER_TO_RESET_OFFSET 222, RESET_CONSUMER_CLIENT_OFFSET 220) ---------------------------
@dataclass(frozen=True, slots=True)
class ResetOffsetBody:
    offset_table: Mapping[MessageQueue, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return fastjson_dumps(bean(offsetTable=sorted_queue_map(self.offset_table)))

    @classmethod
    def decode(cls, body: bytes | bytearray | memoryview) -> ResetOffsetBody:
        what = "reset offsets"
        obj = _object(parse_fastjson(body, what), what)
        table: dict[MessageQueue, int] = {}
        raw = obj.get("offsetTable")
        if isinstance(raw, list):  # the C++ client's ResetOffsetBodyForC: [{..., "offset": n}]
            for i, item in enumerate(raw):
                table[_queue(item, f"{what} entry {i}")] = _int(_object(item, what).get("offset"), f"{what} offset")
        else:
            for q, v in _queue_table(raw, f"{what} offsetTable"):
                table[q] = _int(v, f"{what} offset of {q.topic}/{q.queue_id}")
        return cls(sorted_queue_map(table))


# -- QueryConsumeTimeSpanBody (QUERY_CONSUME_TIME_SPAN 303) --------------------------------------------------------
def _java_date(ms: int) -> str:
    """UtilAll.formatDate(new Date(ms), "yyyy-MM-dd HH:mm:ss,SSS") in the local time zone."""
    try:
        t = _dt.datetime.fromtimestamp(ms / 1000)
    except (OverflowError, OSError, ValueError):
        t = _dt.datetime.fromtimestamp(0)
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{ms % 1000:03d}"


@dataclass(frozen=True, slots=True)
class QueueTimeSpan:
    queue: MessageQueue
    min_timestamp: int = 0
    max_timestamp: int = 0
    consume_timestamp: int = 0
    delay_time: int = 0

    def to_bean(self) -> Bean:
        # Java's bean has getters for the *Str forms too: fastjson writes them.
        return bean(consumeTimeStamp=self.consume_timestamp, consumeTimeStampStr=_java_date(self.consume_timestamp),
                    delayTime=self.delay_time, maxTimeStamp=self.max_timestamp,
                    maxTimeStampStr=_java_date(self.max_timestamp), messageQueue=self.queue,
                    minTimeStamp=self.min_timestamp, minTimeStampStr=_java_date(self.min_timestamp))


def encode_consume_time_span(spans: Iterable[QueueTimeSpan]) -> bytes:
    return fastjson_dumps(bean(consumeTimeSpanSet=[s.to_bean() for s in spans]))


def decode_consume_time_span(body: bytes | bytearray | memoryview) -> list[QueueTimeSpan]:
    what = "consume time span"
    obj = _object(parse_fastjson(body, what), what)
    raw = obj.get("consumeTimeSpanSet") or []
    if not isinstance(raw, list):
        raise RemoteProtocolError(f"{what}: consumeTimeSpanSet must be a list")
    out = []
    for item in raw:
        o = _object(item, f"{what} entry")
        out.append(QueueTimeSpan(_queue(o.get("messageQueue"), f"{what} messageQueue"),
                                 _int(o.get("minTimeStamp"), what), _int(o.get("maxTimeStamp"), what),
                                 _int(o.get("consumeTimeStamp"), what), _int(o.get("delayTime"), what)))
    return out
