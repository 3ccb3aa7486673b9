"""The per-node liveness table: time passed in, RocketMQ's timeout rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cometmq.controller.heartbeats import DEFAULT_TIMEOUT_MS, LOWEST_PRIORITY, BrokerIdentity, HeartbeatTable, LiveInfo

A1 = BrokerIdentity("DefaultCluster", "broker-a", 1)
A2 = BrokerIdentity("DefaultCluster", "broker-a", 2)
B1 = BrokerIdentity("DefaultCluster", "broker-b", 1)


def test_alive_until_the_timeout_inclusive() -> None:
    table = HeartbeatTable()
    assert table.on_heartbeat(A1, "127.0.0.1:10911", 1_000) is True
    assert table.is_alive(A1, 1_000 + DEFAULT_TIMEOUT_MS)
    assert not table.is_alive(A1, 1_000 + DEFAULT_TIMEOUT_MS + 1)
    assert not table.is_alive(A2, 1_000)


def test_defaults_for_missing_fields_and_own_timeout() -> None:
    table = HeartbeatTable(default_timeout_ms=3_000)
    table.on_heartbeat(A1, "h:1", 0)
    info = table.get(A1)
    assert info == LiveInfo(1, "h:1", 0, 3_000, -1, -1, -1, LOWEST_PRIORITY)
    table.on_heartbeat(A1, "h:1", 10, epoch=3, max_offset=99, confirm_offset=50, timeout_ms=500, priority=2)
    assert table.get(A1) == LiveInfo(1, "h:1", 10, 500, 3, 99, 50, 2)
    assert table.is_alive(A1, 510) and not table.is_alive(A1, 511)


def test_the_latest_report_wins_even_if_lower() -> None:
    # a broker that truncated its log must not keep ranking by offsets it no longer has
    table = HeartbeatTable()
    table.on_heartbeat(A1, "h:1", 0, epoch=5, max_offset=1000)
    table.on_heartbeat(A1, "h:1", 1, epoch=5, max_offset=700)
    info = table.get(A1)
    assert info is not None and info.max_offset == 700


def test_heartbeat_after_expiry_counts_as_new() -> None:
    table = HeartbeatTable(default_timeout_ms=100)
    assert table.on_heartbeat(A1, "h:1", 0)
    assert not table.on_heartbeat(A1, "h:1", 50)
    assert table.on_heartbeat(A1, "h:1", 500)


def test_expire_removes_only_the_silent() -> None:
    table = HeartbeatTable(default_timeout_ms=100)
    table.on_heartbeat(A1, "h:1", 0)
    table.on_heartbeat(A2, "h:2", 50)
    table.on_heartbeat(B1, "h:3", 0, timeout_ms=1_000)
    assert table.expire(120) == [A1]
    assert [who for who, _ in table] == [A2, B1]
    assert table.expire(151) == [A2]
    assert len(table) == 1


def test_touch_refreshes_a_known_broker_only() -> None:
    table = HeartbeatTable(default_timeout_ms=100)
    table.on_heartbeat(A1, "h:1", 0, max_offset=7)
    table.touch(A1, 90)
    table.touch(A2, 90)
    assert table.is_alive(A1, 190) and table.get(A2) is None
    info = table.get(A1)
    assert info is not None and info.max_offset == 7


def test_remove_by_identity_and_by_address() -> None:
    table = HeartbeatTable()
    table.on_heartbeat(A1, "h:1", 0)
    table.on_heartbeat(A2, "h:2", 0)
    table.on_heartbeat(B1, "h:1", 0)
    assert table.remove_address("h:1") == [A1, B1]
    assert table.remove(A2) is not None and table.remove(A2) is None
    assert len(table) == 0


def test_group_returns_one_groups_records_by_id() -> None:
    table = HeartbeatTable()
    table.on_heartbeat(A2, "h:2", 0)
    table.on_heartbeat(B1, "h:3", 0)
    table.on_heartbeat(A1, "h:1", 0)
    assert [i.broker_id for i in table.group("DefaultCluster", "broker-a")] == [1, 2]
    assert table.group("Other", "broker-a") == ()


@given(st.lists(st.tuples(st.sampled_from([A1, A2, B1]), st.integers(0, 1_000), st.integers(1, 300)), max_size=30),
       st.integers(0, 2_000))
def test_expire_agrees_with_is_alive(beats: list[tuple[BrokerIdentity, int, int]], now: int) -> None:
    table = HeartbeatTable()
    for who, at, timeout in sorted(beats, key=lambda b: b[1]):
        table.on_heartbeat(who, "h", at, timeout_ms=timeout)
    alive = {who for who, _ in table if table.is_alive(who, now)}
    gone = set(table.expire(now))
    assert not alive & gone
    assert {who for who, _ in table} == alive


def test_live_info_json_round_trip() -> None:
    info = LiveInfo(3, "h:9", 12, 34, 5, 6, 7, 8)
    assert LiveInfo.from_json(info.to_json()) == info
