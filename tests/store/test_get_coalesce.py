"""get_messages(coalesce=True), the pull answer's read: records that lie back to back come as one view, and the
bytes, offsets and statuses are exactly those of the record-by-record read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cometmq.store import message_store
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetResult
from tests.kit import FakeClock

from .conftest import msg, small_config


def same(a: GetResult, b: GetResult) -> None:
    assert a.status is b.status
    assert (a.next_begin_offset, a.min_offset, a.max_offset) == (b.next_begin_offset, b.min_offset, b.max_offset)
    assert b"".join(a.buffers) == b"".join(b.buffers)
    assert list(a.queue_offsets) == list(b.queue_offsets)
    assert a.buffer_total_size == b.buffer_total_size


@pytest.fixture(params=["c", "python"])
def helper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with the C run finder (cometmq.store._indexc.runs) and with the pure-Python one."""
    if request.param == "c":
        if message_store._C_HELPER is None:
            pytest.skip("cometmq.store._indexc is not built")
    else:
        monkeypatch.setattr(message_store, "_C_HELPER", None)
    return str(request.param)


puts = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.integers(0, 400)), min_size=1, max_size=40)
reads = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 120), st.integers(1, 40), st.integers(90, 3000)),
                 min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(puts, reads, st.booleans())
def test_coalesced_reads_equal_record_reads(helper: str, tmp_path_factory: object, batches: list[tuple[int, int, int]],
                                            queries: list[tuple[int, int, int, int]], tiny: bool) -> None:
    path = Path(tmp_path_factory.mktemp("coalesce"))  # type: ignore[attr-defined]
    changes: dict[str, object] = {"commitlog_segment_size": 4096, "consume_queue_units_per_file": 7} if tiny else {}
    store = MessageStore(small_config(path, **changes), clock=FakeClock(None))
    store.start()
    try:
        for i, (qid, count, size) in enumerate(batches):
            body = bytes([65 + i % 26]) * (size + 1)
            if count == 1:
                store.put_message(msg(body=body, queue_id=qid, tags="t"))
            else:  # a batch larger than a tiny segment is refused: fine, the reads compare what is there
                store.put_messages([msg(body=body, queue_id=qid) for _ in range(count)])
        for qid, offset, count, max_bytes in queries:
            for limit in (None, max_bytes):
                plain = store.get_messages("T", qid, offset, count, max_bytes=limit)
                joined = store.get_messages("T", qid, offset, count, max_bytes=limit, coalesce=True)
                same(plain, joined)
                assert len(joined.buffers) <= max(1, len(plain.buffers))
    finally:
        store.shutdown()


def test_a_batch_comes_as_one_view(helper: str, make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    store.put_message(msg(queue_id=1))
    assert store.put_messages([msg(body=f"b{i}".encode(), queue_id=1) for i in range(10)]).ok
    store.put_message(msg(queue_id=2))  # between the batches of queue 1
    assert store.put_messages([msg(body=f"c{i}".encode(), queue_id=1) for i in range(5)]).ok
    r = store.get_messages("T", 1, 1, 10, coalesce=True)
    assert len(r.buffers) == 1 and list(r.queue_offsets) == list(range(1, 11))
    same(store.get_messages("T", 1, 1, 10), r)
    r = store.get_messages("T", 1, 3, 32, max_bytes=5 * 94, coalesce=True)  # the byte cap cuts the run
    assert len(r.buffers) == 1 and list(r.queue_offsets) == list(range(3, 8))
    same(store.get_messages("T", 1, 3, 32, max_bytes=5 * 94), r)
    # across the gap the record-by-record read answers
    same(store.get_messages("T", 1, 0, 32), store.get_messages("T", 1, 0, 32, coalesce=True))
    # a filter always takes the record-by-record read
    r = store.get_messages("T", 1, 0, 32, tag_filter=lambda code: True, coalesce=True)
    assert len(r.buffers) == 16
