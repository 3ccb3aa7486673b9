"""The endpoint's client table (grpc/sessions.py) under a flood of new client ids, and the bounded outbox of a
Telemetry stream."""

from __future__ import annotations

import asyncio
import time

import pytest

from cometmq.grpc import sessions as sessions_mod
from cometmq.grpc.sessions import OUTBOX_MAX, OUTBOX_MAX_BYTES, Outbox, Sessions
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb


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


async def test_a_transaction_check_skips_a_producer_whose_stream_is_full() -> None:
    """A producer that does not read its Telemetry stream was sent every check of its topics, each holding the half's
    message (up to 4 MiB), into an unbounded queue. A full outbox now takes no more: the check goes to another
    producer of the topic, or to none (the broker checks again)."""
    table = Sessions()
    quiet, live = table.get("quiet"), table.get("live")
    for s in (quiet, live):
        s.topics, s.outbox = {"T"}, Outbox()
    check = spb.TelemetryCommand(recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
        transaction_id="t"))
    assert quiet.outbox is not None and live.outbox is not None
    while quiet.outbox.offer(check):
        pass
    assert len(quiet.outbox) == OUTBOX_MAX
    for _ in range(10):
        assert table.send_to_publisher("T", check) is live
    while live.outbox.offer(check):
        pass
    assert table.send_to_publisher("T", check) is None
    assert len(quiet.outbox) == len(live.outbox) == OUTBOX_MAX
    assert await quiet.outbox.get() == check  # the stream takes one: room for one more
    assert table.send_to_publisher("T", check) is quiet
    table.remove("quiet")  # the end mark goes in whatever the outbox holds
    items = [await quiet.outbox.get() for _ in range(OUTBOX_MAX + 1)]
    assert items[-1] is None and len(quiet.outbox) == 0 and quiet.outbox.size_bytes == 0


async def test_an_answer_waits_for_room_in_the_outbox() -> None:
    outbox = Outbox()
    command = spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))
    for _ in range(OUTBOX_MAX):
        await outbox.put(command)
    waiting = asyncio.get_running_loop().create_task(outbox.put(command))
    await asyncio.sleep(0.05)
    assert not waiting.done() and len(outbox) == OUTBOX_MAX
    await outbox.get()
    await asyncio.wait_for(waiting, 1)
    assert len(outbox) == OUTBOX_MAX
    big = spb.TelemetryCommand(settings=pb.Settings(publishing=pb.Publishing(
        topics=[pb.Resource(name="x" * 100_000)] * (OUTBOX_MAX_BYTES // 100_000 + 1))))
    emptied = Outbox()
    assert emptied.offer(big)  # one command larger than the byte bound still goes when the outbox is empty
    assert not emptied.offer(command) and not emptied.has_room()
