"""client/concurrent_consume.py on its own: a pulled batch's first listener call runs in the pulling task when a slot
is free (``run_first``), the others wait; what the listener returns or raises becomes a status. No broker: a
broadcasting consumer (its failures are not sent back), never started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cometmq.client import ConsumeStatus, MessageExt, PushConsumer
from cometmq.client.message import MessageQueue
from cometmq.client.process_queue import ProcessQueue, PullRequest

MQ = MessageQueue("T", "b", 0)


def ext(offset: int) -> MessageExt:
    return MessageExt(topic="T", body=b"ab", properties={}, msg_id=str(offset), offset_msg_id="", queue=MQ,
                      queue_offset=offset, commit_log_offset=offset * 100, born_timestamp=0, store_timestamp=0,
                      born_host="", store_host="", reconsume_times=0, sys_flag=0, flag=0)


def consumer(tmp_path: Path, listener: Any, **kw: Any) -> PushConsumer:
    return PushConsumer("g-concurrent", namesrv="127.0.0.1:1", listener=listener, message_model="BROADCASTING",
                        offset_store_dir=tmp_path, **kw)


def pulled(n: int) -> tuple[PullRequest, list[MessageExt]]:
    req = PullRequest(MQ, ProcessQueue(0), 0)
    msgs = [ext(i) for i in range(n)]
    assert req.pq.put(msgs, n) == msgs
    return req, msgs


async def test_the_first_call_runs_in_the_pulling_task_and_the_rest_wait_for_slots(tmp_path: Path) -> None:
    calls: list[list[int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        calls.append([m.queue_offset for m in msgs])
        return ConsumeStatus.CONSUME_SUCCESS

    c = consumer(tmp_path, listener, batch_max_size=2, max_concurrency=1)
    svc = c._concurrent
    req, msgs = pulled(5)
    first = svc.run_first(req, msgs)  # three calls of at most 2: one slot, so two wait
    assert first is not None and len(svc._backlog) == 2
    assert svc.run_first(*pulled(1)) is None  # no slot free: queued, nothing to run here
    await first  # runs its call, then the backlog, in this task
    assert calls == [[0, 1], [2, 3], [4], [0]]
    assert svc._inflight == 0 and c.stats.consumed == 6 and req.pq.count == 0


@pytest.mark.parametrize("outcome", ["raise", "not a status", "later"])
async def test_what_the_listener_gives_back_becomes_a_status(tmp_path: Path, outcome: str) -> None:
    async def listener(msgs: list[MessageExt]) -> Any:
        if outcome == "raise":
            raise RuntimeError("boom")
        return "yes" if outcome == "not a status" else ConsumeStatus.RECONSUME_LATER

    c = consumer(tmp_path, listener)
    req, msgs = pulled(1)
    first = c._concurrent.run_first(req, msgs)
    assert first is not None
    await first
    assert (c.stats.consumed, c.stats.failed) == (0, 1)  # each taken as RECONSUME_LATER


async def test_a_plain_listener_runs_in_the_thread_pool(tmp_path: Path) -> None:
    import threading

    threads: list[str] = []

    def listener(msgs: list[MessageExt]) -> None:  # None counts as success
        threads.append(threading.current_thread().name)

    c = consumer(tmp_path, listener)
    req, msgs = pulled(1)
    first = c._concurrent.run_first(req, msgs)
    assert first is not None
    await first
    assert threads and threads[0] != threading.current_thread().name and c.stats.consumed == 1
