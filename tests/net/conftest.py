"""Each test starts with a fresh rate limiter for connection warnings (net/limits.py), so a line one test expects
is not held back because an earlier test logged the same peer and reason."""

from __future__ import annotations

import pytest

from cometmq.net.limits import limited_log


@pytest.fixture(autouse=True)
def _fresh_connection_log_limiter() -> None:
    limited_log._last.clear()
