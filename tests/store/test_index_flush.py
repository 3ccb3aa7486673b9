"""The index is flushed every flushIntervalIndex, not on every consume-queue pass (each flush makes the randomly
written hash-slot pages fault again); checkpoints never claim past its last flush, so a crash re-indexes the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cometmq.store.message_store import MessageStore
from cometmq.store.retention import MaintenanceService
from tests.kit import FakeClock
from tests.store.conftest import msg, small_config
from tests.store.test_cq_scale import FakeMonotonic
from tests.store.test_read_release import mapped_rss
from tests.store.test_recovery import crash, reopen


def _dispatched(store: MessageStore) -> int:
    return int(json.loads(store.checkpoint_file.read_bytes())["dispatched_offset"])


def _put(store: MessageStore, keys: list[str]) -> int:
    return store.put_messages([msg(keys=k) for k in keys]).end_offset


def test_the_index_is_flushed_every_interval_and_the_checkpoint_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(small_config(tmp_path / "s", flush_interval_consume_queue_ms=3_600_000,
                                      flush_consume_queue_least_pages=0))
    store.start()
    try:
        assert store.config.flush_interval_index_ms == 10_000 and store.index is not None
        flushes = 0
        real = store.index.flush

        def counted() -> None:
            nonlocal flushes
            flushes += 1
            real()

        monkeypatch.setattr(store.index, "flush", counted)
        clock = FakeMonotonic()
        service = MaintenanceService(store, monotonic=clock)
        first = _put(store, ["a", "b"])
        assert store.index_builder is not None and store.index_builder.wait_applied(first, 5)
        service.run_once()  # no flush of the index yet: this pass makes one
        assert flushes == 1 and _dispatched(store) == first
        second = _put(store, ["c"])
        store.index_builder.wait_applied(second, 5)
        clock.t += 1
        service.run_once()  # the queues are flushed, the index is not: the checkpoint stays at its last flush
        assert flushes == 1 and _dispatched(store) == first
        clock.t += 9
        service.run_once()  # nothing new, but the index is behind and due: flushed, the checkpoint catches up
        assert flushes == 2 and _dispatched(store) == second
        clock.t += 20
        service.run_once()  # nothing new and nothing behind: no pass
        assert flushes == 2
    finally:
        store.shutdown()


def test_a_crash_between_index_flushes_loses_no_key(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = reopen(path, clock)
    _put(store, [f"k{i}" for i in range(20)])
    store.flush_and_checkpoint()
    flushed = _dispatched(store)
    end = _put(store, [f"k{i}" for i in range(20, 40)])
    assert store.index_builder is not None and store.index_builder.wait_applied(end, 5)
    store.flush_and_checkpoint(index=False)  # what a pass between index flushes does
    assert _dispatched(store) == flushed < end  # recovery re-dispatches (and re-indexes) the second half
    crash(store)
    store = reopen(path, clock)
    try:
        for i in range(40):
            assert len(store.query_by_key("T", f"k{i}")) == 1, i  # found, and not indexed twice
    finally:
        store.shutdown()


def test_an_idle_pass_drops_the_index_pages_from_the_mapping(tmp_path: Path) -> None:
    """After writes, the first maintenance pass that finds nothing new drops the index's pages from this process's
    mapping (hash slots included, which flushes keep mapped); lookups still find every key."""
    store = MessageStore(small_config(tmp_path / "s", max_hash_slot_num=500_000, max_index_num=100_000,
                                      flush_interval_index_ms=0, commitlog_segment_size=8 << 20,
                                      flush_interval_consume_queue_ms=3_600_000, flush_commitlog_least_pages=0))
    store.start()
    try:
        assert store.index is not None and store.index_builder is not None
        clock = FakeMonotonic()
        service = MaintenanceService(store, monotonic=clock)
        end = 0
        for n in range(0, 20_000, 100):
            end = _put(store, [f"k{i}" for i in range(n, n + 100)])
        assert end > 0 and store.index_builder.wait_applied(end, 10) and store.wait_flushed(end, 10)
        path = store.index.files[-1].path
        clock.t += 1
        service.run_once()  # flushes the index; its slots stay mapped
        assert mapped_rss(path) > 1 << 20
        clock.t += 1
        service.run_once()  # nothing new: dropped
        assert mapped_rss(path) < 64 << 10
        assert all(len(store.query_by_key("T", f"k{i}")) == 1 for i in range(0, 20_000, 997))
        end = _put(store, ["again"])  # written again: the next idle pass drops them again
        assert store.index_builder.wait_applied(end, 10) and store.wait_flushed(end, 10)
        clock.t += 1
        service.run_once()
        clock.t += 1
        service.run_once()
        assert mapped_rss(path) < 64 << 10 and len(store.query_by_key("T", "again")) == 1
    finally:
        store.shutdown()
