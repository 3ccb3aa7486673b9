"""An in-process nameserver + broker with a controllable clock for POP tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client.admin import Admin
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from tests.kit import FakeClock


@dataclass
class PopCluster:
    namesrv: NamesrvController
    tmp: Path
    clock: FakeClock
    brokers: list[BrokerController] = field(default_factory=list)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"

    @property
    def broker(self) -> BrokerController:
        return self.brokers[0]

    def config(self, name: str, **changes: Any) -> BrokerConfig:
        cfg = BrokerConfig(listen_port=0, broker_name=name, namesrv_addr=self.namesrv_addr,
                           pop_revive_interval_ms=20, pop_snapshot_interval_ms=100)
        store = cfg.store.replace(store_path=self.tmp / name, commitlog_segment_size=8 << 20,
                                  consume_queue_units_per_file=20_000, max_hash_slot_num=4096, max_index_num=65536)
        return cfg.replace(store=store, **changes)

    async def add_broker(self, name: str = "broker-a", **changes: Any) -> BrokerController:
        b = BrokerController(self.config(name, **changes), clock=self.clock)
        await b.start()
        self.brokers.append(b)
        return b

    async def restart(self, index: int = 0, **changes: Any) -> BrokerController:
        """Stop the broker and start it again on its data, with ``changes`` to its config."""
        old = self.brokers[index]
        await old.stop()
        b = BrokerController(old.config.replace(listen_port=0, **changes), clock=self.clock)
        await b.start()
        self.brokers[index] = b
        return b

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        async with Admin(namesrv=self.namesrv_addr) as admin:
            await admin.create_topic(topic, read_queues=queues, write_queues=queues)


@pytest.fixture
async def pop_cluster(tmp_path: Path) -> AsyncIterator[PopCluster]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    c = PopCluster(ns, tmp_path, FakeClock(None, ticking=True))  # invisible times pass without sleeping
    await c.add_broker()
    yield c
    for b in c.brokers:
        await b.stop()
    await ns.stop()
