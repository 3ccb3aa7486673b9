"""WIPE_WRITE_PERM_OF_BROKER / ADD_WRITE_PERM_OF_BROKER hold until the broker registers its table anew (as
RocketMQ: the same data version again re-reads no topic the nameserver holds for the broker)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cometmq.broker.registration import NamesrvRegistrar
from cometmq.namesrv.route_info import RouteInfoManager
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from cometmq.protocol.route import PERM_READ, PERM_READ_WRITE, DataVersion, TopicConfig, TopicRouteData

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def namesrv() -> AsyncIterator[NamesrvController]:
    async with NamesrvController(NamesrvConfig(port=0)) as ctl:
        yield ctl


async def perm(client: RemotingClient, ns: NamesrvController, topic: str) -> int:
    reply = await client.invoke(ns.addr, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return TopicRouteData.decode(reply.body).queue_datas[0].perm


async def test_wiped_write_perm_survives_a_forced_registration_after_a_new_topic(namesrv: NamesrvController) -> None:
    """A broker that registers in full every round (Java's forceRegister, on by default) after registering a
    new topic alone: its full table comes under the version the new topic set, and must not give back the
    write permission an operator wiped (to drain the broker before taking it down)."""
    table = {name: TopicConfig(name, 4, 4) for name in ("T1", "T2")}
    async with RemotingClient() as client:
        registrar = NamesrvRegistrar(client, [namesrv.addr], "c", "broker-a", 0, "127.0.0.1:10911",
                                     "127.0.0.1:10912", lambda: list(table.values()), interval_s=3600,
                                     force_register=True)
        await registrar.start()
        wiped = await client.invoke(namesrv.addr, make_request(RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                                               {"brokerName": "broker-a"}))
        assert wiped.ext_fields["wipeTopicCount"] == "2"
        assert await perm(client, namesrv, "T1") == PERM_READ

        table["NEW"] = TopicConfig("NEW", 4, 4)  # e.g. a consumer group's retry topic
        await registrar.topics_changed([table["NEW"]])
        await registrar.register_now()  # the periodic round: the whole table, under the same version
        assert await perm(client, namesrv, "T1") == PERM_READ
        assert await perm(client, namesrv, "T2") == PERM_READ
        assert await perm(client, namesrv, "NEW") == PERM_READ_WRITE  # registered after the wipe, as RocketMQ

        added = await client.invoke(namesrv.addr, make_request(RequestCode.ADD_WRITE_PERM_OF_BROKER,
                                                               {"brokerName": "broker-a"}))
        assert added.ext_fields["addTopicCount"] == "3"
        assert await perm(client, namesrv, "T1") == PERM_READ_WRITE
        await registrar.stop()


def test_a_new_table_version_is_read_again() -> None:
    """The wipe holds until the broker registers its table under a new version."""
    rim = RouteInfoManager()
    topics = [TopicConfig("T", 4, 4)]
    rim.register_broker("c", "broker-a", "10.0.0.1:10911", 0, "", topics, DataVersion(1, 1))
    rim.update_write_perm("broker-a", wipe=True)
    rim.register_broker("c", "broker-a", "10.0.0.1:10911", 0, "", [TopicConfig("U")], DataVersion(1, 2))
    rim.register_broker("c", "broker-a", "10.0.0.1:10911", 0, "", topics, DataVersion(1, 2))
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].perm == PERM_READ
    rim.register_broker("c", "broker-a", "10.0.0.1:10911", 0, "", topics, DataVersion(1, 3))
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].perm == PERM_READ_WRITE
