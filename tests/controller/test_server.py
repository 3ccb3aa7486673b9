"""The controller over the network: an in-process ControllerServer (LocalLog in tmp_path) driven with raw remoting
requests, a fake clock for liveness, and a fake broker (a RemotingServer) that records NOTIFY_BROKER_ROLE_CHANGED."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.controller.heartbeats import BrokerIdentity
from cometmq.controller.log import LocalLog
from cometmq.controller.server import ControllerConfig, ControllerServer
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RequestCode as Req
from cometmq.protocol.codes import ResponseCode as RC
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit.wait import eventually

CLUSTER, NAME = "c1", "g1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class FakeBroker:
    """A broker's remoting port that records the role-change notifications it gets."""

    def __init__(self) -> None:
        self.notified: list[RemotingCommand] = []
        self.got = asyncio.Event()
        self.server = RemotingServer("127.0.0.1", 0, {Req.NOTIFY_BROKER_ROLE_CHANGED: self._notify})

    async def _notify(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        self.notified.append(cmd)
        self.got.set()

    async def notice_of(self, master_id: int) -> RemotingCommand:
        """The first notification naming ``master_id``, waiting for it."""
        async with asyncio.timeout(5):
            while True:
                for cmd in self.notified:
                    if cmd.ext_fields.get("masterBrokerId") == str(master_id):
                        return cmd
                self.got.clear()
                await self.got.wait()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"


def _server(tmp_path: Path, clock: FakeClock) -> ControllerServer:
    # the scan runs when the test says (wakeup / scan_once), not on its own
    return ControllerServer(ControllerConfig(port=0, scan_interval_s=3600, startup_grace_ms=0),
                            LocalLog(tmp_path / "ctl"), clock)


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    async with RemotingClient() as c:
        yield c


async def call(client: RemotingClient, ctl: ControllerServer, code: int, body: bytes = b"",
               **fields: object) -> RemotingCommand:
    return await client.invoke(ctl.addr, make_request(code, fields, body), 5)


async def heartbeat(client: RemotingClient, ctl: ControllerServer, broker_id: int, addr: str, *,
                    max_offset: int = 0, epoch: int = 0) -> None:
    # two-way here so the test knows it was handled; brokers send it oneway
    reply = await call(client, ctl, Req.BROKER_HEARTBEAT, clusterName=CLUSTER, brokerName=NAME, brokerId=broker_id,
                       brokerAddr=addr, epoch=epoch, maxOffset=max_offset, confirmOffset=max_offset,
                       heartbeatTimeoutMills=3000)
    assert reply.code == RC.SUCCESS


async def join(client: RemotingClient, ctl: ControllerServer, addr: str) -> int:
    """GET_NEXT_BROKER_ID, APPLY_BROKER_ID, REGISTER_BROKER as a broker in controller mode does."""
    reply = await call(client, ctl, Req.CONTROLLER_GET_NEXT_BROKER_ID, clusterName=CLUSTER, brokerName=NAME)
    assert reply.code == RC.SUCCESS, reply.remark
    broker_id = int(reply.ext_fields["nextBrokerId"])
    reply = await call(client, ctl, Req.CONTROLLER_APPLY_BROKER_ID, clusterName=CLUSTER, brokerName=NAME,
                       appliedBrokerId=broker_id, registerCheckCode=f"{addr};1")
    assert reply.code == RC.SUCCESS, reply.remark
    reply = await call(client, ctl, Req.CONTROLLER_REGISTER_BROKER, clusterName=CLUSTER, brokerName=NAME,
                       brokerId=broker_id, brokerAddress=addr, invokeTime=1)
    assert reply.code == RC.SUCCESS, reply.remark
    return broker_id


def set_body(members: list[int], epoch: int) -> bytes:
    return json.dumps({"syncStateSet": members, "syncStateSetEpoch": epoch}).encode()


async def test_lifecycle_of_a_group(tmp_path: Path, client: RemotingClient) -> None:
    clock = FakeClock()
    b1, b2 = FakeBroker(), FakeBroker()
    async with b1.server, b2.server:
        ctl = _server(tmp_path, clock)
        async with ctl:
            assert await join(client, ctl, b1.addr) == 1
            assert await join(client, ctl, b2.addr) == 2
            # the same id with the same check code again is fine; another code is refused
            reply = await call(client, ctl, Req.CONTROLLER_APPLY_BROKER_ID, clusterName=CLUSTER, brokerName=NAME,
                               appliedBrokerId=2, registerCheckCode="other;2")
            assert reply.code == RC.CONTROLLER_BROKER_ID_INVALID
            await heartbeat(client, ctl, 1, b1.addr, max_offset=100)
            await heartbeat(client, ctl, 2, b2.addr, max_offset=100)

            # the first election: the requester becomes master at epoch 1
            reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME,
                               brokerId=1, designateElect="false", invokeTime=1)
            assert reply.code == RC.SUCCESS, reply.remark
            assert reply.ext_fields["masterBrokerId"] == "1" and reply.ext_fields["masterEpoch"] == "1"
            assert reply.ext_fields["masterAddress"] == b1.addr
            first = await b1.notice_of(1)  # every applied election is announced to the alive members
            assert first.ext_fields["masterEpoch"] == "1"
            body = json.loads(reply.body)
            assert body["syncStateSet"] == [1]
            assert body["brokerMemberGroup"]["brokerAddrs"] == {"1": b1.addr, "2": b2.addr}
            set_epoch = int(reply.ext_fields["syncStateSetEpoch"])
            # asked again: the master is still there (brokers take it as success)
            reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME,
                               brokerId=2, designateElect="false", invokeTime=1)
            assert reply.code == RC.CONTROLLER_MASTER_STILL_EXIST and reply.ext_fields["masterBrokerId"] == "1"

            # the master adds broker 2 to the set; stale epochs are fenced
            alter = {"brokerName": NAME, "masterBrokerId": 1, "invokeTime": 1}
            reply = await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, set_body([1, 2], set_epoch),
                               **alter, masterEpoch=0)
            assert reply.code == RC.CONTROLLER_FENCED_MASTER_EPOCH
            reply = await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, set_body([1, 2], set_epoch - 1),
                               **alter, masterEpoch=1)
            assert reply.code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            reply = await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, set_body([1, 2], set_epoch),
                               **alter, masterEpoch=1)
            assert reply.code == RC.SUCCESS, reply.remark
            assert int(reply.ext_fields["newSyncStateSetEpoch"]) == set_epoch + 1
            assert json.loads(reply.body)["syncStateSet"] == [1, 2]

            reply = await call(client, ctl, Req.CONTROLLER_GET_REPLICA_INFO, brokerName=NAME)
            assert reply.code == RC.SUCCESS
            assert (reply.ext_fields["masterBrokerId"], reply.ext_fields["masterEpoch"]) == ("1", "1")
            reply = await call(client, ctl, Req.CONTROLLER_GET_REPLICA_INFO, brokerName="nobody")
            assert reply.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST

            # the master's heartbeats stop; broker 2 goes on: the scan elects it at epoch 2 and tells both alive
            clock.now += 2000
            await heartbeat(client, ctl, 2, b2.addr, max_offset=100)
            clock.now += 1500
            await ctl.processors.scan_once()
            note = await b2.notice_of(2)
            assert note.ext_fields["masterBrokerId"] == "2" and note.ext_fields["masterEpoch"] == "2"
            assert note.ext_fields["masterAddress"] == b2.addr
            assert "toThisBroker" not in note.ext_fields
            assert json.loads(note.body)["syncStateSet"] == [2]
            assert all(n.ext_fields["masterBrokerId"] == "1" for n in b1.notified)  # dead: not told

            reply = await call(client, ctl, Req.CONTROLLER_GET_SYNC_STATE_DATA, json.dumps([NAME]).encode())
            info = json.loads(reply.body)["replicasInfoTable"][NAME]
            assert info["masterBrokerId"] == 2 and info["masterEpoch"] == 2
            assert [(r["brokerId"], r["alive"]) for r in info["inSyncReplicas"]] == [(2, True)]
            assert [(r["brokerId"], r["alive"]) for r in info["notInSyncReplicas"]] == [(1, False)]
            state = ctl.processors.state.to_json()

        # restarted from its data folder: the same state
        ctl = _server(tmp_path, clock)
        async with ctl:
            assert ctl.processors.state.to_json() == state
            reply = await call(client, ctl, Req.CONTROLLER_GET_REPLICA_INFO, brokerName=NAME)
            assert (reply.ext_fields["masterBrokerId"], reply.ext_fields["masterEpoch"]) == ("2", "2")


async def test_a_closed_connection_triggers_an_election(tmp_path: Path, client: RemotingClient) -> None:
    clock = FakeClock()
    b2 = FakeBroker()
    async with b2.server, _server(tmp_path, clock) as ctl:
        ctl.processors._scan.interval_s = 3600
        await join(client, ctl, "127.0.0.1:1")
        await join(client, ctl, b2.addr)
        async with RemotingClient() as master_link:  # the master's own connection
            await master_link.invoke(ctl.addr, make_request(Req.BROKER_HEARTBEAT, {
                "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 1, "brokerAddr": "127.0.0.1:1"}), 5)
            await heartbeat(client, ctl, 2, b2.addr)
            reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME,
                               brokerId=1)
            assert reply.code == RC.SUCCESS
            reply = await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, set_body([1, 2], 1),
                               brokerName=NAME, masterBrokerId=1, masterEpoch=1)
            assert reply.code == RC.SUCCESS, reply.remark
        # no time passes: the close alone makes broker 1 dead and wakes the scan
        note = await b2.notice_of(2)
        assert note.ext_fields["masterEpoch"] == "2"


async def test_errors_and_metadata(tmp_path: Path, client: RemotingClient) -> None:
    async with _server(tmp_path, FakeClock()) as ctl:
        reply = await call(client, ctl, Req.CONTROLLER_GET_METADATA_INFO)
        assert reply.code == RC.SUCCESS
        assert reply.ext_fields["isLeader"] == "true" and reply.ext_fields["controllerLeaderAddress"] == ctl.addr
        reply = await call(client, ctl, Req.CONTROLLER_REGISTER_BROKER, clusterName=CLUSTER, brokerName=NAME,
                           brokerId=1, brokerAddress="127.0.0.1:1")
        assert reply.code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
        reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME,
                           brokerId=1)
        assert reply.code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
        reply = await call(client, ctl, Req.CONTROLLER_APPLY_BROKER_ID, clusterName=CLUSTER, brokerName=NAME)
        assert reply.code == RC.CONTROLLER_INVALID_REQUEST and "appliedBrokerId" in (reply.remark or "")
        reply = await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, b"nope", brokerName=NAME,
                           masterBrokerId=1, masterEpoch=1)
        assert reply.code == RC.CONTROLLER_INVALID_REQUEST


class _Follower(LocalLog):
    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_address(self) -> str | None:
        return "10.0.0.9:9878"


async def test_a_follower_answers_not_leader(tmp_path: Path, client: RemotingClient) -> None:
    ctl = ControllerServer(ControllerConfig(port=0), _Follower(tmp_path), FakeClock())
    async with ctl:
        reply = await call(client, ctl, Req.CONTROLLER_GET_NEXT_BROKER_ID, clusterName=CLUSTER, brokerName=NAME)
        assert reply.code == RC.CONTROLLER_NOT_LEADER and "10.0.0.9:9878" in (reply.remark or "")
        reply = await call(client, ctl, Req.CONTROLLER_GET_METADATA_INFO)
        assert reply.ext_fields["isLeader"] == "false"
        assert reply.ext_fields["controllerLeaderAddress"] == "10.0.0.9:9878"


async def test_restart_grace_and_a_master_coming_back(tmp_path: Path, client: RemotingClient) -> None:
    clock = FakeClock()
    config = ControllerConfig(port=0, scan_interval_s=3600)  # startup grace: the heartbeat timeout (10 s)

    def group() -> tuple[int | None, int]:
        g = ctl.processors.state.group(NAME)
        assert g is not None
        return g.master, g.master_epoch

    async with ControllerServer(config, LocalLog(tmp_path), clock) as ctl:
        await join(client, ctl, "127.0.0.1:1")
        await join(client, ctl, "127.0.0.1:2")
        await heartbeat(client, ctl, 1, "127.0.0.1:1")
        await heartbeat(client, ctl, 2, "127.0.0.1:2")
        assert (await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME,
                           brokerId=1)).code == RC.SUCCESS
        assert (await call(client, ctl, Req.CONTROLLER_ALTER_SYNC_STATE_SET, set_body([1, 2], 1), brokerName=NAME,
                           masterBrokerId=1, masterEpoch=1)).code == RC.SUCCESS
    async with ControllerServer(config, LocalLog(tmp_path), clock) as ctl:
        # restarted: only broker 2 has been heard from yet; the master gets its chance to heartbeat first
        await heartbeat(client, ctl, 2, "127.0.0.1:2")
        await ctl.processors.scan_once()
        assert group() == (1, 1)
        clock.now += 10_001
        await heartbeat(client, ctl, 2, "127.0.0.1:2")
        await ctl.processors.scan_once()
        assert group() == (2, 2)
        # now broker 2 is lost and only 1, outside the set {2}, lives: no master (epoch 3) ...
        clock.now += 10_001
        await heartbeat(client, ctl, 1, "127.0.0.1:1")
        await ctl.processors.scan_once()
        assert group() == (None, 3)
        await ctl.processors.scan_once()  # nothing more to record
        assert group() == (None, 3)
        # ... until broker 2 is back: the scan makes it master again
        await heartbeat(client, ctl, 2, "127.0.0.1:2")
        await ctl.processors.scan_once()
        assert group() == (2, 4)


async def test_heartbeats_with_made_up_names_are_bounded(tmp_path: Path, client: RemotingClient) -> None:
    """Anyone may send BROKER_HEARTBEAT (ACL off): made-up brokers, even ones stating a timeout that never ends,
    take a bounded number of records; a registered broker's heartbeat is still taken; and what a record held
    (its HA address) goes with it, when its connection closes or when it expires."""
    clock = FakeClock()
    async with _server(tmp_path, clock) as ctl:
        await join(client, ctl, "127.0.0.1:1")
        table = ctl.processors.heartbeats
        made_up = [BrokerIdentity(f"c{i}", f"made-up-{i}", i) for i in range(5000)]
        async with RemotingClient() as flood:
            for start in range(0, len(made_up), 500):
                await asyncio.gather(*(call(flood, ctl, Req.BROKER_HEARTBEAT, clusterName=w.cluster,
                                            brokerName=w.broker_name, brokerId=w.broker_id, brokerAddr="10.9.0.1:1",
                                            heartbeatTimeoutMills=2**62, haServerAddr=f"10.9.0.1:{w.broker_id}")
                                       for w in made_up[start:start + 500]))
            assert len(table) <= 2048
            await heartbeat(client, ctl, 1, "127.0.0.1:1")  # a registered broker still gets in
            assert table.is_alive(BrokerIdentity(CLUSTER, NAME, 1), clock.now)
        # the flood's connection closed: its records go, HA addresses too
        await eventually(lambda: len(table) == 1, what="the closed connection's records dropped")
        assert all(table.ha_address(w) is None for w in made_up)

        brief = [BrokerIdentity("x", f"brief-{i}", 1) for i in range(100)]
        await asyncio.gather(*(call(client, ctl, Req.BROKER_HEARTBEAT, clusterName=w.cluster,
                                    brokerName=w.broker_name, brokerId=1, brokerAddr="10.8.0.1:1",
                                    heartbeatTimeoutMills=1000, haServerAddr="10.8.0.1:2") for w in brief))
        assert all(table.ha_address(w) == "10.8.0.1:2" for w in brief)
        clock.now += 60_000
        await ctl.processors.scan_once()
        assert len(table) == 0 and all(table.ha_address(w) is None for w in brief)


async def test_an_election_naming_another_cluster_is_refused(tmp_path: Path, client: RemotingClient) -> None:
    """ELECT_MASTER for a group of another cluster (an operator's typo in `admin elect-master --cluster`) changes
    nothing, as CLEAN_BROKER_DATA already refuses it."""
    async with _server(tmp_path, FakeClock()) as ctl:
        await join(client, ctl, "127.0.0.1:1")
        before = ctl.processors.state.to_json()
        reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName="other", brokerName=NAME,
                           brokerId=1, designateElect="true")
        assert reply.code == RC.CONTROLLER_INVALID_REQUEST and CLUSTER in (reply.remark or "")
        assert ctl.processors.state.to_json() == before
        reply = await call(client, ctl, Req.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER, brokerName=NAME, brokerId=1)
        assert reply.code == RC.SUCCESS, reply.remark
