"""#6316: when two brokers claim brokerId 0 of one group, the higher state version (controller epoch) wins; brokers
that change their id move cleanly; routes list replicas."""

from __future__ import annotations

import pytest

from cometmq.namesrv.route_info import RouteInfoManager
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerResult,
    TopicConfig,
    TopicRouteData,
    body_crc32,
)
from tests.kit import FakeClock

A = "10.0.0.1:10911"
B = "10.0.0.2:10911"
C = "10.0.0.3:10911"
HA = {A: "10.0.0.1:10912", B: "10.0.0.2:10912", C: "10.0.0.3:10912"}
NONE = RegisterBrokerResult(None, None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture
def rim(clock: FakeClock) -> RouteInfoManager:
    return RouteInfoManager(clock.seconds)


def reg(rim: RouteInfoManager, addr: str, broker_id: int, epoch: int, *, queues: int = 4,
        conn: object | None = None) -> RegisterBrokerResult:
    return rim.register_broker("c1", "broker-a", addr, broker_id, HA[addr], [TopicConfig("T", queues, queues)],
                               DataVersion(1, 1, epoch), conn)


def addrs(rim: RouteInfoManager) -> dict[int, str]:
    route = rim.pick_route("T")
    assert route is not None
    return dict(route.broker_datas[0].broker_addrs)


def test_stale_master_cannot_take_id_0_back(rim: RouteInfoManager) -> None:
    reg(rim, A, 0, 1)
    reg(rim, B, 1, 1)
    # The controller elects B at epoch 2 while A is cut off: B registers as master at the higher version.
    assert reg(rim, B, 0, 2, queues=8) == NONE
    assert addrs(rim) == {0: B}
    assert A not in rim.live_brokers()
    # A, still believing it is master at epoch 1, keeps heartbeating: refused, answered with an empty result.
    assert reg(rim, A, 0, 1) == NONE
    assert addrs(rim) == {0: B}
    assert set(rim.live_brokers()) == {B}
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].write_queue_nums == 8  # B's table, not A's
    # A learns of the new epoch and comes back as a replica: listed under id 1 only, told who the master is.
    assert reg(rim, A, 1, 2) == RegisterBrokerResult(B, HA[B])
    assert addrs(rim) == {0: B, 1: A}


def test_equal_state_version_keeps_the_holder(rim: RouteInfoManager) -> None:
    reg(rim, A, 0, 3)
    assert reg(rim, B, 0, 3) == NONE
    assert addrs(rim) == {0: A}
    assert set(rim.live_brokers()) == {A}
    # The refused broker did not become a replica of anything either.
    assert reg(rim, C, 1, 3) == RegisterBrokerResult(A, HA[A])


def test_higher_state_version_replaces_a_live_holder(rim: RouteInfoManager) -> None:
    conn_a = object()
    reg(rim, A, 0, 1, conn=conn_a)
    reg(rim, B, 0, 2)
    assert addrs(rim) == {0: B}
    assert not rim.conn_in_use(conn_a)  # A's connection no longer carries a live registration
    assert rim.on_connection_closed(conn_a) == []  # and closing it later removes nothing of B's


def test_id_0_is_free_again_after_unregister_or_expiry(rim: RouteInfoManager, clock: FakeClock) -> None:
    reg(rim, A, 0, 5)
    assert rim.unregister_broker("c1", "broker-a", A, 0)
    reg(rim, B, 0, 1)  # a lower version takes a free id
    assert addrs(rim) == {0: B}
    clock.advance(121_000)
    assert [b.addr for b in rim.scan_inactive()] == [B]
    reg(rim, C, 0, 1)
    assert addrs(rim) == {0: C}


def test_demoted_master_then_promoted_replica(rim: RouteInfoManager) -> None:
    reg(rim, A, 0, 1)
    reg(rim, B, 1, 1)
    # Demotion first: A moves to id 1 (B's old replica id is its own; here B re-registers later).
    reg(rim, A, 2, 2)
    assert addrs(rim) == {1: B, 2: A}
    reg(rim, B, 0, 2)
    assert addrs(rim) == {0: B, 2: A}
    assert sorted(rim.cluster_info().broker_addr_table["broker-a"].broker_addrs.values()) == [A, B]
    # Each address is live once, under its new id.
    live = rim.live_brokers()
    assert (live[A].broker_id, live[B].broker_id) == (2, 0)


def test_replica_reply_and_routes_list_replicas(rim: RouteInfoManager) -> None:
    assert reg(rim, B, 1, 1) == NONE  # no master yet
    reg(rim, A, 0, 1)
    assert reg(rim, B, 1, 1) == RegisterBrokerResult(A, HA[A])
    assert reg(rim, C, 2, 1) == RegisterBrokerResult(A, HA[A])
    assert addrs(rim) == {0: A, 1: B, 2: C}
    assert rim.cluster_info().broker_addr_table["broker-a"].broker_addrs == {0: A, 1: B, 2: C}


async def test_stale_master_is_answered_success_without_a_master() -> None:
    """Over the wire: the refused broker gets SUCCESS and no masterAddr (RocketMQ's empty result), so it neither
    fails its registration nor starts following anyone; routes keep the newer master."""
    def register(addr: str, broker_id: int, epoch: int) -> RemotingCommand:
        body = RegisterBrokerBody((TopicConfig("T"),), DataVersion(1, 1, epoch)).encode(False)
        return make_request(RequestCode.REGISTER_BROKER, {
            "brokerName": "broker-a", "brokerAddr": addr, "clusterName": "c1", "haServerAddr": HA[addr],
            "brokerId": broker_id, "bodyCrc32": body_crc32(body)}, body)

    ctl = NamesrvController(NamesrvConfig(port=0))
    await ctl.start()
    try:
        async with RemotingClient() as client:
            ok = await client.invoke(ctl.addr, register(B, 0, 2))
            assert ok.code == ResponseCode.SUCCESS
            stale = await client.invoke(ctl.addr, register(A, 0, 1))
            assert stale.code == ResponseCode.SUCCESS and "masterAddr" not in stale.ext_fields
            replica = await client.invoke(ctl.addr, register(A, 1, 2))
            assert (replica.ext_fields["masterAddr"], replica.ext_fields["haServerAddr"]) == (B, HA[B])
            reply = await client.invoke(ctl.addr, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
            route = TopicRouteData.decode(reply.body)
            assert route.broker_datas[0].broker_addrs == {0: B, 1: A}
    finally:
        await ctl.stop()
