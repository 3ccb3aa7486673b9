"""The admin client: topics, routes, clusters, offsets, consumer progress, message lookups, offset resets.

``async with Admin(namesrv="127.0.0.1:9876") as admin: await admin.create_topic("T", read_queues=8)``

The module also holds the per-queue offset requests (min/max offset, search by time, committed offsets) that
the lite-pull consumer shares with the admin client.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from cometmq.client.admin_acl import AclAdmin
from cometmq.client.admin_controller import ControllerAdmin
from cometmq.client.admin_ha import EpochCache, EpochRange, HAStatus, ReplicationAdmin, RoleChange, _json_object
from cometmq.client.admin_kv import ORDER_TOPIC_CONFIG, KvAdmin
from cometmq.client.admin_ops import AdminOpsMixin
from cometmq.client.errors import (
    BrokerError,
    ClientStateError,
    ClientTimeoutError,
    InvalidArgumentError,
    MQClientError,
    NoRouteError,
    reading_reply,
)
from cometmq.client.instance import ClientInstance
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.protocol.acl import Credentials
from cometmq.protocol.admin_bodies import ConsumeStats as JavaConsumeStats
from cometmq.protocol.admin_bodies import TopicStatsTable
from cometmq.protocol.client_bodies import dumps
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.names import TOPIC_MESSAGE_TYPES, TOPIC_NAME_MAX, has_name_chars_only
from cometmq.protocol.properties import UNIQ_KEY
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import (
    MAX_QUEUE_NUMS,
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    ClusterInfo,
    TopicList,
    TopicRouteData,
)

log = logging.getLogger(__name__)

__all__ = [
    "Admin",
    "ConsumeStats",
    "EpochCache",
    "EpochRange",
    "HAStatus",
    "OffsetReset",
    "OffsetWrapper",
    "RoleChange",
    "TopicOffset",
    "to_millis",
]

#: the largest Java long (offsets, ids) and int (counts) a request field holds
_I64_MAX = 2**63 - 1
_I32_MAX = 2**31 - 1


# -- argument checks --------------------------------------------------------------------------------------------
def check_topic(topic: str) -> str:
    """A valid topic name (RocketMQ's rule: 1..127 characters of letters, digits, ``%|-_``), else raise."""
    if not isinstance(topic, str) or not topic or len(topic) > TOPIC_NAME_MAX or not has_name_chars_only(topic):
        raise InvalidArgumentError(f"topic {topic!r} is not a valid topic name (1..127 of letters, digits, %|-_)")
    return topic


def check_group(group: str) -> str:
    if not isinstance(group, str) or not group or len(group) > 255 or not has_name_chars_only(group):
        raise InvalidArgumentError(f"group {group!r} is not a valid group name (1..255 of letters, digits, %|-_)")
    return group


def check_queue(queue: object) -> MessageQueue:
    if not isinstance(queue, MessageQueue):
        raise InvalidArgumentError(f"expected a MessageQueue, got {type(queue).__name__}")
    check_topic(queue.topic)
    if not queue.broker_name:
        raise InvalidArgumentError(f"queue {queue} names no broker")
    if not isinstance(queue.queue_id, int) or queue.queue_id < 0:
        raise InvalidArgumentError(f"queue id {queue.queue_id!r} of {queue.topic} is not a non-negative integer")
    return queue


def to_millis(ts: int | _dt.datetime) -> int:
    """Epoch milliseconds from an int (already ms) or a datetime (naive = local time)."""
    if isinstance(ts, _dt.datetime):
        return int(ts.timestamp() * 1000)
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise InvalidArgumentError(f"a timestamp is epoch milliseconds (int) or a datetime, not {ts!r}")
    if ts < 0:
        raise InvalidArgumentError(f"timestamp {ts} is negative")
    return ts


def queue_label(q: MessageQueue) -> str:
    return f"{q.topic}/{q.broker_name}/{q.queue_id}"


# -- offset requests shared with the lite-pull consumer ------------------------------------------------------------
async def all_topics(instance: ClientInstance) -> list[str]:
    """Every topic some nameserver knows (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted."""
    r = await instance.namesrv_invoke(make_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list")
    if r.code != ResponseCode.SUCCESS:
        raise BrokerError(r.code, r.remark or "", context="topic list")
    with reading_reply("bad topic list"):
        return sorted(TopicList.decode(r.body).topics)


async def broker_addr_of(instance: ClientInstance, broker_name: str, topic: str | None = None) -> str:
    """The master address of ``broker_name``, asking the nameserver (for ``topic``'s route) when unknown."""
    addr = instance.master_addr(broker_name)
    if addr is None and topic is not None:
        await instance.route(topic, refresh=True)
        addr = instance.master_addr(broker_name)
    if addr is None:
        raise NoRouteError(f"no master address known for broker {broker_name}"
                           + (f" (topic {topic})" if topic else ""))
    return addr


async def _queue_request(instance: ClientInstance, q: MessageQueue, code: int, fields: dict[str, object],
                         what: str, ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
    addr = await broker_addr_of(instance, q.broker_name, q.topic)
    return await instance.invoke_ok(addr, make_request(code, fields), context=f"{what} of {queue_label(q)}", ok=ok)


def _int_field(response: RemotingCommand, key: str, what: str) -> int:
    try:
        return int(response.ext_fields[key])
    except (KeyError, ValueError):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"answer without a valid {key!r}", context=what) from None


async def min_offset(instance: ClientInstance, q: MessageQueue) -> int:
    r = await _queue_request(instance, q, RequestCode.GET_MIN_OFFSET, {"topic": q.topic, "queueId": q.queue_id},
                             "min offset")
    return _int_field(r, "offset", "min offset")


async def max_offset(instance: ClientInstance, q: MessageQueue) -> int:
    r = await _queue_request(instance, q, RequestCode.GET_MAX_OFFSET, {"topic": q.topic, "queueId": q.queue_id},
                             "max offset")
    return _int_field(r, "offset", "max offset")


async def search_offset(instance: ClientInstance, q: MessageQueue, timestamp_ms: int) -> int:
    """The first offset of ``q`` stored at or after ``timestamp_ms`` (the max offset when none is)."""
    r = await _queue_request(instance, q, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                             {"topic": q.topic, "queueId": q.queue_id, "timestamp": timestamp_ms},
                             "offset by time")
    return _int_field(r, "offset", "offset by time")


async def query_consumer_offset(instance: ClientInstance, group: str, q: MessageQueue) -> int | None:
    """The offset ``group`` committed for ``q``; None when it never committed one."""
    r = await _queue_request(instance, q, RequestCode.QUERY_CONSUMER_OFFSET,
                             {"consumerGroup": group, "topic": q.topic, "queueId": q.queue_id,
                              "setZeroIfNotFound": False},
                             f"committed offset of {group}", ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
    if r.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return _int_field(r, "offset", "committed offset")


async def update_consumer_offset(instance: ClientInstance, group: str, q: MessageQueue, offset: int) -> None:
    await _queue_request(instance, q, RequestCode.UPDATE_CONSUMER_OFFSET,
                         {"consumerGroup": group, "topic": q.topic, "queueId": q.queue_id, "commitOffset": offset},
                         f"commit of {group}")


# -- result types --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TopicOffset:
    """One queue of GET_TOPIC_STATS_INFO: the offsets it holds and when it was last written."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0

    @property
    def messages(self) -> int:
        return max(0, self.max_offset - self.min_offset)


@dataclass(frozen=True, slots=True)
class OffsetWrapper:
    """One queue of a group's progress: the broker's max offset and the group's committed offset."""

    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


@dataclass(frozen=True, slots=True)
class ConsumeStats:
    """A group's progress (RocketMQ ConsumeStats): per queue, and totals."""

    group: str
    offsets: Mapping[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(w.lag for w in self.offsets.values())

    @property
    def total_broker_offset(self) -> int:
        return sum(w.broker_offset for w in self.offsets.values())

    @property
    def total_consumer_offset(self) -> int:
        return sum(w.consumer_offset for w in self.offsets.values())

    def lag_by_topic(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q, w in self.offsets.items():
            out[q.topic] = out.get(q.topic, 0) + w.lag
        return out


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """What a reset did to one queue (RocketMQ RollbackStats)."""

    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    timestamp_offset: int
    #: the offset written (``consumer_offset`` when a non-forced reset would have moved forward)
    rollback_offset: int


def _records(body: bytes, broker_name: str) -> list[MessageExt]:
    with reading_reply("bad message body", context=broker_name):
        return [MessageExt.from_record(rec, broker_name) for rec in iter_records(body)]


# -- the admin client ---------------------------------------------------------------------------------------------
class Admin(ReplicationAdmin, ControllerAdmin, AdminOpsMixin, KvAdmin, AclAdmin):
    """An asyncio admin client (RocketMQ's DefaultMQAdminExt, the parts a user needs)."""

    def __init__(self, *, namesrv: str | Iterable[str] | None = None, instance: ClientInstance | None = None,
                 timeout: float = 3.0, credentials: Credentials | tuple[str, str] | None = None) -> None:
        if instance is None and namesrv is None:
            raise InvalidArgumentError("an admin client needs namesrv='host:port' or a ClientInstance")
        self.instance = instance or ClientInstance(namesrv or "", request_timeout=timeout, credentials=credentials)
        self.timeout = timeout
        self.started = False

    async def start(self) -> None:
        if self.started:
            return
        await self.instance.start()
        self.started = True

    async def close(self) -> None:
        if not self.started:
            return
        self.started = False
        await self.instance.close()

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _check(self) -> ClientInstance:
        if not self.started:
            raise ClientStateError("the admin client is not started (use 'async with Admin(...)' or start())")
        return self.instance

    # -- nameserver queries -------------------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        """Every broker group and the broker names of each cluster (GET_BROKER_CLUSTER_INFO)."""
        inst = self._check()
        r = await inst.namesrv_invoke(make_request(RequestCode.GET_BROKER_CLUSTER_INFO), "cluster info")
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", context="cluster info")
        with reading_reply("bad cluster info"):
            info = ClusterInfo.decode(r.body)
        for name, bd in info.broker_addr_table.items():
            inst.brokers[name] = dict(bd.broker_addrs)
        return info

    async def list_topics(self) -> list[str]:
        """Every topic some nameserver knows (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted."""
        return await all_topics(self._check())

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The topic's route, fresh from the nameserver; NoRouteError when no nameserver knows it."""
        check_topic(topic)
        route = await self._check().route(topic, refresh=True)
        if route is None:
            raise NoRouteError(f"topic {topic} does not exist (no nameserver has a route for it)")
        return route

    async def _masters(self, *, cluster: str | None, broker: str | None) -> dict[str, str]:
        """{broker name: master address} of a cluster, or of one broker given by name or address."""
        info = await self.cluster_info()
        if broker is not None:
            for name, bd in info.broker_addr_table.items():
                if broker == name or broker in bd.broker_addrs.values():
                    if bd.master_addr is None:
                        raise NoRouteError(f"broker {name} has no master online")
                    return {name: bd.master_addr}
            raise NoRouteError(f"no broker named or at {broker!r} is registered")
        if cluster is None:
            if not info.cluster_addr_table:
                raise NoRouteError("no broker is registered with the nameserver")
            if len(info.cluster_addr_table) != 1:
                raise InvalidArgumentError(f"say which cluster (known: {sorted(info.cluster_addr_table)}) "
                                           "or which broker")
            cluster = next(iter(info.cluster_addr_table))
        names = info.cluster_addr_table.get(cluster)
        if names is None:
            raise NoRouteError(f"cluster {cluster} is unknown (known: {sorted(info.cluster_addr_table)})")
        out = {}
        for name in names:
            data = info.broker_addr_table.get(name)
            if data is not None and data.master_addr is not None:
                out[name] = data.master_addr
        if not out:
            raise NoRouteError(f"cluster {cluster} has no master online")
        return out

    # -- topics ---------------------------------------------------------------------------------------------------
    async def create_topic(self, topic: str, *, read_queues: int = 4, write_queues: int | None = None,
                           perm: int = PERM_READ_WRITE, order: bool = False, message_type: str | None = None,
                           cluster: str | None = None, broker: str | None = None,
                           wait: float = 5.0, topic_sys_flag: int = 0) -> list[str]:
        """Create or update ``topic`` on every master of ``cluster`` (default: the only cluster), or on one
        ``broker`` (name or address), with UPDATE_AND_CREATE_TOPIC. Returns the broker names written.

        ``wait`` > 0 waits (that many seconds at most) until the nameserver's route shows the new config.
        ``topic_sys_flag`` holds RocketMQ's unit bits (1: a unit topic, 2: it has unit subscriptions).
        """
        check_topic(topic)
        write_queues = read_queues if write_queues is None else write_queues
        for what, n in (("read_queues", read_queues), ("write_queues", write_queues)):
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_QUEUE_NUMS:
                raise InvalidArgumentError(f"{what} must be within 1..{MAX_QUEUE_NUMS}, got {n!r}")
        if perm & ~(PERM_READ | PERM_WRITE | 1) or not perm & (PERM_READ | PERM_WRITE):
            raise InvalidArgumentError(f"perm {perm} is not a combination of read (4), write (2) and inherit (1)")
        if isinstance(topic_sys_flag, bool) or not isinstance(topic_sys_flag, int) or topic_sys_flag & ~3:
            raise InvalidArgumentError(f"topic_sys_flag {topic_sys_flag!r} is not a combination of unit (1) and "
                                       "unit sub (2)")
        if message_type is not None and message_type.upper() not in TOPIC_MESSAGE_TYPES:
            raise InvalidArgumentError(f"message type {message_type!r} is not one of "
                                       f"{', '.join(sorted(TOPIC_MESSAGE_TYPES))}")
        masters = await self._masters(cluster=cluster, broker=broker)
        fields: dict[str, object] = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": read_queues,
                                     "writeQueueNums": write_queues, "perm": perm,
                                     "topicFilterType": "SINGLE_TAG", "topicSysFlag": topic_sys_flag,
                                     "order": order}
        if message_type is not None:
            fields["attributes"] = f"+message.type={message_type.upper()}"
        inst = self._check()
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields),
                                              context=f"create topic {topic} on {name}")
                               for name, addr in masters.items()))
        if wait > 0:
            await self._wait_route(topic, wait, lambda route: route is not None and all(
                any(qd.broker_name == name and qd.read_queue_nums == read_queues
                    and qd.write_queue_nums == write_queues and qd.perm == perm for qd in route.queue_datas)
                for name in masters))
        return sorted(masters)

    update_topic = create_topic

    async def _wait_route(self, topic: str, timeout: float, done: Any) -> None:
        inst = self._check()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # The route is asked for to be checked, not kept: an admin that created 10,000 topics must not poll
        # 10,000 routes every 30 s afterwards (the instance refreshes every route it caches).
        cached = topic in inst.routes
        try:
            while True:
                route = await inst.route(topic, refresh=True)
                if done(route):
                    return
                if loop.time() >= deadline:
                    raise ClientTimeoutError(f"the nameserver's route of {topic} did not show the change within "
                                             f"{timeout:g}s")
                await asyncio.sleep(0.05)
        finally:
            if not cached:
                inst.routes.pop(topic, None)

    async def delete_topic(self, topic: str, *, cluster: str | None = None, wait: float = 5.0) -> list[str]:
        """Delete ``topic`` from the masters holding it (or every master of ``cluster``) with
        DELETE_TOPIC_IN_BROKER, then from every nameserver with DELETE_TOPIC_IN_NAMESRV.
        Returns the broker names it was deleted from."""
        check_topic(topic)
        inst = self._check()
        if cluster is not None:
            masters = await self._masters(cluster=cluster, broker=None)
        else:
            route = await inst.route(topic, refresh=True)
            if route is None:
                raise NoRouteError(f"topic {topic} does not exist (no nameserver has a route for it)")
            masters = {bd.broker_name: bd.master_addr for bd in route.broker_datas if bd.master_addr is not None}
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}),
                                              context=f"delete topic {topic} on {name}")
                               for name, addr in masters.items()))
        fields: dict[str, object] = {"topic": topic}
        if cluster is not None:
            fields["clusterName"] = cluster
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields),
                                              context=f"delete topic {topic} on nameserver {addr}")
                               for addr in inst.namesrv_addrs))
        try:  # as RocketMQ's deleteTopic: the topic's order conf goes too
            await self.delete_kv_config(ORDER_TOPIC_CONFIG, topic)
        except BrokerError:
            log.debug("the order conf of %s was not deleted", topic, exc_info=True)
        inst.routes.pop(topic, None)
        if wait > 0:
            await self._wait_route(topic, wait, lambda route: route is None or not any(
                qd.broker_name in masters for qd in route.queue_datas))
            inst.routes.pop(topic, None)
        return sorted(masters)

    async def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        """Min and max offset (and last write time) of every queue of ``topic`` (GET_TOPIC_STATS_INFO)."""
        route = await self.topic_route(topic)
        inst = self._check()
        out: dict[MessageQueue, TopicOffset] = {}
        for bd in route.broker_datas:
            if bd.master_addr is None:
                continue
            r = await inst.invoke_ok(bd.master_addr, make_request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}),
                                     context=f"stats of {topic} on {bd.broker_name}")
            # fastjson's TopicStatsTable (Apache brokers, cometmq) or cometmq's older list: admin_bodies reads both
            with reading_reply(f"bad stats of {topic}", addr=bd.master_addr):
                table = TopicStatsTable.decode(r.body, default_broker=bd.broker_name).offset_table
            for q, o in table.items():
                out[q] = TopicOffset(o.min_offset, o.max_offset, o.last_update_timestamp)
        return dict(sorted(out.items()))

    # -- consumer groups ---------------------------------------------------------------------------------------
    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumeStats:
        """The group's committed offsets against the brokers' max offsets, per queue (GET_CONSUME_STATS).

        With ``topic``, the brokers of that topic are asked about it alone; without, every master of every
        cluster is asked about every topic the group has committed offsets for."""
        check_group(group)
        inst = self._check()
        if topic is not None:
            route = await self.topic_route(topic)
            masters = {bd.broker_name: bd.master_addr for bd in route.broker_datas if bd.master_addr is not None}
        else:
            info = await self.cluster_info()
            masters = {n: bd.master_addr for n, bd in info.broker_addr_table.items() if bd.master_addr is not None}
        fields: dict[str, object] = {"consumerGroup": group}
        if topic is not None:
            fields["topic"] = topic
        offsets: dict[MessageQueue, OffsetWrapper] = {}
        tps = 0.0
        for name, addr in sorted(masters.items()):
            r = await inst.invoke_ok(addr, make_request(RequestCode.GET_CONSUME_STATS, fields),
                                     context=f"progress of {group} on {name}")
            with reading_reply(f"bad progress of {group}", addr=addr):
                stats = JavaConsumeStats.decode(r.body, default_broker=name)
            tps += stats.consume_tps
            for q, w in stats.offset_table.items():
                offsets[q] = OffsetWrapper(w.broker_offset, w.consumer_offset)
        return ConsumeStats(group, dict(sorted(offsets.items())), tps)

    async def reset_offset_by_timestamp(self, group: str, topic: str, timestamp: int | _dt.datetime, *,
                                        force: bool = True) -> list[OffsetReset]:
        """Move ``group``'s committed offsets of ``topic`` to the first message stored at or after ``timestamp``
        (epoch ms or datetime; -1 = the end of each queue): per queue SEARCH_OFFSET_BY_TIMESTAMP (or
        GET_MAX_OFFSET), then UPDATE_CONSUMER_OFFSET. Without ``force`` an offset only ever moves back.

        Consumers of the group that are online keep the offsets they hold in memory and may commit them
        over the reset (RocketMQ also tells them with RESET_CONSUMER_CLIENT_OFFSET; this client does not):
        stop them first, as ``mqadmin resetOffsetByTime`` asks.
        """
        check_group(group)
        ts = -1 if timestamp == -1 else to_millis(timestamp)
        route = await self.topic_route(topic)
        inst = self._check()
        queues = ClientInstance.queues_of(route, topic, writable=False)
        if not queues:
            raise NoRouteError(f"topic {topic} has no readable queue")
        progress = await self.consumer_progress(group, topic)

        async def one(q: MessageQueue) -> OffsetReset:
            current = progress.offsets.get(q)
            broker_off = current.broker_offset if current else await max_offset(inst, q)
            consumer_off = current.consumer_offset if current else 0
            target = await max_offset(inst, q) if ts == -1 else await search_offset(inst, q, ts)
            rollback = target if force or target <= consumer_off else consumer_off
            if rollback != consumer_off or force:
                await update_consumer_offset(inst, group, q, rollback)
            return OffsetReset(q, broker_off, consumer_off, target, rollback)

        return list(await asyncio.gather(*(one(q) for q in queues)))

    async def create_subscription_group(self, group: str, *, cluster: str | None = None, broker: str | None = None,
                                        consume_enable: bool = True, consume_broadcast_enable: bool = True,
                                        consume_from_min_enable: bool = True, retry_queue_nums: int = 1,
                                        retry_max_times: int = 16, consume_message_orderly: bool = False,
                                        **extra: Any) -> list[str]:
        """Create or update a subscription group (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) on every master of a
        cluster or on one broker. ``extra`` holds further RocketMQ config keys (camelCase), sent as they are."""
        check_group(group)
        if not 0 <= retry_queue_nums <= MAX_QUEUE_NUMS:
            raise InvalidArgumentError(f"retry_queue_nums must be within 0..{MAX_QUEUE_NUMS}, got {retry_queue_nums}")
        if not -1 <= retry_max_times <= _I32_MAX:
            raise InvalidArgumentError(f"retry_max_times must be within -1..{_I32_MAX}, got {retry_max_times}")
        for key in ("brokerId", "whichBrokerWhenConsumeSlowly"):  # Java longs
            v = extra.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _I64_MAX):
                raise InvalidArgumentError(f"{key} must be within 0..{_I64_MAX}, got {v!r}")
        masters = await self._masters(cluster=cluster, broker=broker)
        body = dumps({"groupName": group, "consumeEnable": consume_enable,
                      "consumeBroadcastEnable": consume_broadcast_enable,
                      "consumeFromMinEnable": consume_from_min_enable, "retryQueueNums": retry_queue_nums,
                      "retryMaxTimes": retry_max_times, "consumeMessageOrderly": consume_message_orderly, **extra})
        inst = self._check()
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                                                 body),
                                              context=f"create group {group} on {name}")
                               for name, addr in masters.items()))
        return sorted(masters)

    async def delete_subscription_group(self, group: str, *, cluster: str | None = None,
                                        broker: str | None = None, clean_offset: bool = False) -> list[str]:
        """Delete a subscription group (DELETE_SUBSCRIPTIONGROUP) on every master of a cluster or one broker;
        ``clean_offset`` also removes the group's committed offsets there (RocketMQ 5's cleanOffset)."""
        check_group(group)
        masters = await self._masters(cluster=cluster, broker=broker)
        inst = self._check()
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                                                 {"groupName": group, "cleanOffset": clean_offset}),
                                              context=f"delete group {group} on {name}")
                               for name, addr in masters.items()))
        return sorted(masters)

    async def subscription_groups(self, broker: str) -> dict[str, dict[str, Any]]:
        """The subscription group configs of one broker (name or address), by group name."""
        [(name, addr)] = (await self._masters(cluster=None, broker=broker)).items()
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
                                          context=f"groups of {name}")
        table = _json_object(r.body, "subscription groups").get("subscriptionGroupTable") or {}
        if not isinstance(table, dict):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "subscriptionGroupTable is not an object", addr=addr)
        return table

    # -- timer messages ---------------------------------------------------------------------------------------
    async def timer_metrics(self, *, cluster: str | None = None, broker: str | None = None,
                            addr: str | None = None) -> dict[str, dict[str, Any]]:
        """Each master's timer backlog and lateness (GET_TIMER_METRICS, cometmq's JSON), by broker name.

        ``broker`` may be a registered name or address; an address (``host:port``) no nameserver knows is
        asked directly, as is ``addr`` (no nameserver at all); both are keyed by the address. A broker with
        timers off answers ``{"enabled": False}``."""
        inst = self._check()
        if addr is not None:
            masters = {addr: addr}
        elif broker is not None and ":" in broker:
            try:
                masters = await self._masters(cluster=None, broker=broker)
            except MQClientError:
                masters = {broker: broker}  # not registered (or no nameserver): ask the address itself
        else:
            masters = await self._masters(cluster=cluster, broker=broker)

        async def one(name: str, addr: str) -> tuple[str, dict[str, Any]]:
            r = await inst.invoke_ok(addr, make_request(RequestCode.GET_TIMER_METRICS), context=f"timer of {name}")
            return name, _json_object(r.body, f"timer metrics of {name}")

        return dict(await asyncio.gather(*(one(n, a) for n, a in sorted(masters.items()))))

    # -- offsets of single queues -------------------------------------------------------------------------------
    async def min_offset(self, queue: MessageQueue) -> int:
        return await min_offset(self._check(), check_queue(queue))

    async def max_offset(self, queue: MessageQueue) -> int:
        return await max_offset(self._check(), check_queue(queue))

    async def search_offset(self, queue: MessageQueue, timestamp: int | _dt.datetime) -> int:
        return await search_offset(self._check(), check_queue(queue), to_millis(timestamp))

    async def committed_offset(self, group: str, queue: MessageQueue) -> int | None:
        return await query_consumer_offset(self._check(), check_group(group), check_queue(queue))

    async def update_consumer_offset(self, group: str, queue: MessageQueue, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= _I64_MAX:
            raise InvalidArgumentError(f"offset {offset!r} is not within 0..{_I64_MAX}")
        await update_consumer_offset(self._check(), check_group(group), check_queue(queue), offset)

    # -- messages -------------------------------------------------------------------------------------------
    async def view_message(self, offset_msg_id: str, topic: str | None = None) -> MessageExt:
        """The message an offset msgId names, from the broker whose address the id holds (VIEW_MESSAGE_BY_ID).
        ``topic``: the message's (RocketMQ 5's field); with ACL on, an account that is not an admin must name it,
        and the broker answers only a message of that topic."""
        inst = self._check()
        try:
            host, port, offset = decode_offset_msg_id(offset_msg_id)
        except ProtocolError as exc:
            raise InvalidArgumentError(f"not an offset message id: {exc}") from None
        if not 0 < port < 65536:  # (an id of zeros, or one made up)
            raise InvalidArgumentError(f"not an offset message id: {offset_msg_id!r} names no broker address "
                                       f"({host}:{port})")
        addr = f"{host}:{port}"
        ext = {"offset": offset} if topic is None else {"offset": offset, "topic": check_topic(topic)}
        r = await inst.invoke_ok(addr, make_request(RequestCode.VIEW_MESSAGE_BY_ID, ext),
                                 context=f"message {offset_msg_id}")
        msgs = _records(r.body, self._broker_name_at(addr))
        if not msgs:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND, "empty answer", addr=addr, context=offset_msg_id)
        return msgs[0]

    def _broker_name_at(self, addr: str) -> str:
        for name, addrs in self.instance.brokers.items():
            if addr in addrs.values():
                return name
        return addr

    async def query_messages_by_key(self, topic: str, key: str, *, max_num: int = 32,
                                    begin: int | _dt.datetime = 0, end: int | _dt.datetime | None = None
                                    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS hold ``key``, from every broker of the topic (QUERY_MESSAGE),
        oldest first, at most ``max_num``."""
        return await self._query(topic, key, max_num, begin, end, unique=False)

    async def query_message_by_unique_key(self, topic: str, msg_id: str) -> MessageExt:
        """The message of ``topic`` whose UNIQ_KEY (the msg_id a producer's SendResult gives) is ``msg_id``."""
        found = await self._query(topic, msg_id, 32, 0, None, unique=True)
        if not found:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND, f"no message with unique key {msg_id} in {topic}")
        return found[0]

    async def query_message(self, topic: str, msg_id: str) -> MessageExt:
        """A message by either kind of id: the unique key first, then the offset msgId (only when the address
        it names is a known broker)."""
        try:
            return await self.query_message_by_unique_key(topic, msg_id)
        except BrokerError as exc:
            if exc.code != ResponseCode.QUERY_NOT_FOUND:
                raise
        try:
            host, port, _ = decode_offset_msg_id(msg_id)
        except ProtocolError:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND, f"no message with id {msg_id} in {topic}") from None
        if self._broker_name_at(f"{host}:{port}") == f"{host}:{port}":
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND, f"no message with id {msg_id} in {topic}")
        return await self.view_message(msg_id, topic)

    async def _query(self, topic: str, key: str, max_num: int, begin: int | _dt.datetime,
                     end: int | _dt.datetime | None, *, unique: bool) -> list[MessageExt]:
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError("the key to look up is empty")
        if not 1 <= max_num <= 64 * 1024:
            raise InvalidArgumentError(f"max_num must be within 1..65536, got {max_num}")
        begin_ms = to_millis(begin)
        end_ms = to_millis(end) if end is not None else int(time.time() * 1000) + 1
        route = await self.topic_route(topic)
        inst = self._check()
        fields: dict[str, object] = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_ms,
                                     "endTimestamp": end_ms}
        if unique:
            fields["_UNIQUE_KEY_QUERY"] = "true"

        async def one(name: str, addr: str) -> list[MessageExt]:
            r = await inst.invoke_ok(addr, make_request(RequestCode.QUERY_MESSAGE, fields),
                                     context=f"query {key} in {topic} on {name}",
                                     ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            return _records(r.body, name) if r.code == ResponseCode.SUCCESS else []

        results = await asyncio.gather(*(one(bd.broker_name, bd.master_addr) for bd in route.broker_datas
                                         if bd.master_addr is not None))
        found: dict[str, MessageExt] = {}
        for msgs in results:
            for m in msgs:
                # The index is a hash: check the key really is there, and drop duplicates.
                if (m.properties.get(UNIQ_KEY) == key) if unique else (key in m.keys):
                    found[m.offset_msg_id] = m
        return sorted(found.values(), key=lambda m: (m.store_timestamp, m.commit_log_offset))[:max_num]
