"""Brokers registered with several nameservers while one of them is down, then back."""

from __future__ import annotations

import pytest

from cometmq.broker.registration import NamesrvRegistrar
from cometmq.namesrv.server import NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.route import TopicConfig

pytestmark = pytest.mark.timeout(30)


def registrar(client: RemotingClient, namesrvs: list[str], broker_id: int, addr: str) -> NamesrvRegistrar:
    host, port = addr.rsplit(":", 1)
    return NamesrvRegistrar(client, namesrvs, "c", "broker-a", broker_id, addr, f"{host}:{int(port) + 1}",
                            lambda: [TopicConfig("T")], interval_s=3600)


async def test_replica_follows_the_master_a_live_nameserver_names(two_namesrvs: list[NamesrvController]) -> None:
    """A nameserver that stopped answering must not keep naming the master it knew: the replica follows the
    master the nameservers that answer name (RocketMQ reads the answers of the round that got through)."""
    ns1, ns2 = two_namesrvs
    addrs = [ns1.addr, ns2.addr]
    async with RemotingClient(connect_timeout=1.0) as client:
        old_master = registrar(client, addrs, 0, "127.0.0.1:10911")
        replica = registrar(client, addrs, 1, "127.0.0.1:10921")
        await old_master.start()
        await replica.register_now()
        assert replica.master_addr == "127.0.0.1:10911"
        assert replica.master_ha_addr == "127.0.0.1:10912"

        await ns1.stop()  # down: it cannot hear of the new master
        await old_master.stop()  # the old master goes (unregistered where it can be)
        new_master = registrar(client, addrs, 0, "127.0.0.1:10931")
        await new_master.start()
        outcomes = await replica.register_now()
        assert isinstance(outcomes[ns1.addr], Exception)
        assert replica.master_addr == "127.0.0.1:10931"
        assert replica.master_ha_addr == "127.0.0.1:10932"

        # Nobody answers at all: the last answers stand (the replica keeps the master it knows).
        await ns2.stop()
        await replica.register_now()
        assert replica.master_addr == "127.0.0.1:10931"
        await new_master.stop()
        await replica.stop()
