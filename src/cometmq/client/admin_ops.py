"""The operator part of the admin client (``cometmq admin``, RocketMQ's mqadmin): connections of producer and
consumer groups, broker runtime info and config, write permission at the nameservers, reading queues at an
offset, offset resets through the broker (online consumers told), and the groups that consume a topic.
``Admin`` (client/admin.py) has these methods.

Requests a broker or nameserver does not serve (REQUEST_CODE_NOT_SUPPORTED) raise ``BrokerError`` with that
code, except where RocketMQ's tools have a fallback: an offset reset for a group with no consumer online (or a
broker without INVOKE_BROKER_TO_RESET_OFFSET) writes the committed offsets directly, and the groups of a topic
are found from the groups' committed offsets when QUERY_TOPIC_CONSUME_BY_WHO is not served.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cometmq.client.errors import BrokerError, InvalidArgumentError, NoRouteError, reading_reply
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.net.client import split_address
from cometmq.protocol.admin_bodies import (
    BrokerStatsData,
    Connection,
    GroupList,
    KVTable,
    ProducerConnection,
    ResetOffsetBody,
)
from cometmq.protocol.admin_bodies import ConsumerConnection as ConsumerConnectionBody
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request

if TYPE_CHECKING:
    from cometmq.client.admin import ConsumeStats, OffsetReset
    from cometmq.client.instance import ClientInstance
    from cometmq.protocol.route import ClusterInfo, TopicRouteData

__all__ = ["AdminOpsMixin", "ConsumerConnection", "PullResult", "ResetResult"]

_FLAG_SUBSCRIPTION = 0x4
#: codes that mean "this server has no such request": the caller may fall back
_NOT_SERVED = frozenset({ResponseCode.REQUEST_CODE_NOT_SUPPORTED})


# -- results ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConsumerConnection:
    """A consumer group's connections and subscriptions (GET_CONSUMER_CONNECTION_LIST). ``full`` is False when
    the broker only gave the client ids (GET_CONSUMER_LIST_BY_GROUP, the fallback)."""

    group: str
    connections: tuple[Connection, ...] = ()
    #: topic -> subscription expression
    subscriptions: Mapping[str, str] = field(default_factory=dict)
    consume_type: str = ""
    message_model: str = ""
    consume_from_where: str = ""
    full: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "connectionSet": [dict(c.to_bean()) for c in self.connections],
                "subscriptionTable": dict(self.subscriptions), "consumeType": self.consume_type,
                "messageModel": self.message_model, "consumeFromWhere": self.consume_from_where,
                "full": self.full}


@dataclass(frozen=True, slots=True)
class PullResult:
    """One PULL_MESSAGE: the status name (FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL), the messages
    and where the next pull starts, with the queue's offsets as the broker reported them."""

    status: str
    messages: tuple[MessageExt, ...]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class ResetResult:
    """What an offset reset did: ``online`` when the brokers reset the group and told its consumers
    (INVOKE_BROKER_TO_RESET_OFFSET), else the committed offsets were written directly (no consumer online,
    or a broker that does not serve it); ``offsets`` holds the offset each queue now starts from."""

    group: str
    topic: str
    timestamp: int
    online: bool
    offsets: Mapping[MessageQueue, int]
    #: the direct path's per-queue details (RocketMQ's rollback stats); empty when online
    rollbacks: tuple[OffsetReset, ...] = ()


def _json_body(body: bytes | None, what: str, addr: str = "") -> Any:
    """A body that is plain JSON (cometmq's own answers); BrokerError SYSTEM_ERROR when it is not."""
    try:
        return json.loads(body or b"null")
    except (ValueError, RecursionError) as exc:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"bad {what}: {exc}", addr=addr) from None


def _properties_text(text: str) -> dict[str, str]:
    """Java properties text (``key=value`` lines, ``#`` comments) as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


_PULL_STATUS: dict[int, str] = {ResponseCode.SUCCESS: "FOUND", ResponseCode.PULL_NOT_FOUND: "NO_NEW_MSG",
                ResponseCode.PULL_RETRY_IMMEDIATELY: "NO_MATCHED_MSG", ResponseCode.PULL_OFFSET_MOVED: "OFFSET_ILLEGAL"}


# -- the mixin ------------------------------------------------------------------------------------------------
class AdminOpsMixin:
    """Mixed into ``Admin``, whose ``_check`` gives the started client instance and whose topic, cluster and
    group methods these build on."""

    _check: Callable[[], ClientInstance]

    if TYPE_CHECKING:  # Admin's own methods, which these build on
        async def cluster_info(self) -> ClusterInfo: ...

        async def topic_route(self, topic: str) -> TopicRouteData: ...

        async def _masters(self, *, cluster: str | None, broker: str | None) -> dict[str, str]: ...

        async def subscription_groups(self, broker: str) -> dict[str, dict[str, Any]]: ...

        async def _query(self, topic: str, key: str, max_num: int, begin: int | _dt.datetime,
                         end: int | _dt.datetime | None, *, unique: bool) -> list[MessageExt]: ...

        async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumeStats: ...

        async def reset_offset_by_timestamp(self, group: str, topic: str, timestamp: int | _dt.datetime, *,
                                            force: bool = True) -> list[OffsetReset]: ...

    # -- connections ------------------------------------------------------------------------------------------
    async def _any_master_of(self, topic: str) -> tuple[str, str]:
        route = await self.topic_route(topic)
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            if bd.master_addr is not None:
                return bd.broker_name, bd.master_addr
        raise NoRouteError(f"no master of topic {topic} is online")

    async def _group_broker(self, group: str, broker: str | None) -> tuple[str, str]:
        """The broker to ask about a group: ``broker`` (address or name), else a master of its retry topic,
        else the first master the nameserver knows."""
        if broker is not None:
            [(name, addr)] = (await self._masters(cluster=None, broker=broker)).items()
            return name, addr
        try:
            return await self._any_master_of(f"%RETRY%{group}")
        except NoRouteError:
            info = await self.cluster_info()
            masters = sorted((n, bd.master_addr) for n, bd in info.broker_addr_table.items()
                             if bd.master_addr is not None)
            if not masters:
                raise NoRouteError("no broker is registered with the nameserver") from None
            return masters[0]

    async def consumer_connection(self, group: str, *, broker: str | None = None) -> ConsumerConnection:
        """The online consumers of ``group``, their versions and subscriptions (GET_CONSUMER_CONNECTION_LIST;
        a broker that does not serve it gives the client ids alone, GET_CONSUMER_LIST_BY_GROUP).
        BrokerError CONSUMER_NOT_ONLINE when none is online."""
        from cometmq.client.admin import check_group
        from cometmq.protocol.client_bodies import decode_consumer_list

        check_group(group)
        name, addr = await self._group_broker(group, broker)
        inst = self._check()
        context = f"connections of {group} on {name}"
        r = await inst.invoke(addr, make_request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}),
                              context=context)
        if r.code in _NOT_SERVED:
            r = await inst.invoke(addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}),
                                  context=context)
            if r.code != ResponseCode.SUCCESS:  # cometmq answers SYSTEM_ERROR "no consumer ... online"
                raise BrokerError(ResponseCode.CONSUMER_NOT_ONLINE, r.remark or "", addr=addr, context=context)
            with reading_reply("bad consumer list", addr=addr):
                ids = decode_consumer_list(r.body)
            if not ids:
                raise BrokerError(ResponseCode.CONSUMER_NOT_ONLINE, "no consumer online", addr=addr, context=context)
            return ConsumerConnection(group, tuple(Connection(i, language="") for i in sorted(ids)), full=False)
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", addr=addr, context=context)
        with reading_reply("bad consumer connection", addr=addr, context=context):
            body = ConsumerConnectionBody.decode(r.body or b"")
        return ConsumerConnection(group, tuple(sorted(body.connections, key=lambda c: c.client_id)),
                                  {t: sub.sub_string for t, sub in sorted(body.subscription_table.items())},
                                  body.consume_type or "", body.message_model or "", body.consume_from_where or "")

    async def producer_connection(self, group: str, topic: str) -> tuple[Connection, ...]:
        """The online producers of ``group`` (GET_PRODUCER_CONNECTION_LIST), asked at a master of ``topic``."""
        from cometmq.client.admin import check_group

        check_group(group)
        name, addr = await self._any_master_of(topic)
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                                             {"producerGroup": group}),
                                          context=f"connections of producer group {group} on {name}")
        with reading_reply("bad producer connection", addr=addr):
            body = ProducerConnection.decode(r.body or b"")
        return tuple(sorted(body.connections, key=lambda c: c.client_id))

    # -- brokers ----------------------------------------------------------------------------------------------
    async def broker_addrs(self, *, cluster: str | None = None, broker: str | None = None,
                           masters_only: bool = True) -> dict[str, str]:
        """{label: address}: the masters of a cluster (or of the only one), or one broker by name or address;
        with ``masters_only=False`` every broker of them, labelled ``name/id``. An address no nameserver knows
        is taken as it is."""
        if broker is not None and ":" in broker:
            try:
                split_address(broker)
            except ValueError:
                raise InvalidArgumentError(f"broker address {broker!r} is not host:port (a port 1-65535)") from None
            info = await self.cluster_info()
            if not any(broker in bd.broker_addrs.values() for bd in info.broker_addr_table.values()):
                return {broker: broker}
        if masters_only:
            return await self._masters(cluster=cluster, broker=broker)
        names = await self._masters(cluster=cluster, broker=broker)
        info = await self.cluster_info()
        return {f"{n}/{i}": a for n in sorted(names) for i, a in sorted(info.broker_addr_table[n].broker_addrs.items())}

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """A broker's runtime figures (GET_BROKER_RUNTIME_INFO: a KVTable)."""
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_BROKER_RUNTIME_INFO),
                                          context="runtime info")
        with reading_reply("bad runtime info", addr=addr):
            return dict(sorted(KVTable.decode(r.body or b"").table.items()))

    async def broker_stats(self, addr: str, name: str, key: str) -> BrokerStatsData | None:
        """One stats item of a broker over the last minute, hour and day (VIEW_BROKER_STATS_DATA: RocketMQ's
        BrokerStatsManager names, e.g. ``TOPIC_PUT_NUMS`` by topic, ``GROUP_GET_NUMS`` by ``topic@group``); None
        when the broker never counted it (its "not exist" answer)."""
        r = await self._check().invoke(addr, make_request(RequestCode.VIEW_BROKER_STATS_DATA,
                                                          {"statsName": name, "statsKey": key}), context="stats")
        if r.code == ResponseCode.SYSTEM_ERROR and "not exist" in (r.remark or ""):
            return None
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", addr=addr, context=f"stats {name} {key}")
        with reading_reply("bad stats data", addr=addr):
            return BrokerStatsData.decode(r.body or b"")

    async def broker_config(self, addr: str) -> dict[str, str]:
        """A broker's config as it runs (GET_BROKER_CONFIG: Java properties text)."""
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_BROKER_CONFIG), context="broker config")
        return dict(sorted(_properties_text((r.body or b"").decode("utf-8", "replace")).items()))

    async def update_broker_config(self, addr: str, changes: Mapping[str, str]) -> None:
        """Change config keys of a running broker (UPDATE_BROKER_CONFIG); the broker refuses keys it cannot
        change at runtime."""
        if not changes:
            raise InvalidArgumentError("no config key to change")
        for k, v in changes.items():
            if not k or any(c in k for c in "=\n\r") or any(c in str(v) for c in "\n\r"):
                raise InvalidArgumentError(f"bad config entry {k!r}={v!r}")
        body = "".join(f"{k}={v}\n" for k, v in changes.items()).encode("utf-8")
        await self._check().invoke_ok(addr, make_request(RequestCode.UPDATE_BROKER_CONFIG, {}, body),
                                      context="update broker config")

    async def _write_perm(self, code: int, broker_name: str, count_key: str) -> dict[str, int]:
        if not broker_name:
            raise InvalidArgumentError("a broker name is needed")
        inst = self._check()

        async def one(addr: str) -> tuple[str, int]:
            r = await inst.invoke_ok(addr, make_request(code, {"brokerName": broker_name}),
                                     context=f"write perm of {broker_name} at nameserver {addr}")
            try:
                return addr, int(r.ext_fields.get(count_key, 0))
            except ValueError:
                return addr, -1

        return dict(await asyncio.gather(*(one(a) for a in inst.namesrv_addrs)))

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        """Take write permission away from ``broker_name``'s topics at every nameserver
        (WIPE_WRITE_PERM_OF_BROKER); {nameserver: topics changed}."""
        return await self._write_perm(RequestCode.WIPE_WRITE_PERM_OF_BROKER, broker_name, "wipeTopicCount")

    async def add_write_perm(self, broker_name: str) -> dict[str, int]:
        """Give write permission back to ``broker_name``'s topics at every nameserver (ADD_WRITE_PERM_OF_BROKER);
        {nameserver: topics changed}."""
        return await self._write_perm(RequestCode.ADD_WRITE_PERM_OF_BROKER, broker_name, "addTopicCount")

    async def topic_configs(self, broker: str) -> dict[str, dict[str, Any]]:
        """Every topic config of one broker (name or address), by topic (GET_ALL_TOPIC_CONFIG)."""
        [(name, addr)] = (await self.broker_addrs(broker=broker)).items()
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_ALL_TOPIC_CONFIG),
                                          context=f"topics of {name}")
        raw = _json_body(r.body, "topic configs", addr)
        table = raw.get("topicConfigTable") if isinstance(raw, dict) else None
        if not isinstance(table, dict):
            raise BrokerError(ResponseCode.SYSTEM_ERROR, "topicConfigTable is not an object", addr=addr)
        return dict(sorted(table.items()))

    # -- groups of a topic --------------------------------------------------------------------------------------
    async def topic_consumer_groups(self, topic: str) -> list[str]:
        """The groups that consume ``topic`` (QUERY_TOPIC_CONSUME_BY_WHO on each master; where not served: the
        groups with committed offsets for it)."""
        route = await self.topic_route(topic)
        inst = self._check()
        groups: set[str] = set()
        candidates: set[str] = set()  # where QUERY_TOPIC_CONSUME_BY_WHO is not served: groups to check
        for bd in route.broker_datas:
            addr = bd.master_addr
            if addr is None:
                continue
            r = await inst.invoke(addr, make_request(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}),
                                  context=f"groups of {topic} on {bd.broker_name}")
            if r.code == ResponseCode.SUCCESS:
                with reading_reply("bad group list", addr=addr):
                    groups.update(GroupList.decode(r.body or b"").groups)
                continue
            if r.code not in _NOT_SERVED:
                raise BrokerError(r.code, r.remark or "", addr=addr, context=f"groups of {topic}")
            candidates.update(await self.subscription_groups(bd.broker_name))
        for group in sorted(candidates - groups):
            progress = await self.consumer_progress(group)
            if any(q.topic == topic for q in progress.offsets):
                groups.add(group)
        return sorted(groups)

    # -- reading queues -------------------------------------------------------------------------------------
    async def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, *, expression: str = "*",
                   group: str = "TOOLS_CONSUMER") -> PullResult:
        """One PULL_MESSAGE of ``queue`` from ``offset`` (no long polling, nothing committed)."""
        from cometmq.client.admin import broker_addr_of, check_group, check_queue
        from cometmq.client.pulled import decode_pulled

        check_queue(queue)
        check_group(group)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"offset {offset!r} is not a non-negative integer")
        if not 1 <= max_nums <= 1024:
            raise InvalidArgumentError(f"max_nums must be within 1..1024, got {max_nums}")
        inst = self._check()
        addr = await broker_addr_of(inst, queue.broker_name, queue.topic)
        context = f"pull of {queue.topic}/{queue.broker_name}/{queue.queue_id} at {offset}"
        r = await inst.invoke(addr, make_request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": queue.topic, "queueId": str(queue.queue_id),
            "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(_FLAG_SUBSCRIPTION),
            "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": expression, "subVersion": "0",
            "expressionType": "TAG"}), context=context)
        status = _PULL_STATUS.get(r.code)
        if status is None:
            raise BrokerError(r.code, r.remark or "", addr=addr, context=context)
        ext = r.ext_fields

        def num(key: str, default: int) -> int:
            try:
                return int(ext.get(key, default))
            except ValueError:
                return default

        msgs: tuple[MessageExt, ...] = ()
        if r.code == ResponseCode.SUCCESS:
            with reading_reply("bad pulled messages", addr=addr, context=context):
                msgs = tuple(decode_pulled(r.body or b"", queue))
        return PullResult(status, msgs, num("nextBeginOffset", offset), num("minOffset", -1), num("maxOffset", -1))

    async def topic_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic``, fresh from the nameserver, sorted."""
        from cometmq.client.instance import ClientInstance

        route = await self.topic_route(topic)
        queues = sorted(ClientInstance.queues_of(route, topic, writable=False))
        if not queues:
            raise NoRouteError(f"topic {topic} has no readable queue")
        return queues

    async def read_range(self, queue: MessageQueue, begin: int, end: int, *, expression: str = "*",
                         limit: int | None = None, group: str = "TOOLS_CONSUMER") -> list[MessageExt]:
        """The messages of ``queue`` from offset ``begin`` up to (not including) ``end`` that match
        ``expression``, at most ``limit``: pulls, nothing committed."""
        out: list[MessageExt] = []
        offset = max(0, begin)
        while offset < end and (limit is None or len(out) < limit):
            want = min(32, end - offset, (limit - len(out)) if limit is not None else 32)
            result = await self.pull(queue, offset, max(1, want), expression=expression, group=group)
            out.extend(m for m in result.messages if m.queue_offset < end)
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        return out if limit is None else out[:limit]

    async def query_messages_by_unique_key(self, topic: str, msg_id: str, *, max_num: int = 32) -> list[MessageExt]:
        """Every stored message of ``topic`` with the unique key ``msg_id`` (a resent message is stored again
        under the same key), oldest first."""
        return await self._query(topic, msg_id, max_num, 0, None, unique=True)

    async def query_message_by_offset(self, queue: MessageQueue, offset: int) -> MessageExt:
        """The message at ``offset`` of ``queue`` (mqadmin queryMsgByOffset: a pull of one message)."""
        result = await self.pull(queue, offset, 1)
        if not result.messages or result.messages[0].queue_offset != offset:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              f"no message at offset {offset} (the queue holds {result.min_offset}.."
                              f"{result.max_offset - 1})" if result.max_offset >= 0 else f"no message at {offset}",
                              context=f"{queue.topic}/{queue.broker_name}/{queue.queue_id}")
        return result.messages[0]

    # -- offset resets ------------------------------------------------------------------------------------------
    async def reset_offset(self, group: str, topic: str, timestamp: int | _dt.datetime, *,
                           force: bool = True) -> ResetResult:
        """Reset ``group``'s offsets of ``topic`` to ``timestamp`` (epoch ms or datetime; -1: the end of each
        queue) as mqadmin resetOffsetByTime does: each master of the topic resets and tells the group's online
        consumers (INVOKE_BROKER_TO_RESET_OFFSET, which sends them RESET_CONSUMER_CLIENT_OFFSET). When no
        consumer of the group is online (CONSUMER_NOT_ONLINE) or a broker does not serve the request, the
        committed offsets are written directly (``reset_offset_by_timestamp``)."""
        from cometmq.client.admin import check_group, to_millis

        check_group(group)
        ts = -1 if timestamp == -1 else to_millis(timestamp)
        route = await self.topic_route(topic)
        inst = self._check()
        fields: dict[str, object] = {"topic": topic, "group": group, "queueId": -1, "timestamp": ts,
                                     "isForce": force}
        offsets: dict[MessageQueue, int] = {}
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.master_addr
            if addr is None:
                continue
            context = f"reset of {group} on {bd.broker_name}"
            r = await inst.invoke(addr, make_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields),
                                  context=context)
            if r.code in _NOT_SERVED or r.code == ResponseCode.CONSUMER_NOT_ONLINE:
                rollbacks = await self.reset_offset_by_timestamp(group, topic, ts, force=force)
                return ResetResult(group, topic, ts, False, {s.queue: s.rollback_offset for s in rollbacks},
                                   tuple(rollbacks))
            if r.code != ResponseCode.SUCCESS:
                raise BrokerError(r.code, r.remark or "", addr=addr, context=context)
            with reading_reply("bad reset offsets", addr=addr, context=context):
                offsets.update(ResetOffsetBody.decode(r.body or b"").offset_table)
        return ResetResult(group, topic, ts, True, dict(sorted(offsets.items())))
