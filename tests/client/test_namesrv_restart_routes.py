"""The SDK with several nameservers, one of which restarted and does not know the topics yet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client import Admin, Message, Producer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from tests.kit import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[list[NamesrvController], BrokerController]]:
    namesrvs = [NamesrvController(NamesrvConfig(port=0)) for _ in range(2)]
    for ns in namesrvs:
        await ns.start()
    cfg = BrokerConfig(listen_port=0, broker_name="broker-a", namesrv_addr=";".join(ns.addr for ns in namesrvs))
    cfg = cfg.replace(store=cfg.store.replace(store_path=tmp_path / "b", commitlog_segment_size=8 << 20,
                                              consume_queue_units_per_file=10_000, max_hash_slot_num=4096,
                                              max_index_num=65536))
    broker = BrokerController(cfg)
    await broker.start()
    try:
        yield namesrvs, broker
    finally:
        await broker.stop()
        for ns in namesrvs:
            await ns.stop()


async def test_a_restarted_nameserver_that_does_not_know_the_topic_yet_is_not_the_last_word(
        cluster: tuple[list[NamesrvController], BrokerController]) -> None:
    namesrvs, _broker = cluster
    async with Admin(namesrv=namesrvs[1].addr) as admin:
        await admin.create_topic("RestartT", read_queues=2)
    assert namesrvs[0].route_info.pick_route("RestartT") is not None
    p = Producer("restart-pg", namesrv=";".join(ns.addr for ns in namesrvs))
    await p.start()
    try:
        p.instance._namesrv_index = 0  # the producer asks the first nameserver
        assert (await p.send(Message("RestartT", b"before"))).msg_id
        # The first nameserver restarts, empty: the broker registers with it again only at its next round.
        port = namesrvs[0].port
        await namesrvs[0].stop()
        namesrvs[0] = NamesrvController(NamesrvConfig(port=port))
        await namesrvs[0].start()
        assert namesrvs[0].route_info.pick_route("RestartT") is None
        # (the producer has seen its connection to the first nameserver close, so it asks it again)
        await eventually(lambda: not any(not c.closed for a, c in p.instance.remoting.connections.items()
                                         if a == namesrvs[0].addr), 5, what="the old connection closed")
        p.instance._namesrv_index = 0
        route = await p.instance.route("RestartT", refresh=True)  # the periodic poll, or a refresh after a failure
        assert route is not None and [bd.broker_name for bd in route.broker_datas] == ["broker-a"]
        assert (await p.send(Message("RestartT", b"after"))).msg_id
        # a topic no nameserver knows is still unknown
        assert await p.instance.route("NoSuchTopic", refresh=True) is None
    finally:
        await p.close()


async def test_the_route_poll_keeps_a_route_the_only_nameserver_forgot_in_a_restart(
        cluster: tuple[list[NamesrvController], BrokerController]) -> None:
    """A nameserver that restarted knows no topic until the brokers register again (their next round, up to 30 s
    later). The periodic route poll in that window dropped the cached route, and the producer could not send to
    a broker that was up all along; as RocketMQ's client, the poll now keeps the route it has."""
    namesrvs, _broker = cluster
    async with Admin(namesrv=namesrvs[0].addr) as admin:
        await admin.create_topic("PollT", read_queues=2)
    p = Producer("poll-pg", namesrv=namesrvs[0].addr)  # the only nameserver this producer knows
    await p.start()
    try:
        assert (await p.send(Message("PollT", b"before"))).msg_id
        port = namesrvs[0].port
        await namesrvs[0].stop()
        namesrvs[0] = NamesrvController(NamesrvConfig(port=port))
        await namesrvs[0].start()
        assert namesrvs[0].route_info.pick_route("PollT") is None
        await p.instance._refresh_routes()  # the 30 s poll, in the window
        assert "PollT" in p.instance.routes
        assert (await p.send(Message("PollT", b"after"))).msg_id
        # an explicit lookup still says what the nameserver knows
        assert await p.instance.route("PollT", refresh=True) is None
    finally:
        await p.close()
