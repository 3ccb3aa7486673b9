"""Start-up recovery: find the true end of the commit log, then make consume queues and index agree.

Clean stop (no ``abort`` marker, a checkpoint with the exact end): trust it; only check that nothing
lies past that end. Otherwise scan from the last point the checkpoint says was durable, verifying
magic, lengths and body CRC; cut the log at the first bad record (zeroing the rest, so stale bytes
can never be read back as records); drop consume-queue units and index files past the end; and
re-dispatch from the checkpoint's dispatched offset. Re-dispatch skips units already present, so
recovery never duplicates or reorders.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cometmq.store.checkpoint import Checkpoint

if TYPE_CHECKING:
    from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)


def load_consume_queues(store: MessageStore) -> None:
    """Every queue on disk, unmapped: the last file of each is read (one pread when it is small) to find its end."""
    root = store.config.consume_queue_dir
    root.mkdir(parents=True, exist_ok=True)
    with os.scandir(root) as topics:
        topic_dirs = sorted((e.name, e.path) for e in topics if e.is_dir())
    for topic, topic_path in topic_dirs:
        with os.scandir(topic_path) as queues:
            qdirs = sorted((int(e.name), e.path) for e in queues if e.name.isdigit() and e.is_dir())
        for queue_id, qpath in qdirs:
            cq = store.new_consume_queue(topic, queue_id, Path(qpath))
            cq.load(qpath)
            cq.recover()
            store.queues[(topic, queue_id)] = cq


def recover(store: MessageStore) -> bool:
    """Recover the store's files; returns True when the previous run did not stop cleanly."""
    started = time.monotonic()
    commitlog = store.commitlog
    commitlog.files.load()
    load_consume_queues(store)
    if store.index is not None:
        store.index.load()
    checkpoint = Checkpoint.load(store.checkpoint_file)
    abnormal = store.abort_file.exists() or checkpoint is None or checkpoint.clean_end_offset < 0
    files = commitlog.files
    if not files.files:
        end = 0
        abnormal = abnormal and checkpoint is not None  # a new, empty store is not a crashed one
    elif not abnormal and checkpoint is not None and \
            files.min_offset <= checkpoint.clean_end_offset <= files.max_offset and \
            not _bytes_follow(store, checkpoint.clean_end_offset):
        end = _check_clean_end(store, checkpoint.clean_end_offset)
    else:
        if not abnormal:
            log.warning("the clean checkpoint does not match the log; checking it record by record")
        abnormal = True
        start = files.min_offset
        if checkpoint is not None:
            mf = files.find(min(checkpoint.dispatched_offset, checkpoint.commitlog_flushed))
            if mf is not None:
                start = mf.file_from_offset
        # Segments before the scan start are taken whole; from there on every record is verified.
        result = commitlog.recover_end(start)
        end = result.end_offset
        if result.corrupt_at is not None:
            log.warning("commit log: invalid record at %d; the log now ends there", result.corrupt_at)
        log.info("commit log: %d records verified from %d, end %d", result.records, start, end)
        commitlog.truncate(end)

    for cq in store.queues.values():
        cq.truncate_from_phy(end)
        cq.delete_before_phy(files.min_offset)
    if store.index is not None:
        store.index.truncate_after(end)

    redispatch_from = files.min_offset
    if checkpoint is not None and checkpoint.dispatched_offset >= files.min_offset:
        redispatch_from = min(checkpoint.dispatched_offset, end)
        if files.find(redispatch_from) is None and redispatch_from != end:
            redispatch_from = files.min_offset
    checked_from, cut = _check_consume_queues(store)
    if cut < end:
        # A record whose header names another queue or queue offset than its unit (the body CRC does not cover the
        # header): the log ends before it, as at any other bad record.
        log.warning("commit log: the record at %d does not hold the queue and offset its consume-queue unit names; the "
                    "log now ends there (%d bytes dropped)", cut, end - cut)
        end = cut
        commitlog.truncate(end)
        for cq in store.queues.values():
            cq.truncate_from_phy(end)
        if store.index is not None:
            store.index.truncate_after(end)
    redispatch_from = min(redispatch_from, checked_from, end)
    # The units re-dispatched from here on are not on disk yet: the first checkpoint must not claim them.
    store.checkpoint_floor(redispatch_from, end if checkpoint is None else min(checkpoint.commitlog_flushed, end))
    store.reput.reput_offset = redispatch_from
    count = store.reput.reput_from_log(end, notify=False)
    store.reput.reput_offset = end
    store.rebuild_queue_table()
    for cq in store.queues.values():
        cq.end_recovery()
    for mf in files.files:
        mf.flushed_position = mf.wrote_position
    log.info("recovery %s: log end %d, %d records re-dispatched, %.3f s",
             "after a crash" if abnormal else "after a clean stop", end, count, time.monotonic() - started)
    return abnormal


def _check_consume_queues(store: MessageStore) -> tuple[int, int]:
    """Check the units of each consume queue's last file that point into the last ``recover_check_segments``
    commit-log segments against their records (magic code, size, queue id and offset: RocketMQ's ConsumeQueue
    recover stops at a unit that does not hold up). A queue is cut at its first bad unit, and the commit log (the
    source of truth) is re-dispatched from where that queue's last good record ends, which writes the units
    back. When the unit names a record of the right size whose header says another queue or queue offset (header
    fields the body CRC does not cover), the record is the damaged one: the log must end before it. Returns (where
    to re-dispatch from, where the log must end): the log end for both when every unit holds up."""
    commitlog = store.commitlog
    files = commitlog.files
    end = commitlog.max_offset
    keep = store.config.recover_check_segments
    if keep <= 0 or not files.files:
        return end, end
    min_phy = files.files[max(0, len(files.files) - keep)].file_from_offset
    redispatch = cut = end
    for cq in store.queues.values():
        bad = cq.first_bad_unit(commitlog.record_matches, min_phy)
        if bad is None:
            continue
        unit = cq.get_unit(bad)
        if unit is not None and commitlog.record_starts_at(unit[0], unit[1]):
            cut = min(cut, unit[0])
        prev = cq.get_unit(bad - 1)
        start = prev[0] + prev[1] if prev is not None and prev[1] > 0 else max(files.min_offset, min_phy)
        log.warning("consume queue %s: unit %d does not match the commit log; rebuilding it from %d on from the log "
                    "(re-dispatch from %d)", cq.files.directory, bad, bad, start)
        cq.truncate_to(bad)
        redispatch = min(redispatch, start)
    return redispatch, cut


def _check_clean_end(store: MessageStore, clean_end: int) -> int:
    """The log end after a clean stop: the checkpoint's, unless the records before it do not hold up.

    As RocketMQ's recoverNormally (checkCRCOnRecover): the records of the last ``recover_check_segments``
    segments are checked (lengths, body CRC) up to the recorded end; a segment file cut short (its missing
    tail reads as zeros), zeroed or flipped bytes end the log at the last valid record before them, with a
    WARNING naming the segment (the consume queues and index then drop what points past it)."""
    files = store.commitlog.files
    _set_end_positions(store, clean_end)
    keep = store.config.recover_check_segments
    if keep <= 0 or not files.files:
        return clean_end
    start = files.files[max(0, len(files.files) - keep)].file_from_offset
    result = store.commitlog.recover_end(start)
    log.info("recovery after a clean stop: %d records checked from %d (last %d segment(s))", result.records,
             start, min(keep, len(files.files)))
    if result.end_offset >= clean_end:
        return clean_end
    end = result.end_offset
    mf = files.find(end)
    name = mf.path if mf is not None else files.directory
    log.warning("commit log %s: the clean checkpoint says the log ends at %d, but the record at %d is %s; the log "
                "now ends there (%d bytes dropped)", name, clean_end, end,
                "damaged" if result.corrupt_at is not None else "missing (zeros: the file was cut short?)",
                clean_end - end)
    store.commitlog.truncate(end)
    return end


def _bytes_follow(store: MessageStore, end: int) -> bool:
    """True when something that is not zero lies where the log is said to end."""
    mf = store.commitlog.files.find(end)
    if mf is None:
        return False
    pos = end - mf.file_from_offset
    return pos + 8 <= mf.size and bytes(mf.mm[pos : pos + 8]) != bytes(8)


def _set_end_positions(store: MessageStore, end: int) -> None:
    files = store.commitlog.files
    for mf in list(files.files):
        if mf.file_from_offset > end or (mf.file_from_offset == end and mf is not files.first):
            # Only a segment created just before the stop can lie past a clean end; it is empty.
            files.files.remove(mf)
            files._starts.remove(mf.file_from_offset)
            mf.destroy()
        elif mf.end_offset > end:
            mf.wrote_position = mf.flushed_position = end - mf.file_from_offset
