"""What keeps a restart's rebuild of the transactions short: the persisted progress pair, and the renewal of halves
that would hold it back.

The table (state.py) is rebuilt at a restart from the half and op queues read from the progress pair on
(``TransactionTable.progress``: the oldest *latest* record of a pending transaction). A check re-appends its half,
so a transaction that is checked moves on. One not checked for long (a producer's CHECK_IMMUNITY_TIME_IN_SECONDS
of a day, the gRPC ``orphaned_transaction_recovery_duration``, a long transactionCheckInterval) would hold the pair
at its record until then, and every restart meanwhile would read every half and op record appended since (the
halves all added to the table before the ops resolve them: time and memory growing with all transaction traffic).

So a pending half whose latest record lies more than :func:`lag_limit` records behind the half queue's end, and
whose check is not due within ``transactionTimeOut`` (a check re-appends it then anyway: a fresh half is left to
its first check), is *renewed*: its latest
record is appended again (``messages.renewed``, as RocketMQ puts a half still immune back into the half queue),
the same message and check count, naming its origin and the store time its next check counts from. Its due time
is the same in memory and, through the copy, after a restart; an END naming any of its records resolves its
origin, so it is decided (and delivered) once.

Each renewal is one more half record; one happens per pending half per ``lag_limit`` records appended at most,
and the limit grows with the pending transactions (four records each), so renewals are at most a quarter of the
half records appended, while a restart reads about ``lag_limit`` records besides the pending ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from cometmq.broker.appender import Appender
from cometmq.broker.transaction import messages as tm
from cometmq.broker.transaction.front import HALF_TOPIC, OP_TOPIC
from cometmq.broker.transaction.state import PendingHalf, TransactionTable
from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import decode_record
from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)

#: a pending half is renewed once this many half records (at least) were appended after its latest one
RENEW_LAG = 4096


def read_progress(path: Path) -> tuple[int, int]:
    """The persisted ``(half_offset, op_offset)``; (0, 0) when there is none, or it cannot be read (logged)."""
    raw = read_optional(path)
    if not raw:
        return 0, 0
    try:
        data = json.loads(raw)
        return int(data["halfOffset"]), int(data["opOffset"])
    except (ValueError, KeyError, TypeError) as exc:
        log.error("cannot read %s (%s): rebuilding transactions from the start of the queues", path, exc)
        return 0, 0


def write_progress(path: Path, progress: tuple[int, int]) -> None:
    write_atomic(path, json.dumps({"halfOffset": progress[0], "opOffset": progress[1]}).encode())


def lag_limit(pending: int) -> int:
    """How far (half records) a pending half's latest record may lie behind the half queue's end."""
    return max(RENEW_LAG, 4 * pending)


def lagging(table: TransactionTable, half_end: int, due_after: int) -> list[PendingHalf]:
    """The pending halves to renew, oldest record first: lagging, their checks due after ``due_after``."""
    cutoff = half_end - lag_limit(len(table))
    found = [h for h in table.pending.values() if h.latest_offset < cutoff and h.next_check_ms > due_after]
    found.sort(key=lambda h: h.latest_offset)
    return found


async def renew_lagging(store: MessageStore, appender: Appender, table: TransactionTable, due_after: int,
                        chunk: int) -> int:
    """Renew the halves that lag and whose checks are due after ``due_after`` (on the event loop's thread), letting
    other work run after each ``chunk`` of them; how many were renewed. One resolved meanwhile is not (a copy of a
    resolved transaction would be pending again after a restart: its op lies before the copy's op mark). One whose
    record cannot be read is checked at once instead (which drops it as lost)."""
    half_end = store.max_offset(HALF_TOPIC, 0)
    if not table.pending or table.progress(half_end, 0)[0] >= half_end - lag_limit(len(table)):
        return 0
    renewed = 0
    for n, half in enumerate(lagging(table, half_end, due_after), 1):
        if n % chunk == 0:
            await asyncio.sleep(0)
        if table.pending.get(half.origin) is not half:
            continue
        view = store.read_record(half.latest_phy)
        try:
            rec = None if view is None else decode_record(view)[0]
        except ProtocolError:
            rec = None
        if rec is None or rec.topic != HALF_TOPIC:
            table.schedule(half, 0)  # (checked now: the check drops it as lost, and logs it)
            continue
        op_mark = store.max_offset(OP_TOPIC, 0)  # (the op queue's end before the copy: see state.py)
        result = appender.append([tm.renewed(rec, half.origin)])  # (no await since the pending test above)
        if not result.ok:
            log.warning("transaction %d: cannot renew its half (%s); trying later", half.origin, result.status.value)
            break
        r = result.records[0]
        table.record_appended(half.origin, r.queue_offset, r.phy_offset, half.check_times, op_mark)
        renewed += 1
    if renewed:
        log.info("transactions: %d pending halves renewed (their checks not due yet), restart progress at %d of %d",
                 renewed, table.progress(store.max_offset(HALF_TOPIC, 0), 0)[0], store.max_offset(HALF_TOPIC, 0))
    return renewed
