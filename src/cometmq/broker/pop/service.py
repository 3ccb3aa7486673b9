"""PopService: the broker's POP state, its durability, redelivery ("revive") and POP long polling.

Design (RocketMQ 5's POP, with an equivalent durable design — see ``log.py``):

- Per (group, topic, queue) a ``QueueState``: a pop cursor, the offsets in flight with their invisible
  time, and the committed offset below which everything is done. A message whose invisible time passes
  without an ack is handed out again *from its own queue* with its reconsume count + 1 (no copy to a retry
  topic), so ordered POP keeps its order and an ack of the current delivery always finds its message.
- Every change is appended to the commit log (pop-log records) before it is applied and before the
  client hears of it; snapshots bound the replay after a restart.
- The revive tick (every ``pop_revive_interval_ms``) finds deliveries whose time is up, moves those past
  the group's ``retryMaxTimes`` to ``%DLQ%<group>`` and wakes POP requests waiting for that topic.
- A POP that finds nothing waits (``pollTime``) for an arrival on the topic, a redelivery, or — for ordered
  groups — an ack that unblocks a queue. Ordered waiters are not woken by arrivals on a queue that is still
  blocked for their group (no busy re-waking, RocketMQ #8592).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cometmq.broker.appender import Appender, answer_code
from cometmq.broker.config import BrokerConfig
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.offsets import ConsumerOffsetManager
from cometmq.broker.pop import log as poplog
from cometmq.broker.pop.front import POP_LOG_TOPIC, POP_STATE_FILE, PopMetrics
from cometmq.broker.pop.log import QueueKey
from cometmq.broker.pop.state import HEAP_SLACK, QueueState
from cometmq.broker.stats import BrokerStats
from cometmq.broker.topics import TopicConfigManager, dlq_topic
from cometmq.common.periodic import Periodic
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.message import decode_record, pack_host, record_layout
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.pop import INIT_MODE_MIN
from cometmq.protocol.properties import ORIGIN_MESSAGE_ID, UNIQ_KEY, encode_properties
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.message import TIMER_SRC_PHY

if TYPE_CHECKING:
    from cometmq.net.connection import RemotingConnection

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")


@dataclass(eq=False)
class Waiter:
    group: str
    topic: str
    queue_id: int  # -1: any
    order: bool
    future: asyncio.Future[None] = field(repr=False)
    #: the request's connection: its close ends the wait (nobody is left to answer)
    conn: RemotingConnection | None = field(default=None, repr=False)


class PopService:
    def __init__(self, config: BrokerConfig, store: MessageStore, appender: Appender, *,
                 offsets: ConsumerOffsetManager, groups: SubscriptionGroupManager, topics: TopicConfigManager,
                 clock: Callable[[], int], stats: BrokerStats | None = None) -> None:
        self.config = config
        #: None: metrics are off, nothing is counted
        self.stats = stats
        self.store = store
        self.appender = appender
        self.offsets = offsets
        self.groups = groups
        self.topics = topics
        self.clock = clock
        self.states: dict[QueueKey, QueueState] = {}
        self.snapshot_path = config.store.config_dir / POP_STATE_FILE
        self.metrics = PopMetrics()
        self._waiters: dict[str, set[Waiter]] = {}
        #: waiters per connection, so a closing connection ends its own (one close callback per connection)
        self._by_conn: dict[RemotingConnection, set[Waiter]] = {}
        #: (visible_at, key): when to look at a queue for expired deliveries; lazily pruned
        self._expiry: list[tuple[int, QueueKey]] = []
        self._last_pop_time = 0
        self._dirty = False
        self._revive = Periodic("pop-revive", config.pop_revive_interval_ms / 1000, self._revive_now, logger=log)
        self._snapshots = Periodic("pop-snapshot", config.pop_snapshot_interval_ms / 1000, self._snapshot_if_dirty,
                                   logger=log)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    # -- lifecycle ----------------------------------------------------------------------------------------
    def load(self) -> None:
        """Load the snapshot and replay the pop log after it. Called after the store has started."""
        try:
            log_offset, states = poplog.load_snapshot(self.snapshot_path)
        except poplog.PopLogError as exc:
            bad = self.snapshot_path.with_name(self.snapshot_path.name + ".bad")
            log.error("%s; set aside as %s, replaying the whole pop log", exc, bad)
            self.snapshot_path.rename(bad)
            log_offset, states = 0, {}
        store = self.store
        offset = max(log_offset, store.min_offset(POP_LOG_TOPIC, 0))
        end = store.max_offset(POP_LOG_TOPIC, 0)
        replayed = 0
        while offset < end:
            result = store.get_messages(POP_LOG_TOPIC, 0, offset, 1024)
            if not result.buffers:
                offset = max(result.next_begin_offset, offset + 1)
                continue
            for view in result.buffers:
                try:
                    rec, _ = decode_record(view)
                    poplog.apply(states, poplog.decode(rec.body))
                    replayed += 1
                except Exception as exc:  # one bad record must not stop the broker
                    log.error("skipping an unreadable pop-log record: %s", exc)
            offset = result.next_begin_offset
        self.states = states
        now = self.clock()
        for key, qs in states.items():
            nxt = qs.next_expiry()
            if nxt is not None:
                heapq.heappush(self._expiry, (nxt, key))
            self._last_pop_time = max(self._last_pop_time, *(d.pop_time for d in qs.inflight.values()), 0)
        if states:
            inflight = sum(len(qs.inflight) for qs in states.values())
            log.info("POP state: %d queues, %d messages in flight, %d log records replayed (now %d)",
                     len(states), inflight, replayed, now)

    async def start(self) -> None:
        self.start_ticks()

    def start_ticks(self) -> None:
        """``start`` from the event loop's thread, without awaiting: the revive and snapshot ticks (the broker's
        front starts a service it builds while the master's services run)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._revive.start()
        self._snapshots.start()

    async def stop(self) -> None:
        await self._revive.stop()
        await self._snapshots.stop()
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.future.done():
                    w.future.cancel()
        self._waiters.clear()
        self._by_conn.clear()
        self.snapshot()

    def snapshot(self) -> None:
        """Write the snapshot and publish committed offsets to the consumer offset table."""
        offsets = self.offsets
        for (group, topic, qid), qs in self.states.items():
            if offsets.query(group, topic, qid) != qs.committed:
                offsets.commit(group, topic, qid, qs.committed)
        poplog.save_snapshot(self.snapshot_path, self.store.max_offset(POP_LOG_TOPIC, 0), self.states)
        self._dirty = False

    def _snapshot_if_dirty(self) -> None:
        if self._dirty:
            try:
                self.snapshot()
            except OSError as exc:
                log.error("cannot write the POP snapshot: %s", exc)

    # -- state ----------------------------------------------------------------------------------------------
    def state(self, group: str, topic: str, queue_id: int, init_mode: int) -> QueueState:
        key = (group, topic, queue_id)
        qs = self.states.get(key)
        if qs is None:
            start = self.offsets.query(group, topic, queue_id)
            store = self.store
            min_off = store.min_offset(topic, queue_id)
            if start < 0:
                # A new group: MIN starts at the oldest message; MAX at the newest, except on a queue that
                # still holds everything it ever had (RocketMQ's "still in memory" rule, simplified).
                start = min_off if init_mode == INIT_MODE_MIN or min_off == 0 else store.max_offset(topic, queue_id)
            start = max(start, min_off)
            qs = self.states[key] = QueueState(committed=start, cursor=start)
        return qs

    def forget(self, *, group: str = "", topic: str = "") -> int:
        """Drop the POP state of a deleted topic (every group's) or of a deleted group whose offsets are cleaned
        (every topic's), as RocketMQ's deleteTopic and deleteSubscriptionGroup clean the offsets and in-flight counts:
        a topic (or group) created again under the name starts afresh, nothing of the old one is redelivered, and the
        next snapshot does not put the offsets back. Logged first, so that a restart's replay does not bring the state
        back; when the log refuses the record the snapshot (which replay starts after) is written at once instead.
        The number of queue states dropped."""
        if not any((not group or k[0] == group) and (not topic or k[1] == topic) for k in self.states):
            return 0
        try:
            self.append([poplog.encode_forget(group, topic)])
            logged = True
        except RemotingError as exc:
            log.error("cannot log dropping the POP state of %s: %s; writing the snapshot instead",
                      group or topic, exc.remark)
            logged = False
        dropped = poplog.forget(self.states, group, topic)
        self._dirty = True
        if not logged:
            try:
                self.snapshot()
            except OSError as exc:
                log.error("cannot write the POP snapshot: %s", exc)
        log.info("POP state of %s %s dropped (%d queues)", "group" if group else "topic", group or topic, len(dropped))
        return len(dropped)

    def next_pop_time(self) -> int:
        """A strictly increasing ms time: every delivery has its own pop time."""
        t = max(self.clock(), self._last_pop_time + 1)
        self._last_pop_time = t
        return t

    def append(self, bodies: list[bytes]) -> PutResult:
        """Append pop-log records. Raises RemotingError when the store refuses them (state unchanged)."""
        msgs = [MessageInner(topic=POP_LOG_TOPIC, body=b, queue_id=0) for b in bodies]
        result = self.appender.append(msgs)
        if not result.ok:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"cannot log POP state: {result.status.value}")
        self._dirty = True
        return result

    async def durable(self, result: PutResult) -> None:
        """Wait until the records of ``result`` are durable as configured (broker/appender.py)."""
        code = answer_code(await self.appender.durable(result))
        if code != ResponseCode.SUCCESS:
            raise RemotingError(code, f"POP state is not durable in time ({result.status.value})")

    def track_expiry(self, key: QueueKey, visible_at: int) -> None:
        heap = self._expiry
        heapq.heappush(heap, (visible_at, key))
        if len(heap) > 2 * len(self.states) + HEAP_SLACK:
            # One entry a pop or change of invisible time: with long invisible times they piled up without bound.
            # The earliest entry of each queue is all the revive needs: its look at the queue pushes the next.
            earliest: dict[QueueKey, int] = {}
            for at, k in heap:
                if at < earliest.get(k, at + 1):
                    earliest[k] = at
            heap[:] = sorted((at, k) for k, at in earliest.items())  # (in place: the revive may hold the list)

    def max_retry(self, group: str) -> int:
        cfg = self.groups.find(group)
        return cfg.retryMaxTimes if cfg is not None else self.config.max_reconsume_times

    @staticmethod
    def with_attempts(view: memoryview, attempts: int) -> bytes | bytearray | memoryview:
        """The record as a consumer sees it on this delivery: its reconsume count raised by ``attempts``."""
        if attempts <= 0:
            return view
        buf = bytearray(view)
        reconsume_times_pos = record_layout(buf).reconsume_times_pos  # an IPv6 born or store host moves it
        (stored,) = _I32.unpack_from(buf, reconsume_times_pos)
        _I32.pack_into(buf, reconsume_times_pos, stored + attempts)
        return buf

    # -- revive ----------------------------------------------------------------------------------------------
    async def _revive_now(self) -> None:
        await self.revive(self.clock())

    async def revive(self, now: int) -> None:
        """Deliveries whose invisible time passed become available again; past the retry limit, to the DLQ."""
        heap = self._expiry
        keys: set[QueueKey] = set()
        while heap and heap[0][0] <= now:
            keys.add(heapq.heappop(heap)[1])
        for key in keys:
            qs = self.states.get(key)
            if qs is None:
                continue
            group, topic, _qid = key
            limit = self.max_retry(group)
            due = qs.due(now)
            over = [o for o in due if qs.inflight[o].attempts + 1 > limit]
            if over and not await self.to_dlq(key, qs, over):
                # the write failed: again in a second (as the timer does), not never
                heapq.heappush(heap, (now + max(self.config.pop_revive_interval_ms, 1000), key))
            if len(over) < len(due):
                self.wake(topic, group, reason="revive")
            # The queue's next look: when the earliest delivery still invisible ends. It covers every later one,
            # so the queue needs no other entry (``track_expiry`` keeps only the earliest when it compacts).
            nxt = qs.next_expiry_after(now)
            if nxt is not None:
                heapq.heappush(heap, (nxt, key))

    async def to_dlq(self, key: QueueKey, qs: QueueState, offsets: list[int]) -> bool:
        """Move ``offsets`` to the group's DLQ; False when a failed write left some in flight (to try again)."""
        group, topic, qid = key
        dlq = dlq_topic(group)
        self.topics.create_system_topic(dlq, 1)
        msgs: list[tuple[tuple[int, int], MessageInner]] = []
        done: list[tuple[int, int]] = []
        for off in offsets:
            d = qs.inflight.get(off)
            if d is None:
                continue
            done.append((off, d.pop_time))
            got = self.store.get_messages(topic, qid, off, 1)
            if not got.buffers or got.queue_offsets[0] != off:
                log.warning("POP %s: message %s-%d@%d is gone (retention); dropping it", group, topic, qid, off)
                continue
            try:
                rec, _ = decode_record(got.buffers[0])
            except Exception as exc:  # a damaged record: dropped (logged), the others go on
                log.error("POP %s: message %s-%d@%d is unreadable (%s); dropping it", group, topic, qid, off, exc)
                continue
            props = dict(rec.properties)
            props.setdefault(ORIGIN_MESSAGE_ID, props.get(UNIQ_KEY) or offset_msg_id(
                self.store.commitlog.store_host, rec.physical_offset))
            props["RETRY_TOPIC"] = topic
            props.pop(TIMER_SRC_PHY, None)  # no copy put by the timer (recovery and a replica skip what one names)
            msgs.append(((off, d.pop_time), MessageInner(
                topic=dlq, body=rec.body, queue_id=0, properties=props, properties_raw=encode_properties(props),
                flag=rec.flag, sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp,
                born_host=pack_host(*rec.born_host), reconsume_times=rec.reconsume_times + d.attempts + 1)))
        moved, complete = len(msgs), True
        if msgs:
            # (stored is enough: a flush or replica-ack timeout still wrote the copies, which must not be written again)
            result = await self.appender.put([m for _, m in msgs])
            if not result.stored and not result.unputtable:
                log.error("POP %s: cannot write %d messages to %s (%s); will retry", group, len(msgs), dlq,
                          result.status.value)
                return False
            if not result.stored:  # one of them is refused: one at a time, and one the store refuses is dropped
                moved = 0
                for i, (entry, m) in enumerate(msgs):
                    r = await self.appender.put([m])
                    if r.stored:
                        moved += 1
                    elif r.unputtable:
                        log.error("POP %s: %s refuses message %s-%d@%d (%s %s); dropping it", group, dlq, topic, qid,
                                  entry[0], r.status.value, r.remark)
                    else:
                        log.error("POP %s: cannot write to %s (%s); will retry", group, dlq, r.status.value)
                        left = {e for e, _ in msgs[i:]}
                        done = [e for e in done if e not in left]
                        complete = False
                        break
        if not done:
            return complete
        self.append([poplog.encode_done(poplog.KIND_DLQ, key, qs.cursor, done)])
        for off, pop_time in done:
            qs.done(off, pop_time)
        self.metrics.dlq += moved
        if self.stats is not None and moved:
            self.stats.to_dlq(group, topic, moved)
        log.warning("POP %s: %d messages of %s-%d passed %d retries; moved to %s", group, moved, topic, qid,
                    self.max_retry(group), dlq)
        self.wake(topic, group, reason="ack", ordered_only=True)
        return complete

    # -- waiting ---------------------------------------------------------------------------------------------
    def add_waiter(self, w: Waiter) -> None:
        self._waiters.setdefault(w.topic, set()).add(w)
        conn = w.conn
        if conn is not None:
            by_conn = self._by_conn.get(conn)
            if by_conn is None:
                by_conn = self._by_conn[conn] = {w}
                conn.add_close_callback(self._connection_closed)  # (at once if it closed already)
            else:
                by_conn.add(w)

    def remove_waiter(self, w: Waiter) -> None:
        waiters = self._waiters.get(w.topic)
        if waiters is not None:
            waiters.discard(w)
            if not waiters:
                del self._waiters[w.topic]
        if w.conn is not None:
            by_conn = self._by_conn.get(w.conn)
            if by_conn is not None:
                by_conn.discard(w)

    def _connection_closed(self, conn: RemotingConnection) -> None:
        """The client went away: its waiters stop waiting (the poll then ends without taking anything)."""
        for w in self._by_conn.pop(conn, ()):
            if not w.future.done():
                w.future.set_result(None)

    def wake(self, topic: str, group: str | None = None, *, reason: str, ordered_only: bool = False) -> None:
        waiters = self._waiters.get(topic)
        if not waiters:
            return
        for w in list(waiters):
            if (group is not None and w.group != group) or (ordered_only and not w.order):
                continue
            if not w.future.done():
                w.future.set_result(None)
                if reason == "revive":
                    self.metrics.woken_by_revive += 1
                else:
                    self.metrics.woken_by_ack += 1

    def on_arrival(self, req: DispatchRequest) -> None:
        """The store's arrival listener. Cheap when nobody waits on the topic: one dict lookup."""
        if req.topic not in self._waiters:
            return
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._arrived, req.topic, req.queue_id)
        else:
            self._arrived(req.topic, req.queue_id)

    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        """``on_arrival`` for a dispatched batch: each (topic, queue) with waiters is looked at once."""
        waiters = self._waiters
        if not waiters:
            return
        seen = {(req.topic, req.queue_id) for req in reqs if req.topic in waiters}
        for topic, queue_id in seen:
            if self._loop is not None and threading.get_ident() != self._loop_thread:
                self._loop.call_soon_threadsafe(self._arrived, topic, queue_id)
            else:
                self._arrived(topic, queue_id)

    def _arrived(self, topic: str, queue_id: int) -> None:
        waiters = self._waiters.get(topic)
        if not waiters:
            return
        now = self.clock()
        for w in list(waiters):
            if w.future.done() or (w.queue_id >= 0 and w.queue_id != queue_id):
                continue
            if w.order:
                qs = self.states.get((w.group, topic, queue_id))
                if qs is not None and qs.blocked(now):
                    continue  # that queue hands out nothing until its message is acked: don't wake for it
            w.future.set_result(None)
            self.metrics.woken_by_arrival += 1

    def has_waiters(self, topic: str) -> bool:
        return topic in self._waiters

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())
