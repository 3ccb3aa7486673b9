"""A timer checkpoint that is lost (deleted) or unreadable (corrupted): the timer must not skip the messages that
fell due while the broker was down, nor deliver again what it had delivered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kit import FakeClock, eventually

from .conftest import Timer, settle
from .test_service import crash

MakeTimer = Callable[..., Any]


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
@pytest.mark.parametrize("how", ["stop", "crash"])
async def test_a_lost_checkpoint_skips_no_message_due_while_down(make_timer: MakeTimer, tmp_path: Path,
                                                                 damage: str, how: str) -> None:
    path = tmp_path / "lost"
    clock = FakeClock()
    t: Timer = await make_timer(path, clock=clock)
    await settle(t)
    base = clock.now
    t.schedule_many([(f"A{i}", base + 1000 + i) for i in range(20)])  # delivered before the stop
    t.schedule_many([(f"B{i}", base + 5000 + i * 10) for i in range(20)])  # due while the broker is down
    t.schedule_many([(f"C{i}", base + 60_000 + i) for i in range(20)])  # due after the restart
    await eventually(lambda: t.service.enqueue_offset == 60, 5, what="60 indexed")
    clock.advance(2000)
    await settle(t)
    await eventually(lambda: len(t.delivered()) == 20, 5, what="A delivered")
    await settle(t)
    if how == "stop":
        await t.stop()
    else:
        await crash(t)
    ck = path / "config" / "timercheck"
    if damage == "deleted":
        ck.unlink()
    else:
        ck.write_bytes(b"\x00garbage{")
    clock.advance(10_000)  # B falls due while the broker is down
    t2: Timer = await make_timer(path, clock=clock)
    assert t2.service.recovered_abnormally
    await settle(t2)
    await eventually(lambda: len(t2.delivered()) >= 40, 5, what="B delivered after the restart")
    await settle(t2)
    keys = t2.uniq_keys()
    assert sorted(keys) == sorted([f"A{i}" for i in range(20)] + [f"B{i}" for i in range(20)]), Counter(keys)
    clock.advance(50_000)
    await settle(t2)
    await eventually(lambda: len(t2.delivered()) >= 60, 5, what="C delivered at its time")
    await settle(t2)
    keys = t2.uniq_keys()
    assert len(keys) == 60 and Counter(keys).most_common(1)[0][1] == 1, Counter(keys).most_common(3)
    assert t2.service.metrics()["scheduled"] == 0
