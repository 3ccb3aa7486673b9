"""Periodic: the step runs every interval, survives a failing pass, runs at once on wakeup, and stops cleanly."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cometmq.common.periodic import Periodic
from tests.kit import eventually


async def test_runs_a_plain_step_every_interval_after_the_first() -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()
    p = Periodic("counting", 0.02, lambda: calls.append(loop.time()))
    started = loop.time()
    p.start()
    assert p.running
    await eventually(lambda: len(calls) >= 3, 5, what="three passes")
    await p.stop()
    assert calls[0] - started >= 0.015  # the first pass waits an interval, as the loops it replaces did
    assert not p.running


async def test_awaits_an_async_step_and_ignores_what_a_plain_one_returns() -> None:
    done: list[str] = []

    async def step() -> None:
        await asyncio.sleep(0)
        done.append("async")

    a = Periodic("async", 0.01, step)
    b = Periodic("returns", 0.01, lambda: [1, 2, 3])  # e.g. a scan that returns what it expired
    a.start()
    b.start()
    await eventually(lambda: len(done) >= 2, 5, what="two async passes")
    await asyncio.sleep(0.03)
    await a.stop()
    await b.stop()


async def test_a_failing_pass_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("bad pass")

    logger = logging.getLogger("tests.periodic")
    p = Periodic("flaky-scan", 0.01, step, logger=logger)
    with caplog.at_level(logging.ERROR, logger="tests.periodic"):
        p.start()
        await eventually(lambda: calls >= 3, 5, what="passes after the failure")
        await p.stop()
    [record] = [r for r in caplog.records if r.name == "tests.periodic"]
    assert "flaky-scan failed a pass" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)


async def test_wakeup_runs_the_step_at_once() -> None:
    ran = asyncio.Event()
    p = Periodic("sleepy", 3600, ran.set)
    p.start()
    await asyncio.sleep(0.01)
    assert not ran.is_set()
    p.wakeup()
    await asyncio.wait_for(ran.wait(), 2)
    await p.stop()


async def test_a_wakeup_during_a_pass_runs_another_pass() -> None:
    calls = 0
    release = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()

    p = Periodic("busy", 3600, step)
    p.start()
    p.wakeup()
    await eventually(lambda: calls == 1, 2, what="the first pass")
    p.wakeup()  # arrives while the first pass runs
    release.set()
    await eventually(lambda: calls == 2, 2, what="the pass the wakeup asked for")
    await p.stop()


async def test_stop_cancels_a_pass_in_progress_and_is_idempotent() -> None:
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def step() -> None:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    p = Periodic("long", 0.001, step)
    await p.stop()  # never started: nothing to do
    p.start()
    await asyncio.wait_for(entered.wait(), 2)
    await p.stop()
    assert cancelled.is_set() and not p.running
    await p.stop()
    p.wakeup()  # after stop: ignored


async def test_the_step_may_stop_its_own_service_and_it_can_start_again() -> None:
    calls = 0
    p: Periodic

    async def step() -> None:
        nonlocal calls
        calls += 1
        await p.stop()
        await asyncio.sleep(0)  # the step goes on after stop: it is not cancelled

    p = Periodic("once", 0.001, step)
    p.start()
    await eventually(lambda: not p.running, 2, what="the service to stop itself")
    assert calls == 1
    p.start()
    await eventually(lambda: calls == 2, 2, what="a pass after the restart")
    await p.stop()


async def test_a_lasting_failure_is_logged_once_a_spell_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    """A step that fails on every pass for one lasting cause (a full disk) logs its traceback once, not once a pass;
    a different failure is logged again; the first pass that succeeds ends the spell with one line."""
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        if calls <= 20:
            raise OSError(28, "No space left on device")
        if calls == 21:
            raise ValueError("another cause")

    logger = logging.getLogger("tests.periodic.spell")
    p = Periodic("full-disk", 0.001, step, logger=logger)
    with caplog.at_level(logging.WARNING, logger="tests.periodic.spell"):
        p.start()
        await eventually(lambda: calls >= 25, 5, what="passes after the spell")
        await p.stop()
    records = [r for r in caplog.records if r.name == "tests.periodic.spell"]
    errors = [r for r in records if r.levelno == logging.ERROR]
    assert [r.exc_info[1].__class__ for r in errors if r.exc_info] == [OSError, ValueError], \
        [r.getMessage() for r in records]
    assert len(errors) == 2
    [end] = [r for r in records if r.levelno == logging.WARNING]
    assert "full-disk passes again, after 21 failed pass(es)" in end.getMessage()


def test_a_service_thread_logs_a_lasting_failure_once_and_repeats_it_as_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    """The thread base (common/service.py) uses the same rule; past ``repeat_s`` the spell is reported again as a
    count of the passes that failed, without a traceback."""
    import threading
    import time

    from cometmq.common.service import ServiceThread

    class Full(ServiceThread):
        def __init__(self) -> None:
            super().__init__("FlushConsumeQueueService", 0.001)
            self.calls = 0
            self.many = threading.Event()

        def run_once(self) -> None:
            self.calls += 1
            if self.calls >= 30:
                self.many.set()
            raise OSError(28, "No space left on device")

        def on_shutdown(self) -> None:
            pass

    svc = Full()
    svc._failures.repeat_s = 3600.0
    with caplog.at_level(logging.ERROR, logger="cometmq.common.service"):
        svc.start()
        assert svc.many.wait(10)
        svc._failures.repeat_s = 0.0  # the next failed pass is past the repeat interval: one count line
        calls = svc.calls
        deadline = time.monotonic() + 10
        while svc.calls < calls + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        svc.stop()
    records = [r for r in caplog.records if r.name == "cometmq.common.service"]
    assert records[0].exc_info is not None and "FlushConsumeQueueService failed a pass" in records[0].getMessage()
    counts = [r for r in records[1:] if "more passes failed so since the last report" in r.getMessage()]
    assert counts and all(r.exc_info is None for r in records[1:])
    assert len(records) < 10  # not one a pass (~30 passes and more failed)
