"""4.x delay levels (RocketMQ's ScheduleMessageService).

A message with the DELAY property is stored under SCHEDULE_TOPIC_XXXX, queue level-1, with its real
topic and queue in REAL_TOPIC / REAL_QID. One task per level reads that queue in order: each message
is due at its store time plus the level's delay (all messages of a level have the same delay, so the
queue is in due order). Due messages are put back under their real topic with the same UNIQ_KEY. The
progress per level is saved atomically after every delivered batch, so a restart re-delivers at most
the batch that was being delivered when the process died.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from cometmq.broker.appender import Appender
from cometmq.broker.send_hooks import SendContext, SendKind
from cometmq.broker.topics import SCHEDULE_TOPIC
from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.common.tasks import cancel_and_wait
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.message import TRANSACTION_MASK, decode_record, pack_host
from cometmq.protocol.properties import DELAY, REAL_QID, REAL_TOPIC, encode_properties
from cometmq.store.message import TRANSACTION_COMMIT_TYPE, DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus, PutResult

log = logging.getLogger(__name__)

BATCH = 64
#: the transaction types of the sys flag a delay level applies to: none and committed
_DELAYABLE = (0, TRANSACTION_COMMIT_TYPE)


def delay_level(raw: str) -> int:
    """A DELAY property's level, read as RocketMQ reads it (Integer.parseInt: an optional sign and ASCII digits, a
    32-bit value). Anything else is refused with MESSAGE_ILLEGAL: RocketMQ fails such a send too, and taking it as
    no delay would deliver at once a message meant to wait."""
    digits = raw[1:] if raw[:1] in ("+", "-") else raw
    if digits.isascii() and digits.isdigit() and len(digits) <= 10:
        level = int(raw)
        if -(2**31) <= level < 2**31:
            return level
    raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"the delay level (property {DELAY}) {raw[:32]!r} is not an "
                                                      "integer")


class ScheduleMessageService:
    #: as a send hook: producers' sends and consumers' send-backs may name a delay level
    kinds = frozenset({SendKind.SEND, SendKind.SEND_BACK})

    def __init__(self, store: MessageStore, appender: Appender, delays: tuple[int, ...], path: Path,
                 clock: Callable[[], int]) -> None:
        self.store = store
        self.appender = appender
        self.path = path
        self.clock = clock
        self.delays = delays
        #: level -> next offset to deliver in SCHEDULE_TOPIC queue level-1
        self.offsets: dict[int, int] = {}
        self._events: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = 0

    # -- on the send path (a send hook, broker/send_hooks.py) ----------------------------------------------
    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> bool:
        for m in msgs:
            self.rewrite_if_delayed(m)
        return False

    def after_put(self, msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        pass

    def rewrite_if_delayed(self, msg: MessageInner) -> None:
        """Park a message with a DELAY level under the schedule topic. Not a prepared or rolled-back transaction
        message; a committed one is delayed as a plain one is (RocketMQ's CommitLog: its send-back's retry copy
        keeps the COMMIT type and must wait its level like any other)."""
        raw = msg.properties.get(DELAY)
        if raw is None or msg.sys_flag & TRANSACTION_MASK not in _DELAYABLE:
            return
        level = delay_level(raw)
        if level <= 0:
            return
        level = min(level, len(self.delays))
        props = msg.edit_properties()
        props[DELAY] = str(level)
        props[REAL_TOPIC] = msg.topic
        props[REAL_QID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> None:
        raw = read_optional(self.path)
        if raw:
            try:
                self.offsets = {int(k): int(v) for k, v in json.loads(raw)["offsetTable"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("cannot read %s (%s); delay progress restarts from the queues' starts", self.path, exc)

    def persist(self) -> None:
        write_atomic(self.path, json.dumps({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}})
                     .encode())

    def replace_offsets(self, offsets: dict[int, int]) -> bool:
        """Take the master's delivery progress (a replica's copy, broker/ha/metadata.py); persisted at once, as
        every change of it is."""
        if offsets == self.offsets:
            return False
        self.offsets = dict(offsets)
        self.persist()
        return True

    async def start(self) -> None:
        self._correct_offsets()
        for level in range(1, len(self.delays) + 1):
            self._events[level] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._run_level(level), name=f"delay-level-{level}"))

    def _correct_offsets(self) -> None:
        """Take a level's progress back to the end of its queue when it is past it (RocketMQ's correctDelayOffset):
        a promoted replica that took its master's progress before its own log caught up, or a log cut back at
        recovery. Left there, the level would skip the messages stored below it and deliver nothing until its
        queue grew past it."""
        changed = False
        for level, offset in list(self.offsets.items()):
            end = self.store.max_offset(SCHEDULE_TOPIC, level - 1)
            if offset > end:
                log.warning("delay level %d: progress %d is past the end %d of %s/%d; restarting from its end",
                            level, offset, end, SCHEDULE_TOPIC, level - 1)
                self.offsets[level] = end
                changed = True
        if changed:
            self.persist()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        self.persist()

    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        for req in reqs:
            if req.topic == SCHEDULE_TOPIC:
                self.on_arrival(req)

    def on_arrival(self, req: DispatchRequest) -> None:
        if req.topic == SCHEDULE_TOPIC:
            event = self._events.get(req.queue_id + 1)
            if event is not None:
                event.set()

    # -- delivery ---------------------------------------------------------------------------------------
    async def _run_level(self, level: int) -> None:
        delay = self.delays[level - 1]
        queue_id = level - 1
        event = self._events[level]
        store = self.store
        while True:
            event.clear()
            offset = max(self.offsets.get(level, 0), store.min_offset(SCHEDULE_TOPIC, queue_id))
            result = store.get_messages(SCHEDULE_TOPIC, queue_id, offset, BATCH, max_bytes=4 << 20)
            wait_s: float | None = None
            if result.buffers:
                now = self.clock()
                due: list[MessageInner] = []
                next_offset = offset
                for view, qoff in zip(result.buffers, result.queue_offsets, strict=True):
                    try:
                        rec, _ = decode_record(view)
                        deliver_at = rec.store_timestamp + delay
                        restored = self._restore(rec) if deliver_at <= now else None
                    except Exception as exc:  # a damaged record: skipped (logged), the level goes on
                        log.error("delay level %d: the record at offset %d of %s/%d is unreadable (%s); skipped",
                                  level, qoff, SCHEDULE_TOPIC, queue_id, exc)
                        next_offset = qoff + 1
                        continue
                    if restored is None:
                        wait_s = (deliver_at - now) / 1000
                        break
                    due.append(restored)
                    next_offset = qoff + 1
                else:
                    next_offset = result.next_begin_offset
                if due:
                    res = await self.appender.put(due)
                    if not res.ok:
                        log.error("delay level %d: re-put failed (%s); retrying in 1 s", level, res.status.value)
                        wait_s = 1.0
                        next_offset = offset
                    else:
                        self.delivered += len(due)
                if next_offset != offset:
                    self.offsets[level] = next_offset
                    self.persist()
                    continue
            elif result.next_begin_offset > offset and result.status.value != "OFFSET_OVERFLOW_ONE":
                self.offsets[level] = result.next_begin_offset
                continue
            elif result.status is GetStatus.OFFSET_FOUND_NULL and offset < result.max_offset:
                # The store found no unit at ``offset`` inside the queue (damage: a unit that does not match its
                # record is stepped over by the store itself): skip it, or this level would stop delivering for good.
                log.error("delay level %d: offset %d of %s/%d cannot be read; skipped", level, offset,
                          SCHEDULE_TOPIC, queue_id)
                self.offsets[level] = offset + 1
                self.persist()
                continue
            try:
                if wait_s is None:
                    await event.wait()
                else:
                    await asyncio.wait_for(event.wait(), min(wait_s, 3600))
            except TimeoutError:
                pass

    def _restore(self, rec: object) -> MessageInner:
        from cometmq.protocol.message import MessageRecord

        assert isinstance(rec, MessageRecord)
        props = dict(rec.properties)
        topic = props.pop(REAL_TOPIC, rec.topic)
        try:
            queue_id = int(props.pop(REAL_QID, "0"))
        except ValueError:
            queue_id = 0
        props.pop(DELAY, None)
        return MessageInner(topic=topic, body=rec.body, queue_id=queue_id, properties=props,
                            properties_raw=encode_properties(props), flag=rec.flag, sys_flag=rec.sys_flag,
                            born_timestamp=rec.born_timestamp, born_host=pack_host(*rec.born_host),
                            reconsume_times=rec.reconsume_times)
