"""SYNC_FLUSH group commit on the broker's send path: inline commits, the slow-disk hand-off, and a real broker
process killed with SIGKILL while many producers wait for their acknowledgements."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from cometmq.broker.append_batcher import AppendBatcher
from cometmq.broker.appender import Appender
from cometmq.client import Message
from cometmq.client.sync import SyncLitePullConsumer
from cometmq.store.message_store import MessageStore
from tests.interop.cometmq_server import CometServer
from tests.store.conftest import SYNC, msg


def sync_batcher(store: MessageStore, loop: asyncio.AbstractEventLoop) -> AppendBatcher:
    """The broker's one write path (as its controller builds it) under SYNC_FLUSH."""
    appender = Appender(store, sync_flush_timeout_s=5.0)
    appender.start(loop)
    return appender.batcher


async def test_fast_disk_commits_each_batch_in_the_loop_thread(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(flush_disk_type=SYNC)
    service = store.flush_service
    b = sync_batcher(store, asyncio.get_running_loop())
    for _ in range(3):
        results = await asyncio.gather(*(b.put([msg()]) for _ in range(32)))
        assert all(r.ok for r in results)
        # Resolved only after a flush covered every record of the batch.
        assert service.flushed_offset >= max(r.end_offset for r in results)
    assert b.appends == 3
    assert service.inline_commits == 3 and service.handed_off == 0  # type: ignore[attr-defined]


async def test_slow_disk_hands_the_round_to_the_flush_thread(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(flush_disk_type=SYNC, group_commit_inline_max_us=500)
    service = store.flush_service
    service.flush_seconds_avg = 0.05  # as if fdatasync took 50 ms: too slow to hold the loop for
    loop_thread = threading.get_ident()
    flushed_in: list[int] = []
    store.add_flush_listener(lambda _offset: flushed_in.append(threading.get_ident()))
    b = sync_batcher(store, asyncio.get_running_loop())
    results = await asyncio.gather(*(b.put([msg()]) for _ in range(16)))
    assert all(r.ok for r in results)
    assert service.flushed_offset >= max(r.end_offset for r in results)
    assert service.handed_off == 1 and service.inline_commits == 0  # type: ignore[attr-defined]
    assert flushed_in and loop_thread not in flushed_in


def test_inline_commit_can_be_turned_off(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(flush_disk_type=SYNC, group_commit_inline_max_us=0)
    res = store.put_messages([msg()], request_flush=False)
    assert res.ok
    store.commit(res.end_offset)  # asks the flush thread
    assert store.wait_flushed(res.end_offset, 5.0)
    assert store.flush_service.inline_commits == 0  # type: ignore[attr-defined]


def test_kill_9_of_a_sync_flush_broker_keeps_every_acknowledged_send(tmp_path: Path) -> None:
    """32 producers send concurrently to a SYNC_FLUSH broker process; it is killed with SIGKILL mid-stream.
    After the restart every send that was acknowledged is there (and nothing appears twice). A killed process
    leaves its written pages in the page cache, so this checks recovery of the broker's log and queues; that an
    acknowledgement waits for fdatasync is what the tests above assert (flushed offset at resolution)."""
    server = CometServer(tmp_path / "srv", {"flushDiskType": "SYNC_FLUSH"})
    server.start()
    acked: set[bytes] = set()
    try:
        server.create_topic("SyncKill", 4)

        async def produce() -> None:
            from cometmq.client import Producer

            producer = Producer("sync-kill", namesrv=server.namesrv, send_timeout=2.0, retries=0)
            await producer.start()
            stop = asyncio.Event()

            async def sender(w: int) -> None:
                i = 0
                while not stop.is_set():
                    body = f"w{w}-{i}".encode()
                    i += 1
                    try:
                        await producer.send(Message("SyncKill", body))
                    except Exception:
                        stop.set()  # the broker is gone
                        return
                    acked.add(body)
                    if len(acked) == 3000:
                        # SIGKILL while the other senders' requests are in flight.
                        await asyncio.to_thread(server.kill)
                        stop.set()

            try:
                await asyncio.wait_for(asyncio.gather(*(sender(w) for w in range(32))), 120)
            finally:
                await producer.close()

        asyncio.run(produce())
        assert len(acked) >= 3000
        server.start()
        got: list[bytes] = []
        with SyncLitePullConsumer("sync-kill-check", namesrv=server.namesrv, auto_commit=False,
                                  consume_from="first") as c:
            c.subscribe("SyncKill")
            idle = 0
            while idle < 3:
                batch = c.poll(1.0)
                idle = 0 if batch else idle + 1
                got.extend(m.body for m in batch)
        missing = acked - set(got)
        assert not missing, f"{len(missing)} acknowledged sends lost, e.g. {sorted(missing)[:5]}"
        assert len(got) == len(set(got)), "a record appears twice after recovery"
    finally:
        server.close()
