"""TransactionalMessageService: half messages, END_TRANSACTION, check-back and restart recovery.

The durable design is RocketMQ's (``messages.py``): halves and op records live in the commit log under two
system topics, so the store's own recovery covers them. What differs, and why:

- The unresolved transactions are kept in memory (``state.py``) and rebuilt from the two queues at start,
  reading only from the persisted progress pair on. Checks are due-time driven (a heap), not a periodic scan:
  the first check comes ``transactionTimeOut`` (or the producer's CHECK_IMMUNITY_TIME_IN_SECONDS) after the half
  was stored, and further ones every ``transactionCheckInterval``. A half whose check is far off is re-appended
  meanwhile when much half traffic came after it (``progress.py``), so that the restart progress moves on.
- A transaction is identified by its first half record, whichever copy an END_TRANSACTION names, and a commit
  appends the delivered message and its op record in ONE contiguous append. So a commit is delivered once:
  a second END (the producer's own plus a check's answer, a retried oneway, a restart in between) finds the
  transaction resolved and only gets a SUCCESS with a remark; a crash can never keep one without the other.
- The system topics RMQ_SYS_TRANS_HALF_TOPIC and RMQ_SYS_TRANS_OP_HALF_TOPIC get permission 0: no client can
  read halves early or forge them by sending there.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, cast

from cometmq.broker.appender import Appender, answer_code
from cometmq.broker.clients import ClientChannel, ProducerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.send_hooks import SendContext, SendKind
from cometmq.broker.topics import TopicConfigManager
from cometmq.broker.transaction import messages as tm
from cometmq.broker.transaction.front import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    check_transaction_config,
    wants_transaction,
)
from cometmq.broker.transaction.progress import read_progress, renew_lagging, write_progress
from cometmq.broker.transaction.ranges import READ_BYTES, Chunk, range_halves, unit_points_at
from cometmq.broker.transaction.state import OutcomeMemory, PendingHalf, TransactionTable
from cometmq.common.tasks import cancel_and_wait
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from cometmq.protocol.message import MessageRecord, decode_record
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.names import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX
from cometmq.protocol.properties import PGROUP, UNIQ_KEY
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from cometmq.protocol.route import PERM_READ_WRITE
from cometmq.protocol.transaction_batch import (
    HALF_BATCH_FIELD,
    MAX_END_ENTRIES,
    PACKED_PROPERTY,
    EndOutcome,
    decode_end_entry_fields,
    encode_end_outcomes,
)
from cometmq.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageInner,
)
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult

log = logging.getLogger(__name__)

#: how many due checks one pass sends before letting other work run
_CHECK_BATCH = 256
#: how often the restart progress is written when it changed (and the longest the check loop sleeps)
_PERSIST_INTERVAL_S = 1.0


@dataclass
class TransactionMetrics:
    prepared: int = 0
    committed: int = 0
    rolled_back: int = 0
    #: END_TRANSACTION with state 0 (the producer does not know yet): left for the next check
    unknown: int = 0
    #: END_TRANSACTION for a transaction already resolved: answered, nothing delivered
    already_resolved: int = 0
    refused: int = 0
    checks_sent: int = 0
    #: checks due while no producer of the group was connected (counted as checks, as RocketMQ does)
    checks_without_producer: int = 0
    #: halves moved to TRANS_CHECK_MAX_TIME_TOPIC after transactionCheckMax checks
    discarded: int = 0
    #: halves whose record had gone (retention) before they were resolved
    lost: int = 0
    #: halves re-appended before their check was due, so that the restart progress moves on (progress.py)
    renewed: int = 0


#: resolved transactions whose outcome is remembered (a few MB at most)
RESOLVED_MEMORY = 65_536
assert RESOLVED_MEMORY >= MAX_END_ENTRIES  # a batched END's claims are all remembered until it appends them
#: what a decision makes of a transaction
_OUTCOME = {TRANSACTION_COMMIT_TYPE: "committed", TRANSACTION_ROLLBACK_TYPE: "rolled back"}
#: what a batched END counts for each half it decides: its share of the op record (the C helper counts the same)
_OP_SHARE = 64
#: bytes a packed half's commit leaves in its segment for the op record and the blank end marker
_OP_ROOM = 4096
#: a commit's append of this many records or more defers the store's key index (rolling) for _DEFER_INDEX_S: the
#: appends get the GIL instead of sharing it with the index builder (as the timer's bursts do; lookups by key still
#: drain the builder's queue themselves, and the builder drains anyway after IndexBuilder's MAX_DEFER_S)
_DEFER_INDEX_RECORDS = 1024
_DEFER_INDEX_S = 0.25


class TransactionalMessageService:
    #: as a send hook: a producer's send may be a transaction's half
    kinds = frozenset({SendKind.SEND})

    def __init__(self, cfg: BrokerConfig, store: MessageStore, appender: Appender, topics: TopicConfigManager,
                 producers: ProducerManager, clock: Callable[[], int]) -> None:
        self.config = cfg
        self.store = store
        self.appender = appender
        self.topics = topics
        self.producers = producers
        self.clock = clock
        check_transaction_config(cfg)
        self.timeout_ms = cfg.transaction_timeout_ms
        self.check_max = cfg.transaction_check_max
        self.check_interval_ms = cfg.transaction_check_interval_ms
        self.table = TransactionTable()
        self.metrics = TransactionMetrics()
        self.progress_path = cfg.store.config_dir / "transactionProgress.json"
        self._wake = asyncio.Event()
        self._sleep_until: int | None = None
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._persisted: tuple[int, int] | None = None
        #: the progress pair of the last pass and the log's end then: written once the log is flushed that far
        self._staged: tuple[tuple[int, int], int] | None = None
        self._last_persist = 0.0
        #: how (at least) the last ``RESOLVED_MEMORY`` transactions ended ("committed" / "rolled back" /
        #: "discarded"), so that a late END_TRANSACTION asking the opposite is refused instead of answered "already
        #: resolved" (an exactly-once writer must learn that its half was discarded); in memory only: after a
        #: restart the answer for an older one is "already resolved", as before
        self._outcomes = OutcomeMemory(RESOLVED_MEMORY)

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.END_TRANSACTION: self.end_transaction,
                RequestCode.END_TRANSACTION_BATCH: self.end_transactions}

    # -- lifecycle --------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Create the system topics and rebuild the unresolved transactions from the half and op queues. What was
        tracked before goes (a broker promoted again: its log may have been cut while it was a replica, and the
        half-queue offsets it knew given to other halves), as a restart forgets it."""
        started = time.monotonic()
        self.table = TransactionTable()
        self._outcomes = OutcomeMemory(RESOLVED_MEMORY)
        topics = self.topics
        topics.create_system_topic(HALF_TOPIC, 1, perm=0)
        topics.create_system_topic(OP_TOPIC, 1, perm=0)
        half_from, op_from = read_progress(self.progress_path)
        store = self.store
        half_from = min(max(half_from, store.min_offset(HALF_TOPIC, 0)), store.max_offset(HALF_TOPIC, 0))
        op_from = min(max(op_from, store.min_offset(OP_TOPIC, 0)), store.max_offset(OP_TOPIC, 0))
        due: dict[int, int] = {}
        halves = 0
        for rec in self._records(HALF_TOPIC, half_from):
            halves += 1
            origin = tm.origin_of(rec.properties, rec.queue_offset)
            times = tm.check_times_of(rec.properties)
            due[origin] = tm.due_ms(rec.properties, rec.store_timestamp, self.timeout_ms, self.check_interval_ms)
            if self.table.get(origin) is None:
                self.table.add(PendingHalf(origin, rec.queue_offset, rec.physical_offset,
                                           rec.properties.get(PGROUP, ""), times, 0, op_from))
            else:
                self.table.record_appended(origin, rec.queue_offset, rec.physical_offset, times, op_from)
        ops = 0
        for rec in self._records(OP_TOPIC, op_from):
            ops += 1
            for offset in tm.parse_op_body(rec.body):
                self.table.resolve(offset)
        # Producers reconnect after a restart: give them one transactionTimeOut before the first check.
        earliest = self.clock() + self.timeout_ms
        for half in list(self.table.pending.values()):
            self.table.schedule(half, max(due[half.origin], earliest))
        self._persisted = (half_from, op_from)
        log.info("transactions: %d unresolved after reading %d half records from offset %d and %d op records "
                 "from offset %d in %.3f s", len(self.table), halves, half_from, ops, op_from,
                 time.monotonic() - started)

    async def start(self) -> None:
        self.start_checking()

    def start_checking(self) -> None:
        """Start the check-back loop (on the event loop's thread)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-check")

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None
        self._persist_progress()

    # -- the send path (a send hook, broker/send_hooks.py) -------------------------------------------------------
    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> bool:
        """A transaction's half (or a half batch's halves) is stored out of sight until END_TRANSACTION; no
        later hook sees it."""
        if not self.is_half_send(msgs, ctx.batch, ctx.half_batch):
            return False
        group = ctx.producer_group
        self._check_packed(msgs, ctx.half_batch)
        kept = tm.to_halves(msgs) if ctx.half_batch else None
        if kept is None:
            kept = [tm.to_half(m, group) for m in msgs]
        ctx.on_stored = functools.partial(self._halves_stored, kept)
        return True

    def _check_packed(self, msgs: list[MessageInner], half_batch: bool) -> None:
        """A packed half (protocol/transaction_batch.py) is stored only when its body unpacks as its commit will
        unpack it, into records that fit in one append (a segment); a half batch's item may not be one."""
        if half_batch:
            for n, m in enumerate(msgs):
                if m.properties_raw is not None and tm.holds_packed(m.properties_raw) and PACKED_PROPERTY in (
                        m.properties):
                    raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"item {n} of a half batch is a packed half "
                                        f"({PACKED_PROPERTY}): send it on its own")
            return
        room = self.config.store.commitlog_segment_size - _OP_ROOM
        for m in msgs:
            try:
                count = tm.packed_count(m)
                if count is None:
                    continue
                tm.check_packed(m, count)
            except ValueError as exc:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
            size = tm.unpacked_size(m, count)
            if size > room:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"a packed half's {count} messages would take up to "
                                    f"{size} bytes as records, more than a commit-log segment holds with its op "
                                    f"record ({room})")

    def after_put(self, msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        pass

    @staticmethod
    def is_half_send(msgs: list[MessageInner], batch: bool, half_batch: bool = False) -> bool:
        """Whether a send is a transaction's half (TRAN_MSG=true, or the PREPARED sys flag). A batch may be one only
        as cometmq's half batch (``half_batch``: request field cometmqHalfBatch=true), and then every item must be
        (protocol/transaction_batch.py); RocketMQ refuses transactional batches, and so do we without that field."""
        wanted = [wants_transaction(m) for m in msgs
                  if not m.topic.startswith((RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX))]
        if not batch:
            return any(wanted)
        if not half_batch:
            if any(wanted):
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "transactional messages cannot be sent in a batch "
                                    f"(cometmq takes a batch of halves with the request field {HALF_BATCH_FIELD}"
                                    "=true)")
            return False
        if len(wanted) != len(msgs):
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"a half batch ({HALF_BATCH_FIELD}) cannot go to a "
                                f"retry or dead-letter topic ({msgs[0].topic})")
        if not all(wanted):
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"a half batch ({HALF_BATCH_FIELD}) holds only "
                                f"transactional messages: item {wanted.index(False)} of {len(wanted)} has no "
                                "TRAN_MSG=true (nor does the header's sys flag say PREPARED)")
        return True

    def _halves_stored(self, kept: list[tuple[str, str | None]], result: PutResult) -> None:
        """Track halves from the moment their records are in the log (before they are durable, before anything
        else runs): the restart progress written meanwhile must already count them. The send's answer carries
        the halves' offsets."""
        if not result.ok:
            return
        # The op queue's end now: the halves' own batch holds no op record, so this is its end before them.
        op_mark = self.store.max_offset(OP_TOPIC, 0)
        records = result.records
        if kept.count(kept[0]) == len(kept) and records[0].store_timestamp == records[-1].store_timestamp:
            # A half batch as the SDK sends it: one group, one immunity, one append (one store time).
            group, wanted = kept[0]
            due = records[0].store_timestamp + tm.immunity_of(wanted, self.timeout_ms)
            self.table.add_batch([r.queue_offset for r in records], [r.phy_offset for r in records], group, due,
                                 op_mark)
            self.metrics.prepared += len(kept)
            if self._sleep_until is None or due < self._sleep_until:
                self._wake.set()
            return
        earliest: int | None = None
        timeout, add = self.timeout_ms, self.table.add
        immunity: dict[str | None, int] = {}  # the items of a batch mostly share theirs
        for (group, wanted), r in zip(kept, result.records, strict=True):
            wait = immunity.get(wanted)
            if wait is None:
                wait = immunity[wanted] = tm.immunity_of(wanted, timeout)
            due = r.store_timestamp + wait
            add(PendingHalf(r.queue_offset, r.queue_offset, r.phy_offset, group, 0, due, op_mark))
            if earliest is None or due < earliest:
                earliest = due
        self.metrics.prepared += len(kept)
        if earliest is not None and (self._sleep_until is None or earliest < self._sleep_until):
            self._wake.set()

    # -- END_TRANSACTION (37) and END_TRANSACTION_BATCH (31037, a cometmq extension) ----------------------------
    async def end_transaction(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        h = EndTransactionRequestHeader.from_ext(cmd.ext_fields)  # a bad header: answered at the dispatch
        if self.config.broker_id != 0:
            raise RemotingError(ResponseCode.SLAVE_NOT_AVAILABLE, "END_TRANSACTION goes to the master broker")
        state = h.commit_or_rollback
        source = "check answer" if h.from_transaction_check else "producer"
        if state not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {state} is not 0, 8 or 12")
        claimed = self._claim(h.producer_group, h.commit_log_offset, h.tran_state_table_offset, state, h.msg_id,
                              source, cmd.ext_fields.get("topic"))
        if isinstance(claimed, str):
            return make_response(cmd, ResponseCode.SUCCESS, claimed)
        half, stored, origin = claimed
        ops = [tm.op_record([origin, stored.queue_offset], self.clock())]
        # One contiguous append: the delivered message never exists without the op record that resolves it.
        try:
            msgs = [tm.commit_messages(stored, h.commit_log_offset)[0], *ops] if state == TRANSACTION_COMMIT_TYPE \
                else ops
        except ValueError as exc:
            self.table.add(half)  # nothing was written: still unresolved
            self._outcomes.forget(origin)
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"the half cannot be committed: {exc}") from None
        self._defer_index(msgs)
        result = self.appender.append(msgs)
        if not result.ok:
            self.table.add(half)  # nothing was written: still unresolved
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{result.status.value}: {result.remark}")
        self._resolved(origin, state)
        return make_response(cmd, answer_code(await self.appender.durable(result)))

    async def end_transactions(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """Many END_TRANSACTIONs of one producer group in one request (protocol/transaction_batch.py): each
        entry decided as :meth:`end_transaction` decides it, a range entry each of its halves so, the commits'
        messages and op records appended together in as few appends as the message size limit allows (each
        append holds its op record: no delivered message exists without it). The answer lists each entry's
        outcome. With the field ``topic`` (what the ACL checked) a half of another topic is refused."""
        group = cmd.ext_fields.get("producerGroup")
        topic = cmd.ext_fields.get("topic")
        if not group:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "END_TRANSACTION_BATCH needs the field producerGroup")
        if self.config.broker_id != 0:
            raise RemotingError(ResponseCode.SLAVE_NOT_AVAILABLE, "END_TRANSACTION_BATCH goes to the master broker")
        entries = decode_end_entry_fields(cmd.body)  # a bad body: answered at the dispatch, nothing decided
        outcomes: list[EndOutcome | None] = [None] * len(entries)
        #: of each range entry: [halves refused, the first refusal's code and remark, halves already resolved]
        ranges: dict[int, list[Any]] = {}
        limit = self.config.store.max_message_size
        msgs: list[MessageInner] = []
        #: the transactions claimed for the next append, a group per entry or run of a range: (entry, halves, origins)
        claimed: list[tuple[int, list[PendingHalf], list[int]]] = []
        n_claimed = 0  # (how many halves ``claimed`` holds)
        op_offsets: list[int] = []
        size = 0
        appended: list[tuple[PutResult, Iterable[int]]] = []
        #: transactions taken off the table and not in ``claimed`` yet: (origins, halves, how many of them are)
        loose: list[Any] = [[], [], 0]

        def refuse(i: int, code: int, remark: str) -> None:
            tally = ranges.get(i)
            if tally is None:
                outcomes[i] = EndOutcome(code, remark)
            else:
                tally[0] += 1
                if tally[1] is None:
                    tally[1], tally[2] = code, remark

        def flush() -> None:
            nonlocal msgs, claimed, op_offsets, size, n_claimed
            if not claimed:
                return
            msgs.append(tm.op_record(op_offsets, self.clock()))
            self._defer_index(msgs)
            result = self.appender.append(msgs)
            if result.ok:
                # What _resolved does for each: the outcomes are remembered since the claims (none forgotten since:
                # a request names at most MAX_END_ENTRIES <= RESOLVED_MEMORY halves), the metrics count the commits
                # (a message each: a packed half's is one, its batch_items) and the rollbacks.
                commits = len(msgs) - 1
                self.metrics.committed += commits
                self.metrics.rolled_back += n_claimed - commits
                appended.append((result, dict.fromkeys(i for i, _, _ in claimed)))
            else:
                for i, halves, origins in claimed:
                    for half, origin in zip(halves, origins, strict=True):
                        self.table.add(half)  # nothing was written: still unresolved
                        self._outcomes.forget(origin)
                        refuse(i, ResponseCode.SYSTEM_ERROR, f"{result.status.value}: {result.remark}")
            msgs, claimed, op_offsets, size, n_claimed = [], [], [], 0, 0

        def decide(i: int, stored: tm.StoredHalf, commit_log_offset: int, state: int, msg_id: str) -> None:
            nonlocal size, n_claimed
            commit: MessageInner | None = None
            cost = _OP_SHARE
            try:
                self._of_topic(stored, topic)
                if state == TRANSACTION_COMMIT_TYPE:
                    commit, size_of = tm.commit_messages(stored, commit_log_offset)
                    cost += size_of
                got = self._decide(group, stored, state, msg_id, "producer (batch)")
            except ValueError as exc:  # (a packed half that does not unpack: nothing claimed)
                refuse(i, ResponseCode.SYSTEM_ERROR, f"the half cannot be committed: {exc}")
                return
            except RemotingError as exc:
                refuse(i, int(exc.code), exc.remark)
                return
            if isinstance(got, str):
                tally = ranges.get(i)
                if tally is None:
                    outcomes[i] = EndOutcome(ResponseCode.SUCCESS, got)
                elif state != TRANSACTION_NOT_TYPE:
                    tally[3] += 1
                return
            half, origin = got
            # Claimed now: a later entry of this request naming the same transaction is decided against this one.
            self._remember(origin, _OUTCOME[state])
            loose[:] = [origin], [half], 0  # (until it is in ``claimed``)
            if size + cost > limit:  # rollbacks count too: their offsets make the op record grow
                flush()
            if commit is not None:
                msgs.append(commit)
            size += cost
            claimed.append((i, [half], [origin]))
            n_claimed += 1
            loose[:] = [], [], 0
            op_offsets.extend((origin, stored.queue_offset))

        try:
            for i, (commit_log_offset, table_offset, state, msg_id, count) in enumerate(entries):
                if count == 1:
                    try:
                        stored = self._half_at(group, commit_log_offset, table_offset) \
                            if state != TRANSACTION_NOT_TYPE else None
                    except RemotingError as exc:
                        outcomes[i] = EndOutcome(int(exc.code), exc.remark)
                        continue
                    if stored is None:
                        outcomes[i] = EndOutcome(ResponseCode.SUCCESS, self._unknown(group, msg_id, "producer (batch)"))
                    else:
                        decide(i, stored, commit_log_offset, state, msg_id)
                    continue
                ranges[i] = [0, None, "", 0]
                if state == TRANSACTION_NOT_TYPE:
                    self._unknown(group, msg_id, "producer (batch)")
                    self.metrics.unknown += count - 1  # (one each, as single entries count)
                    continue
                # What decide does, inlined for the usual half of a range (plain, pending): a few hundred ns each.
                pending, wanted, commit = self.table.pending, _OUTCOME[state], state == TRANSACTION_COMMIT_TYPE
                remembered = self._outcomes
                # (with a topic the commits are built for rollbacks too: their topics are what is checked)
                for n, got in range_halves(self.store, group, commit_log_offset, table_offset, count,
                                           commit or topic is not None):
                    if isinstance(got, Chunk):
                        origins, phys, committed, costs = got.origins, got.phys, got.msgs, got.costs
                        if topic is not None:
                            if any(m.topic != topic for m in cast(list[MessageInner], committed)):
                                for k, origin in enumerate(origins):  # each checked and decided on its own
                                    decide(i, tm.StoredHalf(HALF_TOPIC, phys[k], n + k, group, origin, None,
                                                            got.record(k)), phys[k], state, msg_id)
                                continue
                            if not commit:
                                committed, costs = None, [_OP_SHARE] * len(origins)
                        before = len(pending)
                        halves = list(map(pending.pop, origins, itertools.repeat(None)))
                        loose[:] = origins, halves, 0
                        # (counted, not searched: ``None in halves`` would call PendingHalf.__eq__ for each)
                        if before - len(pending) == len(origins):  # all pending (the usual case): claimed at once
                            remembered.remember_all(origins, wanted)
                            start, total = 0, len(origins)
                            # (each its own origin, the usual case: the op record lists each offset once anyway)
                            own = origins == list(range(n, n + total))
                            while start < total:
                                fits = bisect.bisect_right(list(itertools.accumulate(costs[start:])), limit - size)
                                if not fits:  # the next does not fit in this append
                                    if claimed:
                                        flush()
                                        continue
                                    fits = 1  # (one alone larger than the limit goes in an append of its own)
                                stop = start + fits
                                if committed is not None:
                                    msgs.extend(committed[start:stop])
                                size += sum(costs[start:stop])
                                run = origins if stop - start == total else origins[start:stop]
                                claimed.append((i, cast(list[PendingHalf], halves if run is origins
                                                        else halves[start:stop]), run))
                                n_claimed += stop - start
                                op_offsets.extend(run)
                                if not own:
                                    op_offsets.extend(range(n + start, n + stop))
                                start = loose[2] = stop
                                if start < total:
                                    flush()
                            continue
                        for origin, half in zip(origins, halves, strict=True):
                            if half is not None:
                                pending[origin] = half  # back: decided one by one below (their heap items stayed)
                        loose[:] = [], [], 0
                        for k, origin in enumerate(origins):
                            half = pending.pop(origin, None)
                            if half is None:  # decided before, or refused: as a single entry is
                                record = got.record(k)
                                decide(i, tm.StoredHalf(HALF_TOPIC, phys[k], n + k, group, origin, None, record),
                                       phys[k], state, msg_id)
                                continue
                            remembered.remember(origin, wanted)
                            loose[:] = [origin], [half], 0
                            cost = costs[k]
                            if size + cost > limit:
                                flush()
                            if committed is not None:
                                msgs.append(committed[k])
                            size += cost
                            claimed.append((i, [half], [origin]))
                            n_claimed += 1
                            loose[:] = [], [], 0
                            op_offsets.extend((origin, n + k))
                    elif isinstance(got, RemotingError):
                        self.metrics.refused += 1
                        refuse(i, int(got.code), f"the range's half {n - table_offset} of {count}: {got.remark}")
                    else:
                        decide(i, got, got.physical_offset, state, msg_id)
            flush()
        except BaseException:
            # Nothing below was appended: those transactions are still undecided (the table and the outcomes as if
            # this request had not named them), and the request is answered with the error.
            for _, run_halves, run_origins in claimed:
                for half, origin in zip(run_halves, run_origins, strict=True):
                    self.table.add(half)
                    self._outcomes.forget(origin)
            for origin, half in zip(loose[0][loose[2]:], loose[1][loose[2]:], strict=True):
                if half is not None and origin not in self.table.pending:
                    self.table.add(half)
                    self._outcomes.forget(origin)
            raise
        # No await before the last append above: requests of one connection are decided in the order they came.
        codes: dict[int, int] = {}
        for result, done in appended:
            code = answer_code(await self.appender.durable(result))
            outcome = EndOutcome(code)
            for i in done:
                if i in ranges:
                    if code != ResponseCode.SUCCESS:
                        codes.setdefault(i, code)
                else:
                    outcomes[i] = outcome
        for i, (failed, code, remark, already) in ranges.items():
            count = entries[i][4]
            if failed:
                outcomes[i] = EndOutcome(code, f"{failed} of {count} halves not decided; first: {remark}", already)
            elif i in codes:
                outcomes[i] = EndOutcome(codes[i], "stored, not durable in time", already)
            else:
                outcomes[i] = EndOutcome(ResponseCode.SUCCESS, f"{count - already} halves decided, {already} "
                                         "already resolved" if entries[i][2] != TRANSACTION_NOT_TYPE else
                                         "state unknown: the broker will check back", already)
        return make_response(cmd, ResponseCode.SUCCESS, None, None,
                             encode_end_outcomes([o or EndOutcome(ResponseCode.SYSTEM_ERROR) for o in outcomes]))

    def _defer_index(self, msgs: list[MessageInner]) -> None:
        """Before an append of commits: a large one (a packed half's items count each) defers the key index."""
        builder = self.store.index_builder
        # (counted only when the messages alone are too few to decide: a packed half's commit is one of them)
        if builder is not None and (len(msgs) >= _DEFER_INDEX_RECORDS
                                    or sum(m.batch_items or 1 for m in msgs) >= _DEFER_INDEX_RECORDS):
            builder.defer(_DEFER_INDEX_S)

    def _unknown(self, group: str, msg_id: str | None, source: str) -> str:
        self.metrics.unknown += 1
        log.debug("%s %s of %s: state unknown, left for the next check", source, msg_id, group)
        return "state unknown: the broker will check back"

    def _claim(self, group: str, commit_log_offset: int, table_offset: int, state: int, msg_id: str | None,
               source: str, topic: str | None = None) -> tuple[PendingHalf, tm.StoredHalf, int] | str:
        """Take one END decision's transaction off the table: ``(half, stored half, origin)`` of the pending half it
        resolves (the caller appends its records, or puts ``half`` back), or the remark of an answer that
        writes nothing (state unknown, already resolved). RemotingError when it is refused: no such half, another
        group's, or a decision contradicting the one already taken."""
        if state == TRANSACTION_NOT_TYPE:
            return self._unknown(group, msg_id, source)
        stored = self._half_at(group, commit_log_offset, table_offset)
        self._of_topic(stored, topic)
        got = self._decide(group, stored, state, msg_id, source)
        return got if isinstance(got, str) else (got[0], stored, got[1])

    def _of_topic(self, stored: tm.StoredHalf, topic: str | None) -> None:
        """NO_PERMISSION unless the half is of ``topic`` (the request's field, what the ACL checked; None: any)."""
        if topic is None:
            return
        rec = stored.record if stored.record is not None else decode_record(stored.data)[0]
        if tm.real_destination(rec)[0] != topic:
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the half message at commit-log offset "
                                f"{stored.physical_offset} is not of topic {topic}")

    def _decide(self, group: str, stored: tm.StoredHalf, state: int, msg_id: str | None,
                source: str) -> tuple[PendingHalf, int] | str:
        """:meth:`_claim` of a half already read and checked: ``(half, origin)`` or the remark."""
        origin = stored.origin
        half = self.table.resolve(origin)
        if half is not None:
            return half, origin
        outcome = self._outcomes.get(origin)
        wanted = _OUTCOME[state]
        if outcome is not None and outcome != wanted and not (outcome == "discarded" and wanted == "rolled back"):
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.TRANSACTION_FAILED,
                                f"transaction {origin} ({msg_id}) was {outcome} already"
                                + (f" after {self.check_max} checks without a decision (kept in {CHECK_MAX_TOPIC})"
                                   if outcome == "discarded" else "") + f": it cannot be {wanted} now")
        self.metrics.already_resolved += 1
        return "the transaction is already resolved"

    def _resolved(self, origin: int, state: int) -> None:
        if state == TRANSACTION_COMMIT_TYPE:
            self.metrics.committed += 1
        else:
            self.metrics.rolled_back += 1
        self._remember(origin, _OUTCOME[state])

    def _remember(self, origin: int, outcome: str) -> None:
        self._outcomes.remember(origin, outcome)

    def _half_at(self, group: str, commit_log_offset: int, table_offset: int) -> tm.StoredHalf:
        """The half record an END names, checked as RocketMQ checks it (group, queue and log offsets)."""
        view = self.store.read_record(commit_log_offset)
        stored = tm.read_half(view) if view is not None else None
        if stored is None or stored.topic != HALF_TOPIC or stored.physical_offset != commit_log_offset:
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed: no half "
                                f"message at commit-log offset {commit_log_offset}")
        if stored.group != group:
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "The producer group wrong: the half message belongs to "
                                f"{stored.group!r}, not {group!r}")
        if stored.queue_offset != table_offset:
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong: "
                                f"{table_offset}, the half is at {stored.queue_offset}")
        if not unit_points_at(self.store, table_offset, commit_log_offset):
            self.metrics.refused += 1
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed: the half "
                                f"queue's offset {table_offset} is not the record at commit-log offset "
                                f"{commit_log_offset}")
        return stored

    # -- check-back -------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            now = self.clock()
            due = self.table.pop_due(now, _CHECK_BATCH)
            for half in due:
                try:
                    self._check(half, now)
                except Exception:
                    log.exception("checking transaction %d failed", half.origin)
                    self.table.schedule(half, now + self.check_interval_ms)
            if len(due) == _CHECK_BATCH:
                await asyncio.sleep(0)
                continue
            if time.monotonic() - self._last_persist >= _PERSIST_INTERVAL_S:
                self._last_persist = time.monotonic()
                try:  # (what a check's failure is: logged, tried again next time)
                    self.metrics.renewed += await renew_lagging(self.store, self.appender, self.table,
                                                                now + self.timeout_ms, _CHECK_BATCH)
                except Exception:
                    log.exception("renewing lagging halves failed")
                # A progress pair is written once the log is flushed past what it was computed on: it may point past
                # records (a renewal's copy) a power cut would take back with an async flush's unflushed tail.
                ready, self._staged = self._staged, (self._progress(), self.store.commitlog.max_offset)
                if ready is not None and ready[0] != self._persisted and self.store.flushed_offset >= ready[1]:
                    await asyncio.to_thread(self._write_progress, ready[0])
            nxt = self.table.next_due()
            wait_ms = _PERSIST_INTERVAL_S * 1000 if nxt is None else min(max(0, nxt - now),
                                                                       _PERSIST_INTERVAL_S * 1000)
            self._sleep_until = now + int(wait_ms)
            self._wake.clear()
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._sleep_until = None

    def _check(self, half: PendingHalf, now: int) -> None:
        store = self.store
        rec = self._read(half.latest_phy)
        if rec is None or rec.topic != HALF_TOPIC:
            self.table.resolve(half.origin)
            self.metrics.lost += 1
            log.error("transaction %d of %s: its half message is gone from the commit log (offset %d); dropped",
                      half.origin, half.group, half.latest_phy)
            return
        if half.check_times >= self.check_max:
            self._discard(half, rec, now)
            return
        times = half.check_times + 1
        op_mark = store.max_offset(OP_TOPIC, 0)
        result = self.appender.append([tm.copy_for_check(rec, half.origin, times)])
        self.table.schedule(half, now + self.check_interval_ms)
        if not result.ok:
            log.warning("transaction %d: cannot re-append its half for check %d (%s); retrying later",
                        half.origin, times, result.status.value)
            return
        r = result.records[0]
        self.table.record_appended(half.origin, r.queue_offset, r.phy_offset, times, op_mark)
        channel = self._pick_channel(half.group)
        if channel is None:
            self.metrics.checks_without_producer += 1
            log.warning("transaction %d: no producer of group %s is connected for check %d of %d", half.origin,
                        half.group, times, self.check_max)
            return
        copy = self._read(r.phy_offset)
        if copy is None:
            return
        topic, _ = tm.real_destination(copy)
        uniq = copy.properties.get(UNIQ_KEY)
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=copy.queue_offset, commit_log_offset=copy.physical_offset, msg_id=uniq,
            transaction_id=uniq, offset_msg_id=offset_msg_id(store.commitlog.store_host, copy.physical_offset),
            topic=topic, broker_name=self.config.broker_name)
        request = make_request(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(), tm.check_request_body(copy),
                               oneway=True)
        try:
            channel.conn.send_oneway(request)
        except ConnectionError as exc:
            log.warning("transaction %d: check to %s failed: %s", half.origin, channel.client_id, exc)
            return
        self.metrics.checks_sent += 1
        log.debug("transaction %d (%s): check %d sent to %s", half.origin, uniq, times, channel.client_id)

    def _discard(self, half: PendingHalf, rec: MessageRecord, now: int) -> None:
        self.topics.create_system_topic(CHECK_MAX_TOPIC, 1, PERM_READ_WRITE)
        result = self.appender.append(
            [tm.discarded(rec), tm.op_record([half.origin, half.latest_offset], now)])
        if not result.ok:
            self.table.schedule(half, now + self.check_interval_ms)
            log.error("transaction %d: cannot move it to %s (%s)", half.origin, CHECK_MAX_TOPIC, result.status.value)
            return
        self.table.resolve(half.origin)
        self.metrics.discarded += 1
        self._remember(half.origin, "discarded")
        topic, _ = tm.real_destination(rec)
        log.warning("transaction %s of %s (topic %s) checked %d times without a decision: moved to %s at queue "
                    "offset %d", rec.properties.get(UNIQ_KEY), half.group, topic, half.check_times, CHECK_MAX_TOPIC,
                    result.records[0].queue_offset)

    def _pick_channel(self, group: str) -> ClientChannel | None:
        """One live producer connection of the group, taking turns among them."""
        live = [ch for ch in self.producers.groups.get(group, {}).values() if not ch.conn.closed]
        return live[next(self._rr) % len(live)] if live else None

    # -- helpers ------------------------------------------------------------------------------------------------
    def _read(self, phy: int) -> MessageRecord | None:
        view = self.store.read_record(phy)
        if view is None:
            return None
        try:
            return decode_record(view)[0]
        except ProtocolError:
            return None

    def _records(self, topic: str, start: int) -> Iterator[MessageRecord]:
        store = self.store
        offset = start
        while offset < store.max_offset(topic, 0):
            got = store.get_messages(topic, 0, offset, 1024, max_bytes=READ_BYTES)
            for view in got.buffers:
                try:
                    yield decode_record(view)[0]
                except ProtocolError as exc:
                    log.error("unreadable record in %s: %s", topic, exc)
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset

    def _progress(self) -> tuple[int, int]:
        store = self.store
        return self.table.progress(store.max_offset(HALF_TOPIC, 0), store.max_offset(OP_TOPIC, 0))

    def _write_progress(self, progress: tuple[int, int]) -> None:
        write_progress(self.progress_path, progress)
        self._persisted = progress

    def _persist_progress(self) -> None:
        progress = self._progress()
        if progress != self._persisted:
            self._write_progress(progress)

    def stats(self) -> dict[str, int]:
        return {**asdict(self.metrics), "pending": len(self.table)}
