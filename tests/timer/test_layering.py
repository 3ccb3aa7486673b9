"""ARCHITECTURE.md layers for the timer package: it may use protocol, common and store; the pure
parts (wheel, timer log, record rewrites, config) use no asyncio; nothing in it reaches net or broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_layers import imports_of

TIMER = Path(__file__).resolve().parents[2] / "src" / "cometmq" / "timer"
NEVER = ("cometmq.net", "cometmq.broker", "cometmq.namesrv", "cometmq.client", "cometmq.proxy")


@pytest.mark.parametrize("path", sorted(TIMER.glob("*.py")), ids=lambda p: p.name)
def test_timer_imports(path: Path) -> None:
    names = imports_of(path)
    assert not [n for n in names if n.startswith(NEVER)]
    if path.name in ("wheel.py", "timerlog.py", "message.py", "config.py"):
        assert "asyncio" not in names and "socket" not in names
