"""The testing kit itself: the fake clock moves only when told, the waits return or fail naming their subject."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.kit import START_MS, FakeClock, eventually, wait_until, wall_ms


def test_clock_stands_still_until_advanced() -> None:
    clock = FakeClock()
    assert clock() == clock.now == START_MS
    time.sleep(0.002)
    assert clock() == START_MS
    clock.advance(1500)
    assert clock() == START_MS + 1500
    assert clock.seconds() == (START_MS + 1500) / 1000


def test_clock_start_is_settable_and_now_assignable() -> None:
    clock = FakeClock(1000)
    assert clock() == 1000
    clock.now = 5000
    assert clock() == 5000
    clock.advance(1)
    assert clock.now == 5001
    before = wall_ms()
    assert before <= FakeClock(None)() <= wall_ms()


def test_ticking_clock_follows_real_time_plus_advances() -> None:
    clock = FakeClock(0, ticking=True)
    clock.advance(60_000)
    time.sleep(0.02)
    assert 60_020 <= clock() < 62_000
    clock.now = 100
    assert 100 <= clock() < 200


async def test_eventually_returns_once_true() -> None:
    ticks = 0

    def pred() -> bool:
        nonlocal ticks
        ticks += 1
        return ticks >= 3

    took = await eventually(pred, 1, what="three ticks", step=0.001)
    assert ticks == 3 and 0 <= took < 1


async def test_eventually_awaits_an_async_predicate() -> None:
    calls: list[int] = []

    async def pred() -> bool:
        calls.append(1)
        await asyncio.sleep(0)
        return len(calls) == 2

    await eventually(pred, 1, what="the second call", step=0.001)
    assert len(calls) == 2


async def test_eventually_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the moon"):
        await eventually(lambda: False, 0.05, what="the moon")


def test_wait_until_returns_elapsed_and_fails_naming_its_subject() -> None:
    deadline = time.monotonic() + 0.03
    took = wait_until(lambda: time.monotonic() >= deadline, 2, "30 ms", step=0.005)
    assert 0.02 <= took < 2
    with pytest.raises(AssertionError, match=r"timed out after 0.02s waiting for a miracle"):
        wait_until(lambda: False, 0.02, "a miracle", step=0.005)
