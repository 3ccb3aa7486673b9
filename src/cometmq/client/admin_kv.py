"""The nameservers' KV configs (PUT_KV_CONFIG, GET_KV_CONFIG, DELETE_KV_CONFIG, GET_KVLIST_BY_NAMESPACE) and the
order conf of a topic kept there (RocketMQ's ``createOrUpdateOrderConf``: namespace ``ORDER_TOPIC_CONFIG``, key
the topic, value ``brokerName:queueNums;...``), which route answers carry as ``orderTopicConf``; and the requests
that reach one consumer client through a broker (GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY).
``Admin`` (client/admin.py) has these methods."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cometmq.client.errors import BrokerError, reading_reply
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.protocol.admin_bodies import KVTable
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.remoting import make_request

if TYPE_CHECKING:
    from cometmq.client.instance import ClientInstance

__all__ = ["ORDER_TOPIC_CONFIG", "ConsumeDirectlyResult", "ConsumerRunningInfo", "KvAdmin"]

#: RocketMQ's NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


@dataclass(frozen=True, slots=True)
class ConsumerRunningInfo:
    """What a consumer client says of itself (GET_CONSUMER_RUNNING_INFO): its properties (PROP_CONSUME_TYPE
    CONSUME_PASSIVELY for a push consumer, …), subscriptions (topic -> expression) and the queues it holds,
    each with its process-queue figures (RocketMQ's ProcessQueueInfo names)."""

    client_id: str
    properties: Mapping[str, str] = field(default_factory=dict)
    subscriptions: Mapping[str, str] = field(default_factory=dict)
    queues: Mapping[MessageQueue, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def push(self) -> bool:
        return self.properties.get("PROP_CONSUME_TYPE") == "CONSUME_PASSIVELY"

    @classmethod
    def decode(cls, client_id: str, body: bytes) -> ConsumerRunningInfo:
        from cometmq.protocol.fastjson import ObjectKey, parse_fastjson

        raw = parse_fastjson(body, "consumer running info")
        if not isinstance(raw, dict):
            raise RemoteProtocolError("consumer running info is not an object")
        try:
            props = {str(k): str(v) for k, v in (raw.get("properties") or {}).items()}
            subs = {str(s["topic"]): str(s.get("subString", "*")) for s in raw.get("subscriptionSet") or ()
                    if isinstance(s, dict) and "topic" in s}
            queues = {MessageQueue(str(k["topic"]), str(k["brokerName"]), int(k["queueId"])):
                      dict(v) if isinstance(v, dict) else {}
                      for k, v in (raw.get("mqTable") or {}).items() if isinstance(k, ObjectKey)}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"consumer running info: {exc}") from None
        return cls(client_id, props, subs, dict(sorted(queues.items())))


@dataclass(frozen=True, slots=True)
class ConsumeDirectlyResult:
    """A consumer's answer to CONSUME_MESSAGE_DIRECTLY (RocketMQ's ConsumeMessageDirectlyResult): its listener
    ran on the message; ``consume_result`` is CR_SUCCESS, CR_LATER, CR_THROW_EXCEPTION, CR_RETURN_NULL, …"""

    consume_result: str
    order: bool = False
    auto_commit: bool = True
    remark: str | None = None
    spent_time_ms: int = 0

    @classmethod
    def decode(cls, body: bytes) -> ConsumeDirectlyResult:
        from cometmq.protocol.fastjson import parse_fastjson

        raw = parse_fastjson(body, "consume-directly result")
        if not isinstance(raw, dict) or not isinstance(raw.get("consumeResult"), str):
            raise RemoteProtocolError("consume-directly result: no consumeResult")
        try:
            return cls(raw["consumeResult"], bool(raw.get("order", False)), bool(raw.get("autoCommit", True)),
                       None if raw.get("remark") is None else str(raw["remark"]), int(raw.get("spentTimeMills") or 0))
        except (TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"consume-directly result: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {"consumeResult": self.consume_result, "order": self.order, "autoCommit": self.auto_commit,
                "remark": self.remark, "spentTimeMills": self.spent_time_ms}


class KvAdmin:
    """Mixed into ``Admin``; ``_check`` gives its started client instance."""

    _check: Callable[[], ClientInstance]

    if TYPE_CHECKING:  # Admin's own methods, which these build on
        async def _masters(self, *, cluster: str | None, broker: str | None) -> dict[str, str]: ...

        async def _group_broker(self, group: str, broker: str | None) -> tuple[str, str]: ...

        async def view_message(self, offset_msg_id: str) -> MessageExt: ...

        async def query_message(self, topic: str, msg_id: str) -> MessageExt: ...

    # -- KV configs ---------------------------------------------------------------------------------------------
    async def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        """Set ``namespace``/``key`` to ``value`` on every nameserver (PUT_KV_CONFIG)."""
        inst = self._check()
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.PUT_KV_CONFIG, {
            "namespace": namespace, "key": key, "value": value}), context=f"put KV {namespace}/{key} on {addr}")
            for addr in inst.namesrv_addrs))

    async def get_kv_config(self, namespace: str, key: str) -> str | None:
        """The value of ``namespace``/``key`` at the first nameserver that answers (GET_KV_CONFIG); None when
        it has none."""
        inst = self._check()
        r = await inst.namesrv_invoke(make_request(RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}),
                                      f"KV {namespace}/{key}")
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", context=f"KV {namespace}/{key}")
        return r.ext_fields.get("value")

    async def delete_kv_config(self, namespace: str, key: str) -> None:
        """Remove ``namespace``/``key`` from every nameserver (DELETE_KV_CONFIG)."""
        inst = self._check()
        await asyncio.gather(*(inst.invoke_ok(addr, make_request(RequestCode.DELETE_KV_CONFIG, {
            "namespace": namespace, "key": key}), context=f"delete KV {namespace}/{key} on {addr}")
            for addr in inst.namesrv_addrs))

    async def kv_list(self, namespace: str) -> dict[str, str]:
        """Every key of ``namespace`` at the first nameserver that answers (GET_KVLIST_BY_NAMESPACE)."""
        inst = self._check()
        r = await inst.namesrv_invoke(make_request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace}),
                                      f"KV list {namespace}")
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            return {}
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", context=f"KV list {namespace}")
        with reading_reply("bad KV list"):
            return dict(sorted(KVTable.decode(r.body or b"").table.items()))

    async def update_order_conf(self, topic: str, conf: str, *, replace: bool = True) -> str:
        """Write the order conf of ``topic`` (``brokerName:queueNums;...``) to the nameservers, as RocketMQ's
        createOrUpdateOrderConf: ``replace`` (a whole cluster) sets it, else the brokers of ``conf`` replace
        theirs in the current value. Returns the value written."""
        if not replace:
            current = await self.get_kv_config(ORDER_TOPIC_CONFIG, topic)
            merged = {item.split(":", 1)[0]: item for item in (current or "").split(";") if item}
            for item in conf.split(";"):
                if item:
                    merged[item.split(":", 1)[0]] = item
            conf = ";".join(merged[name] for name in sorted(merged))
        await self.put_kv_config(ORDER_TOPIC_CONFIG, topic, conf)
        return conf

    # -- one consumer client, through a broker --------------------------------------------------------------------
    async def consumer_running_info(self, group: str, client_id: str, *, broker: str | None = None,
                                    jstack: bool = False) -> ConsumerRunningInfo:
        """What consumer ``client_id`` of ``group`` says of itself (GET_CONSUMER_RUNNING_INFO, which a broker
        passes to the client): its type, subscriptions and the queues it holds."""
        name, addr = await self._group_broker(group, broker)
        r = await self._check().invoke_ok(addr, make_request(RequestCode.GET_CONSUMER_RUNNING_INFO, {
            "consumerGroup": group, "clientId": client_id, "jstackEnable": jstack}),
            timeout=max(self._check().request_timeout, 5.0), context=f"running info of {client_id} ({group}) on {name}")
        with reading_reply("bad consumer running info", addr=addr):
            return ConsumerRunningInfo.decode(client_id, r.body or b"")

    async def consume_message_directly(self, group: str, client_id: str, msg_id: str,
                                       topic: str | None = None) -> ConsumeDirectlyResult:
        """Have consumer ``client_id`` of ``group`` run its listener on one message (CONSUME_MESSAGE_DIRECTLY
        through the broker that stores it), as mqadmin's ``queryMsgById -g -d``: nothing is committed or sent
        back. ``msg_id`` is an offset msgId, or with ``topic`` a unique key."""
        msg = await (self.query_message(topic, msg_id) if topic else self.view_message(msg_id))
        addr = msg.store_host
        fields: dict[str, object] = {"consumerGroup": group, "clientId": client_id, "msgId": msg.offset_msg_id,
                                     "topic": msg.topic, "brokerName": msg.queue.broker_name}
        inst = self._check()
        r = await inst.invoke_ok(addr, make_request(RequestCode.CONSUME_MESSAGE_DIRECTLY, fields),
                                 timeout=max(inst.request_timeout, 10.0),
                                 context=f"consume {msg.offset_msg_id} directly at {client_id} ({group})")
        with reading_reply("bad consume-directly result", addr=addr):
            return ConsumeDirectlyResult.decode(r.body or b"")
