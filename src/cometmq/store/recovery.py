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
import time
from typing import TYPE_CHECKING

from cometmq.store.checkpoint import Checkpoint
from cometmq.store.consume_queue import ConsumeQueue

if TYPE_CHECKING:
    from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)


def load_consume_queues(store: MessageStore) -> None:
    root = store.config.consume_queue_dir
    root.mkdir(parents=True, exist_ok=True)
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            continue
        for qdir in sorted(topic_dir.iterdir()):
            if not (qdir.is_dir() and qdir.name.isdigit()):
                continue
            cq = ConsumeQueue(topic_dir.name, int(qdir.name), qdir, store.config.consume_queue_units_per_file,
                              preallocate=store.config.preallocate)
            cq.load()
            cq.recover()
            store.queues[(cq.topic, cq.queue_id)] = cq


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
        end = checkpoint.clean_end_offset
        _set_end_positions(store, end)
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
    store.reput.reput_offset = redispatch_from
    count = store.reput.reput_from_log(end, notify=False)
    store.reput.reput_offset = end
    store.rebuild_queue_table()
    for mf in files.files:
        mf.flushed_position = mf.wrote_position
    log.info("recovery %s: log end %d, %d records re-dispatched, %.3f s",
             "after a crash" if abnormal else "after a clean stop", end, count, time.monotonic() - started)
    return abnormal


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
