"""Request processors of the nameserver: they parse headers and bodies, ask the route table, and answer.

A request a peer got wrong (missing or malformed header, undecodable body, bad checksum) is answered with
INVALID_PARAMETER and a remark naming the problem; the route table is not touched.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

try:  # BLAKE2 without hashlib, which loads OpenSSL's digests (see _body_digest)
    from _blake2 import blake2b as _blake2b
except ImportError:  # (a Python built without its own BLAKE2: hashlib's, from OpenSSL)
    from hashlib import blake2b as _blake2b

from cometmq.namesrv.kv_config import ORDER_TOPIC_CONFIG, KVConfigManager
from cometmq.namesrv.route_info import RouteInfoManager
from cometmq.net.client import split_address
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.remoting import RemotingCommand, make_response
from cometmq.protocol.route import DataVersion, RegisterBrokerBody, TopicList, TopicRouteData, body_crc32

log = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _name(cmd: RemotingCommand) -> str:
    try:
        return RequestCode(cmd.code).name
    except ValueError:
        return str(cmd.code)


def _field(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if value is None:
        raise RemotingError(ResponseCode.INVALID_PARAMETER, f"{_name(cmd)}: header field {key!r} is missing")
    return value


def _text(cmd: RemotingCommand, key: str) -> str:
    value = _field(cmd, key)
    if not value:
        raise RemotingError(ResponseCode.INVALID_PARAMETER, f"{_name(cmd)}: header field {key!r} is empty")
    return value


def _int(cmd: RemotingCommand, key: str, default: int | None = None) -> int:
    raw = cmd.ext_fields.get(key)
    if raw is None and default is not None:
        return default
    raw = _field(cmd, key)
    try:
        value = int(raw)
    except ValueError:
        raise RemotingError(
            ResponseCode.INVALID_PARAMETER, f"{_name(cmd)}: header field {key!r} = {raw[:40]!r} is not an integer"
        ) from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise RemotingError(ResponseCode.INVALID_PARAMETER, f"{_name(cmd)}: header field {key!r} is out of range")
    return value


def _flag(cmd: RemotingCommand, key: str) -> bool:
    # "1" as well as "true": the C++ client's habit for booleans (gotcha 5).
    return cmd.ext_fields.get(key, "false").strip().lower() in ("true", "1")


def _addr(cmd: RemotingCommand, key: str) -> str:
    value = _text(cmd, key)
    try:
        split_address(value)
    except ValueError:
        raise RemotingError(
            ResponseCode.INVALID_PARAMETER, f"{_name(cmd)}: header field {key!r} = {value[:60]!r} is not host:port"
        ) from None
    return value


class NamesrvProcessors:
    """The nameserver's handlers over one ``RouteInfoManager``; ``dispatcher()`` maps codes to them."""

    def __init__(self, route_info: RouteInfoManager, kv: KVConfigManager | None = None, *,
                 order_message_enable: bool = True) -> None:
        self.route_info = route_info
        self.kv = kv if kv is not None else KVConfigManager()
        #: RocketMQ's orderMessageEnable: route answers carry the topic's ORDER_TOPIC_CONFIG as orderTopicConf
        self.order_message_enable = order_message_enable

    def dispatcher(self) -> dict[int, Handler]:
        return {
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.REGISTER_TOPIC_IN_NAMESRV: self.register_topic,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topics,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topics,
            RequestCode.GET_UNIT_TOPIC_LIST: self.get_unit_topics,
            RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST: self.get_unit_topics,
            RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: self.get_unit_topics,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list,
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_NAMESRV_CONFIG: self.not_supported,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.not_supported,
        }

    async def register_broker(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _text(cmd, "clusterName")
        broker_name = _text(cmd, "brokerName")
        broker_addr = _addr(cmd, "brokerAddr")
        broker_id = _int(cmd, "brokerId")
        if broker_id < 0:
            raise RemotingError(ResponseCode.INVALID_PARAMETER, f"REGISTER_BROKER: brokerId {broker_id} is negative")
        ha_addr = cmd.ext_fields.get("haServerAddr", "")
        crc = _int(cmd, "bodyCrc32", 0)
        if crc and crc != body_crc32(cmd.body):  # 0 means the broker did not compute one
            raise RemotingError(ResponseCode.INVALID_PARAMETER, "REGISTER_BROKER: bodyCrc32 does not match the body")
        # 5.x brokers may state their own expiry; otherwise the nameserver's default applies.
        timeout_ms = _int(cmd, "heartbeatTimeoutMillis", 0)
        compressed = _flag(cmd, "compressed")
        # A body this broker sent before, under the data version it still holds here (a Java broker's periodic
        # forced registration, the same bodies of a split one), changes nothing: it is not decoded again.
        digest = _body_digest(cmd.body, compressed)
        known = self.route_info.known_body_version(broker_name, broker_addr, broker_id, digest)
        if known is not None:
            body = RegisterBrokerBody((), known)
            filter_servers = None  # as the body left them
        else:
            try:
                body = RegisterBrokerBody.decode(cmd.body, compressed=compressed)
            except RemoteProtocolError as exc:  # name what was bad; the dispatch answers (INVALID_PARAMETER)
                raise RemoteProtocolError(f"REGISTER_BROKER: bad body: {exc}") from None
            filter_servers = body.filter_server_list
        result = self.route_info.register_broker(
            cluster,
            broker_name,
            broker_addr,
            broker_id,
            ha_addr,
            body.topic_configs,
            body.data_version,
            conn,
            filter_servers=filter_servers,
            timeout_s=timeout_ms / 1000 if timeout_ms > 0 else None,
            body_digest=digest,
        )
        # Null fields are left out, as Java does: a replica must not take "" for its master's address.
        ext = {
            key: value
            for key, value in (("masterAddr", result.master_addr), ("haServerAddr", result.ha_server_addr))
            if value is not None
        }
        return make_response(cmd, ResponseCode.SUCCESS, None, ext)

    async def query_data_version(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """QUERY_DATA_VERSION (322), a broker's needRegister: header ``changed`` says whether its data version
        (the body) differs from the one held here; the body is the one held (absent when not registered)."""
        cluster = _text(cmd, "clusterName")
        broker_addr = _addr(cmd, "brokerAddr")
        try:
            version = DataVersion.decode(cmd.body)
        except RemoteProtocolError as exc:
            raise RemoteProtocolError(f"QUERY_DATA_VERSION: bad body: {exc}") from None
        changed, held = self.route_info.query_data_version(cluster, broker_addr, version)
        return make_response(cmd, ResponseCode.SUCCESS, None, {"changed": "true" if changed else "false"},
                             held.encode() if held is not None else b"")

    async def register_topic(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """REGISTER_TOPIC_IN_NAMESRV (217), RocketMQ's registerSingleTopicAll: one topic's queues as a route
        body. Queues of a broker not registered here are refused, as in RocketMQ (answered SUCCESS, not kept)."""
        topic = _text(cmd, "topic")
        try:
            route = TopicRouteData.decode(cmd.body)
        except RemoteProtocolError as exc:
            raise RemoteProtocolError(f"REGISTER_TOPIC_IN_NAMESRV: bad body: {exc}") from None
        if not self.route_info.register_topic(topic, route.queue_datas):
            log.warning("REGISTER_TOPIC_IN_NAMESRV %s from %s: no queues, or a broker not registered here; ignored",
                        topic[:200], conn.remote_address if conn is not None else "-")
        return make_response(cmd)

    async def unregister_broker(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self.route_info.unregister_broker(
            _text(cmd, "clusterName"), _text(cmd, "brokerName"), _text(cmd, "brokerAddr"), _int(cmd, "brokerId")
        )
        return make_response(cmd)  # success either way: the broker is not registered afterwards

    async def get_route_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _field(cmd, "topic")
        route = self.route_info.pick_route(topic)
        if route is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, f"no route for topic {topic[:200]!r} on this nameserver")
        if self.order_message_enable:
            order_conf = self.kv.get(ORDER_TOPIC_CONFIG, topic)
            if order_conf:
                route = dataclasses.replace(route, order_topic_conf=order_conf)
        return make_response(cmd, body=route.encode())

    async def get_cluster_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, body=self.route_info.cluster_info().encode())

    async def get_all_topics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, body=TopicList(tuple(self.route_info.all_topics())).encode())

    async def delete_topic(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _text(cmd, "topic")
        cluster = cmd.ext_fields.get("clusterName") or None  # 5.x may limit the deletion to one cluster
        self.route_info.delete_topic(topic, cluster)
        return make_response(cmd)

    async def get_topics_by_cluster(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        topics = self.route_info.topics_by_cluster(_text(cmd, "cluster"))
        return make_response(cmd, body=TopicList(tuple(topics)).encode())

    # -- the Java tools' requests (mqadmin, rocketmq-dashboard), in RocketMQ's shapes (protocol/admin_bodies.py,
    # imported at the first of them: an idle nameserver does not hold it)
    async def get_system_topics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        from cometmq.protocol.admin_bodies import encode_topic_list

        names, addr = self.route_info.system_topics()
        return make_response(cmd, body=encode_topic_list(names, addr))

    async def get_unit_topics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # RocketMQ's topicSysFlag unit bits (updateTopic -u/-s): unit topics, topics with unit subscriptions,
        # and those of the latter that are not unit topics themselves
        unit, unit_sub = 0x1, 0x2
        want: dict[int, Callable[[int], bool]] = {
            RequestCode.GET_UNIT_TOPIC_LIST: lambda f: bool(f & unit),
            RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST: lambda f: bool(f & unit_sub),
            RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: lambda f: bool(f & unit_sub) and not f & unit}
        test = want.get(cmd.code, lambda f: False)
        from cometmq.protocol.admin_bodies import encode_topic_list

        return make_response(cmd, body=encode_topic_list(self.route_info.topics_with_sys_flag(test)))

    async def wipe_write_perm(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        count = self.route_info.update_write_perm(_text(cmd, "brokerName"), wipe=True)
        return make_response(cmd, ResponseCode.SUCCESS, None, {"wipeTopicCount": str(count)})

    async def add_write_perm(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        count = self.route_info.update_write_perm(_text(cmd, "brokerName"), wipe=False)
        return make_response(cmd, ResponseCode.SUCCESS, None, {"addTopicCount": str(count)})

    async def get_kv_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        namespace, key = _field(cmd, "namespace"), _field(cmd, "key")
        value = self.kv.get(namespace, key)
        if value is None:
            return make_response(cmd, ResponseCode.QUERY_NOT_FOUND,
                                 f"No config item, Namespace: {namespace} Key: {key}")
        return make_response(cmd, ResponseCode.SUCCESS, None, {"value": value})

    async def get_kv_list(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        namespace = _field(cmd, "namespace")
        table = self.kv.namespace(namespace)
        if table is None:
            return make_response(cmd, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        from cometmq.protocol.admin_bodies import KVTable

        return make_response(cmd, body=KVTable(table).encode())

    async def put_kv_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        namespace, key = _text(cmd, "namespace"), _text(cmd, "key")
        value = _field(cmd, "value")
        try:
            self.kv.put(namespace, key, value)
        except OSError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, _unwritable(cmd, exc)) from None
        log.info("KV config put by %s: %s %s=%s", conn.remote_address if conn is not None else "-", namespace, key,
                 value)
        return make_response(cmd)

    async def delete_kv_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        namespace, key = _text(cmd, "namespace"), _text(cmd, "key")
        try:
            self.kv.delete(namespace, key)
        except OSError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, _unwritable(cmd, exc)) from None
        return make_response(cmd)

    async def not_supported(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, ResponseCode.SYSTEM_ERROR,
                             f"{_name(cmd)}: the cometmq nameserver takes its configuration from its config file at "
                             "start")


def _unwritable(cmd: RemotingCommand, exc: OSError) -> str:
    log.error("%s: cannot write the KV config file: %s", _name(cmd), exc)
    return f"{_name(cmd)}: the KV config file cannot be written ({exc}); nothing changed"


def _body_digest(body: bytes, compressed: bool) -> bytes:
    """A registration body's digest (BLAKE2b, 16 bytes, keyed apart by ``compressed``), from the module hashlib
    takes its BLAKE2 from: ``import hashlib`` also loads OpenSSL's digests, ~0.6 MiB of an idle ``cometmq serve``
    that nothing else of a server without access control needs (docs/benchmarks.md, [16] idle memory)."""
    return _blake2b(body, digest_size=16, person=b"c" if compressed else b"p").digest()
