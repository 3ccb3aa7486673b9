"""Consume-queue units whose record is not where they say: what a read does with them.

A unit names a record by its commit-log offset and size, and a read checks the record there (its total size and
magic code) before serving it. When the two disagree — a unit or a record damaged where recovery's check does not
look (it checks the last consume-queue file of each queue against the last commit-log segments only) — those bytes
are never served. A read that stopped there answered "nothing at this offset" with the same offset to begin from next,
so a consumer pulled that offset again and again, at once (the queue holds more, so a held pull is woken at once),
and never got past it, not after a restart either. As RocketMQ's getMessage goes past a unit it cannot read (its
nextBeginOffset moves past it), the read now steps over it and goes on with the next units; each such unit is logged
once (ERROR, naming the queue, offset and record) and counted (``unreadable``: the broker's metric
cometmq_storage_unreadable_units).

Before stepping over a unit, the read looks at the record its offset names, by that record's own size: when it is
a whole, valid record (lengths, body CRC) of the unit's topic, queue and queue offset, only the unit's size was
damaged, and that record is served (logged once as well).
"""

from __future__ import annotations

import logging

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import decode_record
from cometmq.store.commitlog import CommitLog

log = logging.getLogger(__name__)

#: units remembered as logged; past this many, one is logged each time a read meets it
_MAX_REMEMBERED = 10_000


class BadUnits:
    def __init__(self, commitlog: CommitLog) -> None:
        self._commitlog = commitlog
        #: units a read stepped over (each counted once while fewer than _MAX_REMEMBERED are remembered)
        self.unreadable = 0
        #: units whose record was served by its own size
        self.salvaged = 0
        self._seen: set[tuple[str, int, int]] = set()

    def _first(self, key: tuple[str, int, int]) -> bool:
        if key in self._seen:
            return False
        if len(self._seen) < _MAX_REMEMBERED:
            self._seen.add(key)
        return True

    def salvage(self, topic: str, queue_id: int, queue_offset: int, phy: int, size: int) -> memoryview | None:
        """The record at ``phy`` when it is the unit's record (the unit's size damaged), else None."""
        view = self._commitlog.record_at(phy)
        if view is None:
            return None
        try:
            rec, _ = decode_record(view, check_crc=True)
        except ProtocolError:
            return None
        if rec.topic != topic or rec.queue_id != queue_id or rec.queue_offset != queue_offset:
            return None
        if self._first((topic, queue_id, queue_offset)):
            self.salvaged += 1
            log.warning("consume queue %s-%d offset %d: the unit says %d bytes at %d, the record there has %d; served "
                        "by the record's own size", topic, queue_id, queue_offset, size, phy, len(view))
        return view

    def skipped(self, topic: str, queue_id: int, queue_offset: int, phy: int, size: int) -> None:
        """A unit whose record is not there: counted and logged (once each)."""
        if not self._first((topic, queue_id, queue_offset)):
            return
        self.unreadable += 1
        log.error("consume queue %s-%d offset %d: the record at %d is not the %d-byte record the unit names; "
                  "not served, reads go on after it", topic, queue_id, queue_offset, phy, size)
