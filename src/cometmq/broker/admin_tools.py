"""The admin requests RocketMQ's Java tools send (mqadmin, rocketmq-dashboard, rocketmq-exporter), answered in
the shapes the Java classes serialize (``cometmq.protocol.admin_bodies``).

``AdminProcessor`` (broker/admin.py) keeps the requests clients need; this module holds the tools' own:
connections, who consumes what, consume time spans, broker-wide consume stats, stats items, offset resets and
clones, the broker's config, and the requests forwarded to a consumer (running info, consume directly, status).
Requests cometmq cannot honour are answered with an error whose remark says why, never left unanswered. Which
request goes to which method is ``TOOL_REQUESTS`` in broker/admin.py: this module is imported at the first of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from cometmq.broker.admin import NOT_SUPPORTED
from cometmq.broker.clients import ClientChannel
from cometmq.broker.config import BROKER_KEYS, BrokerConfig, parse_properties
from cometmq.broker.groups import SubscriptionGroupConfig, check_group_name
from cometmq.broker.topics import check_admin_topic
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.admin_bodies import (
    BrokerStatsData,
    BrokerStatsItem,
    Connection,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    ObjectKey,
    OffsetWrapper,
    ProducerConnection,
    ProducerInfo,
    QueueTimeSpan,
    ResetOffsetBody,
    bean,
    encode_consume_time_span,
    encode_producer_table,
    encode_topic_list,
    fastjson_dumps,
    parse_fastjson,
    subscription_bean,
)
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError, RemoteProtocolError
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.names import SYSTEM_TOPIC_PREFIX, SYSTEM_TOPICS
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from cometmq.protocol.route import TopicConfig

if TYPE_CHECKING:
    from cometmq.broker.admin import AdminProcessor

log = logging.getLogger(__name__)


#: How long the broker waits for a consumer it forwards a request to (RocketMQ: 5 s).
CALL_CLIENT_TIMEOUT_S = 5.0
LONG_MAX = 2**63 - 1


#: BrokerStatsManager's stats item names (VIEW_BROKER_STATS_DATA's statsName).
STATS_NAMES = frozenset({"TOPIC_PUT_NUMS", "TOPIC_PUT_SIZE", "GROUP_GET_NUMS", "GROUP_GET_SIZE",
                         "SNDBCK_PUT_NUMS", "BROKER_PUT_NUMS", "BROKER_GET_NUMS", "GROUP_GET_FROM_DISK_NUMS",
                         "GROUP_GET_FROM_DISK_SIZE", "BROKER_GET_FROM_DISK_NUMS", "BROKER_GET_FROM_DISK_SIZE",
                         "COMMERCIAL_SEND_TIMES", "COMMERCIAL_RCV_TIMES", "COMMERCIAL_SEND_SIZE",
                         "COMMERCIAL_RCV_SIZE", "GROUP_GET_LATENCY", "TOPIC_PUT_LATENCY", "GROUP_CK_NUMS",
                         "GROUP_ACK_NUMS", "DLQ_PUT_NUMS"})

#: UPDATE_BROKER_CONFIG: the keys a running broker can take, and how each is applied.
RUNTIME_KEYS = ("channelExpiredTimeout", "lockMaxLiveTime")

def _ok(cmd: RemotingCommand, body: bytes = b"", ext: dict[str, str] | None = None) -> RemotingCommand:
    return make_response(cmd, ResponseCode.SUCCESS, None, ext or {}, body)


def _text(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if not value:
        raise RemoteProtocolError(f"header field {key!r} is missing")
    return value


def _int(cmd: RemotingCommand, key: str, default: int | None = None) -> int:
    raw = cmd.ext_fields.get(key)
    if raw is None or raw == "":
        if default is None:
            raise RemoteProtocolError(f"header field {key!r} is missing")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RemoteProtocolError(f"header field {key!r} = {raw[:40]!r} is not an integer") from None


def _flag(cmd: RemotingCommand, key: str) -> bool:
    return cmd.ext_fields.get(key, "false").strip().lower() in ("true", "1")


def _connection(ch: ClientChannel) -> Connection:
    return Connection(ch.client_id, ch.conn.remote_address, ch.language, ch.version)


def _format_delay_levels(levels: Iterable[int]) -> str:
    out = []
    for ms in levels:
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                out.append(f"{ms // size}{unit}")
                break
        else:
            out.append(f"{ms}ms")
    return " ".join(out)


def _prop_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "value") and not isinstance(value, (int, str)):  # an Enum
        return str(value.value)
    return str(value)


class AdminTools:
    """The Java tools' admin requests, over the broker parts ``AdminProcessor`` holds."""

    def __init__(self, admin: AdminProcessor) -> None:
        self.admin = admin

    # -- helpers --------------------------------------------------------------------------------------------
    @property
    def broker_name(self) -> str:
        return self.admin.config.broker_name

    def _broker_addr(self, conn: RemotingConnection) -> str:
        """The address clients reach this broker at: its advertised host and the port the request came in on
        (the config's port is 0 when the broker was started on an ephemeral one)."""
        port = conn.local_address.rpartition(":")[2]
        cfg = self.admin.config
        return f"{cfg.broker_ip or cfg.listen_host}:{port}" if port.isdigit() else cfg.advertised_addr

    def _topic(self, topic: str) -> TopicConfig:
        cfg = self.admin.topics.get(topic)
        if cfg is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        return cfg

    def _offset_wrapper(self, group: str, topic: str, q: int) -> OffsetWrapper:
        store = self.admin.store
        broker_offset = max(store.max_offset(topic, q), 0)
        consumer_offset = max(self.admin.offsets.query(group, topic, q), 0)
        pulled = self.admin.pulled_offset(group, topic, q)
        last = store.store_time(topic, q, consumer_offset - 1) if consumer_offset > 0 else None
        return OffsetWrapper(broker_offset, consumer_offset, max(consumer_offset, pulled), last or 0)

    # -- connections ----------------------------------------------------------------------------------------
    async def consumer_connection(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group = _text(cmd, "consumerGroup")
        info = self.admin.consumers.groups.get(group)
        if info is None:
            return make_response(cmd, ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = ConsumerConnection(tuple(_connection(ch) for ch in info.channels.values()), dict(info.subscriptions),
                                  info.consume_type, info.message_model, info.consume_from_where)
        return _ok(cmd, body.encode())

    async def producer_connection(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group = _text(cmd, "producerGroup")
        channels = self.admin.producers.groups.get(group)
        if not channels:
            return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return _ok(cmd, ProducerConnection(tuple(_connection(ch) for ch in channels.values())).encode())

    async def all_producer_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        table = {group: [ProducerInfo(ch.client_id, ch.conn.remote_address, ch.language, ch.version,
                                      ch.last_update_ms) for ch in sorted(channels.values(), key=lambda c: c.client_id)]
                 for group, channels in self.admin.producers.groups.items()}
        return _ok(cmd, encode_producer_table(table))

    # -- who consumes what ------------------------------------------------------------------------------------
    async def topic_consume_by_who(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _text(cmd, "topic")
        groups = {g for g, info in self.admin.consumers.groups.items() if topic in info.subscriptions}
        groups |= self.admin.offsets.groups_of_topic(topic)
        return _ok(cmd, GroupList(tuple(groups)).encode())

    async def topics_by_consumer(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group = _text(cmd, "group")
        return _ok(cmd, encode_topic_list(self.admin.offsets.topics_of_group(group), self._broker_addr(conn)))

    async def subscription_by_consumer(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group, topic = _text(cmd, "group"), _text(cmd, "topic")
        sub = self.admin.consumers.subscription(group, topic)
        return _ok(cmd, fastjson_dumps(bean(group=group, topic=topic,
                                            subscriptionData=subscription_bean(sub) if sub is not None else None)))

    async def consume_time_span(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topic, group = _text(cmd, "topic"), _text(cmd, "group")
        cfg = self._topic(topic)
        store = self.admin.store
        now = self.admin.clock()
        spans = []
        for q in range(cfg.write_queue_nums):
            min_time = store.earliest_store_time(topic, q) or 0
            max_offset = store.max_offset(topic, q)
            max_time = (store.store_time(topic, q, max_offset - 1) or 0) if max_offset > 0 else 0
            consumer_offset = self.admin.offsets.query(group, topic, q)
            consume_time = (store.store_time(topic, q, consumer_offset - 1) or 0) if consumer_offset > 0 else min_time
            delay = 0
            if consumer_offset < max_offset:
                next_time = store.store_time(topic, q, max(consumer_offset, 0))
                delay = now - next_time if next_time else 0
            spans.append(QueueTimeSpan(MessageQueue(topic, self.broker_name, q), min_time, max_time, consume_time,
                                       delay))
        return _ok(cmd, encode_consume_time_span(spans))

    async def system_topics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        held = {t for t in self.admin.topics.topics if t.startswith(SYSTEM_TOPIC_PREFIX)}
        return _ok(cmd, encode_topic_list(SYSTEM_TOPICS | held))

    # -- broker-wide stats ------------------------------------------------------------------------------------
    def _groups(self) -> set[str]:
        groups = set(self.admin.groups.groups)
        for key in self.admin.offsets.table:
            groups.add(key.split("@", 1)[1] if "@" in key else key)
        return groups

    def _subscribed(self, group: str, topic: str) -> bool:
        """RocketMQ's filter: a group with online subscriptions counts only the topics it subscribes to."""
        info = self.admin.consumers.groups.get(group)
        return info is None or not info.subscriptions or topic in info.subscriptions

    async def broker_consume_stats(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        only_order = _flag(cmd, "isOrder")
        out = []
        total_diff = total_inflight = 0
        for group in sorted(self._groups()):
            stats_of_group = []
            for topic in sorted(self.admin.offsets.topics_of_group(group)):
                cfg = self.admin.topics.get(topic)
                if cfg is None or (only_order and not cfg.order) or not self._subscribed(group, topic):
                    continue
                table = {MessageQueue(topic, self.broker_name, q): self._offset_wrapper(group, topic, q)
                         for q in range(cfg.write_queue_nums)}
                stats = ConsumeStats(table, 0.0)  # consumeTps: no windowed counter yet
                total_diff += stats.total_diff()
                total_inflight += stats.inflight_total_diff()
                stats_of_group.append(stats)
            out.append((group, tuple(stats_of_group)))
        return _ok(cmd, ConsumeStatsList(tuple(out), self._broker_addr(conn), total_diff, total_inflight).encode())

    async def view_stats(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        name, key = _text(cmd, "statsName"), cmd.ext_fields.get("statsKey", "")
        if name not in STATS_NAMES:
            return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        windows = self.admin.windows
        item = windows.item(name, key) if windows is not None else None
        if item is None:  # RocketMQ's answer for an item it never counted (or one not kept here: not KEPT)
            return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return _ok(cmd, BrokerStatsData(*(BrokerStatsItem(w.sum, w.tps, w.avgpt)
                                          for w in (item.minute, item.hour, item.day))).encode())

    # -- offsets ------------------------------------------------------------------------------------------------
    async def reset_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's Broker2Client.resetOffset: each queue to the first offset stored at or after ``timestamp``
        (-1: the end; with ``isForce`` false an offset only moves back), or one queue (``queueId``) to
        ``offset``; the group's online consumers are told (RESET_CONSUMER_CLIENT_OFFSET) and the offsets
        committed. With no consumer online the answer is CONSUMER_NOT_ONLINE, and tools write the offsets
        themselves, as mqadmin does."""
        topic, group = _text(cmd, "topic"), _text(cmd, "group")
        timestamp = _int(cmd, "timestamp", -1)
        force = _flag(cmd, "isForce") if "isForce" in cmd.ext_fields else True
        queue_id = _int(cmd, "queueId", -1)
        target = _int(cmd, "offset", -1)
        cfg = self._topic(topic)
        if queue_id >= cfg.write_queue_nums:  # (RocketMQ resets the queues the topic has; a made-up one was written)
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"queueId {queue_id} is not a queue of {topic}: it has "
                                                           f"{cfg.write_queue_nums}")
        channels = [ch for ch in self.admin.consumers.channels(group) if not ch.conn.closed]
        if not channels:
            return make_response(cmd, ResponseCode.CONSUMER_NOT_ONLINE,
                                 f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                                 f"Timestamp: {timestamp}")
        store = self.admin.store
        offsets: dict[MessageQueue, int] = {}
        queues = [queue_id] if queue_id >= 0 else list(range(cfg.write_queue_nums))
        for q in queues:
            if queue_id >= 0 and target >= 0:
                low, high = store.min_offset(topic, q), store.max_offset(topic, q)
                if target < low or target > high:
                    return make_response(cmd, ResponseCode.SYSTEM_ERROR,
                                         f"Target offset {target} not in consume queue range [{low}-{high}]")
                offsets[MessageQueue(topic, self.broker_name, q)] = target
                continue
            wanted = store.max_offset(topic, q) if timestamp < 0 else store.offset_by_time(topic, q, timestamp)
            current = self.admin.offsets.query(group, topic, q)
            wanted = max(wanted, 0)
            offsets[MessageQueue(topic, self.broker_name, q)] = wanted if force or current < 0 or wanted < current \
                else current
        for mq, offset in offsets.items():
            self.admin.offsets.commit(group, topic, mq.queue_id, offset)
        body = ResetOffsetBody(offsets).encode()
        notice = make_request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                              {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}, body,
                              oneway=True)
        for ch in channels:
            try:
                ch.conn.send_oneway(notice)
            except ConnectionError as exc:
                log.warning("cannot tell %s of %s about the offset reset: %s", ch.client_id, group, exc)
        log.info("reset offsets of %s on %s to %s", group, topic, {m.queue_id: o for m, o in offsets.items()})
        return _ok(cmd, body)

    async def correction_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _text(cmd, "topic")
        compare = cmd.ext_fields.get("compareGroup", "")
        skip = {g for g in cmd.ext_fields.get("filterGroups", "").split(",") if g}
        table = self.admin.offsets.table
        correction: dict[int, int] = {}
        for key, queues in table.items():
            t, _, g = key.partition("@")
            if t != topic or g in skip:
                continue
            for q, o in queues.items():
                correction[q] = min(correction.get(q, o), o)
        for q, o in table.get(f"{topic}@{compare}", {}).items():
            if q in correction:
                correction[q] = LONG_MAX if correction[q] > o else correction[q]
        return _ok(cmd, fastjson_dumps(bean(correctionOffsets=dict(sorted(correction.items())))))

    async def clone_group_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        src, dest = _text(cmd, "srcGroup"), _text(cmd, "destGroup")
        topic = cmd.ext_fields.get("topic") or None
        offline = _flag(cmd, "offline")
        offsets = self.admin.offsets
        topics = [topic] if topic else sorted(offsets.topics_of_group(src))
        for t in topics:
            if self.admin.topics.get(t) is None:
                continue
            if not offline and not self._subscribed(src, t):
                continue
            queues = offsets.table.get(f"{t}@{src}")
            if queues:
                offsets.reset(dest, t, dict(queues))
        return _ok(cmd)

    # -- requests forwarded to a consumer ------------------------------------------------------------------
    def _consumer(self, group: str, client_id: str) -> ClientChannel:
        for ch in self.admin.consumers.channels(group):
            if ch.client_id == client_id and not ch.conn.closed:
                return ch
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")

    async def _call(self, ch: ClientChannel, group: str, request: RemotingCommand) -> RemotingCommand:
        try:
            return await ch.conn.request(request, CALL_CLIENT_TIMEOUT_S)
        except TimeoutError as exc:
            raise RemotingError(ResponseCode.CONSUME_MSG_TIMEOUT,
                                f"consumer <{group}> <{ch.client_id}> Timeout: {exc}") from None
        except ConnectionError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"invoke consumer <{group}> <{ch.client_id}> Exception: {exc}") from None

    async def _forward(self, cmd: RemotingCommand, body: bytes | None = None) -> RemotingCommand:
        group, client_id = _text(cmd, "consumerGroup"), _text(cmd, "clientId")
        ch = self._consumer(group, client_id)
        reply = await self._call(ch, group, make_request(cmd.code, cmd.ext_fields,
                                                         cmd.body if body is None else body))
        return make_response(cmd, reply.code, reply.remark, reply.ext_fields, reply.body)

    async def consumer_running_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return await self._forward(cmd)

    async def consume_message_directly(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        msg_id = _text(cmd, "msgId")
        try:
            _, _, offset = decode_offset_msg_id(msg_id)
        except ProtocolError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"bad msgId {msg_id}: {exc}") from None
        record = self.admin.store.read_record(offset)
        if record is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"no message at commit-log offset {offset}")
        return await self._forward(cmd, bytes(record))

    async def consumer_status(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """Broker2Client.getConsumeStatus: ask each consumer of the group (or the one at ``clientAddr``) for
        its offsets of ``topic`` (GET_CONSUMER_STATUS_FROM_CLIENT) and gather them by client id."""
        topic, group = _text(cmd, "topic"), _text(cmd, "group")
        client_addr = cmd.ext_fields.get("clientAddr") or None
        channels = [ch for ch in self.admin.consumers.channels(group) if not ch.conn.closed]
        if not channels:
            return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"No Any Consumer online in the consumer group: "
                                                                  f"[{group}]")
        table: dict[str, dict[MessageQueue, int]] = {}
        for ch in channels:
            if client_addr is not None and ch.conn.remote_address != client_addr:
                continue
            request = make_request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"topic": topic, "group": group,
                                                                                "clientAddr": client_addr or ""})
            try:
                reply = await self._call(ch, group, request)
            except RemotingError as exc:
                log.warning("consumer status of %s: %s", ch.client_id, exc)
                continue
            if reply.code != ResponseCode.SUCCESS:
                continue
            try:
                raw = parse_fastjson(reply.body, "consumer status")
                queues = raw.get("messageQueueTable") if isinstance(raw, dict) else None
                table[ch.client_id] = {
                    MessageQueue(str(k["topic"]), str(k["brokerName"]), int(k["queueId"])): int(v)
                    for k, v in (queues or {}).items() if isinstance(k, ObjectKey)}
            except (RemoteProtocolError, KeyError, TypeError, ValueError) as exc:
                log.warning("bad consumer status from %s: %s", ch.client_id, exc)
        body = fastjson_dumps(bean(consumerTable={c: {q: o for q, o in sorted(t.items())}
                                                  for c, t in sorted(table.items())},
                                   messageQueueTable={}))
        return _ok(cmd, body)

    # -- config -----------------------------------------------------------------------------------------------
    def _config_properties(self, conn: RemotingConnection) -> dict[str, str]:
        from cometmq.store.config import STORE_KEYS

        cfg: BrokerConfig = self.admin.config
        out: dict[str, str] = {}
        for key, (attr, _conv) in BROKER_KEYS.items():
            if key == "brokerElectionPriority":
                continue
            value = getattr(cfg, attr)
            if key == "innerClientAuthenticationCredentials":
                # the broker's own (admin) keys: the access key only, never the secret (any account may ask this)
                if value:
                    out[key] = json.dumps({"accessKey": value[0]})
                continue
            out[key] = _format_delay_levels(value) if key == "messageDelayLevel" else _prop_value(value)
        port = conn.local_address.rpartition(":")[2]
        if port.isdigit():
            out["listenPort"] = port
        out["channelExpiredTimeout"] = str(self.admin.consumers.channel_expired_ms)
        out["lockMaxLiveTime"] = str(self.admin.locks.lock_max_live_ms)
        for key, (attr, _conv) in STORE_KEYS.items():
            if hasattr(cfg.store, attr):
                value = getattr(cfg.store, attr)
                if key == "mappedFileSizeConsumeQueue":
                    from cometmq.store.config import CQ_UNIT_SIZE

                    value = value * CQ_UNIT_SIZE
                out[key] = _prop_value(value)
        return dict(sorted(out.items()))

    async def broker_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        text = "".join(f"{k}={v}\n" for k, v in self._config_properties(conn).items())
        version = fastjson_dumps(bean(counter=self.admin.config_version, stateVersion=0, timestamp=0)).decode()
        return _ok(cmd, text.encode("utf-8"), {"version": version})

    async def update_broker_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            changes = parse_properties(cmd.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"string2Properties error: {exc}")
        refused = sorted(k for k in changes if k not in RUNTIME_KEYS)
        if refused:
            return make_response(cmd, ResponseCode.NO_PERMISSION,
                                 f"cannot change {', '.join(refused)} on a running cometmq broker (set them in "
                                 f"broker.conf and restart); changeable at runtime: {', '.join(RUNTIME_KEYS)}")
        values: dict[str, int] = {}
        for key, raw in changes.items():
            try:
                values[key] = int(raw)
            except ValueError:
                return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{key}={raw[:40]!r} is not an integer")
            if values[key] <= 0:
                return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{key} must be positive")
        admin = self.admin
        if "channelExpiredTimeout" in values:
            admin.consumers.channel_expired_ms = admin.producers.channel_expired_ms = values["channelExpiredTimeout"]
        if "lockMaxLiveTime" in values:
            admin.locks.lock_max_live_ms = values["lockMaxLiveTime"]
        if values:
            admin.config_version += 1
            log.info("broker config changed by %s: %s", conn.remote_address, values)
        return _ok(cmd)

    async def topic_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        cfg = self._topic(_text(cmd, "topic"))
        return _ok(cmd, fastjson_dumps(bean(**cfg.to_json())))

    async def group_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group = _text(cmd, "group")
        cfg = self.admin.groups.groups.get(group)
        if cfg is None:
            return make_response(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"group[{group}] not exist")
        return _ok(cmd, fastjson_dumps(bean(**asdict(cfg))))

    async def create_topic_list(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        raw = parse_fastjson(cmd.body, "topic config list")
        items = raw.get("topicConfigList") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise RemoteProtocolError("topic config list: topicConfigList must be a list")
        configs = [TopicConfig.from_json(item) for item in items]
        for cfg in configs:  # every one checked before any is put: a refused list changes nothing
            check_admin_topic(cfg)
        for cfg in configs:
            self.admin.topics.put(cfg)
        await self.admin.topics.routes_settled()
        return _ok(cmd)

    async def create_group_list(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        raw = parse_fastjson(cmd.body, "subscription group list")
        items = raw.get("groupConfigList") if isinstance(raw, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise RemoteProtocolError("subscription group list: groupConfigList must be a list of objects")
        try:
            configs = [SubscriptionGroupConfig.from_json(item) for item in items]
        except TypeError as exc:
            raise RemoteProtocolError(f"bad subscription group config: {exc}") from None
        for cfg in configs:  # every name checked before any is written
            check_group_name(cfg.groupName)
        for cfg in configs:
            self.admin.groups.put(cfg)
        return _ok(cmd)

    async def not_supported(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        name = RequestCode(cmd.code).name
        return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"{name}: {NOT_SUPPORTED[RequestCode(cmd.code)]}")
