"""Commit-log retention and pending timer messages: a fileReservedTime shorter than a message's wait must not delete
the record the timer will put (the message was acknowledged); a forced clean (disk full) that must is logged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import decode_record
from cometmq.store.message import MessageInner
from cometmq.timer.message import TIMER_TOPIC
from tests.broker.conftest import StartBroker, props, send_request
from tests.kit import FakeClock, eventually

from .conftest import Timer, settle

MakeTimer = Callable[..., Any]
#: 64 KiB segments kept 3.6 s after their last write
SHORT_RETENTION = {"commitlog_segment_size": 64 << 10, "max_message_size": 16 << 10, "file_reserved_time_h": 0.001}


def fill(t: Timer, segments: int) -> None:
    """Plain messages filling about ``segments`` commit-log segments."""
    msgs = [MessageInner(topic="F", body=b"x" * 1000, properties={"UNIQ_KEY": f"F{i}"}) for i in range(64 * segments)]
    for i in range(0, len(msgs), 16):
        assert t.store.put_messages(msgs[i:i + 16]).ok


async def schedule_and_fill(t: Timer, clock: FakeClock) -> int:
    """One timer message due in a minute, then four segments of other messages; the log's offset of its record."""
    await settle(t)
    t.schedule("LATER", clock.now + 60_000)
    await eventually(lambda: t.service.enqueue_offset == 1, 5, what="the timer message indexed")
    record = t.service._tl().read(t.service._tl().min_pos)
    assert record is not None
    fill(t, 4)
    clock.advance(5_000)  # every segment but the newest is past its reserved time
    await settle(t)
    await t.service.checkpoint()
    return record.offset_py


async def test_retention_keeps_the_record_of_a_pending_timer_message(make_timer: MakeTimer, tmp_path: Path) -> None:
    clock = FakeClock(None)  # (retention compares the clock with the segments' file times)
    t: Timer = await make_timer(tmp_path / "keep", clock=clock, store_changes=SHORT_RETENTION)
    offset = await schedule_and_fill(t, clock)
    t.store.cleaner.delete_expired(clock.now)
    assert t.store.commitlog.min_offset <= offset, "the pending timer message's record was deleted"
    clock.advance(60_000)
    await settle(t)
    await eventually(lambda: t.uniq_keys() == ["LATER"], 5, what="the timer message delivered")
    assert t.service.stats.lost == 0
    # Delivered (and checkpointed): nothing holds its record any more.
    await settle(t)
    await t.service.checkpoint()
    clock.advance(5_000)
    t.store.cleaner.delete_expired(clock.now)
    assert t.store.commitlog.min_offset > offset, "retention stayed held after the delivery"


async def test_a_forced_clean_that_deletes_a_pending_timer_record_says_so(
        make_timer: MakeTimer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(None)
    t: Timer = await make_timer(tmp_path / "force", clock=clock, store_changes=SHORT_RETENTION)
    offset = await schedule_and_fill(t, clock)
    with caplog.at_level(logging.ERROR):
        t.store.cleaner.delete_expired(clock.now, force=True)  # the disk is full: the oldest segment goes
    assert t.store.commitlog.min_offset > offset
    assert any(r.levelno >= logging.ERROR and "timer" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        clock.advance(60_000)
        await settle(t)
        await eventually(lambda: t.service.stats.lost == 1, 5, what="the loss counted")
    assert any(r.levelno >= logging.ERROR and "retention" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


async def test_a_broker_with_short_retention_delivers_its_timer_message(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """fileReservedTime (about a second here) shorter than a timer message's wait: the broker's retention deletes
    the expired segments before the timer record's, keeps that one, and the message is delivered."""
    b = await start_broker(tmp_path / "b", store_commitlog_segment_size=64 << 10, store_max_message_size=16 << 10,
                           store_file_reserved_time_h=0.0003)

    async def fill(n: int) -> None:
        for i in range(n):
            reply = await client.invoke(b.addr, send_request("F", b"x" * 4000, 0, props(UNIQ_KEY=f"F{time.time()}{i}")))
            assert reply.code == ResponseCode.SUCCESS, reply.remark

    await fill(20)  # more than a segment before the timer message
    reply = await client.invoke(b.addr, send_request("T", b"later", 0, props(UNIQ_KEY="LATER", TIMER_DELAY_MS="3000")))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    await fill(40)
    await eventually(lambda: b.store.max_offset(TIMER_TOPIC, 0) == 1, 5, what="the timer record stored")
    unit = b.store.queues[(TIMER_TOPIC, 0)].get_unit(0)
    assert unit is not None
    record = unit[0]
    await asyncio.sleep(1.5)  # every segment but the newest is past its reserved time
    b.store.cleaner.delete_expired(b.store.clock())
    assert 0 < b.store.commitlog.min_offset <= record, (b.store.commitlog.min_offset, record)
    await eventually(lambda: b.store.max_offset("T", 0) == 1, 10, what="the timer message delivered")
    got = b.store.get_messages("T", 0, 0, 1)
    assert decode_record(got.buffers[0])[0].body == b"later"
