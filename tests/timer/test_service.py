"""The timer service on a real MessageStore: exact-time delivery, bursts, past-due, cancel, rolling
(40 days with an injected clock), the window edge, restarts without duplicates, crash replay."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cometmq.protocol.properties import REAL_QID, REAL_TOPIC
from cometmq.store.message import MessageInner
from cometmq.timer.message import (
    TIMER_OUT_MS,
    TIMER_ROLL_TIMES,
    TIMER_SRC_PHY,
    TIMER_TOPIC,
    Rewrite,
    delete_marker,
    rewrite_for_timer,
)
from cometmq.timer.timerlog import UNIT_SIZE
from tests.kit import START_MS, FakeClock, eventually, wall_ms

from .conftest import Timer, settle

MakeTimer = Callable[..., Any]
DAY = 86_400_000


async def test_delivers_each_message_at_its_time_never_early(make_timer: MakeTimer) -> None:
    t: Timer = await make_timer()
    now = wall_ms()
    t.schedule_many([(f"U{i}", now + 300 + i * 7) for i in range(150)])
    t.schedule("Q2", now + 350, queue_id=2, TAGS="tag")
    await asyncio.sleep(0.2)
    assert t.delivered() == []  # nothing early
    await eventually(lambda: len(t.delivered()) == 150, 5, what="150 delivered")
    for rec in t.delivered():
        due = int(rec.properties[TIMER_OUT_MS])
        assert due <= rec.store_timestamp < due + 250, (due, rec.store_timestamp)
        assert rec.properties["UNIQ_KEY"] == rec.body.decode()  # the message id is kept
        assert REAL_TOPIC not in rec.properties and REAL_QID not in rec.properties
        assert TIMER_SRC_PHY in rec.properties
    [q2] = t.delivered(queue_id=2)  # the real queue is kept, and the tag
    assert q2.properties["UNIQ_KEY"] == "Q2" and q2.tags == "tag"
    m = t.service.metrics()
    assert (m["delivered"], m["scheduled"], m["dueUndelivered"], m["lost"]) == (151, 0, 0, 0)
    assert m["lateness"]["count"] == 151 and m["lateness"]["maxMs"] < 250


async def test_a_burst_in_one_slot_does_not_stall_the_next(make_timer: MakeTimer) -> None:
    t: Timer = await make_timer()
    due = (wall_ms() // 100 + 8) * 100
    t.schedule_many([(f"B{i}", due) for i in range(20_000)])
    t.schedule("NEXT", due + 100)
    await eventually(lambda: t.service.stats.delivered == 20_001, 20, what="20001 delivered")
    recs = t.delivered()
    assert len(recs) == 20_001 and len({r.properties["UNIQ_KEY"] for r in recs}) == 20_001
    late = [r.store_timestamp - int(r.properties[TIMER_OUT_MS]) for r in recs]
    assert min(late) >= 0 and max(late) < 3000
    nxt = next(r for r in recs if r.properties["UNIQ_KEY"] == "NEXT")
    assert nxt.store_timestamp - (due + 100) < 3000
    assert t.puts < 20_001 // 100  # batched through the store's batch append


async def test_past_due_records_are_delivered_at_once(make_timer: MakeTimer) -> None:
    t: Timer = await make_timer()
    now = wall_ms()
    # A record that waited in the timer topic (an indexing backlog): already due when indexed.
    m = MessageInner(topic=TIMER_TOPIC, body=b"late", properties={
        "UNIQ_KEY": "LATE", TIMER_OUT_MS: str(now - 5000), REAL_TOPIC: "T", REAL_QID: "0"})
    assert t.store.put_messages([m]).ok
    await eventually(lambda: len(t.delivered()) == 1, 3, what="one delivered")
    assert t.service.stats.lateness.max_ms >= 5000
    # A send whose time has already passed is stored as an ordinary message.
    t.schedule("PAST", now - 1)
    assert [r.properties["UNIQ_KEY"] for r in t.delivered()] == ["LATE", "PAST"]


async def test_cancel_before_due(make_timer: MakeTimer) -> None:
    t: Timer = await make_timer()
    now = wall_ms()
    due = (now // 100 + 5) * 100 + 30
    t.schedule("KEEP", due)
    t.schedule("DROP", due)
    t.schedule("OTHER-TOPIC", due, topic="T2")
    t.cancel("DROP", due)
    t.cancel("OTHER-TOPIC", due)  # names T + OTHER-TOPIC: a different message, nothing cancelled
    assert t.service.metrics()["scheduled"] <= 3
    await eventually(lambda: t.service.stats.delivered == 2, 3, what="two delivered")
    await asyncio.sleep(0.2)
    assert t.uniq_keys() == ["KEEP"] and t.uniq_keys("T2") == ["OTHER-TOPIC"]
    assert t.service.stats.cancelled == 1


async def test_cancel_in_the_open_slot_and_after_delivery(make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock)
    slot_start = (clock.now // 100 + 3) * 100
    t.schedule("A", slot_start + 50)
    t.schedule("B", slot_start + 60)
    clock.now = slot_start  # the slot opens; A and B wait for their exact times
    await settle(t)
    assert t.service._cur is not None and t.service._cur.slot == slot_start // 100
    t.cancel("A", slot_start + 50)  # a marker for the open slot
    await settle(t)
    clock.now = slot_start + 55
    await settle(t)
    assert t.uniq_keys() == []
    clock.now = slot_start + 60
    await settle(t)
    assert t.uniq_keys() == ["B"]
    # After its time a message cannot be cancelled: the marker is refused (the broker answers
    # ILLEGAL_OPERATION to RECALL_MESSAGE), and B stays delivered once.
    m = delete_marker("T", "B", slot_start + 60, producer_group=None, born_ms=clock.now, born_host=bytes(8))
    assert rewrite_for_timer(m, clock.now, t.config.max_delay_ms).outcome is Rewrite.ILLEGAL
    clock.advance(1000)
    await settle(t)
    assert t.uniq_keys() == ["B"] and t.service.stats.cancelled == 1


async def test_forty_day_delay_rolls_and_arrives_on_time(make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock)
    due = clock.now + 40 * DAY + 1234
    t.schedule("FAR", due)
    t.schedule("NEAR", clock.now + 1000)
    while clock.now < due - 6 * 3_600_000:
        clock.advance(6 * 3_600_000)
        await settle(t, 1)
        await eventually(lambda: t.service._cur is None or t.service._cur.next_at() is None, 5,
                         what="the current slot to have nothing left")
    await settle(t)
    assert t.uniq_keys() == ["NEAR"]
    assert t.service.stats.rolled >= 39
    assert t.service.metrics()["scheduled"] == 1
    clock.now = due - 1
    await settle(t)
    assert t.uniq_keys() == ["NEAR"]
    clock.now = due
    await settle(t)
    recs = t.delivered()
    assert [r.properties["UNIQ_KEY"] for r in recs] == ["NEAR", "FAR"]
    assert recs[1].store_timestamp == due and int(recs[1].properties[TIMER_ROLL_TIMES]) >= 39


async def test_window_edge(make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock, roll_window_slot=100)  # a 10 s window of 100 ms slots
    t.schedule("INSIDE", clock.now + 99 * 100)
    t.schedule("EDGE", clock.now + 100 * 100)
    await eventually(lambda: t.service.enqueue_offset == 2, 5,
                     what="both indexed")  # indexed at the time they were sent
    for _ in range(9):
        clock.advance(1000)
        await settle(t, 1)
    for at in (9900, 10_000):
        clock.now = START_MS + at
        await settle(t)
    assert t.uniq_keys() == ["INSIDE", "EDGE"]
    assert t.service.stats.rolled == 1
    recs = t.delivered()
    assert TIMER_ROLL_TIMES not in recs[0].properties and recs[1].properties[TIMER_ROLL_TIMES] == "1"
    assert [r.store_timestamp - int(r.properties[TIMER_OUT_MS]) for r in recs] == [0, 0]


async def test_clean_restart_delivers_nothing_twice(make_timer: MakeTimer, tmp_path: Path) -> None:
    path = tmp_path / "restart"
    t: Timer = await make_timer(path)
    now = wall_ms()
    n = 3000
    t.schedule_many([(f"R{i}", now + 400 + i * 800 // n) for i in range(n)])
    await eventually(lambda: len(t.delivered()) > 200, 5, what="over 200 delivered before the crash", step=0.001)
    await t.stop()
    before = t.service.stats.delivered
    assert 0 < before < n
    t2: Timer = await make_timer(path)
    await eventually(lambda: len(t2.delivered()) >= n, 10, what="every message delivered after the restart")
    await asyncio.sleep(0.3)
    keys = t2.uniq_keys()
    assert len(keys) == n and Counter(keys).most_common(1)[0][1] == 1
    for rec in t2.delivered():
        assert rec.store_timestamp >= int(rec.properties[TIMER_OUT_MS])
    assert not t2.service.recovered_abnormally


async def crash(t: Timer) -> None:
    """Stop the timer as kill -9 would: no final checkpoint, files left as they are."""
    svc = t.service
    for task in svc._tasks:
        task.cancel()
    await asyncio.gather(*svc._tasks, return_exceptions=True)
    svc._tasks = []
    svc._close_files()
    svc.loaded = False
    t.store.shutdown()


async def test_crash_replays_without_loss_or_duplicates(make_timer: MakeTimer, tmp_path: Path) -> None:
    path = tmp_path / "crash"
    t: Timer = await make_timer(path, flush_interval_ms=200)
    now = wall_ms()
    n = 4000
    t.schedule_many([(f"C{i}", now + 300 + i * 900 // n) for i in range(n)])
    await eventually(lambda: len(t.delivered()) > 300, 5, what="over 300 delivered before the crash", step=0.001)
    await crash(t)
    t2: Timer = await make_timer(path, flush_interval_ms=200)
    assert t2.service.recovered_abnormally
    await eventually(lambda: len(t2.delivered()) >= n, 10, what="every message delivered after the restart")
    await asyncio.sleep(0.3)
    keys = t2.uniq_keys()
    assert len(keys) == n and Counter(keys).most_common(1)[0][1] == 1


async def test_crash_with_a_torn_timer_log_tail(make_timer: MakeTimer, tmp_path: Path) -> None:
    path = tmp_path / "torn"
    clock = FakeClock()
    t: Timer = await make_timer(path, clock=clock, flush_interval_ms=10_000)
    await settle(t)
    t.schedule_many([(f"X{i}", clock.now + 5000 + i) for i in range(50)])
    await eventually(lambda: t.service.enqueue_offset == 50, 5, what="50 indexed")
    tl = t.service._tl()
    last = tl.write_pos - UNIT_SIZE
    await crash(t)
    seg = path / "timerlog" / f"{last - last % tl.file_size:020d}"
    with open(seg, "r+b") as f:  # the newest entry torn: the wheel now points past the log's end
        f.seek(last % tl.file_size + 20)
        f.write(b"\xff\xff")
    t2: Timer = await make_timer(path, clock=clock)
    assert t2.service.recovered_abnormally
    await eventually(lambda: t2.service.enqueue_offset == 50, 5, what="50 indexed after the restart")
    clock.advance(6000)
    await settle(t2)
    await eventually(lambda: len(t2.delivered()) == 50, 5, what="50 delivered after the restart")
    assert sorted(t2.uniq_keys()) == sorted(f"X{i}" for i in range(50))


async def test_records_stored_before_start_are_indexed_from_the_queue(tmp_path: Path) -> None:
    t = Timer(tmp_path / "early")
    t.store.start()
    now = wall_ms()
    t.schedule_many([(f"E{i}", now + 200) for i in range(10)])
    t.store.add_arrival_listener(t.service.on_arrival)
    await t.service.start()
    try:
        await eventually(lambda: len(t.delivered()) == 10, 3, what="10 delivered")
    finally:
        await t.stop()


async def test_delivered_timer_log_segments_are_deleted(make_timer: MakeTimer) -> None:
    t: Timer = await make_timer(timerlog_file_size=4096)  # 73 entries per segment
    now = wall_ms()
    t.schedule_many([(f"S{i}", now + 100 + i) for i in range(500)])
    await eventually(lambda: len(t.delivered()) == 500, 5, what="500 delivered")
    await eventually(lambda: len(t.service._tl().segment_starts()) == 1, 5,
                     what="the timer log rolled down to one segment")


async def test_metrics_scheduled_and_due_backlog(make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock)
    t.schedule_many([(f"M{i}", clock.now + 5000 + i) for i in range(10)])
    t.schedule("LATER", clock.now + 60_000)
    await eventually(lambda: t.service.enqueue_offset == 11, 5, what="11 indexed")
    m = t.service.metrics()
    assert (m["scheduled"], m["dueUndelivered"], m["enqueueLag"]) == (11, 0, 0)
    clock.advance(6000)  # due, but the dequeue has not run yet
    assert t.service.metrics()["dueUndelivered"] == 10
    await settle(t)
    m = t.service.metrics()
    assert (m["scheduled"], m["dueUndelivered"], m["delivered"]) == (1, 0, 10)
    assert m["lateness"]["counts"][-1] == 0 and m["lateness"]["count"] == 10


async def test_a_changed_precision_waits_until_nothing_is_pending(make_timer: MakeTimer, tmp_path: Path) -> None:
    path = tmp_path / "geo"
    clock = FakeClock()
    t: Timer = await make_timer(path, clock=clock)
    t.schedule("G", clock.now + 10_000)
    await eventually(lambda: t.service.enqueue_offset == 1, 5, what="one indexed")
    await t.stop()
    t2: Timer = await make_timer(path, clock=clock, precision_ms=1000)
    assert t2.service.precision_ms == 100  # kept: a message is pending on the old wheel
    clock.advance(10_000)
    await settle(t2)
    assert t2.uniq_keys() == ["G"]
    await t2.stop()
    t3: Timer = await make_timer(path, clock=clock, precision_ms=1000)
    assert t3.service.precision_ms == 1000
    t3.schedule("H", clock.now + 3000)
    clock.advance(3000)
    await settle(t3)
    await eventually(lambda: t3.uniq_keys() == ["G", "H"], 5, what="G and H delivered")
    assert clock.now > START_MS


async def test_read_ahead_is_not_skipped_when_the_clock_moves_between_step_and_deadline(
        make_timer: MakeTimer) -> None:
    clock = FakeClock()
    t: Timer = await make_timer(clock=clock)
    svc = t.service
    due = clock.now + 20_000
    t.schedule_many([(f"P{i}", due) for i in range(10)])
    await eventually(lambda: svc.enqueue_offset == 10, 5, what="10 indexed")
    await settle(t)
    # One step 1 ms before the slot enters the read-ahead horizon, the deadline computed 1 ms later.
    clock.now = due - svc.config.prefetch_ms - 1
    assert svc._prefetch_step(clock.now) is False
    clock.now += 1
    deadline = svc._next_deadline()
    assert deadline is not None and deadline <= clock.now  # read ahead now, not when the slot opens
    await settle(t)
    assert svc.metrics()["prefetched"] == 10


def test_a_load_that_fails_closes_what_it_opened(tmp_path: Path) -> None:
    """The wheel's file cannot be opened (a directory in its place): the load raises, and the TimerLog it had opened
    is closed again (the broker tries the build again later, tests/timer/test_broker_timer.py)."""
    timer = Timer(tmp_path / "store")
    timer.store.start()
    try:
        timer.service.wheel_path.mkdir(parents=True)
        with pytest.raises(IsADirectoryError):
            timer.service.load()
        assert timer.service.timerlog is None and timer.service.wheel is None and not timer.service.loaded
    finally:
        timer.store.shutdown()
async def test_a_recall_older_than_its_rolled_message_still_cancels_it(make_timer: MakeTimer, tmp_path: Path) -> None:
    """A marker sent while its message is out on a roll is linked into the due slot before the message's roll copy,
    so the newest-first walk meets the message first. Opened after a restart (no read-ahead), the slot is walked
    in chunks: the message must not be put before the walk reaches its marker."""
    path = tmp_path / "rolled-recall"
    clock = FakeClock()
    clock.now = (clock.now // 100 + 1) * 100
    t0 = clock.now
    due = t0 + 1050
    t: Timer = await make_timer(path, clock=clock, roll_window_slot=8, dequeue_chunk=4)  # a 0.8 s window
    t.schedule("GONE", due)  # 10 slots ahead: rolled
    await settle(t)
    clock.now = t0 + 300
    await settle(t)
    t.cancel("GONE", due)  # 7 slots ahead: linked into the due slot at once
    t.schedule_many([(f"F{i}", due + i) for i in range(10)])
    await settle(t)
    clock.now = t0 + 700  # the roll slot: GONE comes back, into the due slot, after its marker
    await settle(t)
    assert t.service.stats.rolled == 1 and t.uniq_keys() == []
    await t.stop()
    clock.now = t0 + 3000
    t2: Timer = await make_timer(path, clock=clock, roll_window_slot=8, dequeue_chunk=4)
    await settle(t2)
    await eventually(lambda: len(t2.delivered()) >= 10, 5, what="the ten others delivered")
    await settle(t2)
    assert sorted(t2.uniq_keys()) == sorted(f"F{i}" for i in range(10))
    assert t2.service.stats.cancelled == 1
