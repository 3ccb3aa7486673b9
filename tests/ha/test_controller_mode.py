"""Brokers in controller mode against a fake controller: a RemotingServer answering RocketMQ's controller codes
from a small dict-based state (not the real controller: this tests the broker's side of the protocol)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.broker.ha.controller_client import META_FILE, TEMP_META_FILE
from cometmq.broker.ha.service import Role
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from tests.broker.conftest import StartBroker, send_request
from tests.kit import eventually

RC = RequestCode


class FakeController:
    """One controller node that is always the leader; a broker group's state in plain fields."""

    def __init__(self) -> None:
        self.next_id = 1
        self.applied: dict[int, str] = {}
        self.addrs: dict[int, str] = {}
        self.ha_addrs: dict[int, str] = {}
        self.master: int | None = None
        self.epoch = 0
        self.sync_state_set: set[int] = set()
        self.set_epoch = 0
        self.calls: list[int] = []
        self.heartbeats: list[dict[str, str]] = []
        self.alters: list[dict[str, Any]] = []
        #: ALTER_SYNC_STATE_SET waits for this (a test holds the answer back)
        self.alter_gate = asyncio.Event()
        self.alter_gate.set()
        #: GET_REPLICA_INFO waits for this (a test holds the answers back)
        self.info_gate = asyncio.Event()
        self.info_gate.set()
        self.refuse_alter: int | None = None
        #: REGISTER_BROKER answers SYSTEM_ERROR while this is False
        self.register_ok = True
        #: every request's connection is closed unanswered (the controller is unreachable)
        self.down = False
        self.server = RemotingServer("127.0.0.1", 0, {code: self._handle for code in (
            RC.BROKER_HEARTBEAT, RC.CONTROLLER_GET_METADATA_INFO, RC.CONTROLLER_GET_NEXT_BROKER_ID,
            RC.CONTROLLER_APPLY_BROKER_ID, RC.CONTROLLER_REGISTER_BROKER, RC.CONTROLLER_ELECT_MASTER,
            RC.CONTROLLER_ALTER_SYNC_STATE_SET, RC.CONTROLLER_GET_REPLICA_INFO)})

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def _role(self, cmd: RemotingCommand, code: int = ResponseCode.SUCCESS) -> RemotingCommand:
        fields: dict[str, object] = {"masterBrokerId": self.master if self.master is not None else "",
                                     "masterAddress": self.addrs.get(self.master, "") if self.master else "",
                                     "masterEpoch": self.epoch, "syncStateSetEpoch": self.set_epoch}
        if self.master in self.ha_addrs:
            fields["masterHaAddress"] = self.ha_addrs[self.master]
        body = json.dumps({"syncStateSet": sorted(self.sync_state_set), "syncStateSetEpoch": self.set_epoch})
        return make_response(cmd, code, None, fields, body.encode())

    async def _handle(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        if self.down:
            conn.close()
            return None
        self.calls.append(cmd.code)
        f = cmd.ext_fields
        if cmd.code == RC.BROKER_HEARTBEAT:
            self.heartbeats.append(dict(f))
            return None
        if cmd.code == RC.CONTROLLER_GET_METADATA_INFO:
            return make_response(cmd, ResponseCode.SUCCESS, None, {"isLeader": "true", "controllerLeaderId": "n0",
                                                                   "controllerLeaderAddress": self.addr})
        if cmd.code == RC.CONTROLLER_GET_NEXT_BROKER_ID:
            return make_response(cmd, ResponseCode.SUCCESS, None, {"nextBrokerId": self.next_id})
        if cmd.code == RC.CONTROLLER_APPLY_BROKER_ID:
            bid, check = int(f["appliedBrokerId"]), f["registerCheckCode"]
            if self.applied.get(bid, check) != check:
                return make_response(cmd, ResponseCode.CONTROLLER_BROKER_ID_INVALID, "taken")
            self.applied[bid] = check
            self.next_id = max(self.next_id, bid + 1)
            return make_response(cmd)
        if cmd.code == RC.CONTROLLER_REGISTER_BROKER:
            if not self.register_ok:
                return make_response(cmd, ResponseCode.SYSTEM_ERROR, "not now")
            self.addrs[int(f["brokerId"])] = f["brokerAddress"]
            return self._role(cmd)
        if cmd.code == RC.CONTROLLER_ELECT_MASTER:
            if self.master is not None:
                return self._role(cmd, ResponseCode.CONTROLLER_MASTER_STILL_EXIST)
            self.master, self.epoch = int(f["brokerId"]), self.epoch + 1
            self.sync_state_set, self.set_epoch = {self.master}, self.set_epoch + 1
            return self._role(cmd)
        if cmd.code == RC.CONTROLLER_ALTER_SYNC_STATE_SET:
            await self.alter_gate.wait()
            body = json.loads(cmd.body)
            self.alters.append({**f, **body})
            if self.refuse_alter is not None:
                return make_response(cmd, self.refuse_alter, "refused")
            if int(f["masterEpoch"]) != self.epoch or int(f["masterBrokerId"]) != self.master:
                return make_response(cmd, ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, "fenced")
            self.sync_state_set, self.set_epoch = set(body["syncStateSet"]), self.set_epoch + 1
            answer = json.dumps({"syncStateSet": sorted(self.sync_state_set), "syncStateSetEpoch": self.set_epoch})
            return make_response(cmd, ResponseCode.SUCCESS, None, {"newSyncStateSetEpoch": self.set_epoch},
                                 answer.encode())
        assert cmd.code == RC.CONTROLLER_GET_REPLICA_INFO
        await self.info_gate.wait()
        return self._role(cmd)


@pytest.fixture
async def fake() -> AsyncIterator[FakeController]:
    c = FakeController()
    await c.server.start()
    try:
        yield c
    finally:
        c.alter_gate.set()
        c.info_gate.set()
        await c.server.stop()


def controller_mode(fake: FakeController, **extra: Any) -> dict[str, Any]:
    return {"enable_controller_mode": True, "controller_addr": fake.addr, "broker_heartbeat_interval_ms": 100,
            "sync_broker_metadata_period_ms": 200, "sync_controller_metadata_period_ms": 1000, **extra}


async def test_off_by_default(start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    broker = await start_broker(tmp_path / "b")
    assert broker.controller_client is None and broker.replication.confirmed
    assert (await client.invoke(broker.addr, send_request("T", b"x"), 5)).code == ResponseCode.SUCCESS
    assert not (tmp_path / "b" / META_FILE).exists()


async def test_the_id_is_applied_persisted_and_reused(start_broker: StartBroker, fake: FakeController,
                                                      tmp_path: Path) -> None:
    fake.next_id = 3
    broker = await start_broker(tmp_path / "b", **controller_mode(fake))
    await eventually(lambda: broker.replication.confirmed, 10, what="the role confirmed")
    assert broker.controller_client is not None and broker.controller_client.broker_id == 3
    assert fake.applied[3].startswith(broker.addr + ";")  # the register check code: address;time
    meta = json.loads((tmp_path / "b" / META_FILE).read_text())
    assert meta["brokerId"] == 3 and meta["registerCheckCode"] == fake.applied[3]
    assert not (tmp_path / "b" / TEMP_META_FILE).exists()
    # The first broker of the group asked for an election and became the master at epoch 1.
    assert broker.replication.role is Role.MASTER and broker.replication.epoch == 1
    await eventually(lambda: any(h["brokerId"] == "3" for h in fake.heartbeats), 5, what="a heartbeat")
    beat = next(h for h in fake.heartbeats if h["brokerId"] == "3")
    assert {"clusterName", "brokerAddr", "brokerName", "epoch", "maxOffset", "confirmOffset",
            "heartbeatTimeoutMills", "electionPriority"} <= beat.keys()
    await broker.stop()

    fake.calls.clear()
    again = await start_broker(tmp_path / "b", **controller_mode(fake))
    await eventually(lambda: again.replication.confirmed, 10, what="the role confirmed after the restart")
    assert again.controller_client is not None and again.controller_client.broker_id == 3
    assert RC.CONTROLLER_GET_NEXT_BROKER_ID not in fake.calls and RC.CONTROLLER_APPLY_BROKER_ID not in fake.calls
    # Still the master at epoch 1: resumed, no new epoch entry.
    assert again.replication.role is Role.MASTER and [e.epoch for e in again.replication.epochs.entries] == [1]


async def test_a_temp_id_file_is_applied_again(start_broker: StartBroker, fake: FakeController,
                                               tmp_path: Path) -> None:
    # Crashed after APPLY_BROKER_ID succeeded but before the final file was written.
    fake.applied[5] = "10.0.0.1:10911;1"
    fake.next_id = 6
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / TEMP_META_FILE).write_text(json.dumps({
        "clusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": 5,
        "registerCheckCode": "10.0.0.1:10911;1"}))
    broker = await start_broker(tmp_path / "b", **controller_mode(fake))
    await eventually(lambda: broker.replication.confirmed, 10, what="the role confirmed")
    assert broker.controller_client is not None and broker.controller_client.broker_id == 5
    assert RC.CONTROLLER_GET_NEXT_BROKER_ID not in fake.calls
    assert json.loads((tmp_path / "b" / META_FILE).read_text())["brokerId"] == 5
    assert not (tmp_path / "b" / TEMP_META_FILE).exists()


async def test_no_writes_before_the_role_is_confirmed(start_broker: StartBroker, fake: FakeController,
                                                      client: RemotingClient, tmp_path: Path) -> None:
    fake.register_ok = False
    broker = await start_broker(tmp_path / "b", **controller_mode(fake))
    await eventually(lambda: RC.CONTROLLER_REGISTER_BROKER in fake.calls, 5, what="a register attempt")
    refused = await client.invoke(broker.addr, send_request("T", b"early"), 5)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and "not confirmed" in (refused.remark or "")
    assert broker.store.commitlog.max_offset == 0
    fake.register_ok = True
    await eventually(lambda: broker.replication.confirmed, 10, what="the role confirmed")
    assert (await client.invoke(broker.addr, send_request("T", b"now"), 5)).code == ResponseCode.SUCCESS


def notify(fake: FakeController, **override: Any) -> RemotingCommand:
    fields: dict[str, object] = {"masterBrokerId": fake.master, "masterAddress": fake.addrs.get(fake.master or 0, ""),
                                 "masterEpoch": fake.epoch, "syncStateSetEpoch": fake.set_epoch}
    if fake.master in fake.ha_addrs:
        fields["masterHaAddress"] = fake.ha_addrs[fake.master]
    fields.update(override)
    body = json.dumps({"syncStateSet": sorted(fake.sync_state_set), "syncStateSetEpoch": fake.set_epoch})
    return make_request(RC.NOTIFY_BROKER_ROLE_CHANGED, fields, body.encode())


async def test_role_changes_only_at_a_higher_epoch(start_broker: StartBroker, fake: FakeController,
                                                   client: RemotingClient, tmp_path: Path) -> None:
    broker = await start_broker(tmp_path / "b", **controller_mode(fake))
    await eventually(lambda: broker.replication.role is Role.MASTER, 10, what="the first election")
    r = broker.replication
    assert r.replica_id == 1 and r.epoch == 1
    # Another broker (2) is elected at epoch 2: this one follows it.
    fake.master, fake.epoch, fake.sync_state_set, fake.set_epoch = 2, 2, {2}, 2
    fake.addrs[2], fake.ha_addrs[2] = "127.0.0.1:1", "127.0.0.1:2"
    reply = await client.invoke(broker.addr, notify(fake), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    assert r.role is Role.SLAVE and r.acted_epoch == 2 and r.master_ha_addr() == "127.0.0.1:2"
    refused = await client.invoke(broker.addr, send_request("T", b"x"), 5)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    # A stale notification (epoch 1, naming this broker) is ignored.
    stale = await client.invoke(broker.addr, notify(fake, masterBrokerId=1, masterEpoch=1), 5)
    assert stale.code == ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH
    assert r.role is Role.SLAVE and r.acted_epoch == 2
    # Elected at epoch 3: promoted, with the controller's set.
    fake.master, fake.epoch, fake.sync_state_set, fake.set_epoch = 1, 3, {1}, 3
    reply = await client.invoke(broker.addr, notify(fake), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    assert r.role is Role.MASTER and r.epoch == 3 and r.sync.members == {0} and r.sync.epoch == 3
    assert (await client.invoke(broker.addr, send_request("T", b"y"), 5)).code == ResponseCode.SUCCESS
    # Same master epoch, newer set: the master takes the set (broker 2 is in it now).
    fake.sync_state_set, fake.set_epoch = {1, 2}, 4
    reply = await client.invoke(broker.addr, notify(fake), 5)
    assert reply.code == ResponseCode.SUCCESS
    assert r.role is Role.MASTER and r.epoch == 3 and r.sync.members == {0, 2} and r.sync.epoch == 4


async def test_the_sync_state_set_changes_through_the_controller(start_broker: StartBroker, fake: FakeController,
                                                                 client: RemotingClient, tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "m", **controller_mode(fake))
    await eventually(lambda: master.replication.role is Role.MASTER, 10, what="the master elected")
    fake.ha_addrs[1] = master.ha_addr
    fake.alter_gate.clear()  # hold the controller's answer back
    replica = await start_broker(tmp_path / "r", **controller_mode(fake))
    await eventually(lambda: replica.replication.confirmed, 10, what="the replica's role")
    assert replica.replication.role is Role.SLAVE and replica.replication.replica_id == 2
    sync = master.replication.sync
    await eventually(lambda: sync.pending == {0, 2}, 10, what="the proposal to add the replica")
    await eventually(lambda: len(fake.alters) == 0 and RC.CONTROLLER_ALTER_SYNC_STATE_SET in fake.calls, 5,
                     what="the proposal sent")
    # In flight: the set is unchanged, but acks count against old and new together (#5663).
    assert sync.members == {0} and sync.counted() == {0, 2}
    fake.alter_gate.set()
    await eventually(lambda: sync.pending is None and sync.members == {0, 2}, 10, what="the answer applied")
    assert fake.alters[0]["syncStateSet"] == [1, 2] and fake.alters[0]["masterEpoch"] == "1"
    assert sync.epoch == fake.set_epoch == 2
    reply = await client.invoke(master.addr, send_request("T", b"acked by both"), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    # A refused proposal is dropped; the set stays what the controller has.
    fake.refuse_alter = ResponseCode.CONTROLLER_INVALID_REPLICAS
    sync.pending = frozenset({0, 2, 7})
    assert master.controller_client is not None
    master.controller_client.propose()
    await eventually(lambda: sync.pending is None, 10, what="the refused proposal dropped")
    assert sync.members == {0, 2} and sync.epoch == 2


async def test_the_lease_stops_acks_when_the_controller_and_replicas_are_gone(
        start_broker: StartBroker, fake: FakeController, client: RemotingClient, tmp_path: Path) -> None:
    broker = await start_broker(tmp_path / "b", **controller_mode(fake, controller_heartbeat_timeout_ms=600))
    await eventually(lambda: broker.replication.role is Role.MASTER, 10, what="the master elected")
    assert broker.replication.lease_ms == 400
    assert (await client.invoke(broker.addr, send_request("T", b"a"), 5)).code == ResponseCode.SUCCESS
    fake.down = True  # the controller is unreachable, and there is no replica to hear from
    await eventually(lambda: broker.replication.lease_expired(), 5, what="the lease expired")
    refused = await client.invoke(broker.addr, send_request("T", b"b"), 5)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and "heard neither" in (refused.remark or "")
    assert not broker.replication.acked(broker.store.commitlog.max_offset)
    fake.down = False  # heard from the controller again: acks resume
    await eventually(lambda: not broker.replication.lease_expired(), 10, what="the lease renewed")
    assert (await client.invoke(broker.addr, send_request("T", b"c"), 5)).code == ResponseCode.SUCCESS
    await asyncio.sleep(0)


async def test_a_late_answer_renews_the_lease_only_from_when_it_was_asked(
        start_broker: StartBroker, fake: FakeController, client: RemotingClient, tmp_path: Path) -> None:
    """An answer that took longer than the lease (the controller, or this broker, was stalled) proves only that the
    controller named this master when it was asked: it must not renew the lease as of its arrival."""
    broker = await start_broker(tmp_path / "b", **controller_mode(fake, controller_heartbeat_timeout_ms=600,
                                                                  sync_controller_metadata_period_ms=600_000))
    await eventually(lambda: broker.replication.role is Role.MASTER, 10, what="the master elected")
    assert (await client.invoke(broker.addr, send_request("T", b"a"), 5)).code == ResponseCode.SUCCESS
    fake.info_gate.clear()  # the master's polls (its lease renewals) get no answer for now
    await eventually(lambda: broker.replication.lease_expired(), 5, what="the lease expired")
    await asyncio.sleep(0.6)  # (the poll held since is older than the lease)
    held = fake.calls.count(RC.CONTROLLER_GET_REPLICA_INFO)
    fake.info_gate.set()  # answer the held poll (naming this master), and hold the next ones again
    fake.info_gate.clear()
    await asyncio.sleep(0.2)
    assert fake.calls.count(RC.CONTROLLER_GET_REPLICA_INFO) >= held
    assert broker.replication.lease_expired()
    refused = await client.invoke(broker.addr, send_request("T", b"b"), 5)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, (refused.code, refused.remark)
    fake.info_gate.set()  # prompt answers again: the lease is renewed
    await eventually(lambda: not broker.replication.lease_expired(), 10, what="the lease renewed")
    assert (await client.invoke(broker.addr, send_request("T", b"c"), 5)).code == ResponseCode.SUCCESS


def test_the_keys_are_rocketmqs() -> None:
    from cometmq.broker.config import broker_config_from_properties

    cfg = broker_config_from_properties({"enableControllerMode": "true", "controllerAddr": "a:1; b:2",
                                         "controllerHeartBeatTimeoutMills": "3000", "brokerElectionPriority": "2",
                                         "syncBrokerMetadataPeriod": "700"})
    assert cfg.enable_controller_mode and cfg.controller_addrs == ["a:1", "b:2"]
    assert (cfg.controller_heartbeat_timeout_ms, cfg.election_priority, cfg.sync_broker_metadata_period_ms) == \
        (3000, 2, 700)
    assert not broker_config_from_properties({}).enable_controller_mode
