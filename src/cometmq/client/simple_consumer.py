"""The simple consumer: POP consumption (RocketMQ 5), where the broker — not the client — shares messages out.

Each :meth:`SimpleConsumer.receive` sends one POP_MESSAGE to a broker of a subscribed topic; the broker picks
the queues, hands out up to ``max_messages`` messages and hides them from everyone else for
``invisible_duration``. Acknowledge each with :meth:`ack` (or many with :meth:`ack_many`); one not acked in
time is delivered again, to any consumer of the group, with its ``reconsume_times`` raised by one — after the
group's retry limit it goes to ``%DLQ%<group>``. :meth:`change_invisible_duration` extends (or shortens) the
time; it gives the message a new receipt handle and the old one becomes stale (refused by the broker).

Usage::

    async with SimpleConsumer("my-group", namesrv="127.0.0.1:9876") as consumer:
        consumer.subscribe("Orders", "TagA || TagB")
        for msg in await consumer.receive(max_messages=32, invisible_duration=30, wait=20):
            handle(msg.body)
            await consumer.ack(msg)

Any number of simple consumers of one group can share a topic, also more consumers than queues: work is
shared message by message. With ``ordered=True`` each queue hands out its next message only after the
previous one was acked (or its invisible time passed): per-queue FIFO.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from cometmq.client.admin import check_group, check_topic
from cometmq.client.consume_types import Subscription
from cometmq.client.errors import (
    BrokerError,
    ClientConnectionError,
    ClientStateError,
    ClientTimeoutError,
    InvalidArgumentError,
    NoRouteError,
    reading_reply,
)
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.client.lite_pull_consumer import decode_pulled
from cometmq.client.message import MessageExt, MessageQueue
from cometmq.protocol.acl import Credentials
from cometmq.protocol.client_bodies import CLUSTERING, CONSUME_ACTIVELY, ConsumerData
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY
from cometmq.protocol.pop import (
    INIT_MODE_MAX,
    INIT_MODE_MIN,
    AckMessageRequestHeader,
    BatchAck,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    ExtraInfo,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
    encode_batch_ack_body,
    parse_offset_info,
)
from cometmq.protocol.remoting import RemotingCommand, make_request

log = logging.getLogger(__name__)

__all__ = ["ReceivedMessage", "SimpleConsumer", "StaleHandleError"]


class StaleHandleError(BrokerError):
    """The receipt handle no longer names the message's current delivery: it was delivered again, its
    invisible time was changed, or it was never popped."""


@dataclass(slots=True)
class ReceivedMessage:
    """A message received by POP, with the receipt handle that acks it."""

    message: MessageExt
    handle: ExtraInfo
    group: str
    broker_addr: str

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def tags(self) -> str | None:
        return self.message.tags

    @property
    def keys(self) -> list[str]:
        return self.message.keys

    @property
    def properties(self) -> Mapping[str, str]:
        return self.message.properties

    @property
    def msg_id(self) -> str:
        return self.message.msg_id

    @property
    def queue(self) -> MessageQueue:
        return self.message.queue

    @property
    def queue_offset(self) -> int:
        return self.message.queue_offset

    @property
    def reconsume_times(self) -> int:
        return self.message.reconsume_times

    @property
    def delivery_attempt(self) -> int:
        return self.message.reconsume_times + 1

    @property
    def receipt_handle(self) -> str:
        return str(self.handle)

    @property
    def invisible_until_ms(self) -> int:
        return self.handle.visible_at


def _seconds(name: str, value: float, *, minimum: float = 0.0) -> int:
    if not isinstance(value, int | float) or value < minimum:
        raise InvalidArgumentError(f"{name} must be a number of seconds >= {minimum}, got {value!r}")
    return int(value * 1000)


class SimpleConsumer:
    """A POP consumer: receive, ack, change invisible time (RocketMQ 5's SimpleConsumer, over remoting).

    ``max_inflated_body_size`` bounds the inflating of a COMPRESSED body (default 16 MiB, four times the producers'
    default max_message_size; a few KiB stored can inflate to gigabytes): one that inflates to more is received as
    stored, ``sys_flag & 1`` set (an inflated body has that bit cleared, as in RocketMQ's clients).
    """

    def __init__(self, group: str, *, namesrv: str | None = None, instance: ClientInstance | None = None,
                 invisible_duration: float = 30.0, await_duration: float = 20.0, ordered: bool = False,
                 consume_from: Literal["last", "first"] = "last", request_timeout: float = 3.0,
                 credentials: Credentials | tuple[str, str] | None = None,
                 max_inflated_body_size: int = DEFAULT_MAX_INFLATED_BODY) -> None:
        self.group = check_group(group)
        if not isinstance(max_inflated_body_size, int) or max_inflated_body_size < 1:
            raise InvalidArgumentError(f"max_inflated_body_size must be a positive number of bytes, "
                                       f"got {max_inflated_body_size!r}")
        self.max_inflated_body_size = max_inflated_body_size
        if instance is None and namesrv is None:
            raise InvalidArgumentError("a SimpleConsumer needs namesrv= or instance=")
        if consume_from not in ("last", "first"):
            raise InvalidArgumentError(f"consume_from must be 'last' or 'first', got {consume_from!r}")
        self.invisible_ms = _seconds("invisible_duration", invisible_duration, minimum=0.001)
        self.await_ms = _seconds("await_duration", await_duration)
        self.ordered = ordered
        self.init_mode = INIT_MODE_MIN if consume_from == "first" else INIT_MODE_MAX
        self.request_timeout = request_timeout
        self.instance = instance if instance is not None else ClientInstance(namesrv or "",
                                                                             request_timeout=request_timeout,
                                                                             credentials=credentials)
        self._subs: dict[str, Subscription] = {}
        self._rotation = itertools.count()
        self.started = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        await self.instance.start()
        self.instance.register_consumer(self)
        self.started = True
        try:
            for topic in self._subs:
                await self.instance.route(topic, refresh=True)
            await self.instance.heartbeat()
        except BaseException:
            await self.close()  # (the instance's timers and connections too)
            raise

    async def close(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            await self.instance.unregister(consumer_group=self.group)
        finally:
            await self.instance.close()  # one use fewer: a shared instance closes when its last user does

    async def __aenter__(self) -> SimpleConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- ConsumerLike (heartbeats) -----------------------------------------------------------------------------
    def consumer_data(self) -> ConsumerData:
        subs = tuple(s.data() for s in self._subs.values())
        return ConsumerData(self.group, CONSUME_ACTIVELY, CLUSTERING, "CONSUME_FROM_LAST_OFFSET", subs)

    def on_ids_changed(self) -> None:
        pass  # the broker shares the messages out: nothing to rebalance

    # -- subscriptions ---------------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self._subs[check_topic(topic)] = Subscription.parse(topic, expression, expression_type)

    def unsubscribe(self, topic: str) -> None:
        self._subs.pop(topic, None)

    @property
    def subscriptions(self) -> dict[str, str]:
        return {t: s.expression for t, s in self._subs.items()}

    # -- receive ---------------------------------------------------------------------------------------------
    async def receive(self, max_messages: int = 16, invisible_duration: float | None = None,
                      wait: float | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages from one broker, waiting up to ``wait`` seconds for some to arrive
        (default ``await_duration``); an empty list when none came."""
        if not self.started:
            raise ClientStateError("the consumer is not started")
        if not isinstance(max_messages, int) or not 1 <= max_messages <= 1024:
            raise InvalidArgumentError(f"max_messages must be within 1..1024, got {max_messages!r}")
        invisible_ms = self.invisible_ms if invisible_duration is None else _seconds(
            "invisible_duration", invisible_duration, minimum=0.001)
        wait_ms = self.await_ms if wait is None else _seconds("wait", wait)
        if not self._subs:
            raise ClientStateError("subscribe to a topic before receiving")
        targets = await self._targets()
        if not targets:
            raise NoRouteError(f"no readable queue for {sorted(self._subs)}")
        sub, broker_name, addr = targets[next(self._rotation) % len(targets)]
        header = PopMessageRequestHeader(consumer_group=self.group, topic=sub.topic, queue_id=-1,
                                         max_msg_nums=max_messages, invisible_time=invisible_ms, poll_time=wait_ms,
                                         born_time=_now_ms(), init_mode=self.init_mode, exp_type=sub.expression_type,
                                         exp=sub.expression, order=self.ordered)
        try:
            response = await self._invoke(sub.topic, addr, make_request(RequestCode.POP_MESSAGE, header.to_ext()),
                                          timeout=wait_ms / 1000 + self.request_timeout,
                                          context=f"pop {sub.topic} for {self.group}")
            if response.code in (ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND,
                                 ResponseCode.NO_MESSAGE):
                return []
            if response.code != ResponseCode.SUCCESS:
                raise BrokerError(response.code, response.remark or "", addr=addr, context=f"pop {sub.topic}")
        except BrokerError as exc:
            if route_stale(exc):  # e.g. a replica refusing POP: the next receive asks the new master
                await self.instance.refresh_route(sub.topic)
            raise
        out: list[ReceivedMessage] = []
        unwanted: list[ReceivedMessage] = []
        group = self.group
        tags = sub.tags
        # (the tag check reads each record's properties, decoded lazily: inside the block, as the rest of the answer)
        with reading_reply("unreadable POP answer", addr=addr):
            msgs = self._decode(response.body, PopMessageResponseHeader.from_ext(response.ext_fields), sub.topic,
                                broker_name, self.max_inflated_body_size)
            for msg, info in msgs:
                received = ReceivedMessage(msg, info, group, addr)
                if tags is not None and msg.tags not in tags:
                    unwanted.append(received)  # a tag-hash collision: the broker filters by hash only
                else:
                    out.append(received)
        if unwanted:
            await self.ack_many(unwanted)
        return out

    @staticmethod
    def _decode(body: bytes, rh: PopMessageResponseHeader, topic: str, broker_name: str,
                max_inflated: int = DEFAULT_MAX_INFLATED_BODY) -> list[tuple[MessageExt, ExtraInfo]]:
        """The messages of a POP answer with their handles. The body holds the records queue by queue, in the
        order of the header's msgOffsetInfo, so each queue's run of records is decoded as one pull body."""
        starts = parse_offset_info(rh.start_offset_info)
        out: list[tuple[MessageExt, ExtraInfo]] = []
        pos = 0
        for (flag, qid), offsets in parse_offset_info(rh.msg_offset_info).items():
            if not offsets:
                continue  # a queue named with no offsets: nothing of it in the body
            begin = pos
            for _ in offsets:
                if pos + 4 > len(body):
                    raise RemoteProtocolError("a POP answer's body is shorter than its msgOffsetInfo says")
                pos += int.from_bytes(body[pos:pos + 4], "big")
            msgs = decode_pulled(body[begin:pos], MessageQueue(topic, broker_name, qid), max_inflated)
            if len(msgs) != len(offsets):
                raise RemoteProtocolError("a POP answer's records do not match its msgOffsetInfo")
            ck = starts.get((flag, qid), offsets[:1])[0]
            pop_time, invisible, revive = rh.pop_time, rh.invisible_time, rh.revive_qid
            out.extend((m, ExtraInfo(ck, pop_time, invisible, revive, flag, broker_name, qid, off))
                       for m, off in zip(msgs, offsets, strict=True))
        if pos != len(body):
            raise RemoteProtocolError("a POP answer's body holds more records than its msgOffsetInfo lists")
        return out

    async def _targets(self) -> list[tuple[Subscription, str, str]]:
        targets = []
        for sub in self._subs.values():
            route = await self.instance.route(sub.topic)
            if route is None:
                continue
            names = sorted({q.broker_name for q in self.instance.queues_of(route, sub.topic, writable=False)})
            for name in names:
                addr = self.instance.master_addr(name)
                if addr is not None:
                    targets.append((sub, name, addr))
        return targets

    # -- ack / change invisible time -------------------------------------------------------------------------
    async def ack(self, msg: ReceivedMessage) -> None:
        """Acknowledge one message. Raises StaleHandleError when its handle is no longer current."""
        self._check_received(msg)
        h = msg.handle
        header = AckMessageRequestHeader(consumer_group=self.group, topic=msg.message.queue.topic,
                                         queue_id=h.queue_id, extra_info=str(h), offset=h.queue_offset)
        response = await self._invoke(msg.message.queue.topic, msg.broker_addr,
                                      make_request(RequestCode.ACK_MESSAGE, header.to_ext()),
                                      context=f"ack {msg.topic}-{h.queue_id}@{h.queue_offset}")
        self._raise_for(response.code, response.remark, msg.broker_addr, "ack")

    async def ack_many(self, msgs: Iterable[ReceivedMessage]) -> None:
        """Acknowledge many messages with one BATCH_ACK_MESSAGE per broker. Stale handles among them are
        reported together in one StaleHandleError after the others were acked."""
        by_broker: dict[str, dict[tuple[str, int, int, int], list[ReceivedMessage]]] = defaultdict(
            lambda: defaultdict(list))
        for m in msgs:
            self._check_received(m)
            h = m.handle
            by_broker[m.broker_addr][(m.message.queue.topic, h.queue_id, h.pop_time, h.invisible_time)].append(m)
        stale: list[str] = []
        for addr, groups in by_broker.items():
            acks = []
            for (topic, qid, pop_time, invisible), ms in groups.items():
                offsets = tuple(sorted(m.handle.queue_offset for m in ms))
                acks.append(BatchAck(self.group, topic, ms[0].handle.retry_flag, offsets[0], qid,
                                     ms[0].handle.revive_qid, pop_time, invisible, offsets))
            broker_name = next(iter(groups.values()))[0].handle.broker_name
            response = await self._invoke(acks[0].topic, addr, make_request(
                RequestCode.BATCH_ACK_MESSAGE, {}, encode_batch_ack_body(broker_name, acks)),
                context=f"batch ack of {sum(len(v) for v in groups.values())}")
            self._raise_for(response.code, response.remark, addr, "batch ack")
            if response.ext_fields.get("staleOffsets"):
                stale.append(response.ext_fields["staleOffsets"])
        if stale:
            raise StaleHandleError(ResponseCode.NO_MESSAGE, f"stale receipt handles: {','.join(stale)}",
                                   context="batch ack")

    async def change_invisible_duration(self, msg: ReceivedMessage, duration: float) -> ReceivedMessage:
        """Make the message invisible for ``duration`` seconds from now. Gives it a new handle (in place, and
        returned); the old handle becomes stale."""
        self._check_received(msg)
        ms = _seconds("duration", duration)
        h = msg.handle
        header = ChangeInvisibleTimeRequestHeader(consumer_group=self.group, topic=msg.message.queue.topic,
                                                  queue_id=h.queue_id, extra_info=str(h), offset=h.queue_offset,
                                                  invisible_time=ms)
        response = await self._invoke(
            msg.message.queue.topic, msg.broker_addr,
            make_request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header.to_ext()),
            context=f"change invisible time of {msg.topic}-{h.queue_id}@{h.queue_offset}")
        self._raise_for(response.code, response.remark, msg.broker_addr, "change invisible time")
        rh = ChangeInvisibleTimeResponseHeader.from_ext(response.ext_fields)
        msg.handle = h.renewed(rh.pop_time, rh.invisible_time)
        return msg

    async def _invoke(self, topic: str, addr: str, cmd: RemotingCommand, *, timeout: float | None = None,
                      context: str) -> RemotingCommand:
        """``instance.invoke``; a broker that cannot be reached makes the route of ``topic`` be asked for again
        at once (rate-limited), so the next receive goes to the group's new master."""
        try:
            return await self.instance.invoke(addr, cmd, timeout, context=context)
        except (ClientConnectionError, ClientTimeoutError):
            await self.instance.refresh_route(topic)
            raise

    def _check_received(self, msg: object) -> None:
        if not self.started:
            raise ClientStateError("the consumer is not started")
        if not isinstance(msg, ReceivedMessage):
            raise InvalidArgumentError(f"expected a ReceivedMessage from receive(), got {type(msg).__name__}")
        if msg.group != self.group:
            raise InvalidArgumentError(f"the message was received by group {msg.group}, not {self.group}")

    @staticmethod
    def _raise_for(code: int, remark: str | None, addr: str, context: str) -> None:
        if code == ResponseCode.SUCCESS:
            return
        if code == ResponseCode.NO_MESSAGE:
            raise StaleHandleError(code, remark or "", addr=addr, context=context)
        raise BrokerError(code, remark or "", addr=addr, context=context)

    def __repr__(self) -> str:
        return f"SimpleConsumer(group={self.group!r}, topics={sorted(self._subs)})"


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000
