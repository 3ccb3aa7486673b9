"""Consuming: by POP (QueryAssignment, ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue) and by offset (PullMessage, UpdateOffset, GetOffset, QueryOffset)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from cometmq.grpc import convert, limits
from cometmq.grpc.backend import any_master
from cometmq.grpc.handles import ReceiptHandle
from cometmq.grpc.producer_rpcs import ALL_TYPES, endpoints_for
from cometmq.grpc.rpc import RpcBase, client_id_of, remaining_ms, streaming, unary
from cometmq.grpc.status import OK_STATUS, GrpcError, from_remoting, status
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    TopicQueueHeader,
    UpdateConsumerOffsetRequestHeader,
)
from cometmq.protocol.message import MessageRecord, iter_records
from cometmq.protocol.pop import (
    INIT_MODE_MAX,
    INIT_MODE_MIN,
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
    extra_info_for,
)
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import perm_readable

MAX_BATCH = 1024
#: how long a message popped for a client that went away before it was written stays hidden (RocketMQ's proxy:
#: ReceiveMessageResponseStreamWriter's NACK_INVISIBLE_TIME)
NACK_INVISIBLE_MS = 1000
#: PULL_MESSAGE sysFlag: suspend (long poll) + the request carries its subscription
_PULL_SYS_FLAG = 0x2 | 0x4

log = logging.getLogger("cometmq.grpc")


def _popped(response: RemotingCommand, broker_name: str) -> list[tuple[ReceiptHandle, MessageRecord]]:
    """The messages of a POP answer, each with the receipt handle of its delivery."""
    rh = PopMessageResponseHeader.from_ext(response.ext_fields)
    out = []
    for rec in iter_records(response.body or b""):
        info = extra_info_for(rh, rec.topic, rec.queue_id, rec.queue_offset, broker_name)
        out.append((ReceiptHandle(broker_name, rec.topic, info, rec.physical_offset), rec))
    return out


def _filter(expr: pb.FilterExpression) -> tuple[str, str]:
    if expr.type == pb.SQL:
        return "SQL92", expr.expression
    return "TAG", expr.expression or "*"


class ConsumerRpcs(RpcBase):
    port: int

    def _check(self, response: RemotingCommand, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        if response.code not in ok:
            raise GrpcError(from_remoting(response.code), response.remark or f"broker answered {response.code}")
        return response

    # -- assignment -----------------------------------------------------------------------------------------
    @unary(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request: spb.QueryAssignmentRequest, context: Any) -> spb.QueryAssignmentResponse:
        """One assignment per broker with readable queues, queue id -1: the broker's POP picks the queue (and
        keeps per-queue order for FIFO groups), so every consumer of the group may ask every broker."""
        limits.check_topic(request.topic)
        limits.check_group(request.group)
        topic = request.topic.name
        route = await self.backend.routed(topic, any_master)
        endpoints = endpoints_for(request.endpoints, self.config.host, self.port)
        masters = {bd.broker_name for bd in route.broker_datas if bd.master_addr is not None}
        out = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.broker_name in masters and perm_readable(qd.perm) and qd.read_queue_nums > 0:
                mq = pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE,
                                     broker=pb.Broker(name=qd.broker_name, id=0, endpoints=endpoints),
                                     accept_message_types=ALL_TYPES)
                out.append(pb.Assignment(message_queue=mq))
        if not out:  # RocketMQ's proxy answers the same
            raise GrpcError(pb.Code.FORBIDDEN, f"no readable queue in topic {topic}")
        return spb.QueryAssignmentResponse(status=OK_STATUS, assignments=out)

    # -- receive ----------------------------------------------------------------------------------------------
    @streaming(spb.ReceiveMessageResponse)
    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest,
                             context: Any) -> AsyncIterator[spb.ReceiveMessageResponse]:
        group, mq = request.group.name, request.message_queue
        topic = mq.topic.name
        limits.check_topic(mq.topic)
        limits.check_group(request.group)
        invisible = limits.receive_invisible(request, self.config)
        poll = (convert.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout")
                else self.config.long_polling_ms)
        left = remaining_ms(context)
        if left is not None:  # answer before the client gives up
            poll = min(poll, int(left - self.config.deadline_margin_ms - self.config.request_timeout_s * 1000 / 3))
        poll = max(poll, 0)
        batch = request.batch_size if request.batch_size > 0 else 32
        if batch > MAX_BATCH:
            raise GrpcError(pb.Code.BAD_REQUEST, f"batch size {batch} exceeds {MAX_BATCH}")
        client_id = client_id_of(context)
        # an auto-renewing receive's messages are renewed while the client holds them (grpc/renewal.py); the
        # receive counts as the client being there
        renew = request.auto_renew and self.config.auto_renew and bool(client_id)
        session = self.sessions.get(client_id) if renew else self.sessions.find(client_id)
        if session is not None and session.fifo_group == group:
            fifo = session.fifo
        else:
            # No Settings of this client for the group yet (the endpoint restarted and the client's Telemetry stream
            # is not back; its Heartbeat, which may come first, says nothing of the order): the group's own config,
            # as its Settings reply says. An unordered POP on a FIFO group handed out a queue's next messages while
            # its earlier ones were still being processed.
            fifo = bool((await self.backend.group_config(topic, group)).get("consumeMessageOrderly", False))
        exp_type, exp = _filter(request.filter_expression)
        addr = await self.backend.broker_addr(topic, mq.broker.name)
        header = PopMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=-1, max_msg_nums=batch, invisible_time=invisible,
            poll_time=poll, born_time=int(time.time() * 1000),
            init_mode=INIT_MODE_MAX if self.config.init_mode == "max" else INIT_MODE_MIN,
            exp_type=exp_type, exp=exp, order=fifo or None, attempt_id=request.attempt_id or None)
        pop = asyncio.ensure_future(self.backend.invoke(addr, make_request(RequestCode.POP_MESSAGE, header.to_ext()),
                                                        timeout=poll / 1000 + self.config.request_timeout_s,
                                                        topic=topic))
        try:
            response = await asyncio.shield(pop)
        except asyncio.CancelledError:
            # The client went away mid-poll: the broker's POP still waits, and what it takes would reach nobody.
            self._spawn(self._give_back_pop(pop, group, mq.broker.name))
            raise
        if response.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT):
            yield spb.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        self._check(response)
        popped = _popped(response, mq.broker.name)
        if renew:
            for h, rec in popped:
                self.renewer.track(client_id, group, h, rec.reconsume_times)
        sent = 0  # messages the stream took: it asks for the next item once it has sent one
        try:
            messages = [convert.record_to_message(rec, namespace=mq.topic.resource_namespace, topic=topic,
                                                  receipt_handle=h.encode(), invisible_ms=invisible,
                                                  max_body_size=self.config.max_body_size) for h, rec in popped]
            if not messages:
                yield spb.ReceiveMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message"))
                return
            yield spb.ReceiveMessageResponse(status=OK_STATUS)
            # the clients measure delivery latency from this (the Python push consumer fails without it)
            yield spb.ReceiveMessageResponse(delivery_timestamp=convert.to_timestamp(int(time.time() * 1000)))
            for m in messages:
                yield spb.ReceiveMessageResponse(message=m)
                sent += 1
        finally:
            if sent < len(popped):  # the client went away (or a message failed to convert) before it had them all
                if renew:
                    for h, _ in popped[sent:]:
                        self.renewer.forget(client_id, h)
                self._spawn(self._give_back(group, [h for h, _ in popped[sent:]]))

    # -- messages popped for a client that is gone -----------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            self.backend.spawn(coro)
        except RuntimeError:  # no running loop (a stream finalized at shutdown): they come back at their time
            coro.close()

    async def _give_back_pop(self, pop: asyncio.Future[RemotingCommand], group: str, broker_name: str) -> None:
        try:
            response = await pop
            if response.code == ResponseCode.SUCCESS:
                await self._give_back(group, [h for h, _ in _popped(response, broker_name)])
        except (GrpcError, ProtocolError) as exc:  # (nothing popped, or an answer that does not parse)
            log.info("POP of group %s for a client that went away: %s", group, exc)

    async def _give_back(self, group: str, handles: list[ReceiptHandle]) -> None:
        """Make what was popped for a client that did not get it visible again after NACK_INVISIBLE_MS (RocketMQ's
        proxy nacks a message it could not write so), not after the receive's invisible time (up to 12 hours; a
        FIFO queue blocked as long)."""
        results = await asyncio.gather(*(self._change_invisible(group, h, NACK_INVISIBLE_MS) for h in handles),
                                       return_exceptions=True)
        for h, r in zip(handles, results, strict=True):
            if isinstance(r, BaseException):
                log.info("giving back %s-%d@%d of group %s, popped for a client that went away: %s", h.topic,
                         h.queue_id, h.offset, group, r)

    def _handle(self, text: str) -> ReceiptHandle:
        try:
            return ReceiptHandle.decode(text)
        except ProtocolError as exc:
            raise GrpcError(pb.Code.INVALID_RECEIPT_HANDLE, str(exc)) from None

    # -- ack / change invisible time / DLQ ----------------------------------------------------------------------
    @unary(spb.AckMessageResponse)
    async def AckMessage(self, request: spb.AckMessageRequest, context: Any) -> spb.AckMessageResponse:
        limits.check_topic(request.topic)
        limits.check_group(request.group)
        group, client_id = request.group.name, client_id_of(context)
        if len(request.entries) == 1:  # what the clients send: no task for a gather of one
            results = [await self._ack_one(group, client_id, request.entries[0])]
        else:
            results = list(await asyncio.gather(*(self._ack_one(group, client_id, e) for e in request.entries)))
        entries = [spb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=s)
                   for e, s in zip(request.entries, results, strict=True)]
        codes = {s.code for s in results}
        overall = (results[0] if len(codes) == 1 else status(pb.Code.MULTIPLE_RESULTS, "entries differ")) \
            if results else OK_STATUS
        return spb.AckMessageResponse(status=overall, entries=entries)

    async def _ack_one(self, group: str, client_id: str, entry: spb.AckMessageEntry) -> pb.Status:
        try:
            # a renewed delivery: the latest renewal's handle (the client's is stale once renewed)
            h = await self.renewer.take(client_id, group, self._handle(entry.receipt_handle))
            addr = await self.backend.broker_addr(h.topic, h.broker_name)
            header = AckMessageRequestHeader(consumer_group=group, topic=h.topic, queue_id=h.queue_id,
                                             extra_info=str(h.extra_info), offset=h.offset)
            self._check(await self.backend.invoke(addr, make_request(RequestCode.ACK_MESSAGE, header.to_ext())))
            return OK_STATUS
        except GrpcError as exc:
            return status(exc.code, exc.message)

    @unary(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: Any) -> spb.ChangeInvisibleDurationResponse:
        limits.check_topic(request.topic)
        limits.check_group(request.group)
        h = self._handle(request.receipt_handle)
        invisible = convert.duration_ms(request.invisible_duration)
        limits.check_invisible(invisible, self.config)
        group = request.group.name
        h = await self.renewer.take(client_id_of(context), group, h)  # the client decides now: no more renewal
        renewed = await self._change_invisible(group, h, invisible)
        return spb.ChangeInvisibleDurationResponse(status=OK_STATUS, receipt_handle=renewed.encode())

    async def _change_invisible(self, group: str, h: ReceiptHandle, invisible: int) -> ReceiptHandle:
        """CHANGE_MESSAGE_INVISIBLETIME for the delivery ``h`` names; the broker refuses a stale handle or one of
        another group (INVALID_RECEIPT_HANDLE). Returns the new handle."""
        addr = await self.backend.broker_addr(h.topic, h.broker_name)
        header = ChangeInvisibleTimeRequestHeader(consumer_group=group, topic=h.topic, queue_id=h.queue_id,
                                                  extra_info=str(h.extra_info), offset=h.offset,
                                                  invisible_time=invisible)
        response = self._check(await self.backend.invoke(addr, make_request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                                                                            header.to_ext())))
        rh = ChangeInvisibleTimeResponseHeader.from_ext(response.ext_fields)
        return h.renewed(rh.pop_time, rh.invisible_time)

    @unary(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                                              context: Any) -> spb.ForwardMessageToDeadLetterQueueResponse:
        """Copy the message to the group's DLQ (CONSUMER_SEND_MSG_BACK with delay level -1), then ack it.

        The handle is checked first, by a change of invisible time that also keeps the message hidden while it is
        copied: a stale handle, or one of another group, is refused before anything is copied. Should the copy
        fail, the message comes back when that time is over."""
        limits.check_topic(request.topic)
        limits.check_group(request.group)
        group = request.group.name
        h = await self.renewer.take(client_id_of(context), group, self._handle(request.receipt_handle))
        h = await self._change_invisible(group, h, int(self.config.request_timeout_s * 2000))
        addr = await self.backend.broker_addr(h.topic, h.broker_name)
        back = ConsumerSendMsgBackRequestHeader(offset=h.commit_log_offset, group=group, delay_level=-1,
                                                origin_msg_id=request.message_id or None, origin_topic=h.topic,
                                                max_reconsume_times=request.max_delivery_attempts or None)
        self._check(await self.backend.invoke(addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, back.to_ext())))
        ack = AckMessageRequestHeader(consumer_group=group, topic=h.topic, queue_id=h.queue_id,
                                      extra_info=str(h.extra_info), offset=h.offset)
        self._check(await self.backend.invoke(addr, make_request(RequestCode.ACK_MESSAGE, ack.to_ext())))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=OK_STATUS)

    # -- by offset -------------------------------------------------------------------------------------------
    @streaming(spb.PullMessageResponse)
    async def PullMessage(self, request: spb.PullMessageRequest,
                          context: Any) -> AsyncIterator[spb.PullMessageResponse]:
        mq = request.message_queue
        topic = mq.topic.name
        addr = await self.backend.broker_addr(topic, mq.broker.name)
        poll = convert.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        left = remaining_ms(context)
        if left is not None:
            poll = min(poll, int(left - self.config.deadline_margin_ms - self.config.request_timeout_s * 1000 / 3))
        poll = max(poll, 0)
        exp_type, exp = _filter(request.filter_expression)
        batch = request.batch_size if request.batch_size > 0 else 32
        header = PullMessageRequestHeader(
            consumer_group=request.group.name, topic=topic, queue_id=mq.id, queue_offset=request.offset,
            max_msg_nums=min(batch, MAX_BATCH), sys_flag=_PULL_SYS_FLAG if poll > 0 else 0x4,
            suspend_timeout_millis=poll, subscription=exp, expression_type=exp_type)
        response = await self.backend.invoke(addr, make_request(RequestCode.PULL_MESSAGE, header.to_ext()),
                                             timeout=poll / 1000 + self.config.request_timeout_s,
                                             topic=topic)
        next_offset = int(response.ext_fields.get("nextBeginOffset", request.offset) or request.offset)
        if response.code == ResponseCode.SUCCESS:
            yield spb.PullMessageResponse(status=OK_STATUS)
            for rec in iter_records(response.body or b""):
                yield spb.PullMessageResponse(message=convert.record_to_message(
                    rec, namespace=mq.topic.resource_namespace, topic=topic, max_body_size=self.config.max_body_size))
        elif response.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
            yield spb.PullMessageResponse(status=status(pb.Code.MESSAGE_NOT_FOUND, "no new message"))
        elif response.code == ResponseCode.PULL_OFFSET_MOVED:
            yield spb.PullMessageResponse(status=status(pb.Code.ILLEGAL_OFFSET, f"offset moved to {next_offset}"))
        else:
            self._check(response)
        yield spb.PullMessageResponse(next_offset=next_offset)

    @unary(spb.UpdateOffsetResponse)
    async def UpdateOffset(self, request: spb.UpdateOffsetRequest, context: Any) -> spb.UpdateOffsetResponse:
        mq = request.message_queue
        if request.offset < 0:
            raise GrpcError(pb.Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        addr = await self.backend.broker_addr(mq.topic.name, mq.broker.name)
        header = UpdateConsumerOffsetRequestHeader(consumer_group=request.group.name, topic=mq.topic.name,
                                                   queue_id=mq.id, commit_offset=request.offset)
        self._check(await self.backend.invoke(addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())))
        return spb.UpdateOffsetResponse(status=OK_STATUS)

    @unary(spb.GetOffsetResponse)
    async def GetOffset(self, request: spb.GetOffsetRequest, context: Any) -> spb.GetOffsetResponse:
        mq = request.message_queue
        addr = await self.backend.broker_addr(mq.topic.name, mq.broker.name)
        header = QueryConsumerOffsetRequestHeader(consumer_group=request.group.name, topic=mq.topic.name,
                                                  queue_id=mq.id)
        response = await self.backend.invoke(addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext()))
        if response.code != ResponseCode.SUCCESS:
            raise GrpcError(pb.Code.OFFSET_NOT_FOUND, response.remark or "the group has no offset for this queue")
        return spb.GetOffsetResponse(status=OK_STATUS, offset=int(response.ext_fields.get("offset", "0")))

    @unary(spb.QueryOffsetResponse)
    async def QueryOffset(self, request: spb.QueryOffsetRequest, context: Any) -> spb.QueryOffsetResponse:
        mq = request.message_queue
        addr = await self.backend.broker_addr(mq.topic.name, mq.broker.name)
        if request.query_offset_policy == pb.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise GrpcError(pb.Code.BAD_REQUEST, "policy TIMESTAMP needs a timestamp")
            cmd = make_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequestHeader(
                topic=mq.topic.name, queue_id=mq.id, timestamp=convert.timestamp_ms(request.timestamp)).to_ext())
        else:
            code = RequestCode.GET_MIN_OFFSET if request.query_offset_policy == pb.BEGINNING \
                else RequestCode.GET_MAX_OFFSET
            cmd = make_request(code, TopicQueueHeader(topic=mq.topic.name, queue_id=mq.id).to_ext())
        response = self._check(await self.backend.invoke(addr, cmd))
        return spb.QueryOffsetResponse(status=OK_STATUS, offset=int(response.ext_fields.get("offset", "0")))

    @unary(spb.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, request: spb.SyncLiteSubscriptionRequest,
                                   context: Any) -> spb.SyncLiteSubscriptionResponse:
        raise GrpcError(pb.Code.UNSUPPORTED, "lite topics are not supported by cometmq")
