"""A broker gone from every route is forgotten (RocketMQ's MQClientInstance.cleanOfflineBroker): no more heartbeats or
unregisters sent to its address."""

from __future__ import annotations

import logging

import pytest

from cometmq.client import ClientInstance, Producer
from tests.kit import eventually

from .conftest import Cluster
from .test_push_consumer import create_topic


async def test_a_broker_dropped_from_every_route_gets_no_more_heartbeats(cluster: Cluster,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    await cluster.add_broker("broker-b")
    await create_topic(cluster, "Offline", 2)
    inst = ClientInstance(cluster.namesrv_addr, poll_namesrv_interval=0.1)
    async with Producer("pg-offline", instance=inst):
        await inst.route("Offline")
        gone = inst.master_addr("broker-b")
        kept = inst.master_addr("broker-a")
        assert gone is not None and kept is not None
        await inst.heartbeat()
        assert gone in inst._heartbeat_known
        b = cluster.brokers.pop()
        await b.stop()  # (it unregisters from the nameserver: the route now names broker-a alone)
        await eventually(lambda: "broker-b" not in inst.brokers, what="broker-b forgotten")
        assert inst.all_broker_addrs() == [kept]
        assert gone not in inst._heartbeat_known
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            await inst.heartbeat()
        assert not [r for r in caplog.records if gone in r.getMessage()]
        assert inst.master_addr("broker-a") == kept  # the broker still routed stays
