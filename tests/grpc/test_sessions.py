"""The endpoint's client table (grpc/sessions.py) under a flood of new client ids."""

from __future__ import annotations

import time

import pytest

from cometmq.grpc import sessions as sessions_mod
from cometmq.grpc.sessions import Sessions


def test_many_new_client_ids_cost_linear_time_not_quadratic() -> None:
    """Any client names its own client id (the x-mq-client-id header of each request). Each new one made the
    table scan every session for expired ones: 60,000 made-up ids cost ~1.8e9 steps on the event loop. The scan
    now runs at most once a second."""
    table = Sessions()
    t0 = time.perf_counter()
    for i in range(60_000):
        table.get(f"made-up-{i}")
    assert time.perf_counter() - t0 < 5.0  # (~0.1 s now; ~30 s before: a bound that catches the quadratic scan)
    assert len(table) == 60_000


def test_silent_sessions_still_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(sessions_mod.time, "monotonic", lambda: now[0])
    table = Sessions()
    table.get("old")
    now[0] += sessions_mod.SESSION_EXPIRY_S + 1
    table.get("new")  # a new id after the expiry: the silent one goes
    assert table.find("old") is None and table.find("new") is not None
