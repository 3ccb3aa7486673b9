"""The broker's stats line counts what producers stored and consumers were handed, and statsLogIntervalSec
switches it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from cometmq.broker.config import load_broker_conf
from cometmq.broker.stats_log import Totals
from cometmq.net.client import RemotingClient
from tests.broker.conftest import StartBroker, send_request


async def test_stats_totals_count_stored_and_handed_out(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(stats_log_interval_s=0)  # metrics off: the counters are kept all the same
    assert not b.stats_log._periodic.running
    for i in range(5):
        reply = await client.invoke(b.addr, send_request("StatsT", b"x%d" % i), 5)
        assert reply.code == 0
    b.offsets.commit("g", "StatsT", 0, 2)  # a commit hands nothing out: not counted
    assert b._stats_totals() == Totals(5, 0)
    b.stats.got("StatsT", "g", 0, 2, 200, 2)
    assert b._stats_totals() == Totals(5, 2)
    line = b.stats_log.line()
    assert line.startswith(f"[BROKER] {b.config.broker_name} putTps") and "topics" in line and "diskRatio" in line
    assert "putTotal 5 getTotal 2" in line


async def test_the_line_is_logged_every_interval(start_broker: StartBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cometmq.broker.stats")
    b = await start_broker(stats_log_interval_s=0.05)
    assert b.stats_log._periodic.running
    for _ in range(100):
        if any("[BROKER]" in r.getMessage() for r in caplog.records):
            break
        await asyncio.sleep(0.02)
    assert any("putTps" in r.getMessage() for r in caplog.records)


def test_stats_interval_key(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("statsLogIntervalSec=0\n")
    assert load_broker_conf(conf).stats_log_interval_s == 0
    conf.write_text("")
    assert load_broker_conf(conf).stats_log_interval_s == 60


async def test_with_metrics_on_the_line_reads_the_counters(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(stats_log_interval_s=0, metrics_exporter_type="PROM")
    assert b.stats is not None
    for i in range(3):
        assert (await client.invoke(b.addr, send_request("StatsM", b"m%d" % i), 5)).code == 0
    b.offsets.commit("g", "StatsM", 0, 1)  # committed offsets are not what it counts now
    assert b._stats_totals() == Totals(3, 0)
    b.stats.got("StatsM", "g", 0, 2, 200, 2)
    assert b._stats_totals() == Totals(3, 2)
