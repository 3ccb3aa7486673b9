"""Queue locks for orderly consumers (RocketMQ's RebalanceLockManager).

One owner (client id) per (group, queue). A lock lasts ``lock_max_live_ms`` since its owner last
locked it; the owner renews by locking again. The table is plain data touched only from the event
loop, so no lock is held around I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cometmq.protocol.client_bodies import MessageQueue


@dataclass
class LockEntry:
    client_id: str
    last_update_ms: int
    #: the connection the lock was last taken or renewed on (compared by identity), if known: a close of another
    #: of the client's connections leaves the lock alone
    conn: object | None = None


class RebalanceLockManager:
    def __init__(self, clock: Callable[[], int], lock_max_live_ms: int = 60_000) -> None:
        self.clock = clock
        self.lock_max_live_ms = lock_max_live_ms
        self.table: dict[str, dict[MessageQueue, LockEntry]] = {}

    def _expired(self, entry: LockEntry, now: int) -> bool:
        return now - entry.last_update_ms > self.lock_max_live_ms

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str,
                       conn: object | None = None) -> set[MessageQueue]:
        """Lock (or renew) what is free, expired or already ours; return the queues ``client_id`` now holds.
        ``conn``: the connection the request came on, remembered with each lock (``unlock_client``)."""
        now = self.clock()
        locks = self.table.get(group)
        got: set[MessageQueue] = set()
        for mq in mqs:
            if locks is None:
                locks = self.table[group] = {}  # only when there is a queue to lock: no empty groups left
            entry = locks.get(mq)
            if entry is None or entry.client_id == client_id or self._expired(entry, now):
                locks[mq] = LockEntry(client_id, now, conn)
                got.add(mq)
        return got

    def scan_expired(self) -> int:
        """Forget the expired locks (the broker's housekeeping): an owner that never comes back (no heartbeat on
        its connection, no UNREGISTER_CLIENT) would otherwise keep its entries forever. Returns how many went."""
        now = self.clock()
        removed = 0
        for group in list(self.table):
            locks = self.table[group]
            for mq in [mq for mq, e in locks.items() if self._expired(e, now)]:
                del locks[mq]
                removed += 1
            if not locks:
                del self.table[group]
        return removed

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        """Release queues, but only those ``client_id`` owns."""
        locks = self.table.get(group)
        if not locks:
            return
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
        if not locks:
            del self.table[group]

    def unlock_client(self, client_id: str, group: str | None = None, conn: object | None = None) -> int:
        """Release everything a departed client held (in ``group`` only, when given: one of its consumers left;
        only the locks last taken on ``conn``, when given: that connection closed, and a lock the client took again
        on a new connection since is not its to free), so others need not wait for expiry."""
        released = 0
        groups = list(self.table) if group is None else [group] if group in self.table else []
        for name in groups:
            locks = self.table[name]
            for mq in [mq for mq, e in locks.items() if e.client_id == client_id and (conn is None or e.conn is conn)]:
                del locks[mq]
                released += 1
            if not locks:
                del self.table[name]
        return released

    def is_locked(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        entry = self.table.get(group, {}).get(mq)
        return entry is not None and entry.client_id == client_id and not self._expired(entry, self.clock())

    def owner(self, group: str, mq: MessageQueue) -> str | None:
        entry = self.table.get(group, {}).get(mq)
        if entry is None or self._expired(entry, self.clock()):
            return None
        return entry.client_id
