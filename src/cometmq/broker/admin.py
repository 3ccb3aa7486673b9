"""Client management, consumer offsets, offset and message lookups, queue locks and admin requests."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from cometmq import __version__
from cometmq.broker.clients import ConsumerManager, ProducerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.groups import SubscriptionGroupConfig, SubscriptionGroupManager, check_group_name
from cometmq.broker.locks import RebalanceLockManager
from cometmq.broker.offsets import ConsumerOffsetManager, check_commit_offset
from cometmq.broker.stats import BrokerStats
from cometmq.broker.stats_windows import StatsWindows
from cometmq.broker.topics import TopicConfigManager, check_admin_topic, check_read_queue, retry_topic
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import (
    CLUSTERING,
    IS_SUB_CHANGE,
    IS_SUPPORT_HEART_BEAT_V2,
    HeartbeatData,
    LockBatchBody,
    MessageQueue,
    encode_lock_ok,
    loads_object,
)
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError, RemoteProtocolError
from cometmq.protocol.headers import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerListByGroupRequestHeader,
    Header,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    SearchOffsetRequestHeader,
    TopicQueueHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from cometmq.protocol.message import decode_record
from cometmq.protocol.remoting import DEFAULT_MAX_FRAME_SIZE, DEFAULT_VERSION, RemotingCommand, make_response
from cometmq.protocol.route import TopicConfig
from cometmq.store.message_store import MessageStore

if TYPE_CHECKING:
    from cometmq.broker.admin_tools import AdminTools

log = logging.getLogger(__name__)

Handler = Callable[[RemotingConnection, RemotingCommand], Awaitable[RemotingCommand | None]]


H = TypeVar("H", bound=Header)

#: The Java tools' requests (mqadmin, rocketmq-dashboard, rocketmq-exporter): request code -> the method of
#: :class:`cometmq.broker.admin_tools.AdminTools` that answers it. That module (and the bodies it writes,
#: cometmq.protocol.admin_bodies) is imported at the first of them: an idle broker does not hold it (issue [16]).
TOOL_REQUESTS: dict[int, str] = {
    RequestCode.GET_CONSUMER_CONNECTION_LIST: "consumer_connection",
    RequestCode.GET_PRODUCER_CONNECTION_LIST: "producer_connection",
    RequestCode.GET_ALL_PRODUCER_INFO: "all_producer_info",
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: "topic_consume_by_who",
    RequestCode.QUERY_TOPICS_BY_CONSUMER: "topics_by_consumer",
    RequestCode.QUERY_SUBSCRIPTION_BY_CONSUMER: "subscription_by_consumer",
    RequestCode.QUERY_CONSUME_TIME_SPAN: "consume_time_span",
    RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: "system_topics",
    RequestCode.GET_BROKER_CONSUME_STATS: "broker_consume_stats",
    RequestCode.VIEW_BROKER_STATS_DATA: "view_stats",
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: "reset_offset",
    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: "consumer_status",
    RequestCode.GET_CONSUMER_RUNNING_INFO: "consumer_running_info",
    RequestCode.CONSUME_MESSAGE_DIRECTLY: "consume_message_directly",
    RequestCode.QUERY_CORRECTION_OFFSET: "correction_offset",
    RequestCode.CLONE_GROUP_OFFSET: "clone_group_offset",
    RequestCode.GET_BROKER_CONFIG: "broker_config",
    RequestCode.UPDATE_BROKER_CONFIG: "update_broker_config",
    RequestCode.GET_TOPIC_CONFIG: "topic_config",
    RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: "group_config",
    RequestCode.UPDATE_AND_CREATE_TOPIC_LIST: "create_topic_list",
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST: "create_group_list",
}
#: requests cometmq cannot honour, with the remark its answer gives (AdminTools.not_supported)
NOT_SUPPORTED: dict[int, str] = {
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: "cometmq removes expired consume-queue files on its own schedule",
    RequestCode.DELETE_EXPIRED_COMMITLOG: "cometmq deletes expired commit-log files on its own schedule",
    RequestCode.CLEAN_UNUSED_TOPIC: "cometmq removes a topic's queues when the topic is deleted",
    RequestCode.QUERY_CONSUME_QUEUE: "cometmq does not serve raw consume-queue entries",
}
TOOL_REQUESTS.update((code, "not_supported") for code in NOT_SUPPORTED)


def _message_type(attributes: str | None) -> str:
    """The ``message.type`` of a create's ``attributes`` (``+message.type=FIFO``; ``-message.type`` resets it), the
    only topic attribute cometmq keeps: SYSTEM_ERROR for any other, rather than leaving it unapplied unsaid."""
    message_type = "NORMAL"
    for item in (attributes or "").replace(";", ",").split(","):
        key, sep, value = item.strip().partition("=")
        if not key:
            continue
        if key == "-message.type" and not sep:
            message_type = "NORMAL"
        elif key.lstrip("+") == "message.type" and sep:
            message_type = value.strip().upper()
        else:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"unsupported topic attribute {item.strip()!r}: cometmq "
                                                           "keeps +message.type only")
    return message_type


def parse(cls: type[H], cmd: RemotingCommand) -> H:
    # no longer needed (a bad header raises RemoteProtocolError, answered at the dispatch): inline as from_ext
    return cls.from_ext(cmd.ext_fields)


#: QUERY_MESSAGE's largest body: the frame limit less room for the header
_QUERY_BODY_MAX = DEFAULT_MAX_FRAME_SIZE - 64 * 1024


def _topic_of(view: memoryview, offset: int) -> str:
    """The topic of the record ``view`` a client named by its commit-log offset; NO_PERMISSION unless it decodes and
    its body CRC holds: a user may publish a body holding a made-up record header (of a topic it may read, with a
    body length running over the next records) and name the offset of that header."""
    try:
        return decode_record(view, check_crc=True)[0].topic
    except ProtocolError as exc:
        raise RemotingError(ResponseCode.NO_PERMISSION, f"no message at commit-log offset {offset}: {exc}") from None


def ok(cmd: RemotingCommand, ext: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    return make_response(cmd, ResponseCode.SUCCESS, None, ext or {}, body)


class AdminProcessor:
    def __init__(self, config: BrokerConfig, store: MessageStore, *, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, consumers: ConsumerManager,
                 producers: ProducerManager, locks: RebalanceLockManager, held_pulls: Callable[[], int],
                 clock: Callable[[], int], stats: BrokerStats | None = None,
                 windows: StatsWindows | None = None, forget_pop: Callable[..., int] | None = None) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.consumers = consumers
        self.producers = producers
        self.locks = locks
        self.held_pulls = held_pulls
        self.clock = clock
        #: the broker's counters: runtime info's totals (None only in tests that build the processor alone)
        self.stats = stats
        #: their rates and recent sums: runtime info's TPS, VIEW_BROKER_STATS_DATA
        self.windows = windows
        #: drops the POP state of a deleted topic (``topic=``) or group (``group=``): ``Pop.forget``
        self.forget_pop = forget_pop
        self.boot_ms = clock()
        #: GET_BROKER_CONFIG's data version: bumped by every UPDATE_BROKER_CONFIG
        self.config_version = 0
        self._tools: AdminTools | None = None

    @property
    def tools(self) -> AdminTools:
        """The tools' requests (TOOL_REQUESTS), built at the first."""
        if self._tools is None:
            from cometmq.broker.admin_tools import AdminTools

            self._tools = AdminTools(self)
        return self._tools

    def _tool(self, name: str) -> Handler:
        async def handle(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
            answer: Handler = getattr(self.tools, name)
            return await answer(conn, cmd)

        handle.__name__ = handle.__qualname__ = name
        return handle

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.earliest_time,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topics,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.create_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            **{code: self._tool(name) for code, name in TOOL_REQUESTS.items()},
        }

    # -- clients ----------------------------------------------------------------------------------------------
    async def heartbeat(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            data = HeartbeatData.decode(cmd.body)
        except ProtocolError as exc:  # name the part; the dispatch picks the code
            raise RemoteProtocolError(f"bad heartbeat: {exc}") from None
        conn.attributes["client_id"] = data.client_id
        # Heartbeat v2 (RocketMQ 5): a non-zero fingerprint stands for the heartbeat's subscriptions; with
        # withoutSub the client sent only the fingerprint. A group whose current subscriptions were not given
        # with that fingerprint (unknown here, e.g. after a restart, or changed) answers IS_SUB_CHANGE=true:
        # the client sends the full heartbeat. A 4.x heartbeat (no fingerprint) is full, as it always was.
        fingerprint = data.fingerprint
        without_sub = data.without_sub and fingerprint != 0
        sub_change = fingerprint == 0  # what RocketMQ answers a v1 heartbeat
        # The retry topics of the clustering groups, created before the answer with one sync for them all.
        consumers = [(consumer, self.groups.find(consumer.group_name)) for consumer in data.consumers]
        self.topics.create_system_topics((retry_topic(consumer.group_name), cfg.retryQueueNums)
                                         for consumer, cfg in consumers
                                         if cfg is not None and consumer.message_model == CLUSTERING
                                         and cfg.retryQueueNums > 0)  # (no retry queues: it takes no retries)
        for consumer, cfg in consumers:
            if without_sub and not self.consumers.knows_fingerprint(consumer.group_name, fingerprint):
                sub_change = True
            self.consumers.register(conn, data.client_id, cmd.language, cmd.version, consumer,
                                    notify=cfg is None or cfg.notifyConsumerIdsChangedEnable,
                                    fingerprint=fingerprint, without_sub=without_sub)
        for group in data.producer_groups:
            self.producers.register(conn, data.client_id, cmd.language, cmd.version, group)
        return ok(cmd, {IS_SUPPORT_HEART_BEAT_V2: "true", IS_SUB_CHANGE: "true" if sub_change else "false"})

    async def unregister_client(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(UnregisterClientRequestHeader, cmd)
        # only this connection's registration: another peer naming a client id (GET_CONSUMER_LIST_BY_GROUP tells
        # them) must not take a live consumer out of its group (its queues rebalanced away while it consumes them)
        if h.producer_group:
            self.producers.unregister(h.producer_group, h.client_id, conn)
        if h.consumer_group:
            self.consumers.unregister(h.consumer_group, h.client_id, conn)
            # that group's locks only: the client's consumers of other groups go on (one client id serves them
            # all), and with access control on, the request was allowed for this group alone
            self.locks.unlock_client(h.client_id, h.consumer_group)
        return ok(cmd)

    async def consumer_list(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(GetConsumerListByGroupRequestHeader, cmd)
        body = self.consumers.consumer_list_body(h.consumer_group)  # encoded once per membership change
        if body is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"no consumer of group {h.consumer_group} is online")
        return ok(cmd, body=body)

    # -- offsets --------------------------------------------------------------------------------------------
    async def query_consumer_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(QueryConsumerOffsetRequestHeader, cmd)
        offset = self.offsets.query(h.consumer_group, h.topic, h.queue_id)
        if offset >= 0:
            return ok(cmd, {"offset": str(offset)})
        # Never committed: as RocketMQ, a queue that still starts at 0 is read from its start, so a new
        # group sees the messages already sent to a new topic.
        if self.store.min_offset(h.topic, h.queue_id) <= 0 and h.set_zero_if_not_found is not False:
            return ok(cmd, {"offset": "0"})
        return make_response(cmd, ResponseCode.QUERY_NOT_FOUND, "no committed offset for this queue")

    async def update_consumer_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(UpdateConsumerOffsetRequestHeader, cmd)
        check_commit_offset(h.commit_offset)
        # As RocketMQ 5: a topic this broker has, one of its queues, and a group it has, made here when groups
        # are auto-created, as a pull makes it (RocketMQ makes it at the heartbeat only; an operator may set a new
        # group's offsets before its consumers start). Else every made-up name stays in consumerOffset.json.
        check_read_queue(self.topics.existing(h.topic), h.queue_id)
        self.groups.require(h.consumer_group)
        self.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return ok(cmd)

    async def max_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(TopicQueueHeader, cmd)
        return ok(cmd, {"offset": str(self.store.max_offset(h.topic, h.queue_id))})

    async def min_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(TopicQueueHeader, cmd)
        return ok(cmd, {"offset": str(self.store.min_offset(h.topic, h.queue_id))})

    async def search_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(SearchOffsetRequestHeader, cmd)
        return ok(cmd, {"offset": str(self.store.offset_by_time(h.topic, h.queue_id, h.timestamp))})

    async def earliest_time(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(TopicQueueHeader, cmd)
        ts = self.store.earliest_store_time(h.topic, h.queue_id)
        return ok(cmd, {"timestamp": str(ts if ts is not None else -1)})

    # -- messages -------------------------------------------------------------------------------------------
    async def view_message(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(ViewMessageRequestHeader, cmd)
        view = self.store.read_record(h.offset)
        if view is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"no message at commit-log offset {h.offset}")
        if h.topic and self.config.acl_enable and _topic_of(view, h.offset) != h.topic:
            # the ACL checked the topic named (an account that names none must be an admin): the offset must be a
            # message of it, else any message of the log could be read by its offset
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the message at commit-log offset {h.offset} is not "
                                                            f"one of topic {h.topic}")
        return ok(cmd, body=bytes(view))

    async def query_message(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(QueryMessageRequestHeader, cmd)
        found = self.store.query_by_key(h.topic, h.key, max(1, min(h.max_num, 64)), h.begin_timestamp,
                                          h.end_timestamp)
        if not found:
            return make_response(cmd, ResponseCode.QUERY_NOT_FOUND, f"no message with key {h.key} in {h.topic}")
        ext = {"indexLastUpdateTimestamp": str(self.clock()),
               "indexLastUpdatePhyoffset": str(self.store.commitlog.max_offset)}
        # the newest records that fit in one frame a client takes (64 large ones would not), the first always
        room, parts = _QUERY_BODY_MAX, list[memoryview]()
        for view in found:
            if parts and len(view) > room:
                break
            parts.append(view)
            room -= len(view)
        return ok(cmd, ext, b"".join(parts))

    # -- locks ----------------------------------------------------------------------------------------------
    async def lock_batch(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        body = self._lock_body(cmd)
        # Only queues this broker has, of a group it has (made as a pull makes it): a made-up name is not locked
        # (left out of the answer, which a client reads as "not locked"). Else one frame of made-up queues, groups or
        # broker names held ~250,000 entries until they expired, and a peer sending such frames grew the table
        # without bound within the lock's lifetime. (RocketMQ locks whatever it is sent.)
        self.groups.require(body.consumer_group)
        name = self.config.broker_name
        topics = self.topics.topics
        wanted: list[MessageQueue] = []
        for mq in body.mq_set:
            cfg = topics.get(mq.topic)
            if cfg is not None and mq.broker_name == name and \
                    0 <= mq.queue_id < max(cfg.read_queue_nums, cfg.write_queue_nums):
                wanted.append(mq)
        got = self.locks.try_lock_batch(body.consumer_group, wanted, body.client_id, conn)
        return ok(cmd, body=encode_lock_ok(got))

    async def unlock_batch(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        body = self._lock_body(cmd)
        self.locks.unlock_batch(body.consumer_group, body.mq_set, body.client_id)
        return ok(cmd)

    @staticmethod
    def _lock_body(cmd: RemotingCommand) -> LockBatchBody:
        try:
            return LockBatchBody.decode(cmd.body)
        except ProtocolError as exc:  # name the part; the dispatch picks the code
            raise RemoteProtocolError(f"bad lock body: {exc}") from None

    # -- topics and groups ----------------------------------------------------------------------------------
    async def create_topic(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(CreateTopicRequestHeader, cmd)
        cfg = TopicConfig(h.topic, h.read_queue_nums, h.write_queue_nums, h.perm, h.topic_filter_type,
                          h.topic_sys_flag, h.order, _message_type(h.attributes))
        check_admin_topic(cfg)
        self.topics.put(cfg)
        await self.topics.routes_settled()  # answered once the nameservers have it, as RocketMQ does
        return ok(cmd)

    async def delete_topic(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = parse(DeleteTopicRequestHeader, cmd)
        self.topics.delete(h.topic)
        if self.forget_pop is not None:  # (its offsets and in-flight messages go with it, as in RocketMQ)
            self.forget_pop(topic=h.topic)
        self.offsets.delete_topic(h.topic)
        self.store.delete_topic(h.topic)
        if self.stats is not None:
            self.stats.forget_topic(h.topic)
        # Durable before the answer: a crash soon after must bring back neither the consumers' offsets of the topic
        # nor its queues (recovery re-dispatches the log from the checkpoint, which its queues' units held back):
        # together they had the topic's old messages delivered again under the name.
        self.offsets.persist()
        if not await asyncio.to_thread(self.store.maintenance.checkpoint_now, 10.0):
            log.warning("topic %s deleted, but the store's checkpoint was not written within 10 s: after a crash its "
                        "queues may come back from the log", h.topic)
        return ok(cmd)

    async def all_topics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # TopicConfigSerializeWrapper
        from cometmq.protocol.admin_bodies import bean, fastjson_dumps

        table = {c.topic_name: bean(**c.to_json()) for c in sorted(self.topics.all(), key=lambda c: c.topic_name)}
        return ok(cmd, body=fastjson_dumps(bean(
            dataVersion=bean(counter=self.topics.data_version, stateVersion=0, timestamp=0), topicConfigTable=table)))

    async def create_group(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            raw = loads_object(cmd.body, "subscription group")
            cfg = SubscriptionGroupConfig.from_json(raw)
            cfg = self.groups.with_attributes(cfg, raw.get("attributes"))
        except (ProtocolError, TypeError, ValueError) as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {exc}") from None
        check_group_name(cfg.groupName)
        self.groups.put(cfg)
        return ok(cmd)

    async def all_groups(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # SubscriptionGroupWrapper
        from dataclasses import asdict

        from cometmq.protocol.admin_bodies import bean, fastjson_dumps

        table = {n: bean(**asdict(c)) for n, c in sorted(self.groups.groups.items())}
        return ok(cmd, body=fastjson_dumps(bean(dataVersion=bean(counter=0, stateVersion=0, timestamp=0),
                                                forbiddenTable={}, subscriptionGroupTable=table)))

    async def delete_group(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("groupName", "")
        if not group:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "header field 'groupName' is missing")
        self.groups.delete(group)
        if self.stats is not None:
            self.stats.forget_group(group)
        if cmd.ext_fields.get("cleanOffset", "false").strip().lower() in ("true", "1"):
            if self.forget_pop is not None:  # and its POP state (RocketMQ clears its in-flight counts)
                self.forget_pop(group=group)
            removed = self.offsets.delete_group(group)  # RocketMQ 5's cleanOffset (deleteSubGroup -r true)
            log.info("offsets of group %s removed (%d topics)", group, removed)
        return ok(cmd)

    # -- stats ----------------------------------------------------------------------------------------------
    def _queues(self, topic: str) -> list[int]:
        cfg = self.topics.existing(topic)
        return list(range(max(cfg.read_queue_nums, cfg.write_queue_nums)))

    async def topic_stats(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """TopicStatsTable: per queue its min and max offset and when its last message was stored."""
        from cometmq.protocol.admin_bodies import TopicOffset, TopicStatsTable

        topic = cmd.ext_fields.get("topic", "")
        store = self.store
        table: dict[MessageQueue, TopicOffset] = {}
        for q in self._queues(topic):
            last = max(store.max_offset(topic, q), 0)
            ts = store.store_time(topic, q, last - 1) if last > 0 else None
            table[MessageQueue(topic, self.config.broker_name, q)] = TopicOffset(
                max(store.min_offset(topic, q), 0), last, ts or 0)
        # topicPutTps: the broker keeps no per-topic rate window yet
        return ok(cmd, body=TopicStatsTable(table, 0.0).encode())

    def pulled_offset(self, group: str, topic: str, queue_id: int) -> int:
        """How far the group's pulls have read (the stats' record), -1 when unknown."""
        stats = self.stats
        return stats.pulled.get((group, topic, queue_id), -1) if stats is not None else -1

    async def consume_stats(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """ConsumeStats: per queue of the group's topics, the broker's max offset, the committed one, how far
        the group pulled and when the last consumed message was stored. As RocketMQ: ``topicList`` (comma
        separated) names the topics outright; otherwise ``topic`` or every topic the group committed offsets
        for, less those the group's online consumers do not subscribe to."""
        from cometmq.protocol.admin_bodies import ConsumeStats

        group = cmd.ext_fields.get("consumerGroup", "")
        listed = [t for t in cmd.ext_fields.get("topicList", "").split(",") if t]
        if listed:
            topics = sorted(set(listed))
        else:
            topic_filter = cmd.ext_fields.get("topic") or None
            topics = [topic_filter] if topic_filter else sorted(self.offsets.topics_of_group(group))
            info = self.consumers.groups.get(group)
            if info is not None and info.subscriptions:
                topics = [t for t in topics if t in info.subscriptions]
        table = {}
        for topic in topics:
            cfg = self.topics.get(topic)
            if cfg is None:
                continue
            for q in range(cfg.read_queue_nums):
                table[MessageQueue(topic, self.config.broker_name, q)] = self.tools._offset_wrapper(group, topic, q)
        # consumeTps: the broker keeps no per-group rate window yet
        return ok(cmd, body=ConsumeStats(table, 0.0).encode())

    async def runtime_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """KVTable of the keys RocketMQ's broker answers (mqadmin brokerStatus, the dashboard and the exporter read
        them, the exporter every one), plus cometmq's own (heldPullRequests, topicCount, consumerGroupsOnline)."""
        from cometmq.protocol.admin_bodies import KVTable

        return ok(cmd, body=KVTable(runtime_table(self)).encode())


_DISTRIBUTE_LABELS = ("<=0ms", "0~10ms", "10~50ms", "50~100ms", "100~200ms", "200~500ms", "500ms~1s", "1~2s",
                      "2~3s", "3~4s", "4~5s", "5~10s", "10s~")


def human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(n, false): ``512 B``, ``1.5 KiB``, ``931.5 GiB``."""
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n, 1024)), 6)
    return f"{n / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


def _runtime(ms: int) -> str:
    s = ms // 1000
    return f"[ {s // 86400} days, {s % 86400 // 3600} hours, {s % 3600 // 60} minutes, {s % 60} seconds ]"


def runtime_table(admin: AdminProcessor) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO's table. Counts are the broker's stats (totals since start, as RocketMQ's
    ``...TodayNow``); TPS ("10 s, 1 min, 10 min") and the totals when today and yesterday began come from its
    windows (cometmq.broker.stats_windows); latencies are not kept: "0"."""
    store = admin.store
    now = admin.clock()
    stats = admin.stats
    put_total, put_bytes, _ = stats.total_in() if stats is not None else (0, 0, 0)
    get_total = stats.total_out()[0] if stats is not None else 0
    earliest = [t for t in (store.earliest_store_time(topic, q) for topic, q in list(store.queues)) if t]
    try:
        st = os.statvfs(store.config.store_path)
        disk_total, disk_free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        ratio = 0.0 if disk_total == 0 else (disk_total - disk_free) / disk_total
    except OSError:
        disk_total = disk_free = 0
        ratio = -1.0
    windows = admin.windows
    put_tps, get_tps = windows.tps() if windows is not None else ((0.0,) * 3, (0.0,) * 3)
    today, yesterday = (windows.today_morning, windows.yesterday_morning) if windows is not None else ((0, 0),) * 2
    put_tps_text, get_tps_text = (" ".join(f"{v:.1f}" for v in tps) for tps in (put_tps, get_tps))
    table = {
        "brokerVersionDesc": f"cometmq {__version__}", "brokerVersion": str(DEFAULT_VERSION),
        "brokerActive": "true", "bootTimestamp": str(admin.boot_ms), "runtime": _runtime(now - admin.boot_ms),
        "msgPutTotalTodayNow": str(put_total), "msgGetTotalTodayNow": str(get_total),
        "msgPutTotalTodayMorning": str(today[0]), "msgGetTotalTodayMorning": str(today[1]),
        "msgPutTotalYesterdayMorning": str(yesterday[0]), "msgGetTotalYesterdayMorning": str(yesterday[1]),
        # getFound: pulls that found messages (as messages); misses are not counted
        "putTps": put_tps_text, "getFoundTps": get_tps_text, "getMissTps": "0.0 0.0 0.0",
        "getTotalTps": get_tps_text, "getTransferredTps": get_tps_text,
        "getTransferedTps": get_tps_text,  # the old spelling: the dashboard and the exporter read this one
        "putMessageTimesTotal": str(max(put_total, 1)), "putMessageSizeTotal": str(put_bytes),
        "putMessageAverageSize": repr(put_bytes / max(put_total, 1)), "putMessageFailedTimes": "0",
        "putMessageEntireTimeMax": "0", "getMessageEntireTimeMax": "0", "putLatency99": "0.00",
        "putLatency999": "0.00", "putMessageDistributeTime": " ".join(f"[{label}]:0" for label in _DISTRIBUTE_LABELS),
        "dispatchMaxBuffer": "0", "dispatchBehindBytes": "0", "pageCacheLockTimeMills": "0",
        "commitLogMinOffset": str(store.commitlog.min_offset), "commitLogMaxOffset": str(store.commitlog.max_offset),
        "commitLogDiskRatio": repr(ratio), f"commitLogDiskRatio_{store.config.store_path}": repr(ratio),
        "consumeQueueDiskRatio": repr(ratio),
        "commitLogDirCapacity": f"Total : {human_bytes(disk_total)}, Free : {human_bytes(disk_free)}.",
        "remainHowManyDataToFlush": human_bytes(max(store.commitlog.max_offset - store.flushed_offset, 0)),
        "remainTransientStoreBufferNumbs": "0",
        "earliestMessageTimeStamp": str(min(earliest) if earliest else 0),
        "startAcceptSendRequestTimeStamp": "0",
        "timerReadBehind": "0", "timerOffsetBehind": "0", "timerCongestNum": "0", "timerEnqueueTps": "0.0",
        "timerDequeueTps": "0.0",
        "EndTransactionQueueSize": "0", "EndTransactionThreadPoolQueueCapacity": "100000",
        "heldPullRequests": str(admin.held_pulls()), "topicCount": str(len(admin.topics.topics)),
        "consumerGroupsOnline": str(len(admin.consumers.groups)),
    }
    # No thread pools here (one event loop): queues are empty, waits 0; capacities are RocketMQ's defaults.
    for pool, capacity in (("send", 10000), ("pull", 100000), ("litePull", 100000), ("query", 20000),
                           ("ack", 100000)):
        table[f"{pool}ThreadPoolQueueSize"] = "0"
        table[f"{pool}ThreadPoolQueueCapacity"] = str(capacity)
        table[f"{pool}ThreadPoolQueueHeadWaitTimeMills"] = "0"
    return table
