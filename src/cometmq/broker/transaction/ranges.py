"""Reading the halves a range entry of END_TRANSACTION_BATCH names (protocol/transaction_batch.py): the halves at
half-queue offsets ``first`` … ``first + count - 1``, the first at a given commit-log offset.

A half batch is stored in one append, so its halves lie back to back in the log: they are read from the region
the half queue's first unit points at, many at once by the C helper (``messages.commit_records``: each record a
plain half of the group at its offset and at the position its predecessor ends at), and one by one through the
half queue's units when that does not hold, which names what is wrong with each. Bytes that read as a half
elsewhere (inside a message's body) are never taken for one: the first record must be the one the half queue's
unit points at, and every later one follows it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

from cometmq.broker.transaction import messages as tm
from cometmq.broker.transaction.front import HALF_TOPIC
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus

#: bytes read from the log (or the half queue) at a time
READ_BYTES = 4 << 20


@dataclasses.dataclass(slots=True)
class Chunk:
    """Halves of a range read by the C helper (``messages.commit_records``): their records (a list, or a region of
    the log holding them back to back), origins, commit-log offsets, the commits' messages (None for a rollback),
    size estimates and record sizes."""

    records: list[memoryview] | memoryview
    origins: list[int]
    phys: list[int]
    msgs: list[MessageInner] | None
    costs: list[int]
    sizes: list[int]
    starts: list[int] | None = None

    def record(self, k: int) -> bytes:
        if isinstance(self.records, list):
            return bytes(self.records[k])
        if self.starts is None:  # (once: a chunk's halves decided before are read one after another)
            self.starts = [0, *itertools.accumulate(self.sizes)]
        return bytes(self.records[self.starts[k]:self.starts[k + 1]])


def unit_points_at(store: MessageStore, queue_offset: int, commit_log_offset: int) -> bool:
    """Whether the half queue's unit ``queue_offset`` is the record at ``commit_log_offset``: bytes that read as a
    half elsewhere (inside a message's body) are not one."""
    cq = store.queues.get((HALF_TOPIC, 0))
    unit = None if cq is None else cq.get_unit(queue_offset)
    return unit is not None and unit[0] == commit_log_offset


def no_half(queue_offset: int) -> RemotingError:
    return RemotingError(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed: no half message at "
                         f"half-queue offset {queue_offset}")


def range_halves(store: MessageStore, group: str, commit_log_offset: int, first: int, count: int,
                 commit: bool) -> Iterator[tuple[int, Chunk | tm.StoredHalf | RemotingError]]:
    """The halves of a range entry in half-queue order, each with its half-queue offset: read (the checks of a
    single entry made) many at once (:class:`Chunk`: plain halves, the commits built when ``commit``), or one by one
    as their decoded :class:`StoredHalf`, or the refusal of one. Refused as a whole (every half) when the first is
    not at ``commit_log_offset``."""
    end = first + count
    expect = first
    phy: int | None = commit_log_offset if unit_points_at(store, first, commit_log_offset) else None
    while expect < end and phy is not None:
        region = store.commitlog.read_upto(phy, READ_BYTES)
        if region is None:
            break
        read = tm.commit_records(region, end - expect, expect, phy, group, commit)
        if read is None:
            break  # (the queue's units from here on)
        yield expect, Chunk(region, *read)
        expect += len(read[0])
        phy = read[1][-1] + read[4][-1]
    while expect < end:
        got = store.get_messages(HALF_TOPIC, 0, expect, min(end - expect, 4096), max_bytes=READ_BYTES)
        if not got.buffers:
            if got.status is GetStatus.OFFSET_TOO_SMALL and expect < got.next_begin_offset <= end:
                while expect < got.next_begin_offset:  # gone (expired segments): the rest may be there
                    yield expect, no_half(expect)
                    expect += 1
                continue
            break
        before = expect
        offsets, views = got.queue_offsets, got.buffers
        if offsets[0] == expect and offsets[-1] - expect == len(views) - 1 and offsets[-1] < end:
            read = tm.commit_records(views, len(views), expect, commit_log_offset if expect == first else -1,
                                     group, commit)
            if read is not None:  # every one a plain half of the group at its offset
                yield expect, Chunk(views, *read)
                expect += len(views)
                continue
        for offset, view in zip(offsets, views, strict=True):
            if offset >= end:
                break
            while expect < offset:  # gone (an expired segment)
                yield expect, no_half(expect)
                expect += 1
            stored = tm.read_half(view)
            if stored is None or stored.topic != HALF_TOPIC or stored.queue_offset != offset:
                yield offset, no_half(offset)
            elif offset == first and stored.physical_offset != commit_log_offset:
                err = RemotingError(ResponseCode.SYSTEM_ERROR, f"the range's first half is at commit-log offset "
                                    f"{stored.physical_offset}, not {commit_log_offset}: nothing decided")
                for k in range(count):
                    yield first + k, err
                return
            elif stored.group != group:
                yield offset, RemotingError(ResponseCode.SYSTEM_ERROR, "The producer group wrong: the half message "
                                            f"belongs to {stored.group!r}, not {group!r}")
            else:
                yield offset, stored
            expect = offset + 1
        if expect == before:  # nothing of the range in what came back
            break
    while expect < end:
        yield expect, no_half(expect)
        expect += 1
