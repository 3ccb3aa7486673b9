"""Routes, client lifecycle (Heartbeat, Telemetry, NotifyClientTermination) and producing (SendMessage,
EndTransaction, RecallMessage, and the server-initiated transaction checks)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from cometmq.grpc import convert, limits
from cometmq.grpc.backend import PROXY_PRODUCER_GROUP, any_master
from cometmq.grpc.handles import TransactionRef, recall_broker_name
from cometmq.grpc.rpc import Caller, RpcBase, client_id_of, metadata_of, settings_needs, unary
from cometmq.grpc.sessions import Outbox
from cometmq.grpc.status import OK_STATUS, GrpcError, from_remoting, status
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol import properties as P
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.headers import EndTransactionRequestHeader
from cometmq.protocol.message import SysFlag, decode_record
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.properties import encode_properties
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import TopicRouteData, perm_readable, perm_writable

log = logging.getLogger("cometmq.grpc")

ALL_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
#: RocketMQ's retry delays of a concurrently consuming group (delay levels 3.. of the 4.x table), seconds
RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0  # END_TRANSACTION's commitOrRollback (TRANSACTION_COMMIT/ROLLBACK_TYPE)


def endpoints_for(request_endpoints: pb.Endpoints, host: str, port: int) -> pb.Endpoints:
    """The address clients should use for every broker: the one they reached us at (cluster-mode proxy)."""
    if request_endpoints.addresses:
        return request_endpoints
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=port)])


def message_queues(route: TopicRouteData, topic: str, namespace: str, endpoints: pb.Endpoints) -> list[pb.MessageQueue]:
    out: list[pb.MessageQueue] = []
    masters = {bd.broker_name for bd in route.broker_datas if bd.master_addr is not None}
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.broker_name not in masters:
            continue
        broker = pb.Broker(name=qd.broker_name, id=0, endpoints=endpoints)
        for qid in range(max(qd.read_queue_nums, qd.write_queue_nums)):
            r = perm_readable(qd.perm) and qid < qd.read_queue_nums
            w = perm_writable(qd.perm) and qid < qd.write_queue_nums
            perm = pb.READ_WRITE if r and w else pb.READ if r else pb.WRITE if w else pb.NONE
            out.append(pb.MessageQueue(topic=pb.Resource(resource_namespace=namespace, name=topic), id=qid,
                                       permission=perm, broker=broker, accept_message_types=ALL_TYPES))
    return out


def send_v2_fields(topic: str, queue_id: int, sys_flag: int, born_ms: int, properties: str) -> dict[str, str]:
    """SEND_MESSAGE_V2's one-letter header of an endpoint send (what ``send_header_to_v2`` makes of a
    ``SendMessageRequestHeader`` with these fields and the defaults; built directly: it is on every send)."""
    return {"a": PROXY_PRODUCER_GROUP, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
            "g": str(born_ms), "h": "0", "i": properties, "j": "0", "k": "false", "m": "false"}


class ProducerRpcs(RpcBase):
    port: int
    _rr = itertools.count()

    # -- routes and lifecycle ---------------------------------------------------------------------------------
    @unary(spb.QueryRouteResponse)
    async def QueryRoute(self, request: spb.QueryRouteRequest, context: Any) -> spb.QueryRouteResponse:
        limits.check_topic(request.topic)
        topic = request.topic.name
        route = await self.backend.routed(topic, any_master)
        endpoints = endpoints_for(request.endpoints, self.config.host, self.port)
        queues = message_queues(route, topic, request.topic.resource_namespace, endpoints)
        if not queues:
            raise GrpcError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic} has no queue on a broker with a master")
        return spb.QueryRouteResponse(status=OK_STATUS, message_queues=queues)

    @unary(spb.HeartbeatResponse)
    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Any) -> spb.HeartbeatResponse:
        client_id = client_id_of(context)
        if not client_id:
            raise GrpcError(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is missing")
        if request.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
            limits.check_group(request.group)
        s = self.sessions.get(client_id)
        s.client_type = request.client_type
        if request.HasField("group"):
            s.group = request.group.name
        return spb.HeartbeatResponse(status=OK_STATUS)

    @unary(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: Any) -> spb.NotifyClientTerminationResponse:
        client_id = client_id_of(context)
        self.sessions.remove(client_id)
        # what the client still holds (a push consumer's local cache) is visible again in clear_invisible_ms
        # (RocketMQ's proxy: the consumer's unregistration clears its receipt handles)
        self.renewer.clear(client_id)
        return spb.NotifyClientTerminationResponse(status=OK_STATUS)

    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand],
                        context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[spb.TelemetryCommand]:
        try:
            caller = self.check_auth(context, "Telemetry")
        except GrpcError as exc:
            yield spb.TelemetryCommand(status=status(exc.code, exc.message))
            return
        client_id = metadata_of(context).get("x-mq-client-id", "")
        if not client_id:
            yield spb.TelemetryCommand(status=status(pb.Code.CLIENT_ID_REQUIRED, "x-mq-client-id is missing"))
            return
        session = self.sessions.get(client_id)
        outbox = Outbox()
        session.outbox = outbox

        async def read() -> None:
            # Each answer waits for room in the outbox before the next command is read: a client that writes
            # and never reads is held by flow control, not answered into the endpoint's memory without end.
            try:
                async for cmd in request_iterator:
                    if cmd.HasField("settings"):
                        try:
                            self.check_settings(caller, cmd.settings)
                        except GrpcError as exc:  # refused: answered, nothing applied, and the stream ends
                            await outbox.put(spb.TelemetryCommand(status=status(exc.code, exc.message)))
                            break
                        await outbox.put(await self._settings_reply(session, cmd.settings))
                    # thread stack traces and verify results are answers we never asked for: ignored
            except Exception as exc:  # the client went away mid-stream
                log.debug("telemetry stream of %s ended: %s", client_id, exc)
            finally:
                outbox.close()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            if session.outbox is outbox:
                session.outbox = None
                session.last_seen = time.monotonic()

    def check_settings(self, caller: Caller | None, settings: pb.Settings) -> None:
        """With ACL on, a client may announce only topics it may publish to, or a group (and topics) it may
        consume as (RocketMQ 5's proxy checks the same): FORBIDDEN otherwise, BAD_REQUEST for settings that are
        neither a producer's nor a consumer's. Checked at every settings command, against the ACL in force then.
        Then the names, as RocketMQ's proxy checks them after its authorization: a producer's topics
        (ILLEGAL_TOPIC), a consumer's group (ILLEGAL_CONSUMER_GROUP)."""
        if self.acl is not None:
            self.check_caller(caller, "Telemetry", settings_needs(settings))
        if settings.HasField("publishing"):
            for topic in settings.publishing.topics:
                limits.check_topic(topic)
        elif settings.HasField("subscription"):
            limits.check_group(settings.subscription.group)

    async def _settings_reply(self, session: Any, settings: pb.Settings) -> spb.TelemetryCommand:
        session.client_type = settings.client_type
        reply = pb.Settings()
        reply.CopyFrom(settings)
        # Metrics on for push consumers only, pointed at this endpoint (which accepts and drops OTLP exports): the
        # Python push consumer registers its gauges only with metrics on and otherwise stops reading the Telemetry
        # stream. Everyone else gets them off (as RocketMQ's proxy does by default): a client with metrics on
        # records a histogram sample per send or receive, which costs it time on every call.
        if settings.client_type == pb.PUSH_CONSUMER:
            reply.metric.on = True
            if settings.HasField("access_point") and settings.access_point.addresses:
                reply.metric.endpoints.CopyFrom(settings.access_point)
            else:
                reply.metric.endpoints.CopyFrom(endpoints_for(pb.Endpoints(), self.config.host, self.port))
        else:
            reply.metric.on = False
            reply.metric.ClearField("endpoints")
        if settings.HasField("publishing"):
            session.topics = {r.name for r in settings.publishing.topics}
            reply.publishing.max_body_size = self.config.max_body_size
            reply.publishing.validate_message_type = False
            if not settings.HasField("backoff_policy"):
                reply.backoff_policy.CopyFrom(pb.RetryPolicy(max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
                    initial=convert.to_duration(10), max=convert.to_duration(1000), multiplier=2.0)))
        elif settings.HasField("subscription"):
            sub = settings.subscription
            group = sub.group.name
            session.group = group
            topic = sub.subscriptions[0].topic.name if sub.subscriptions else ""
            cfg = await self.backend.group_config(topic, group) if topic else {}
            fifo = bool(cfg.get("consumeMessageOrderly", False))
            retry_max = int(cfg.get("retryMaxTimes", 16))  # type: ignore[call-overload]
            session.fifo, session.fifo_group = fifo, group
            reply.subscription.fifo = fifo
            if not sub.HasField("receive_batch_size"):
                reply.subscription.receive_batch_size = 32
            if not sub.HasField("long_polling_timeout"):
                reply.subscription.long_polling_timeout.CopyFrom(convert.to_duration(self.config.long_polling_ms))
            if fifo:
                policy = pb.RetryPolicy(max_attempts=retry_max + 1, exponential_backoff=pb.ExponentialBackoff(
                    initial=convert.to_duration(1000), max=convert.to_duration(60_000), multiplier=2.0))
            else:
                policy = pb.RetryPolicy(max_attempts=retry_max + 1, customized_backoff=pb.CustomizedBackoff(
                    next=[convert.to_duration(s * 1000) for s in RETRY_DELAYS_S]))
            reply.backoff_policy.CopyFrom(policy)
        return spb.TelemetryCommand(status=OK_STATUS, settings=reply)

    # -- producing ----------------------------------------------------------------------------------------------
    @unary(spb.SendMessageResponse)
    async def SendMessage(self, request: spb.SendMessageRequest, context: Any) -> spb.SendMessageResponse:
        if not request.messages:
            raise GrpcError(pb.Code.BAD_REQUEST, "SendMessage carries no message")
        # every message is checked before any is sent: a bad one refuses the whole request (RocketMQ's proxy too)
        topic = request.messages[0].topic
        if any(m.topic != topic for m in request.messages):
            raise GrpcError(pb.Code.MESSAGE_CORRUPTED, "the messages of one request must be of one topic")
        limits.check_topic(topic)
        now_ms = int(time.time() * 1000)
        for m in request.messages:
            limits.check_message(m, self.config, now_ms)
        # The bodies of one request, GZIP ones inflated, may hold what its frame could hold uncompressed: thousands
        # of small GZIP bodies, each inflating to max_body_size, would otherwise make gigabytes here.
        room = self.config.frame_limit
        prepared = []
        for m in request.messages:
            props, body = convert.send_properties(m, self.config.max_body_size)
            room -= len(body)
            if room < 0:
                raise GrpcError(pb.Code.MESSAGE_BODY_TOO_LARGE, f"the bodies of one SendMessage inflate to more "
                                f"than {self.config.frame_limit} bytes in all")
            prepared.append((m, props, body))
        if len(prepared) == 1:  # what the clients send: no task for a gather of one
            entries = [await self._send_one(*prepared[0])]
        else:
            entries = list(await asyncio.gather(*(self._send_one(*p) for p in prepared)))
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            overall = entries[0].status
        else:
            overall = status(pb.Code.MULTIPLE_RESULTS, "the messages had different outcomes")
        return spb.SendMessageResponse(status=overall, entries=entries)

    async def _send_one(self, msg: pb.Message, props: dict[str, str], body: bytes) -> spb.SendResultEntry:
        try:
            return await self._send(msg, props, body)
        except GrpcError as exc:
            return spb.SendResultEntry(status=status(exc.code, exc.message),
                                       message_id=msg.system_properties.message_id)

    async def _send(self, msg: pb.Message, props: dict[str, str], body: bytes) -> spb.SendResultEntry:
        """Send one checked message (``props`` and ``body`` from ``convert.send_properties``)."""
        topic = msg.topic.name
        mtype = convert.message_type_of(msg)
        route = await self.backend.routed(topic, lambda r: bool(self.backend.writable_queues(r, topic)))
        queues = self.backend.writable_queues(route, topic)
        if not queues:
            raise GrpcError(pb.Code.FORBIDDEN, f"topic {topic} has no writable queue")
        group = msg.system_properties.message_group if msg.system_properties.HasField("message_group") else None
        if group is not None:
            mq = queues[zlib.crc32(group.encode()) % len(queues)]  # one group -> one queue, stable
        else:
            mq = queues[next(self._rr) % len(queues)]
        sys_flag = 0
        if mtype == pb.TRANSACTION:
            props[P.TRAN_MSG] = "true"
            props[P.PGROUP] = PROXY_PRODUCER_GROUP
            sys_flag |= SysFlag.TRANSACTION_PREPARED
            rec = msg.system_properties.orphaned_transaction_recovery_duration
            if msg.system_properties.HasField("orphaned_transaction_recovery_duration") and rec.seconds > 0:
                props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = str(rec.seconds)
        born = msg.system_properties.born_timestamp
        header = send_v2_fields(topic, mq.queue_id, int(sys_flag),
                                convert.timestamp_ms(born) if born.seconds else int(time.time() * 1000),
                                encode_properties(props).decode("utf-8"))
        addr = await self.backend.broker_addr(topic, mq.broker_name)
        response = await self.backend.invoke(addr, make_request(RequestCode.SEND_MESSAGE_V2, header, body), topic=topic)
        if response.code != ResponseCode.SUCCESS:
            raise GrpcError(from_remoting(response.code), response.remark or f"broker answered {response.code}")
        ext = response.ext_fields
        entry = spb.SendResultEntry(status=OK_STATUS, message_id=msg.system_properties.message_id,
                                    offset=int(ext.get("queueOffset", "0") or 0),
                                    recall_handle=ext.get("recallHandle", ""))
        if mtype == pb.TRANSACTION:
            offset_id = ext.get("msgId", "")
            try:
                clo = decode_offset_msg_id(offset_id).offset
            except ProtocolError:
                raise GrpcError(pb.Code.INTERNAL_SERVER_ERROR, f"broker sent a bad msgId {offset_id!r}") from None
            entry.transaction_id = TransactionRef(addr, clo, entry.offset, offset_id,
                                                  ext.get("transactionId") or msg.system_properties.message_id,
                                                  PROXY_PRODUCER_GROUP).encode()
        return entry

    @unary(spb.EndTransactionResponse)
    async def EndTransaction(self, request: spb.EndTransactionRequest, context: Any) -> spb.EndTransactionResponse:
        limits.check_topic(request.topic)
        try:
            ref = TransactionRef.decode(request.transaction_id)
        except ProtocolError as exc:
            raise GrpcError(pb.Code.INVALID_TRANSACTION_ID, str(exc)) from None
        if not await self.backend.is_broker(ref.broker_addr, request.topic.name):
            # the id is the client's to write: the endpoint connects to no address the cluster's routes do not name
            raise GrpcError(pb.Code.INVALID_TRANSACTION_ID, f"the transaction id names {ref.broker_addr}, which is "
                                                            f"not a broker of topic {request.topic.name!r}")
        decision = {pb.COMMIT: COMMIT, pb.ROLLBACK: ROLLBACK}.get(request.resolution, UNKNOWN)
        header = EndTransactionRequestHeader(
            producer_group=ref.producer_group, tran_state_table_offset=ref.tran_state_table_offset,
            commit_log_offset=ref.commit_log_offset, commit_or_rollback=decision, msg_id=ref.offset_msg_id,
            transaction_id=ref.broker_transaction_id,
            from_transaction_check=request.source == pb.SOURCE_SERVER_CHECK)
        ext = header.to_ext()
        # the topic the ACL checked goes along: the broker ends the half only if it is of that topic (the id is the
        # client's to write)
        ext["topic"] = request.topic.name
        response = await self.backend.invoke(ref.broker_addr, make_request(RequestCode.END_TRANSACTION, ext))
        if response.code != ResponseCode.SUCCESS:
            raise GrpcError(from_remoting(response.code), response.remark or f"broker answered {response.code}")
        return spb.EndTransactionResponse(status=OK_STATUS)

    async def on_transaction_check(self, broker_addr: str, cmd: RemotingCommand) -> None:
        """A broker asks about an unresolved half message: ask a producer of its topic over Telemetry."""
        ext = cmd.ext_fields
        rec, _ = decode_record(cmd.body or b"")
        topic = rec.properties.get(P.REAL_TOPIC) or rec.topic
        try:
            ref = TransactionRef(broker_addr, int(ext.get("commitLogOffset", "-1")),
                                 int(ext.get("tranStateTableOffset", "-1")),
                                 ext.get("offsetMsgId") or ext.get("msgId", ""),
                                 ext.get("transactionId") or rec.properties.get(P.UNIQ_KEY, ""),
                                 rec.properties.get(P.PGROUP, PROXY_PRODUCER_GROUP))
        except ValueError:
            log.warning("transaction check from %s with bad offsets: %s", broker_addr, ext)
            return
        message = convert.record_to_message(rec, topic=topic, max_body_size=self.config.max_body_size)
        command = spb.TelemetryCommand(recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=ref.encode()))
        if self.sessions.send_to_publisher(topic, command) is None:
            log.info("transaction check for %s on %s: no producer of the topic is connected with room on its Telemetry "
                     "stream; the broker checks again later", topic, broker_addr)

    @unary(spb.RecallMessageResponse)
    async def RecallMessage(self, request: spb.RecallMessageRequest, context: Any) -> spb.RecallMessageResponse:
        limits.check_topic(request.topic)
        topic = request.topic.name
        broker_name = recall_broker_name(request.recall_handle)  # a bad handle: BAD_REQUEST (rpc._failure)
        addr = await self.backend.broker_addr(topic, broker_name)
        response = await self.backend.invoke(addr, make_request(
            RequestCode.RECALL_MESSAGE, {"topic": topic, "recallHandle": request.recall_handle,
                                         "producerGroup": PROXY_PRODUCER_GROUP}))
        if response.code != ResponseCode.SUCCESS:
            raise GrpcError(from_remoting(response.code), response.remark or f"broker answered {response.code}")
        return spb.RecallMessageResponse(status=OK_STATUS, message_id=response.ext_fields.get("msgId", ""))
