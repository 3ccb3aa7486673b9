"""A replica promoted while its log ends inside a record (as processes).

The master ships its log in frames of at most ``haTransferBatchSize`` bytes that need not end at a record
boundary, so a replica whose master dies mid-stream holds a torn last record. Becoming master it must cut that
invalid tail (reference/controller-ha.md §1.3, "cut invalid tail"; RocketMQ's truncateInvalidMsg) before it
appends: else promoting waits 30 s for a dispatch that never passes the torn record, its new records follow half
a record, and after a crash recovery cuts the log at the torn record: acknowledged sends are lost.

The HA link of replica b1 runs through a small proxy that understands the master's frames and stops forwarding
them once a data frame starts at or past a chosen offset: b1's log then ends exactly there, inside a record.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import ResponseCode
from tests.ha.cluster import Broker, Cluster
from tests.kit import eventually

TOPIC = "HATornTail"
BATCH = 1000


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"haTransferBatchSize": str(BATCH), "slaveTimeout": "1000",
                           "haMaxTimeSlaveNotCatchup": "30000"}) as c:
        yield c


async def send(cluster: Cluster, b: Broker, body: bytes) -> int:
    return await cluster.send(b, TOPIC, body)


async def test_a_replica_promoted_with_a_torn_last_record_cuts_it(cluster: Cluster) -> None:
    async with cluster.replica_behind_cutter(TOPIC, b"acked-0") as (b0, b1, proxy, shared_end):
        # A record of ~3 frames: b1 gets its first frame only.
        proxy.cut_at = shared_end + BATCH
        assert await send(cluster, b0, b"torn-" + b"x" * (3 * BATCH)) == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert proxy.cut

        async def b1_at_cut() -> bool:
            return int((await cluster.status(b1))["maxOffset"]) == shared_end + BATCH

        await eventually(b1_at_cut, 10, what="b1's log ends inside the torn record", step=0.05)
        b0.kill()

        started = time.monotonic()
        reply = await cluster.promote(b1, 2)
        took = time.monotonic() - started
        assert reply.code == 0, reply.remark
        status = await cluster.status(b1)
        sent = await send(cluster, b1, b"after-promote")
        pulled = await cluster.pull_queue(b1.addr, TOPIC, 0)
        b1.kill()  # a crash: recovery reads the log record by record, and stopped at the torn one
        await b1.start()
        await b1.stop()
        log = b1.log()
        print(f"\npromotion took {took:.1f} s; status {status}; send {sent}; pulled "
              f"{[r.body[:13] for r in pulled.records]}; the log after a crash {[r.body[:13] for r in log.records]}")
        assert status["maxOffset"] == shared_end, f"the torn tail was kept: {status}"
        assert status["epochs"] == [[1, 0], [2, shared_end]], status
        assert took < 10, f"promotion took {took:.1f} s (waiting for a dispatch past the torn record)"
        assert sent == ResponseCode.SUCCESS
        assert [r.body for r in pulled.records] == [b"acked-0", b"after-promote"]
        assert [r.body for r in log.records] == [b"acked-0", b"after-promote"], "an acknowledged send was lost"
        assert log.tail_is_zero()
