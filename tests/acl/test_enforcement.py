"""ACL end to end on a real nameserver and broker (aclEnable=true): a plain socket without credentials changes
nothing, the SDK signs with a user's keys and gets what the ACL grants, admin verbs edit the file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cometmq.acl import parse_acl
from cometmq.broker.controller import BrokerController
from cometmq.client.admin import Admin
from cometmq.client.errors import BrokerError
from cometmq.client.message import Message
from cometmq.client.producer import Producer
from cometmq.client.transaction_producer import EndEntry, LocalTransactionState, TransactionProducer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.broker.conftest import broker_config, pull_request, send_request
from tests.kit.acl import admin_and_user

ADMIN = ("adminUser1", "adminSecret1")
USER = ("userAlpha1", "userSecret1")

ACL = admin_and_user(ADMIN, USER, topic_perms={"allowed": "PUB|SUB", "denied": "DENY"})


@dataclass
class Cluster:
    ns: NamesrvController
    broker: BrokerController
    acl_path: Path

    @property
    def namesrv(self) -> str:
        return self.ns.addr

    @property
    def addr(self) -> str:
        return self.broker.addr


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL)
    ns = NamesrvController(NamesrvConfig(port=0, acl_enable=True, acl_file=str(acl_path)))
    await ns.start()
    broker = BrokerController(broker_config(tmp_path / "broker", namesrv_addr=ns.addr, acl_enable=True,
                                            acl_file=str(acl_path), inner_credentials=ADMIN,
                                            auto_create_topic_enable=False))
    await broker.start()
    try:
        async with Admin(namesrv=ns.addr, credentials=ADMIN) as admin:
            for topic in ("allowed", "denied"):
                await admin.create_topic(topic, read_queues=1)
        yield Cluster(ns, broker, acl_path)
    finally:
        await broker.stop()
        await ns.stop()


async def _call(addr: str, cmd: RemotingCommand, creds: tuple[str, str] | None = None) -> RemotingCommand:
    async with RemotingClient() as client:
        if creds is not None:
            cmd = sign_request(cmd, Credentials(*creds))
        return await client.invoke(addr, cmd)


async def test_a_plain_socket_changes_nothing(cluster: Cluster) -> None:
    b = cluster.broker
    attempts = [
        make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "sneaky", "readQueueNums": 1,
                                                           "writeQueueNums": 1, "perm": 6}),
        make_request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "allowed"}),
        make_request(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G"}),
        make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "allowed", "queueId": 0,
                                                          "commitOffset": 42}),
        make_request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "allowed", "group": "G",
                                                                 "timestamp": 0, "isForce": "true"}),
        make_request(RequestCode.UPDATE_BROKER_CONFIG, {}, b"brokerPermission=2\n"),
    ]
    for cmd in attempts:
        r = await _call(cluster.addr, cmd)
        assert r.code == ResponseCode.NO_PERMISSION, (cmd.code, r)
        assert r.remark == "No accessKey is configured"
    assert "sneaky" not in b.topics.topics and "allowed" in b.topics.topics
    assert b.offsets.table.get("allowed@G", {}).get(0) is None
    assert b.config.broker_permission == 6
    # a user without admin rights is refused admin codes too, by name
    r = await _call(cluster.addr, attempts[0], USER)
    assert r.code == ResponseCode.NO_PERMISSION
    assert r.remark == f"Need admin permission for request code=17, but accessKey={USER[0]} is not"
    # a wrong secret is a bad signature
    r = await _call(cluster.addr, send_request("allowed", b"x"), (USER[0], "notTheSecret"))
    assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, f"Check signature failed for accessKey={USER[0]}")


async def test_the_nameserver_refuses_changes_without_an_admin_account(cluster: Cluster) -> None:
    ns = cluster.namesrv
    r = await _call(ns, make_request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "allowed"}))
    assert r.code == ResponseCode.NO_PERMISSION
    r = await _call(ns, make_request(RequestCode.UNREGISTER_BROKER, {
        "brokerName": cluster.broker.config.broker_name, "brokerAddr": cluster.addr,
        "clusterName": cluster.broker.config.broker_cluster_name, "brokerId": 0}))
    assert r.code == ResponseCode.NO_PERMISSION
    r = await _call(ns, make_request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "allowed"}), USER)
    assert r.code == ResponseCode.NO_PERMISSION and "Need admin permission" in (r.remark or "")
    # reads stay open (as RocketMQ's nameserver): the route is still there, the broker still registered
    r = await _call(ns, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "allowed"}))
    assert r.code == ResponseCode.SUCCESS and cluster.addr.encode() in r.body


async def test_only_an_admin_account_keeps_a_broker_alive_on_the_nameserver(cluster: Cluster) -> None:
    """QUERY_DATA_VERSION (322) is a broker's periodic check that its registration is current; the nameserver
    counts the broker as alive from then on (as RocketMQ's queryBrokerTopicConfig), so it is a change, not a read.
    It was open to anyone: a plain socket repeating it kept a dead broker in the routes for good, clients sending
    to it."""
    ns, addr = cluster.ns, cluster.addr
    info = ns.route_info.live_brokers()[addr]
    query = make_request(RequestCode.QUERY_DATA_VERSION, {
        "brokerAddr": addr, "brokerName": cluster.broker.config.broker_name,
        "clusterName": info.cluster, "brokerId": 0}, info.data_version.encode())
    before = info.last_update
    for creds in (None, USER):
        r = await _call(cluster.namesrv, query, creds)
        assert r.code == ResponseCode.NO_PERMISSION, (creds, r.code, r.remark)
        assert ns.route_info.live_brokers()[addr].last_update == before
    # the broker's own (admin) credentials: answered, and it counts as alive from now
    r = await _call(cluster.namesrv, query, ADMIN)
    assert r.code == ResponseCode.SUCCESS and r.ext_fields["changed"] == "false"
    assert ns.route_info.live_brokers()[addr].last_update > before


async def test_the_sdk_signs_with_a_users_keys(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv, credentials=USER) as producer:
        result = await producer.send(Message("allowed", b"hello"))
        assert result.queue.topic == "allowed"
        with pytest.raises(BrokerError) as err:
            await producer.send(Message("denied", b"nope"))
        assert err.value.code == ResponseCode.NO_PERMISSION and "topic=denied" in err.value.remark
    # pulls: allowed topic yes, denied no (the group's default SUB lets the group in)
    r = await _call(cluster.addr, pull_request("allowed", 0, group="G", suspend_ms=0), USER)
    assert r.code == ResponseCode.SUCCESS
    r = await _call(cluster.addr, pull_request("denied", 0, group="G", suspend_ms=0), USER)
    assert r.code == ResponseCode.NO_PERMISSION and "topic=denied" in (r.remark or "")
    # without credentials the SDK gets the same refusal as a socket
    async with Producer("pg", namesrv=cluster.namesrv) as anonymous:
        with pytest.raises(BrokerError) as err:
            await anonymous.send(Message("allowed", b"x"))
        assert err.value.code == ResponseCode.NO_PERMISSION


async def test_the_sdk_decides_halves_in_batches_with_a_users_keys(cluster: Cluster) -> None:
    """END_TRANSACTION_BATCH names the halves' topic: a user account that may publish to it decides them."""
    S = LocalTransactionState
    async with TransactionProducer("txg", namesrv=cluster.namesrv, credentials=USER) as producer:
        results = await producer.send_half_batch([Message("allowed", f"m{i}".encode()) for i in range(4)])
        outcomes = await producer.end_transactions([(r, S.COMMIT) for r in results[:2]])
        assert all(o.ok for o in outcomes), outcomes
        first = results[2]
        rng = EndEntry(decode_offset_msg_id(first.offset_msg_id).offset, first.queue_offset, S.ROLLBACK.value,
                       first.msg_id, 2)
        [rolled] = await producer.end_transaction_batch(first.queue.broker_name, [rng], topic="allowed")
        assert rolled.ok, rolled
        with pytest.raises(BrokerError) as err:  # naming no topic: an admin's request
            await producer.end_transaction_batch(first.queue.broker_name, [rng])
        assert err.value.code == ResponseCode.NO_PERMISSION
    b = cluster.broker
    assert b.store.max_offset("allowed", 0) == 2 and len(b.transactions.table) == 0


async def test_admin_verbs_edit_the_acl_file(cluster: Cluster) -> None:
    async with Admin(namesrv=cluster.namesrv, credentials=ADMIN) as admin:
        assert await admin.update_acl_account("userBravo1", secret_key="bravoSecret1", default_topic_perm="DENY",
                                              topic_perms=["denied=PUB"]) == [cluster.broker.config.broker_name]
        config = await admin.acl_config()
        versions = await admin.acl_versions()
    written = parse_acl(cluster.acl_path.read_text())
    assert written.accounts["userBravo1"].topic_perms == {"denied": 4}
    assert written.counter == 1
    [only] = config.values()
    assert {a["accessKey"] for a in only["plainAccessConfigs"]} == {ADMIN[0], USER[0], "userBravo1"}
    assert next(iter(versions.values()))["version"]["counter"] == 1
    async with Producer("pg", namesrv=cluster.namesrv, credentials=("userBravo1", "bravoSecret1")) as producer:
        await producer.send(Message("denied", b"now allowed"))
    # a user cannot edit the ACL
    async with Admin(namesrv=cluster.namesrv, credentials=USER) as admin:
        with pytest.raises(BrokerError) as err:
            await admin.delete_acl_account("userBravo1")
        assert err.value.code == ResponseCode.NO_PERMISSION
    async with Admin(namesrv=cluster.namesrv, credentials=ADMIN) as admin:
        await admin.delete_acl_account("userBravo1")
    assert "userBravo1" not in parse_acl(cluster.acl_path.read_text()).accounts


async def test_acl_off_by_default(tmp_path: Path) -> None:
    broker = BrokerController(broker_config(tmp_path / "b"))
    assert broker.acl is None
    assert RequestCode.UPDATE_AND_CREATE_ACL_CONFIG not in broker.dispatcher
