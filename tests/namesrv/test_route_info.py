from __future__ import annotations

import pytest

from cometmq.namesrv.route_info import ExpiredBroker, RouteInfoManager
from cometmq.protocol.route import BrokerData, DataVersion, QueueData, RegisterBrokerResult, TopicConfig
from tests.kit import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)  # 1000 s: the route table's clock is in seconds (clock.seconds)


@pytest.fixture
def rim(clock: FakeClock) -> RouteInfoManager:
    return RouteInfoManager(clock.seconds)


V1 = DataVersion(1, 1)
V2 = DataVersion(1, 2)
A0 = "10.0.0.1:10911"
A1 = "10.0.0.11:10911"
B0 = "10.0.0.2:10911"
C0 = "10.0.0.3:10911"


def topics(*names: str, queues: int = 4) -> list[TopicConfig]:
    return [TopicConfig(name, queues, queues) for name in names]


def test_register_master_and_pick_route(rim: RouteInfoManager) -> None:
    result = rim.register_broker("c1", "broker-a", A0, 0, "10.0.0.1:10912", topics("T", "U"), V1)
    assert result == RegisterBrokerResult(None, None)
    route = rim.pick_route("T")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0),)
    assert route.broker_datas == (BrokerData("c1", "broker-a", {0: A0}),)
    assert route.order_topic_conf == ""
    assert rim.pick_route("nope") is None
    assert rim.all_topics() == ["T", "U"]


def test_replica_learns_master_and_is_listed_by_id(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "10.0.0.1:10912", topics("T"), V1)
    # The replica's own topic table does not define queues: only the master's does.
    result = rim.register_broker("c1", "broker-a", A1, 1, "10.0.0.11:10912", topics("T", "OnlyOnReplica"), V1)
    assert result == RegisterBrokerResult(A0, "10.0.0.1:10912")
    route = rim.pick_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: A0, 1: A1}
    assert rim.pick_route("OnlyOnReplica") is None


def test_replica_before_master_gets_no_master(rim: RouteInfoManager) -> None:
    assert rim.register_broker("c1", "broker-a", A1, 1, "", topics("T"), V1) == RegisterBrokerResult(None, None)
    assert rim.pick_route("T") is None


def test_two_brokers_share_a_topic(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-b", B0, 0, "", topics("Shared", "OnlyB", queues=8), V1)
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("Shared", "OnlyA"), V1)
    route = rim.pick_route("Shared")
    assert route is not None
    assert [qd.broker_name for qd in route.queue_datas] == ["broker-a", "broker-b"]
    assert [qd.write_queue_nums for qd in route.queue_datas] == [4, 8]
    assert [bd.broker_name for bd in route.broker_datas] == ["broker-a", "broker-b"]
    only_a = rim.pick_route("OnlyA")
    assert only_a is not None
    assert [bd.broker_name for bd in only_a.broker_datas] == ["broker-a"]


def test_multiple_clusters(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T1", "Both"), V1)
    rim.register_broker("c1", "broker-a", A1, 1, "", [], V1)
    rim.register_broker("c2", "broker-c", C0, 0, "", topics("T2", "Both"), V1)
    info = rim.cluster_info()
    assert info.cluster_addr_table == {"c1": ("broker-a",), "c2": ("broker-c",)}
    assert info.broker_addr_table["broker-a"] == BrokerData("c1", "broker-a", {0: A0, 1: A1})
    assert info.broker_addr_table["broker-c"] == BrokerData("c2", "broker-c", {0: C0})
    assert rim.topics_by_cluster("c1") == ["Both", "T1"]
    assert rim.topics_by_cluster("c2") == ["Both", "T2"]
    assert rim.topics_by_cluster("nope") == []


def test_topic_table_reread_only_when_data_version_changes(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T", queues=16), V1)
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].write_queue_nums == 4
    rim.register_broker("c1", "broker-a", A0, 0, "", [*topics("T", queues=16), *topics("New")], V2)
    route = rim.pick_route("T")
    assert route is not None and route.queue_datas[0].write_queue_nums == 16
    assert rim.pick_route("New") is not None


def test_partial_registration_keeps_other_topics(rim: RouteInfoManager) -> None:
    # 5.x brokers register just a newly created topic; the others must stay routable.
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T", "U"), V1)
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("New"), V2)
    assert rim.all_topics() == ["New", "T", "U"]


def test_expiry_with_fake_clock(rim: RouteInfoManager, clock: FakeClock) -> None:
    conn = object()
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, conn)
    rim.register_broker("c1", "broker-b", B0, 0, "", topics("T"), V1)
    clock.advance(100_000)
    rim.register_broker("c1", "broker-b", B0, 0, "", topics("T"), V1)  # b stays fresh
    clock.advance(20_000)
    assert rim.scan_inactive() == []  # a silent for exactly 120 s: not yet
    clock.advance(500)
    assert rim.scan_inactive() == [ExpiredBroker(A0, conn)]
    route = rim.pick_route("T")
    assert route is not None and [bd.broker_name for bd in route.broker_datas] == ["broker-b"]
    assert "broker-a" not in rim.cluster_info().broker_addr_table
    assert not rim.conn_in_use(conn)
    assert [b.addr for b in rim.scan_inactive(clock.seconds() + 121)] == [B0]
    assert rim.pick_route("T") is None
    assert rim.all_topics() == []
    assert rim.cluster_info().cluster_addr_table == {}


def test_per_broker_timeout(rim: RouteInfoManager, clock: FakeClock) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, timeout_s=10)
    clock.advance(11_000)
    assert [b.addr for b in rim.scan_inactive()] == [A0]


def test_replica_expiry_keeps_master_and_master_expiry_keeps_queues(rim: RouteInfoManager, clock: FakeClock) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    clock.advance(60_000)
    rim.register_broker("c1", "broker-a", A1, 1, "", [], V1)
    clock.advance(61_000)
    rim.scan_inactive()  # the master expires, the replica still serves reads
    route = rim.pick_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {1: A1}
    assert route.queue_datas[0].broker_name == "broker-a"


def test_unregister(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    rim.register_broker("c1", "broker-a", A1, 1, "", [], V1)
    assert not rim.unregister_broker("c1", "broker-a", B0, 0)  # a stale request for another address
    assert rim.unregister_broker("c1", "broker-a", A1, 1)
    route = rim.pick_route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: A0}
    assert rim.unregister_broker("c1", "broker-a", A0, 0)
    assert rim.pick_route("T") is None
    assert rim.cluster_info().broker_addr_table == {}
    assert rim.live_brokers() == {}
    assert not rim.unregister_broker("c1", "broker-a", A0, 0)


def test_connection_close_removes_its_brokers_only(rim: RouteInfoManager) -> None:
    conn_a, conn_b = object(), object()
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, conn_a)
    rim.register_broker("c1", "broker-b", B0, 0, "", topics("T"), V1, conn_b)
    assert rim.on_connection_closed(object()) == []
    assert rim.on_connection_closed(conn_a) == [A0]
    route = rim.pick_route("T")
    assert route is not None and [bd.broker_name for bd in route.broker_datas] == ["broker-b"]


def test_reconnected_broker_survives_its_old_connection_closing(rim: RouteInfoManager) -> None:
    old, new = object(), object()
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, old)
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, new)
    assert rim.on_connection_closed(old) == []
    assert rim.pick_route("T") is not None
    assert rim.on_connection_closed(new) == [A0]


def test_replica_promoted_in_place(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    rim.register_broker("c1", "broker-a", A1, 1, "", topics("T"), V1)
    rim.unregister_broker("c1", "broker-a", A0, 0)
    rim.register_broker("c1", "broker-a", A1, 0, "", topics("T", queues=2), V1)
    route = rim.pick_route("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: A1}
    assert route.queue_datas[0].write_queue_nums == 2  # a new master: its table is read even at the same version


def test_new_machine_takes_over_an_id_once_the_old_one_is_gone(rim: RouteInfoManager, clock: FakeClock) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    # Same state version: the live holder keeps the id (no flapping between two claimants).
    assert rim.register_broker("c1", "broker-a", B0, 0, "", topics("T"), V1) == RegisterBrokerResult(None, None)
    assert set(rim.live_brokers()) == {A0}
    clock.advance(120_500)  # A0 is silent past its timeout; the scan has not run yet
    rim.register_broker("c1", "broker-a", B0, 0, "", topics("T"), V1)
    assert set(rim.live_brokers()) == {B0}
    assert rim.cluster_info().broker_addr_table["broker-a"].broker_addrs == {0: B0}


def test_renamed_broker_leaves_its_old_group(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    rim.register_broker("c1", "broker-z", A0, 0, "", topics("Z"), V1)
    assert list(rim.cluster_info().broker_addr_table) == ["broker-z"]
    assert rim.all_topics() == ["Z"]


def test_delete_topic(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T", "U"), V1)
    rim.register_broker("c2", "broker-c", C0, 0, "", topics("T"), V1)
    assert rim.delete_topic("T", "c2")
    route = rim.pick_route("T")
    assert route is not None and [bd.broker_name for bd in route.broker_datas] == ["broker-a"]
    assert rim.delete_topic("T")
    assert rim.pick_route("T") is None
    assert not rim.delete_topic("T")
    # Deleted for good: the broker's next heartbeat carries the same data version.
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T", "U"), V1)
    assert rim.all_topics() == ["U"]


def test_filter_servers_in_route(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1, filter_servers=["10.0.0.1:30000"])
    route = rim.pick_route("T")
    assert route is not None and route.filter_server_table == {A0: ("10.0.0.1:30000",)}
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    route = rim.pick_route("T")
    assert route is not None and route.filter_server_table == {}


def test_cluster_change_moves_the_group(rim: RouteInfoManager) -> None:
    rim.register_broker("c1", "broker-a", A0, 0, "", topics("T"), V1)
    rim.register_broker("c2", "broker-a", A0, 0, "", topics("T"), V1)
    info = rim.cluster_info()
    assert info.cluster_addr_table == {"c2": ("broker-a",)}
    assert info.broker_addr_table["broker-a"].cluster == "c2"
