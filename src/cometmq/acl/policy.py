"""What a remoting request needs: per request code, the topics and groups it touches and the permission it needs on
each (RocketMQ's PlainAccessResource.parse), and which codes need an admin account.

A retry topic (``%RETRY%group``) is its group: sending to it needs SUB on the group (a consumer's retry), as in
RocketMQ. Codes not listed touch no named resource: any account that signs correctly may use them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from cometmq.acl.model import ANY, PUB, SUB
from cometmq.protocol.client_bodies import HeartbeatData
from cometmq.protocol.codes import RequestCode as C
from cometmq.protocol.names import RETRY_TOPIC_PREFIX as RETRY_PREFIX
from cometmq.protocol.remoting import RemotingCommand

#: RocketMQ's TopicValidator.RMQ_SYS_TRACE_TOPIC: sending traces to it is always allowed
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


@dataclass(frozen=True, slots=True)
class Need:
    resource: str
    is_group: bool
    perm: int

    def describe(self) -> str:
        return f"{'group' if self.is_group else 'topic'}={self.resource}"


def topic_need(topic: str | None, perm: int) -> list[Need]:
    if not topic:
        return []
    if topic.startswith(RETRY_PREFIX):
        return [Need(topic[len(RETRY_PREFIX):], True, SUB)]
    return [Need(topic, False, perm)]


def group_need(group: str | None) -> list[Need]:
    return [Need(group, True, SUB)] if group else []


def _send(cmd: RemotingCommand) -> list[Need]:
    # The long-form ``topic`` and the V2 letter ``b`` both: the send handler reads ``b`` on every V2 send and
    # ``topic`` otherwise, so a request carrying both must be allowed each
    ext = cmd.ext_fields
    topic, letter = ext.get("topic"), ext.get("b")
    return topic_need(topic, PUB) + (topic_need(letter, PUB) if letter != topic else [])


def _sub(topic_key: str, group_key: str) -> Callable[[RemotingCommand], list[Need]]:
    def needs(cmd: RemotingCommand) -> list[Need]:
        ext = cmd.ext_fields
        return topic_need(ext.get(topic_key), SUB) + group_need(ext.get(group_key))

    return needs


def _group(key: str) -> Callable[[RemotingCommand], list[Need]]:
    return lambda cmd: group_need(cmd.ext_fields.get(key))


def send_back_needs(topic_at: Callable[[int], str | None]) -> NeedsFn:
    """CONSUMER_SEND_MSG_BACK: the broker copies the message at a commit-log ``offset`` into the group's retry (or
    dead-letter) topic. RocketMQ asks SUB on the group (its retry topic) only; here SUB on the topic of the message
    copied as well, else any message of the log could be copied into the caller's own retry topic and read there:
    the ``originTopic`` the request names (the broker copies the message only when it is of that topic), or, when it
    names none (the 4.x C++ client sends only group, delayLevel and offset), the topic of the record at ``offset``
    (``topic_at``: None when there is none)."""

    def needs(cmd: RemotingCommand) -> list[Need]:
        ext = cmd.ext_fields
        origin = ext.get("originTopic")
        if not origin:
            raw = ext.get("offset")
            try:
                offset = int(raw or "")
            except ValueError:
                raise ValueError(f"offset {raw!r} is not a commit-log offset") from None
            origin = topic_at(offset)
            if origin is None:
                raise ValueError(f"no message at commit-log offset {offset}")
        return group_need(ext.get("group")) + topic_need(origin, SUB)

    return needs


def _no_record(offset: int) -> str | None:
    return None


def _heartbeat(cmd: RemotingCommand) -> list[Need]:
    data = HeartbeatData.decode(cmd.body)
    out: list[Need] = []
    for consumer in data.consumers:
        out += group_need(consumer.group_name)
        for sub in consumer.subscriptions:
            out += topic_need(sub.topic, SUB)
    return out


def _json_groups(cmd: RemotingCommand) -> list[Need]:
    """Lock/unlock and batch ack bodies: the consumer group (and topics) they name."""
    try:
        raw = json.loads(bytes(cmd.body) or b"{}")
    except ValueError:
        raise ValueError("the body is not JSON") from None
    out: list[Need] = []
    if isinstance(raw, dict):
        out += group_need(raw.get("consumerGroup") if isinstance(raw.get("consumerGroup"), str) else None)
        for ack in raw.get("acks") or ():
            if isinstance(ack, dict):
                out += group_need(ack.get("consumerGroup")) + topic_need(ack.get("topic"), SUB)
    return out


NeedsFn = Callable[[RemotingCommand], list[Need]]

BROKER_NEEDS: dict[int, NeedsFn] = {
    C.SEND_MESSAGE: _send,
    C.SEND_MESSAGE_V2: _send,
    C.SEND_BATCH_MESSAGE: _send,
    C.SEND_REPLY_MESSAGE: _send,
    C.SEND_REPLY_MESSAGE_V2: _send,
    C.RECALL_MESSAGE: lambda cmd: topic_need(cmd.ext_fields.get("topic"), PUB),
    # RocketMQ 5's field (the broker then ends only a half of that topic); 4.x clients send none
    C.END_TRANSACTION: lambda cmd: topic_need(cmd.ext_fields.get("topic"), PUB),
    # cometmq's field too (the broker then decides only that topic's halves); without it, an admin account
    # (Policy.admin_without): no older client sends this request
    C.END_TRANSACTION_BATCH: lambda cmd: topic_need(cmd.ext_fields.get("topic"), PUB),
    # the broker's own policy reads the record a send-back without originTopic names (BrokerController)
    C.CONSUMER_SEND_MSG_BACK: send_back_needs(_no_record),
    C.PULL_MESSAGE: _sub("topic", "consumerGroup"),
    C.LITE_PULL_MESSAGE: _sub("topic", "consumerGroup"),
    C.QUERY_MESSAGE: lambda cmd: topic_need(cmd.ext_fields.get("topic"), SUB),
    # RocketMQ 5's field; without it, an admin account (Policy.admin_without): the broker answers only a record of
    # the topic named, so the offset cannot reach another topic's messages
    C.VIEW_MESSAGE_BY_ID: lambda cmd: topic_need(cmd.ext_fields.get("topic"), SUB),
    C.HEART_BEAT: _heartbeat,
    C.UNREGISTER_CLIENT: _group("consumerGroup"),
    C.GET_CONSUMER_LIST_BY_GROUP: _group("consumerGroup"),
    C.UPDATE_CONSUMER_OFFSET: _sub("topic", "consumerGroup"),
    C.QUERY_CONSUMER_OFFSET: _sub("topic", "consumerGroup"),
    C.POP_MESSAGE: _sub("topic", "consumerGroup"),
    C.PEEK_MESSAGE: _sub("topic", "consumerGroup"),
    C.ACK_MESSAGE: _sub("topic", "consumerGroup"),
    C.CHANGE_MESSAGE_INVISIBLETIME: _sub("topic", "consumerGroup"),
    C.NOTIFICATION: _sub("topic", "consumerGroup"),
    C.POLLING_INFO: _sub("topic", "consumerGroup"),
    C.BATCH_ACK_MESSAGE: _json_groups,
    C.LOCK_BATCH_MQ: _json_groups,
    C.UNLOCK_BATCH_MQ: _json_groups,
    C.QUERY_ASSIGNMENT: _sub("topic", "consumerGroup"),
}

#: RocketMQ's Permission.ADMIN_CODE (17, 25, 215, 200, 207), its ACL administration (50-54), and every other code
#: that changes topics, groups, offsets, the broker's configuration or its files
BROKER_ADMIN_CODES = frozenset({
    C.UPDATE_AND_CREATE_TOPIC, C.UPDATE_AND_CREATE_TOPIC_LIST, C.UPDATE_BROKER_CONFIG, C.DELETE_TOPIC_IN_BROKER,
    C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, C.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, C.DELETE_SUBSCRIPTIONGROUP,
    C.UPDATE_AND_CREATE_ACL_CONFIG, C.DELETE_ACL_CONFIG, C.GET_BROKER_CLUSTER_ACL_INFO,
    C.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, C.GET_BROKER_CLUSTER_ACL_CONFIG,
    C.INVOKE_BROKER_TO_RESET_OFFSET, C.RESET_CONSUMER_OFFSET_IN_BROKER, C.CLONE_GROUP_OFFSET,
    C.TRIGGER_DELETE_FILES, C.CLEAN_EXPIRED_CONSUMEQUEUE, C.CLEAN_UNUSED_TOPIC, C.DELETE_EXPIRED_COMMITLOG,
    C.WIPE_WRITE_PERM_OF_BROKER, C.ADD_WRITE_PERM_OF_BROKER, C.RESET_MASTER_FLUSH_OFFSET, C.CLEAN_BROKER_DATA,
    C.ADD_BROKER, C.REMOVE_BROKER, C.CONSUME_MESSAGE_DIRECTLY, C.SET_MESSAGE_REQUEST_MODE,
    # what a controller (or `cometmq admin promote|demote`) tells a broker: its role, its group's lowest id
    C.NOTIFY_BROKER_ROLE_CHANGED, C.NOTIFY_MIN_BROKER_ID_CHANGE,
})

#: a controller's reads (who leads, a group's master and SyncStateSet, the next free broker id): open to anyone, as
#: route reads are; every other controller code (heartbeats, registering, applying ids, elections, changes of the
#: SyncStateSet, cleaning a group's data) changes its state and needs an admin account
CONTROLLER_PUBLIC_CODES = frozenset({
    C.CONTROLLER_GET_REPLICA_INFO, C.CONTROLLER_GET_METADATA_INFO, C.CONTROLLER_GET_SYNC_STATE_DATA,
    C.CONTROLLER_GET_NEXT_BROKER_ID,
})

#: codes a nameserver answers to anyone: reads of routes, clusters, topic lists and KV config (as RocketMQ, whose
#: nameserver checks nothing), and the embedded controller's reads; every other nameserver code (registering and
#: unregistering brokers, QUERY_DATA_VERSION (it keeps the broker it names alive, as a registration does), deleting
#: topics, write permissions, KV and configuration changes, the embedded controller's changes) needs an admin account
NAMESRV_PUBLIC_CODES = frozenset({
    C.GET_ROUTEINFO_BY_TOPIC, C.GET_BROKER_CLUSTER_INFO, C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    C.GET_TOPICS_BY_CLUSTER, C.GET_SYSTEM_TOPIC_LIST_FROM_NS, C.GET_UNIT_TOPIC_LIST, C.GET_HAS_UNIT_SUB_TOPIC_LIST,
    C.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST, C.GET_KV_CONFIG, C.GET_KVLIST_BY_NAMESPACE,
}) | CONTROLLER_PUBLIC_CODES


@dataclass(frozen=True)
class Policy:
    """What one kind of server checks. ``admin_by_default``: every code that is not public is an admin code."""

    name: str
    needs: Mapping[int, NeedsFn] = field(default_factory=dict)
    admin_codes: frozenset[int] = frozenset()
    public_codes: frozenset[int] = frozenset()
    admin_by_default: bool = False

    #: codes that need an admin account when the request leaves out this field: VIEW_MESSAGE_BY_ID names a
    #: commit-log offset, any message of the log, and END_TRANSACTION_BATCH any half of the log, unless it names
    #: the topic the account must be allowed
    admin_without: Mapping[int, str] = field(default_factory=dict)

    def is_admin(self, code: int) -> bool:
        return self.admin_by_default or code in self.admin_codes

    def needs_admin(self, cmd: RemotingCommand) -> bool:
        """Whether ``cmd`` needs an admin account: its code is one (``is_admin``), or it leaves out the field its
        code needs to be checked on (``admin_without``)."""
        if self.is_admin(cmd.code):
            return True
        name = self.admin_without.get(cmd.code)
        return name is not None and not cmd.ext_fields.get(name)

    def needs_of(self, cmd: RemotingCommand) -> list[Need]:
        fn = self.needs.get(cmd.code)
        return fn(cmd) if fn is not None else []


BROKER_POLICY = Policy("broker", BROKER_NEEDS, BROKER_ADMIN_CODES,
                       admin_without={C.VIEW_MESSAGE_BY_ID: "topic", C.END_TRANSACTION_BATCH: "topic"})
NAMESRV_POLICY = Policy("namesrv", {}, frozenset(), NAMESRV_PUBLIC_CODES, admin_by_default=True)
#: a standalone controller's port (``cometmq controller`` with aclEnable): the embedded controller's rule
CONTROLLER_POLICY = Policy("controller", {}, frozenset(), CONTROLLER_PUBLIC_CODES, admin_by_default=True)

def broker_policy(topic_at: Callable[[int], str | None]) -> Policy:
    """BROKER_POLICY with a send-back that names no originTopic checked on the topic of the record it names."""
    return replace(BROKER_POLICY, needs={**BROKER_NEEDS, C.CONSUMER_SEND_MSG_BACK: send_back_needs(topic_at)})


__all__ = ["ANY", "BROKER_POLICY", "CONTROLLER_POLICY", "NAMESRV_POLICY", "Need", "Policy", "broker_policy",
           "group_need", "send_back_needs", "topic_need"]
