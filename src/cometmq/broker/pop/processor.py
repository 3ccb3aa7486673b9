"""POP_MESSAGE (200050), ACK_MESSAGE (200051), PEEK_MESSAGE (200052), CHANGE_MESSAGE_INVISIBLETIME (200053),
NOTIFICATION (200054) and BATCH_ACK_MESSAGE (200151): RocketMQ 5's POP consumption on the remoting protocol."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from cometmq.broker.config import BrokerConfig
from cometmq.broker.filters import property_filter_for, record_filter_for, tag_filter_for
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.pop import log as poplog
from cometmq.broker.pop.log import QueueKey
from cometmq.broker.pop.service import PopService, Waiter
from cometmq.broker.pop.state import QueueState
from cometmq.broker.topics import TopicConfigManager
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.headers import Header
from cometmq.protocol.pop import (
    MAX_INVISIBLE_MS,
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    ExtraInfo,
    NotificationRequestHeader,
    NotificationResponseHeader,
    PeekMessageRequestHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
    build_offset_info,
    decode_batch_ack_body,
    retry_flag_of,
)
from cometmq.protocol.remoting import RemotingCommand, make_response
from cometmq.protocol.route import TopicConfig, perm_readable
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus

log = logging.getLogger(__name__)
H = TypeVar("H", bound=Header)
R = TypeVar("R")

#: most messages one POP may ask for
MAX_POP_NUMS = 1024


def _check_invisible_time(ms: int, *, minimum: int) -> None:
    """Raise MESSAGE_ILLEGAL for an invisibleTime out of ``minimum``..MAX_INVISIBLE_MS, before anything changes.
    (Unbounded, one POP could hide a message for centuries; RocketMQ's proxy refuses over 12 hours too.)"""
    if ms < minimum:
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "invisibleTime must be positive (ms)" if minimum else
                            "invisibleTime must not be negative (ms)")
    if ms > MAX_INVISIBLE_MS:
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                            f"invisibleTime {ms} ms is too large: the most is {MAX_INVISIBLE_MS} ms (12 hours)")


@dataclass(slots=True)
class _Picked:
    key: QueueKey
    qs: QueueState
    cursor: int
    #: (offset, record, attempts)
    items: list[tuple[int, bytes | bytearray | memoryview, int]]
    gone: list[tuple[int, int]]


class PopProcessor:
    def __init__(self, config: BrokerConfig, store: MessageStore, groups: SubscriptionGroupManager,
                 topics: TopicConfigManager, service: PopService) -> None:
        self.config = config
        self.store = store
        self.groups = groups
        self.topics = topics
        self.svc = service
        self._rotation = itertools.count()

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.POP_MESSAGE: self.pop,
            RequestCode.ACK_MESSAGE: self.ack,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
            RequestCode.PEEK_MESSAGE: self.peek,
            RequestCode.NOTIFICATION: self.notification,
        }

    # -- checks ---------------------------------------------------------------------------------------------
    def _check(self, group: str, topic: str, queue_id: int | None) -> TopicConfig:
        if not perm_readable(self.config.broker_permission):
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the broker {self.config.broker_name} is not readable")
        cfg = self.groups.require(group)
        if not cfg.consumeEnable:
            raise RemotingError(ResponseCode.NO_PERMISSION, f"group {group} may not consume")
        topic_cfg = self.topics.get(topic)
        if topic_cfg is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist on this broker")
        if not perm_readable(topic_cfg.perm):
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the topic {topic} is not readable")
        if queue_id is not None and (queue_id < 0 or queue_id >= topic_cfg.read_queue_nums):
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                                f"queueId {queue_id} is illegal: {topic} has {topic_cfg.read_queue_nums} read queues")
        return topic_cfg

    @staticmethod
    def _parse(cls: type[H], cmd: RemotingCommand) -> H:
        # a bad header raises RemoteProtocolError: the dispatch answers it (MESSAGE_ILLEGAL, codes.py)
        return cls.from_ext(cmd.ext_fields)

    # -- POP ------------------------------------------------------------------------------------------------
    async def pop(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h: PopMessageRequestHeader = self._parse(PopMessageRequestHeader, cmd)
        topic_cfg = self._check(h.consumer_group, h.topic, None if h.queue_id < 0 else h.queue_id)
        if not 1 <= h.max_msg_nums <= MAX_POP_NUMS:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"maxMsgNums must be within 1..{MAX_POP_NUMS}")
        _check_invisible_time(h.invisible_time, minimum=1)
        prop_filter = property_filter_for(h.exp_type, h.exp, self.config.enable_property_filter)
        tag_filter = None if prop_filter is not None or (h.exp_type or "TAG").upper() != "TAG" \
            else tag_filter_for(h.exp)
        record_filter = record_filter_for(prop_filter) if prop_filter is not None else None
        queues = [h.queue_id] if h.queue_id >= 0 else self._rotated(topic_cfg.read_queue_nums)
        response = await self._long_poll(conn, h.consumer_group, h.topic, h.queue_id, bool(h.order), h.poll_time,
                                         lambda: self._pop_once(cmd, h, queues, tag_filter, record_filter))
        if response is not None:
            return response
        code = ResponseCode.POLLING_TIMEOUT if h.poll_time > 0 else ResponseCode.PULL_NOT_FOUND
        header = PopMessageResponseHeader(pop_time=0, invisible_time=h.invisible_time, revive_qid=0, rest_num=0)
        return make_response(cmd, code, "no new message", header.to_ext())

    async def _long_poll(self, conn: RemotingConnection, group: str, topic: str, queue_id: int, order: bool,
                         poll_ms: int, attempt: Callable[[], Awaitable[R | None]]) -> R | None:
        """Run ``attempt`` until it gives an answer, waiting (up to ``poll_ms``) between tries for an arrival on
        the topic, a redelivery or an ack that unblocks an ordered queue; None when the time is up, or when the
        connection has closed (a POP for nobody would hide its messages for their invisible time). A longer
        ``poll_ms`` than ``popMaxPollTimeMs`` is cut to it, as RocketMQ's proxy cuts its long polling: the client
        gets POLLING_TIMEOUT then, and polls again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(poll_ms, 0), self.config.pop_max_poll_time_ms) / 1000
        while True:
            if conn.closed:
                return None
            answer = await attempt()
            remaining = deadline - loop.time()
            if answer is not None or remaining <= 0:
                return answer
            w = Waiter(group, topic, queue_id, order, loop.create_future(), conn)
            self.svc.add_waiter(w)
            try:
                await asyncio.wait_for(w.future, remaining)
            except TimeoutError:
                return None
            finally:
                self.svc.remove_waiter(w)

    def _rotated(self, n: int) -> list[int]:
        start = next(self._rotation) % n
        return [(start + i) % n for i in range(n)]

    async def _pop_once(self, cmd: RemotingCommand, h: PopMessageRequestHeader, queues: list[int],
                        tag_filter: Callable[[int], bool] | None,
                        record_filter: Callable[[memoryview], bool] | None) -> RemotingCommand | None:
        svc, store = self.svc, self.store
        now = svc.clock()
        order = bool(h.order)
        limit = svc.max_retry(h.consumer_group)
        remaining = h.max_msg_nums
        picked: list[_Picked] = []
        rest = 0
        for qid in queues:
            qs = svc.state(h.consumer_group, h.topic, qid, h.init_mode)
            if remaining <= 0 or (order and qs.blocked(now)):
                rest += max(store.max_offset(h.topic, qid) - qs.cursor, 0)
                continue
            p = _Picked((h.consumer_group, h.topic, qid), qs, qs.cursor, [], [])
            if qs.has_due(now):
                for off in qs.due(now):
                    if len(p.items) >= remaining:
                        break
                    d = qs.inflight[off]
                    if d.attempts + 1 > limit:
                        continue  # the revive tick moves it to the DLQ
                    got = store.get_messages(h.topic, qid, off, 1)
                    if got.buffers and got.queue_offsets[0] == off:
                        p.items.append((off, svc.with_attempts(got.buffers[0], d.attempts + 1), d.attempts + 1))
                    else:
                        p.gone.append((off, d.pop_time))
            want = remaining - len(p.items)
            if want > 0 and not (order and p.items):
                p.cursor = self._read_new(h.topic, qid, qs.cursor, want, tag_filter, record_filter, p.items)
            rest += max(store.max_offset(h.topic, qid) - p.cursor, 0)
            if p.items or p.gone or p.cursor != qs.cursor:
                picked.append(p)
                remaining -= len(p.items)
        if not any(p.items for p in picked):
            for p in picked:  # nothing to hand out, but filtered-out or vanished messages are done
                if p.gone:
                    svc.append([poplog.encode_done(poplog.KIND_ACK, p.key, p.cursor, p.gone)])
                    for off, t in p.gone:
                        p.qs.done(off, t)
                p.qs.advance_cursor(p.cursor)
            return None

        pop_time = svc.next_pop_time()
        records = []
        for p in picked:
            first = p.items[0][0] if p.items else p.cursor
            if p.items:
                records.append(poplog.encode_ck(p.key, p.cursor, pop_time, h.invisible_time, first,
                                                [(off, attempts) for off, _, attempts in p.items]))
            if p.gone:
                records.append(poplog.encode_done(poplog.KIND_ACK, p.key, p.cursor, p.gone))
        result = svc.append(records)
        # Logged: apply, then answer (the views are read before anything else can run on the loop).
        starts, offsets, bodies = [], [], []
        redelivered = redelivered_bytes = 0
        for p in picked:
            for off, t in p.gone:
                p.qs.done(off, t)
            if p.items:
                first = p.items[0][0]
                for off, view, attempts in p.items:
                    p.qs.deliver(off, pop_time, h.invisible_time, attempts, first)
                    bodies.append(view)
                    if attempts:
                        redelivered += 1
                        redelivered_bytes += len(view)
                flag = retry_flag_of(h.topic)
                starts.append((flag, p.key[2], str(first)))
                offsets.append((flag, p.key[2], ",".join(str(off) for off, _, _ in p.items)))
                svc.track_expiry(p.key, pop_time + h.invisible_time)
                svc.metrics.popped += len(p.items)
            p.qs.advance_cursor(p.cursor)
        svc.metrics.redelivered += redelivered
        body = b"".join(bodies)
        if svc.stats is not None:  # (redeliveries come from the message's own queue: is_retry, same topic)
            if len(bodies) > redelivered:
                svc.stats.popped(h.topic, h.consumer_group, False, len(bodies) - redelivered,
                                 len(body) - redelivered_bytes)
            if redelivered:
                svc.stats.popped(h.topic, h.consumer_group, True, redelivered, redelivered_bytes)
        header = PopMessageResponseHeader(pop_time=pop_time, invisible_time=h.invisible_time, revive_qid=0,
                                          rest_num=rest, start_offset_info=build_offset_info(starts),
                                          msg_offset_info=build_offset_info(offsets))
        await svc.durable(result)
        return make_response(cmd, ResponseCode.SUCCESS, None, header.to_ext(), body)

    def _read_new(self, topic: str, qid: int, cursor: int, want: int, tag_filter: Callable[[int], bool] | None,
                  record_filter: Callable[[memoryview], bool] | None,
                  out: list[tuple[int, bytes | bytearray | memoryview, int]]) -> int:
        """Append never-delivered messages from ``cursor`` to ``out``; return the new cursor."""
        store = self.store
        for _ in range(2):
            got = store.get_messages(topic, qid, cursor, want, tag_filter, record_filter)
            if got.status is GetStatus.OFFSET_TOO_SMALL:
                cursor = got.min_offset  # retention removed them: start at what is left
                continue
            if got.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
                out.extend((off, view, 0) for off, view in zip(got.queue_offsets, got.buffers, strict=True))
                return max(cursor, got.next_begin_offset)
            if got.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                log.warning("POP cursor of %s-%d at %d is past the queue's end %d; moving to it", topic, qid, cursor,
                            got.max_offset)
                return got.max_offset
            return cursor
        return cursor

    # -- ACK ------------------------------------------------------------------------------------------------
    async def ack(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h: AckMessageRequestHeader = self._parse(AckMessageRequestHeader, cmd)
        self._check(h.consumer_group, h.topic, h.queue_id)
        info = self._extra_info(h.extra_info)
        key = (h.consumer_group, h.topic, h.queue_id)
        qs = self.svc.states.get(key)
        entry = self._ackable(key, qs, h.offset, info.pop_time)
        if entry is None:
            return make_response(cmd, ResponseCode.SUCCESS, "already acknowledged")
        assert qs is not None
        result = self.svc.append([poplog.encode_done(poplog.KIND_ACK, key, qs.cursor, [entry])])
        qs.done(*entry)
        self.svc.metrics.acked += 1
        self._after_ack(key, qs)
        await self.svc.durable(result)
        return make_response(cmd, ResponseCode.SUCCESS)

    async def batch_ack(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        _broker_name, acks = decode_batch_ack_body(cmd.body)
        records: list[bytes] = []
        applied: list[tuple[QueueKey, QueueState, list[tuple[int, int]]]] = []
        stale: list[str] = []
        for a in acks:
            self._check(a.consumer_group, a.topic, a.queue_id)
            key = (a.consumer_group, a.topic, a.queue_id)
            qs = self.svc.states.get(key)
            entries = []
            for off in a.offsets:
                try:
                    entry = self._ackable(key, qs, off, a.pop_time)
                except RemotingError:
                    stale.append(f"{a.topic}-{a.queue_id}@{off}")
                    continue
                if entry is not None:
                    entries.append(entry)
            if entries and qs is not None:
                records.append(poplog.encode_done(poplog.KIND_ACK, key, qs.cursor, entries))
                applied.append((key, qs, entries))
        if records:
            result = self.svc.append(records)
            for key, qs, entries in applied:
                for entry in entries:
                    qs.done(*entry)
                self.svc.metrics.acked += len(entries)
                self._after_ack(key, qs)
            await self.svc.durable(result)
        if stale:
            self.svc.metrics.stale_refused += len(stale)
            return make_response(cmd, ResponseCode.SUCCESS, f"stale receipt handles refused: {' '.join(stale)}",
                                 {"staleOffsets": ",".join(stale)})
        return make_response(cmd, ResponseCode.SUCCESS)

    def _extra_info(self, text: str) -> ExtraInfo:
        return ExtraInfo.parse(text)  # RemoteProtocolError when malformed: answered MESSAGE_ILLEGAL (codes.py)

    def _ackable(self, key: QueueKey, qs: QueueState | None, offset: int, pop_time: int) -> tuple[int, int] | None:
        """(offset, pop time) to ack; None when the message is already done; RemotingError when the handle is
        stale (the message was delivered again, or its invisible time changed) or names nothing popped."""
        if qs is None or offset >= qs.cursor:
            raise RemotingError(ResponseCode.NO_MESSAGE,
                                f"{key[1]}-{key[2]}@{offset} was never popped by group {key[0]}")
        d = qs.inflight.get(offset)
        if d is None:
            return None
        if d.pop_time != pop_time:
            self.svc.metrics.stale_refused += 1
            raise RemotingError(ResponseCode.NO_MESSAGE,
                                f"stale receipt handle for {key[1]}-{key[2]}@{offset}: popTime {pop_time} is not "
                                f"the current delivery's ({d.pop_time})")
        return offset, pop_time

    def _after_ack(self, key: QueueKey, qs: QueueState) -> None:
        # An ordered queue may now hand out its next message: wake that group's waiters (cheap if none).
        if self.svc.has_waiters(key[1]) and (not qs.inflight or not qs.blocked(self.svc.clock())):
            self.svc.wake(key[1], key[0], reason="ack", ordered_only=True)

    # -- CHANGE_MESSAGE_INVISIBLETIME -------------------------------------------------------------------------
    async def change_invisible_time(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h: ChangeInvisibleTimeRequestHeader = self._parse(ChangeInvisibleTimeRequestHeader, cmd)
        self._check(h.consumer_group, h.topic, h.queue_id)
        _check_invisible_time(h.invisible_time, minimum=0)
        info = self._extra_info(h.extra_info)
        key = (h.consumer_group, h.topic, h.queue_id)
        qs = self.svc.states.get(key)
        if self._ackable(key, qs, h.offset, info.pop_time) is None:
            raise RemotingError(ResponseCode.NO_MESSAGE, f"{h.topic}-{h.queue_id}@{h.offset} is already acknowledged")
        assert qs is not None
        d = qs.inflight[h.offset]
        pop_time = self.svc.next_pop_time()
        result = self.svc.append([poplog.encode_ck(key, qs.cursor, pop_time, h.invisible_time, d.ck_offset,
                                                   [(h.offset, d.attempts)])])
        qs.deliver(h.offset, pop_time, h.invisible_time, d.attempts, d.ck_offset)
        self.svc.track_expiry(key, pop_time + h.invisible_time)
        self.svc.metrics.changed += 1
        if h.invisible_time == 0:
            self.svc.wake(h.topic, h.consumer_group, reason="revive")
        await self.svc.durable(result)
        header = ChangeInvisibleTimeResponseHeader(pop_time=pop_time, invisible_time=h.invisible_time, revive_qid=0)
        return make_response(cmd, ResponseCode.SUCCESS, None, header.to_ext())

    # -- PEEK / NOTIFICATION --------------------------------------------------------------------------------
    async def peek(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """Messages a POP would hand out next from one queue, without changing anything."""
        h: PeekMessageRequestHeader = self._parse(PeekMessageRequestHeader, cmd)
        self._check(h.consumer_group, h.topic, h.queue_id)
        if not 1 <= h.max_msg_nums <= MAX_POP_NUMS:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"maxMsgNums must be within 1..{MAX_POP_NUMS}")
        qs = self.svc.state(h.consumer_group, h.topic, h.queue_id, 0)
        got = self.store.get_messages(h.topic, h.queue_id, qs.cursor, h.max_msg_nums)
        header = PopMessageResponseHeader(pop_time=0, invisible_time=0, revive_qid=0,
                                          rest_num=max(got.max_offset - qs.cursor - len(got.buffers), 0))
        if not got.buffers:
            return make_response(cmd, ResponseCode.PULL_NOT_FOUND, "no new message", header.to_ext())
        return make_response(cmd, ResponseCode.SUCCESS, None, header.to_ext(), b"".join(got.buffers))

    async def notification(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """Whether a POP would find something now, waiting up to pollTime for it."""
        h: NotificationRequestHeader = self._parse(NotificationRequestHeader, cmd)
        topic_cfg = self._check(h.consumer_group, h.topic, None if h.queue_id < 0 else h.queue_id)
        queues = [h.queue_id] if h.queue_id >= 0 else list(range(topic_cfg.read_queue_nums))

        async def attempt() -> bool | None:
            return True if self._has_message(h.consumer_group, h.topic, queues, bool(h.order)) else None

        found = await self._long_poll(conn, h.consumer_group, h.topic, h.queue_id, bool(h.order), h.poll_time,
                                      attempt)
        header = NotificationResponseHeader(has_msg=bool(found))
        return make_response(cmd, ResponseCode.SUCCESS, None, header.to_ext())

    def _has_message(self, group: str, topic: str, queues: list[int], order: bool) -> bool:
        now = self.svc.clock()
        store = self.store
        for qid in queues:
            qs = self.svc.state(group, topic, qid, 0)
            if order and qs.blocked(now):
                continue
            if qs.has_due(now) or store.max_offset(topic, qid) > qs.cursor:
                return True
        return False
