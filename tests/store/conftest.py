from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cometmq.store.config import FlushDiskType, StoreConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock


def small_config(path: Path, **changes: object) -> StoreConfig:
    base = StoreConfig(
        store_path=path,
        commitlog_segment_size=64 * 1024,
        consume_queue_units_per_file=64,
        max_hash_slot_num=256,
        max_index_num=1024,
        flush_interval_commitlog_ms=50,
        flush_interval_consume_queue_ms=50,
        max_message_size=16 * 1024,
    )
    if "max_message_size" not in changes:
        seg = int(changes.get("commitlog_segment_size", base.commitlog_segment_size))  # type: ignore[call-overload]
        changes["max_message_size"] = min(base.max_message_size, seg // 2)
    return base.replace(**changes)


def msg(topic: str = "T", body: bytes = b"x" * 100, queue_id: int = 0, tags: str | None = None,
        keys: str | None = None, uniq: str | None = None, **props: str) -> MessageInner:
    properties = dict(props)
    if tags:
        properties["TAGS"] = tags
    if keys:
        properties["KEYS"] = keys
    if uniq:
        properties["UNIQ_KEY"] = uniq
    return MessageInner(topic=topic, body=body, queue_id=queue_id, properties=properties,
                        born_timestamp=1_700_000_000_000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(None)  # at the wall time: retention compares it with file modification times


@pytest.fixture
def make_store(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., MessageStore]]:
    stores: list[MessageStore] = []

    def make(path: Path | None = None, **changes: object) -> MessageStore:
        store = MessageStore(small_config(path or tmp_path / "store", **changes), clock=clock)
        store.start()
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.shutdown()


SYNC = FlushDiskType.SYNC_FLUSH
ASYNC = FlushDiskType.ASYNC_FLUSH
