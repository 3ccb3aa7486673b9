"""AppendBatcher: concurrent requests' appends become one commit-log append, each request its own result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cometmq.broker.append_batcher import AppendBatcher
from cometmq.broker.appender import Appender
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutStatus
from tests.store.conftest import SYNC, msg


async def test_concurrent_requests_share_one_append(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    b = AppendBatcher(asyncio.get_running_loop(), store.put_messages)
    futs = [b.put([msg(body=f"r{i}-{j}".encode(), queue_id=i % 2) for j in range(i + 1)]) for i in range(10)]
    results = await asyncio.gather(*futs)
    assert b.appends == 2 and b.requests == 10  # the first at once, the nine after it in one batch
    for i, r in enumerate(results):
        assert r.ok and len(r.records) == i + 1
        bodies = [store.get_messages("T", rec.queue_id, rec.queue_offset, 1).buffers[0] for rec in r.records]
        assert all(f"r{i}-".encode() in bytes(v) for v in bodies)
        assert r.end_offset == r.records[-1].phy_offset + r.records[-1].size
    assert store.max_offset("T", 0) + store.max_offset("T", 1) == sum(range(1, 11))


async def test_a_bad_request_fails_alone(make_store: Callable[..., MessageStore]) -> None:
    store = make_store()
    b = AppendBatcher(asyncio.get_running_loop(), store.put_messages)
    good1 = b.put([msg(body=b"a")])
    bad = b.put([msg(body=b"x" * (store.config.max_message_size + 1))])
    good2 = b.put([msg(body=b"b")])
    r1, rbad, r2 = await asyncio.gather(good1, bad, good2)
    assert r1.ok and r2.ok and not rbad.ok
    assert rbad.status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_offset("T", 0) == 2


async def test_sync_flush_resolves_only_when_flushed(make_store: Callable[..., MessageStore]) -> None:
    store = make_store(flush_disk_type=SYNC)
    appender = Appender(store, sync_flush_timeout_s=5.0)  # as the broker builds it
    appender.start(asyncio.get_running_loop())
    b = appender.batcher
    results = await asyncio.gather(*(b.put([msg()]) for _ in range(64)))
    assert all(r.ok for r in results)
    assert store.flushed_offset >= max(r.end_offset for r in results)
    assert b.appends == 1  # under SYNC_FLUSH the whole turn shares one append and one group commit


async def test_an_append_that_raises_answers_every_request_with_the_error(
        make_store: Callable[..., MessageStore]) -> None:
    """The CI hang: shipping to a replica whose socket had just closed raised inside the append of a batch drained
    at the end of a loop turn; the batch's senders were never answered. Now they get the error."""
    store = make_store()
    calls = 0

    def put(msgs: list) -> object:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
        return store.put_messages(msgs)

    b = AppendBatcher(asyncio.get_running_loop(), put)  # type: ignore[arg-type]
    futs = [b.put([msg(body=f"m{i}".encode())]) for i in range(5)]  # the first at once, four in the next turn
    results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 5)
    assert results[0].ok  # type: ignore[union-attr]
    assert all(isinstance(r, RuntimeError) and "closed=True" in str(r) for r in results[1:]), results
