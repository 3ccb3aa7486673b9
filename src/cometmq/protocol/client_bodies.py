"""JSON bodies exchanged between clients and brokers: heartbeats, queue locks, consumer lists."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cometmq.protocol.errors import RemoteProtocolError

# ConsumeType / MessageModel / ConsumeFromWhere are sent as ordinals by the C++ client and as names by Java.
CONSUME_ACTIVELY = "CONSUME_ACTIVELY"
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"
CONSUME_POP = "CONSUME_POP"
BROADCASTING = "BROADCASTING"
CLUSTERING = "CLUSTERING"
_CONSUME_TYPES = [CONSUME_ACTIVELY, CONSUME_PASSIVELY, CONSUME_POP]
_MODELS = [BROADCASTING, CLUSTERING]
_FROM_WHERE = {0: "CONSUME_FROM_LAST_OFFSET", 1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
               2: "CONSUME_FROM_MIN_OFFSET", 3: "CONSUME_FROM_MAX_OFFSET", 4: "CONSUME_FROM_FIRST_OFFSET",
               5: "CONSUME_FROM_TIMESTAMP"}


def _enum(value: Any, names: list[str] | dict[int, str], what: str) -> str:
    if isinstance(value, bool):
        raise RemoteProtocolError(f"{what} is a boolean")
    if isinstance(value, int):
        try:
            return names[value]
        except (IndexError, KeyError):
            raise RemoteProtocolError(f"{what} ordinal {value} is unknown") from None
    if isinstance(value, str):
        return value
    raise RemoteProtocolError(f"{what} has a bad value {value!r}")


def loads_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise RemoteProtocolError(f"{what} body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise RemoteProtocolError(f"{what} body is not a JSON object")
    return raw


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    sub_version: int = 0
    expression_type: str = "TAG"
    tags: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SubscriptionData:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("topic"), str):
            raise RemoteProtocolError("subscription without a topic")
        try:
            version = int(raw.get("subVersion", 0) or 0)
        except (TypeError, ValueError):
            raise RemoteProtocolError(f"bad subVersion {raw.get('subVersion')!r}") from None
        sub = raw.get("subString", "*")
        return cls(topic=raw["topic"], sub_string=str(sub if sub is not None else "*"), sub_version=version,
                   expression_type=str(raw.get("expressionType") or "TAG"),
                   tags=tuple(str(t) for t in raw.get("tagsSet") or ()))

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "subString": self.sub_string, "subVersion": self.sub_version,
                "expressionType": self.expression_type, "tagsSet": list(self.tags), "codeSet": []}


@dataclass(frozen=True, slots=True)
class ConsumerData:
    group_name: str
    consume_type: str = CONSUME_PASSIVELY
    message_model: str = CLUSTERING
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: tuple[SubscriptionData, ...] = ()
    unit_mode: bool = False

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ConsumerData:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("groupName"), str):
            raise RemoteProtocolError("consumer data without a groupName")
        subs = raw.get("subscriptionDataSet") or []
        if not isinstance(subs, list):
            raise RemoteProtocolError("subscriptionDataSet is not a list")
        return cls(
            group_name=raw["groupName"],
            consume_type=_enum(raw.get("consumeType", 1), _CONSUME_TYPES, "consumeType"),
            message_model=_enum(raw.get("messageModel", 1), _MODELS, "messageModel"),
            consume_from_where=_enum(raw.get("consumeFromWhere", 0), _FROM_WHERE, "consumeFromWhere"),
            subscriptions=tuple(SubscriptionData.from_json(s) for s in subs),
            unit_mode=bool(raw.get("unitMode", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {"groupName": self.group_name, "consumeType": self.consume_type, "messageModel": self.message_model,
                "consumeFromWhere": self.consume_from_where, "unitMode": self.unit_mode,
                "subscriptionDataSet": [s.to_json() for s in self.subscriptions]}


@dataclass(frozen=True, slots=True)
class HeartbeatData:
    """HEART_BEAT's body. ``fingerprint`` and ``without_sub`` are RocketMQ 5's heartbeat v2
    (``heartbeatFingerprint``, ``withoutSub``): a non-zero fingerprint stands for the heartbeat's content, and
    with ``without_sub`` the consumers' subscriptions are left out (the broker keeps those it has). 4.x
    clients send neither (0 and False); they are encoded only when the fingerprint is set."""

    client_id: str
    producer_groups: tuple[str, ...] = ()
    consumers: tuple[ConsumerData, ...] = ()
    fingerprint: int = 0
    without_sub: bool = False

    @classmethod
    def decode(cls, body: bytes) -> HeartbeatData:
        raw = loads_object(body, "heartbeat")
        client_id = raw.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise RemoteProtocolError("heartbeat without a clientID")
        producers = raw.get("producerDataSet") or []
        consumers = raw.get("consumerDataSet") or []
        if not isinstance(producers, list) or not isinstance(consumers, list):
            raise RemoteProtocolError("heartbeat data sets are not lists")
        groups = []
        for p in producers:
            if not isinstance(p, Mapping) or not isinstance(p.get("groupName"), str):
                raise RemoteProtocolError("producer data without a groupName")
            groups.append(p["groupName"])
        fingerprint = raw.get("heartbeatFingerprint", 0)
        if isinstance(fingerprint, bool) or not isinstance(fingerprint, int | None):
            raise RemoteProtocolError(f"bad heartbeatFingerprint {fingerprint!r}")
        # fastjson names the field after its getter (isWithoutSub -> "withoutSub"); take the field's name too
        without_sub = raw.get("withoutSub", raw.get("isWithoutSub", False))
        return cls(client_id, tuple(groups), tuple(ConsumerData.from_json(c) for c in consumers),
                   fingerprint or 0, without_sub is True)

    def encode(self) -> bytes:
        raw: dict[str, Any] = {"clientID": self.client_id,
                               "producerDataSet": [{"groupName": g} for g in self.producer_groups],
                               "consumerDataSet": [c.to_json() for c in self.consumers]}
        if self.fingerprint:
            raw["heartbeatFingerprint"] = self.fingerprint
            raw["withoutSub"] = self.without_sub
        return dumps(raw)

    def compute_fingerprint(self) -> int:
        """A non-zero signed 32-bit digest of what the heartbeat says, the client id and the subscriptions'
        versions left out (as RocketMQ 5's ``computeHeartbeatFingerprint``; the value itself is ours: the
        broker only compares it with the ones it was sent)."""
        consumers = [{**c.to_json(), "subscriptionDataSet": [{**s.to_json(), "subVersion": 0}
                                                             for s in c.subscriptions]}
                     for c in sorted(self.consumers, key=lambda c: c.group_name)]
        crc = zlib.crc32(dumps({"producerDataSet": sorted(self.producer_groups), "consumerDataSet": consumers}))
        return (crc - (1 << 32) if crc >= 1 << 31 else crc) or 1

    def without_subscriptions(self, fingerprint: int) -> HeartbeatData:
        """The v2 heartbeat that stands for this one: the same groups, no subscriptions, ``fingerprint``."""
        return replace(self, consumers=tuple(replace(c, subscriptions=()) for c in self.consumers),
                       fingerprint=fingerprint, without_sub=True)


#: HEART_BEAT response ext fields (RocketMQ 5's MixAll): the broker takes v2 heartbeats; the client should send
#: the full heartbeat (its subscriptions) next
IS_SUPPORT_HEART_BEAT_V2 = "IS_SUPPORT_HEART_BEAT_V2"
IS_SUB_CHANGE = "IS_SUB_CHANGE"


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    @classmethod
    def from_json(cls, raw: Any) -> MessageQueue:
        if not isinstance(raw, Mapping):
            raise RemoteProtocolError("message queue is not an object")
        try:
            return cls(str(raw["topic"]), str(raw["brokerName"]), int(raw["queueId"]))
        except (KeyError, TypeError, ValueError):
            raise RemoteProtocolError(f"bad message queue {raw!r}") from None

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


@dataclass(frozen=True, slots=True)
class LockBatchBody:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ request body."""

    consumer_group: str
    client_id: str
    mq_set: frozenset[MessageQueue] = field(default_factory=frozenset)
    only_this_broker: bool = False

    @classmethod
    def decode(cls, body: bytes) -> LockBatchBody:
        raw = loads_object(body, "lock batch")
        group, client = raw.get("consumerGroup"), raw.get("clientId")
        if not isinstance(group, str) or not isinstance(client, str):
            raise RemoteProtocolError("lock batch body needs consumerGroup and clientId")
        mqs = raw.get("mqSet") or []
        if not isinstance(mqs, list):
            raise RemoteProtocolError("mqSet is not a list")
        return cls(group, client, frozenset(MessageQueue.from_json(m) for m in mqs), bool(raw.get("onlyThisBroker")))

    def encode(self) -> bytes:
        return dumps({"consumerGroup": self.consumer_group, "clientId": self.client_id,
                      "onlyThisBroker": self.only_this_broker,
                      "mqSet": [m.to_json() for m in sorted(self.mq_set)]})


def encode_lock_ok(mqs: frozenset[MessageQueue] | set[MessageQueue]) -> bytes:
    return dumps({"lockOKMQSet": [m.to_json() for m in sorted(mqs)]})


def decode_lock_ok(body: bytes) -> frozenset[MessageQueue]:
    raw = loads_object(body, "lock result")
    items = raw.get("lockOKMQSet") or []
    if not isinstance(items, list):
        raise RemoteProtocolError("lockOKMQSet is not a list")
    return frozenset(MessageQueue.from_json(m) for m in items)


def encode_consumer_list(client_ids: list[str]) -> bytes:
    return dumps({"consumerIdList": client_ids})


def decode_consumer_list(body: bytes) -> list[str]:
    raw = loads_object(body, "consumer list")
    ids = raw.get("consumerIdList") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RemoteProtocolError("consumerIdList is not a list of strings")
    return list(ids)
