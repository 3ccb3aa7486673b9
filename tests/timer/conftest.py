from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cometmq.protocol.message import MessageRecord, decode_record
from cometmq.store.config import StoreConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.config import TimerConfig
from cometmq.timer.message import Rewrite, delete_marker, rewrite_for_timer
from cometmq.timer.service import TimerMessageService
from tests.broker.conftest import client, start_broker  # noqa: F401 - fixtures for the broker-level tests
from tests.kit import wall_ms


def store_config(path: Path) -> StoreConfig:
    return StoreConfig(store_path=path, commitlog_segment_size=1 << 22, consume_queue_units_per_file=4096,
                       max_message_size=1 << 16, max_hash_slot_num=1024, max_index_num=8192,
                       flush_interval_commitlog_ms=50, flush_commitlog_least_pages=0, preallocate=False)


class Timer:
    """A real MessageStore and TimerMessageService on a folder, as the broker wires them."""

    def __init__(self, path: Path, clock: Callable[[], int] = wall_ms, **cfg: Any) -> None:
        self.path = path
        self.clock = clock
        cfg.setdefault("timerlog_file_size", 56 * 4096)
        cfg.setdefault("preallocate", False)
        cfg.setdefault("flush_interval_ms", 100)
        store_changes = cfg.pop("store_changes", {})
        self.config = TimerConfig(**cfg)
        self.store = MessageStore(store_config(path).replace(**store_changes), clock=clock)
        self.service = TimerMessageService(self.store, self.config, self.put, clock=clock)
        self.puts = 0

    async def put(self, msgs: list[MessageInner]) -> PutResult:
        self.puts += 1
        return self.store.put_messages(msgs)

    async def start(self) -> Timer:
        self.store.start()
        self.store.add_arrival_listener(self.service.on_arrival)
        await self.service.start()
        return self

    async def stop(self) -> None:
        await self.service.stop()
        self.store.shutdown()

    def schedule(self, uniq: str, deliver_ms: int, topic: str = "T", queue_id: int = 0,
                 **props: str) -> MessageInner:
        m = MessageInner(topic=topic, body=uniq.encode(), queue_id=queue_id,
                         properties={"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(deliver_ms), **props})
        r = rewrite_for_timer(m, self.clock(), self.config.max_delay_ms)
        assert r.outcome in (Rewrite.SCHEDULED, Rewrite.DUE_NOW), r
        assert self.store.put_messages([m]).ok
        return m

    def schedule_many(self, items: list[tuple[str, int]], topic: str = "T") -> None:
        msgs = []
        for uniq, deliver in items:
            m = MessageInner(topic=topic, body=uniq.encode(), queue_id=0,
                             properties={"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(deliver)})
            assert rewrite_for_timer(m, self.clock(), self.config.max_delay_ms).outcome is Rewrite.SCHEDULED
            msgs.append(m)
        for i in range(0, len(msgs), 256):
            assert self.store.put_messages(msgs[i:i + 256]).ok

    def cancel(self, uniq: str, deliver_ms: int, topic: str = "T") -> None:
        m = delete_marker(topic, uniq, deliver_ms, producer_group=None, born_ms=self.clock(),
                          born_host=b"\x7f\0\0\1\0\0\0\0")
        assert rewrite_for_timer(m, self.clock(), self.config.max_delay_ms).outcome is Rewrite.SCHEDULED
        assert self.store.put_messages([m]).ok

    def delivered(self, topic: str = "T", queue_id: int = 0) -> list[MessageRecord]:
        out: list[MessageRecord] = []
        off = 0
        while True:
            r = self.store.get_messages(topic, queue_id, off, 4096, max_bytes=64 << 20)
            if not r.buffers:
                return out
            out.extend(decode_record(v)[0] for v in r.buffers)
            off = r.next_begin_offset

    def uniq_keys(self, topic: str = "T", queue_id: int = 0) -> list[str]:
        return [r.properties["UNIQ_KEY"] for r in self.delivered(topic, queue_id)]


async def settle(timer: Timer, rounds: int = 3) -> None:
    """Let the services run until they have nothing to do at the current (fake) time."""
    for _ in range(rounds):
        timer.service.wakeup()
        for _ in range(200):
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)


@pytest.fixture
async def make_timer(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Timer] = []

    async def make(path: Path | None = None, clock: Callable[[], int] = wall_ms, **cfg: Any) -> Timer:
        t = Timer(path or tmp_path / "store", clock, **cfg)
        await t.start()
        made.append(t)
        return t

    yield make
    for t in made:
        if t.service.loaded:
            await t.stop()
