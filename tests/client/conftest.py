"""An in-process nameserver + broker for SDK tests (real sockets on free ports, data in a temp folder)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.namesrv.server import NamesrvConfig, NamesrvController


@dataclass
class Cluster:
    namesrv: NamesrvController
    brokers: list[BrokerController]
    tmp: Path

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"

    async def add_broker(self, name: str, **changes: Any) -> BrokerController:
        cfg = BrokerConfig(listen_port=0, broker_name=name, namesrv_addr=self.namesrv_addr,
                           message_delay_level=(300, 600, 900))
        store = cfg.store.replace(store_path=self.tmp / name, commitlog_segment_size=8 << 20,
                                  consume_queue_units_per_file=10_000, max_hash_slot_num=4096, max_index_num=65536)
        store_changes = {k[6:]: changes.pop(k) for k in list(changes) if k.startswith("store_")}
        b = BrokerController(cfg.replace(store=store.replace(**store_changes), **changes))
        await b.start()
        self.brokers.append(b)
        return b


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    c = Cluster(ns, [], tmp_path)
    await c.add_broker("broker-a")
    yield c
    for b in c.brokers:
        await b.stop()
    await ns.stop()
