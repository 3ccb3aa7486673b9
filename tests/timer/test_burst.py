"""Many messages due together: read ahead sooner, delivered with the key index and the garbage collector
held off, everything delivered once and findable afterwards."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import cometmq.store.index_builder as index_builder
from cometmq.store.message import MessageInner
from cometmq.timer.slotwork import BurstGcPause
from tests.kit import FakeClock, eventually

from .conftest import Timer, settle

MakeTimer = Callable[..., Awaitable[Any]]


@pytest.fixture
def gc_restored() -> Any:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_gc_pause_holds_the_collector_off_and_gives_it_back(gc_restored: None) -> None:
    gc.enable()
    pause = BurstGcPause(max_s=30)
    pause.hold()
    assert not gc.isenabled() and pause.active and pause.pauses == 1
    pause.hold()  # holding again changes nothing
    assert pause.pauses == 1
    pause.release()
    assert gc.isenabled() and not pause.active
    pause.release()  # releasing twice is harmless
    assert gc.isenabled()
    pause.hold()  # a burst right after another may hold it again at once
    assert not gc.isenabled() and pause.pauses == 2
    pause.release()
    assert gc.isenabled()


def test_gc_pause_is_bounded_and_leaves_a_collector_others_turned_off_alone(gc_restored: None) -> None:
    gc.enable()
    pause = BurstGcPause(max_s=0.02)
    pause.hold()
    time.sleep(0.05)
    pause.hold()  # past max_s: the collector runs again ...
    assert gc.isenabled() and not pause.active
    pause.hold()  # ... for at least as long before it may pause again
    assert gc.isenabled() and pause.pauses == 1
    gc.disable()
    other = BurstGcPause(max_s=30)
    other.hold()
    other.release()
    assert not gc.isenabled() and other.pauses == 0


async def test_index_builder_deferral_keeps_lookups_right(make_timer: MakeTimer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    t: Timer = await make_timer()
    builder = t.store.index_builder
    assert builder is not None
    builder.defer(30)
    msgs = [MessageInner(topic="IX", body=b"x", properties={"UNIQ_KEY": f"U{i}", "KEYS": f"k{i}"})
            for i in range(10)]
    assert t.store.put_messages(msgs).ok
    await asyncio.sleep(0.3)  # several passes of the builder's thread: none indexed while deferred
    assert builder.applied_offset < builder.submitted_offset
    [found] = t.store.query_by_key("IX", "k3")  # a lookup indexes what is queued itself
    assert found is not None and builder.applied_offset == builder.submitted_offset
    monkeypatch.setattr(index_builder, "MAX_DEFER_S", 0.1)
    builder.defer(30)
    assert t.store.put_messages([MessageInner(topic="IX", body=b"y", properties={"KEYS": "late"})]).ok
    # deferred longer than MAX_DEFER_S at a stretch: the thread indexes anyway
    await eventually(lambda: builder.applied_offset == builder.submitted_offset, 10,
                     what="the builder to apply all it was given")


async def test_a_burst_slot_is_read_ahead_sooner_and_delivered_whole(make_timer: MakeTimer,
                                                                     gc_restored: None) -> None:
    gc.enable()
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock, burst_messages=50, prefetch_ms=1000, burst_prefetch_ms=10_000)
    svc = t.service
    due = clock.now + 60_000
    small_due = due + 5000
    t.schedule_many([(f"B{i:03}", due) for i in range(120)] + [(f"S{i}", small_due) for i in range(5)])
    await eventually(lambda: svc.enqueue_offset == 125, 5, what="125 indexed")
    await settle(t)
    assert svc.metrics()["prefetched"] == 0  # neither is near yet
    clock.now = due - 8000  # beyond prefetch_ms, within burst_prefetch_ms
    await settle(t)
    assert svc.metrics()["prefetched"] == 120  # the burst is ready; the small slot 13 s away is not
    clock.now = due
    await settle(t)
    await eventually(lambda: len(t.uniq_keys()) == 120, 5, what="120 delivered")
    assert t.uniq_keys() == [f"B{i:03}" for i in range(120)]  # once each, in the order they were sent
    assert svc._gc_pause.pauses == 1 and gc.isenabled()  # held off for the burst, given back after it
    assert [r.properties["UNIQ_KEY"] for r in map(_decode, t.store.query_by_key("T", "B007"))] == ["B007"]
    clock.now = small_due
    await settle(t)
    await eventually(lambda: len(t.uniq_keys()) == 125, 5, what="125 delivered")
    assert svc._gc_pause.pauses == 1  # five messages are no burst
    assert svc.stats.delivered == 125 and svc.metrics()["scheduled"] == 0


async def test_a_small_slot_is_read_ahead_only_within_prefetch_ms(make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock, burst_messages=1000, prefetch_ms=1000, burst_prefetch_ms=10_000)
    svc = t.service
    due = clock.now + 60_000
    t.schedule_many([(f"N{i}", due) for i in range(120)])
    await eventually(lambda: svc.enqueue_offset == 120, 5, what="120 indexed")
    clock.now = due - 8000
    await settle(t)
    assert svc.metrics()["prefetched"] == 0
    clock.now = due - 500
    await settle(t)
    assert svc.metrics()["prefetched"] == 120


def _decode(view: memoryview) -> Any:
    from cometmq.protocol.message import decode_record

    return decode_record(view)[0]
