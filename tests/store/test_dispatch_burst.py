"""The consume-queue dispatch and the index builder's deferral, which a timer burst leans on
(the dispatch skips transactional halves inline and reuses a queue's lookup across a run of records)."""

from __future__ import annotations

import time
from collections.abc import Callable

from cometmq.protocol.message import decode_record
from cometmq.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from cometmq.store.message_store import MessageStore

from .conftest import msg


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    r = store.get_messages(topic, queue_id, 0, 100, max_bytes=1 << 20)
    return [decode_record(v)[0].body for v in r.buffers]


def test_only_consumable_records_reach_the_consume_queues(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    batch = []
    for i, flag in enumerate([TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_COMMIT_TYPE,
                              TRANSACTION_ROLLBACK_TYPE, TRANSACTION_NOT_TYPE]):
        m = msg("TX", f"m{i}".encode())
        m.sys_flag = flag
        batch.append(m)
    assert store.put_messages(batch).ok
    assert bodies(store, "TX", 0) == [b"m0", b"m2", b"m4"]
    assert store.max_offset("TX", 0) == 3


def test_runs_and_switches_of_queues_and_topics_in_one_batch(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    layout = [("A", 0), ("A", 0), ("A", 1), ("B", 1), ("A", 1), ("A", 0), ("B", 0), ("B", 0), ("A", 0)]
    batch = [msg(t, f"{t}{q}-{i}".encode(), queue_id=q) for i, (t, q) in enumerate(layout)]
    assert store.put_messages(batch).ok
    for topic in ("A", "B"):
        for q in (0, 1):
            want = [f"{t}{qq}-{i}".encode() for i, (t, qq) in enumerate(layout) if (t, qq) == (topic, q)]
            assert bodies(store, topic, q) == want, (topic, q)


def test_a_deferred_index_builder_still_answers_lookups(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    builder = store.index_builder
    assert builder is not None
    builder.defer(30)
    assert store.put_messages([msg("IX", f"b{i}".encode(), keys=f"k{i}") for i in range(20)]).ok
    time.sleep(0.3)  # several of the builder thread's passes
    assert builder.applied_offset < builder.submitted_offset  # it left the queue alone
    [found] = store.query_by_key("IX", "k7")
    assert decode_record(found)[0].body == b"b7"
    assert builder.applied_offset == builder.submitted_offset
