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

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import ResponseCode
from tests.ha.cluster import Broker, Cluster
from tests.kit import eventually

TOPIC = "HATornTail"
BATCH = 1000


class FrameCutter:
    """Forwards replica → master bytes as they come and master → replica frames until a data frame starts at or
    past ``cut_at``; from then on nothing more of that link reaches the replica (the sockets stay open)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut_at: int | None = None
        self.cut = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> FrameCutter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def addr(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for coro in (self._up(reader, up_writer), self._down(up_reader, writer)):
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)

    @staticmethod
    async def _up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cut = False  # (per link: a new link's handshake passes, its data from ``cut_at`` on does not)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            while True:
                head = await reader.readexactly(8)
                state, size = struct.unpack(">ii", head)
                rest = await reader.readexactly((12 if state == 1 else 28) + size)
                if state == 2 and size > 0 and self.cut_at is not None:
                    (start,) = struct.unpack_from(">q", rest, 0)
                    if start >= self.cut_at:
                        cut = self.cut = True
                if not cut:
                    writer.write(head + rest)
                    await writer.drain()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"haTransferBatchSize": str(BATCH), "slaveTimeout": "1000",
                           "haMaxTimeSlaveNotCatchup": "30000"}) as c:
        yield c


async def send(cluster: Cluster, b: Broker, body: bytes) -> int:
    return await cluster.send(b, TOPIC, body)


async def test_a_replica_promoted_with_a_torn_last_record_cuts_it(cluster: Cluster) -> None:
    b0 = (await cluster.start(1))[0]
    b1 = cluster.add_broker(1)
    await cluster.create_topic(b0, TOPIC, 1)
    proxy = await FrameCutter(("127.0.0.1", b0.ha_port)).start()
    try:
        await b1.start()
        assert (await cluster.follow(b1, b0, 1, 1, proxy.addr)).code == 0
        await cluster.wait_sync_set(b0, {0, 1})
        assert await send(cluster, b0, b"acked-0") == ResponseCode.SUCCESS
        shared_end = await cluster.wait_caught_up(b1, b0)

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
    finally:
        await proxy.stop()
