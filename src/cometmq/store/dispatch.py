"""The dispatcher ("reput"): turns committed records into consume-queue units, index entries and
arrival notices, in log order, up to the confirmed offset.

It runs in the appending thread right after an append (no polling loop), so listeners hear of a
message in the same call that stored it. When replication holds the confirmed offset back, the
requests wait in ``pending`` until ``confirm`` moves it; records that arrived as raw bytes (a
replica) are read from the log by ``CommitLog.dispatch_requests`` (store/record_walk.py).

A dispatch that fails to write (a full disk: a consume-queue file cannot grow) stops where it is: the records
stay in the log, the append that stored them is answered as stored (a producer told otherwise would send the
message again: a duplicate), and the dispatch goes on from the log at the next append or ``retry`` (the store's
maintenance pass), rewriting nothing already written (a unit already there is skipped).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from cometmq.common.failures import Failures
from cometmq.store.commitlog import CommitLog
from cometmq.store.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, DispatchRequest
from cometmq.store.record_walk import BLANK, LIMIT, UNDECODABLE

log = logging.getLogger(__name__)

#: the transaction bit of exactly the halves that go to no consume queue (``DispatchRequest.goes_to_consume_queue``)
_HALVES_BIT = TRANSACTION_PREPARED_TYPE & TRANSACTION_ROLLBACK_TYPE

Dispatcher = Callable[[DispatchRequest], None]
#: Built-in dispatchers take a whole batch, so a consumer of many records pays its per-call cost once.
BatchDispatcher = Callable[[list[DispatchRequest]], None]
#: A hook that may rewrite a decoded request's tag code (e.g. delivery time for scheduled topics).
TagCodeHook = Callable[[DispatchRequest], None]


class ReputService:
    def __init__(self, commitlog: CommitLog) -> None:
        self.commitlog = commitlog
        self.reput_offset = 0
        #: built-in dispatchers (consume queue, index) run before listeners
        self.dispatchers: list[BatchDispatcher] = []
        #: arrival listeners (long polling, POP, timer); they must be quick and must not append
        self.listeners: list[Dispatcher] = []
        #: the same, called once per dispatched batch (a 128-message send, a timer burst's 2,048 re-puts):
        #: one call instead of one per record and listener
        self.batch_listeners: list[BatchDispatcher] = []
        self.pending: deque[DispatchRequest] = deque()
        self.tag_code_hooks: list[TagCodeHook] = []
        #: the write error that stopped the dispatch (None: it is not stopped), and the offset to go on to
        self.stalled: OSError | None = None
        self._stalled_to = 0
        self._failures = Failures(log, "the dispatch")

    def submit(self, requests: list[DispatchRequest], confirmed: int) -> None:
        """Requests built by an append, then dispatch everything up to ``confirmed``."""
        if not self.pending and requests and requests[-1].phy_offset + requests[-1].size <= confirmed \
                and requests[0].phy_offset == self.reput_offset:
            try:
                self._dispatch_all(requests)
            except OSError as exc:  # the reput offset stays before them: the log has them
                self._stall(exc, confirmed)
            return
        self.pending.extend(requests)
        self.confirm(confirmed)

    def confirm(self, confirmed: int) -> None:
        """Dispatch pending requests (or records decoded from the log) up to ``confirmed``; a write error stops it
        (logged, see ``retry``)."""
        try:
            self._confirm(confirmed)
        except OSError as exc:
            self._stall(exc, confirmed)
            return
        if self.stalled is not None:
            self.stalled = None
            self._failures.passed()

    def retry(self) -> None:
        """Go on with a dispatch a write error stopped (call it with the store's lock held)."""
        if self.stalled is not None:
            self.confirm(self._stalled_to)

    def _stall(self, exc: OSError, confirmed: int) -> None:
        self.stalled, self._stalled_to = exc, max(confirmed, self._stalled_to)
        self._failures.failed(exc, f"the dispatch stopped at commit-log offset {self.reput_offset}: the records are "
                                   "stored, and are dispatched once the next append or maintenance pass can write")

    def _confirm(self, confirmed: int) -> None:
        ready: list[DispatchRequest] = []
        while self.pending and self.pending[0].phy_offset + self.pending[0].size <= confirmed:
            req = self.pending.popleft()
            if req.phy_offset < self.reput_offset:
                continue
            if req.phy_offset != self.reput_offset and not ready:
                # Something before it came in as raw bytes: decode that part from the log first.
                self.reput_from_log(req.phy_offset)
            ready.append(req)
        if ready:
            self._dispatch_all(ready)
        if self.reput_offset < confirmed and not self.pending:
            self.reput_from_log(confirmed)

    def reput_from_log(self, until: int, *, notify: bool = True) -> int:
        """Decode and dispatch records from the reput offset up to ``until``; returns how many."""
        count = 0
        read = self.commitlog.dispatch_requests
        offset = self.reput_offset
        while offset < until:
            # Up to 1,024 records of one segment at a time, read straight from its bytes (store/record_walk.py).
            batch, offset, why = read(offset, until, 1024)
            if batch:
                self._note_queue_offsets(batch)
                self._dispatch_all(batch, notify=notify)
                count += len(batch)
            if why == UNDECODABLE:
                # Its topic or properties are not UTF-8 (no append of ours writes such a record): the dispatch
                # stays before it rather than skip a record, and each later confirm tries (and logs) again.
                log.error("undecodable record at %d stops the dispatch", offset)
                break
            if why != LIMIT and why != BLANK:
                break
        # Blank segment tails are not records: skip them so the reput offset reaches ``until``.
        if self.reput_offset < until:
            mf = self.commitlog.files.find(self.reput_offset)
            if mf is not None and mf is not self.commitlog.files.last and until >= mf.end_offset:
                self.reput_offset = mf.end_offset
                if self.reput_offset < until:
                    count += self.reput_from_log(until, notify=notify)
        return count

    def _note_queue_offsets(self, batch: list[DispatchRequest]) -> None:
        """Tag-code hooks, then the queue offsets: records that came in as bytes (a replica) were numbered by
        another log, so later local appends must continue from their queue offsets."""
        hooks = self.tag_code_hooks
        if hooks:
            for req in batch:
                for hook in hooks:
                    hook(req)
        table = self.commitlog.queue_table
        # Per run of one (topic, queue) (a batch is one): the table ends as the record-by-record update leaves it.
        key: tuple[str, int] | None = None
        top = -1
        for req in batch:
            if req.sys_flag & _HALVES_BIT:  # prepared and rolled-back halves take no queue offset
                continue
            if key is None or req.queue_id != key[1] or req.topic != key[0]:
                if key is not None and table.get(key, 0) <= top:
                    table[key] = top + 1
                key, top = (req.topic, req.queue_id), req.queue_offset
            elif req.queue_offset > top:
                top = req.queue_offset
        if key is not None and table.get(key, 0) <= top:
            table[key] = top + 1

    def _dispatch_all(self, requests: list[DispatchRequest], *, notify: bool = True) -> None:
        for dispatcher in self.dispatchers:
            dispatcher(requests)
        last = requests[-1]
        self.reput_offset = last.phy_offset + last.size
        if notify:
            for batch_listener in self.batch_listeners:
                try:
                    batch_listener(requests)
                except Exception:
                    log.exception("arrival listener failed")
            for listener in self.listeners:
                for req in requests:
                    try:
                        listener(req)
                    except Exception:
                        log.exception("arrival listener failed")
