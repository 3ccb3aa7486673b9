from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.store.message_store import MessageStore
from tests.kit import FakeClock
from tests.store.conftest import small_config


def broker_config(path: Path, **changes: Any) -> BrokerConfig:
    cfg = BrokerConfig(listen_port=0, message_delay_level=(300, 600, 900))
    store = cfg.store.replace(store_path=path, commitlog_segment_size=1 << 20, consume_queue_units_per_file=1000,
                              max_hash_slot_num=1024, max_index_num=8192, max_message_size=256 * 1024,
                              flush_interval_commitlog_ms=50, flush_interval_consume_queue_ms=50)
    store_changes = {k[6:]: changes.pop(k) for k in list(changes) if k.startswith("store_")}
    return cfg.replace(store=store.replace(**store_changes), **changes)


StartBroker = Callable[..., Awaitable[BrokerController]]


@pytest.fixture
async def start_broker(tmp_path: Path) -> AsyncIterator[StartBroker]:
    started: list[BrokerController] = []

    async def start(path: Path | None = None, **changes: Any) -> BrokerController:
        b = BrokerController(broker_config(path or tmp_path / "broker", **changes))
        await b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        await b.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    c = RemotingClient()
    yield c
    await c.close()


def send_request(topic: str, body: bytes, queue_id: int = 0, properties: str = "", **extra: Any) -> RemotingCommand:
    ext: dict[str, Any] = {"producerGroup": "pg", "topic": topic, "defaultTopic": "TBW102",
                           "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": 0, "bornTimestamp": "1",
                           "flag": 0, "properties": properties, "reconsumeTimes": "0", "unitMode": "0", "batch": "0"}
    ext.update(extra)
    return make_request(RequestCode.SEND_MESSAGE, ext, body)


def pull_request(topic: str, offset: int, queue_id: int = 0, group: str = "cg", subscription: str = "*",
                 sys_flag: int = 6, suspend_ms: int = 5000, **extra: Any) -> RemotingCommand:
    ext: dict[str, Any] = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": str(offset),
                           "maxMsgNums": 32, "sysFlag": sys_flag, "commitOffset": "0", "subVersion": "0",
                           "suspendTimeoutMillis": str(suspend_ms), "subscription": subscription}
    ext.update(extra)
    return make_request(RequestCode.PULL_MESSAGE, ext)


def props(**kv: str) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in kv.items())


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., MessageStore]]:
    """Started stores in ``tmp_path`` (small segments, a fake clock), shut down after the test."""
    stores: list[MessageStore] = []

    def make(**changes: object) -> MessageStore:
        store = MessageStore(small_config(tmp_path / f"store{len(stores)}", **changes), clock=FakeClock(None))
        store.start()
        stores.append(store)
        return store

    yield make
    for s in stores:
        s.shutdown()


async def create_topics(client: RemotingClient, addr: str, *topics: str, queues: int = 4) -> None:
    """Create ``topics`` on the broker as an operator does (UPDATE_AND_CREATE_TOPIC, the admin CLI's request)."""
    for topic in topics:
        r = await client.invoke(addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6}))
        assert r.code == ResponseCode.SUCCESS, r.remark
