"""ACL between brokers and their controller (docs/security.md): a broker with aclEnable=true takes role changes
(NOTIFY_BROKER_ROLE_CHANGED 1008) only signed by an admin account; a controller with aclEnable=true takes changes
(elections, registrations, heartbeats, ...) only signed by one, while its reads stay open; and a group in
controller mode with ACL on everywhere still fails over, the new master told by the controller's signed 1008."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cometmq.acl.policy import BROKER_POLICY
from cometmq.acl.remoting import SigningRemotingClient, parse_credentials
from cometmq.broker.controller import BrokerController
from cometmq.broker.ha.service import Role
from cometmq.controller.config import (
    controller_file_from_properties,
    load_controller_conf,
    split_namesrv_properties,
)
from cometmq.controller.log import LocalLog
from cometmq.controller.server import ControllerConfig, ControllerServer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.store.config import ConfigError
from tests.broker.conftest import broker_config
from tests.kit import eventually
from tests.kit.acl import admin_and_user

ADMIN = ("ctlAdmin01", "ctlAdminSecret1")
USER = ("ctlUser001", "ctlUserSecret1")
ACL = admin_and_user(ADMIN, USER, default_topic="PUB|SUB")


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return path


async def _call(addr: str, cmd: RemotingCommand, creds: tuple[str, str] | None = None) -> RemotingCommand:
    async with RemotingClient() as client:
        if creds is not None:
            cmd = sign_request(cmd, Credentials(*creds))
        return await client.invoke(addr, cmd)


async def test_a_broker_with_acl_takes_role_changes_only_from_an_admin_account(tmp_path: Path,
                                                                              acl_file: Path) -> None:
    broker = BrokerController(broker_config(tmp_path / "b", acl_enable=True, acl_file=str(acl_file)))
    await broker.start()
    try:
        before = broker.replication.epoch
        promote = make_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {"masterEpoch": before + 5,
                                                                        "toThisBroker": "true"})
        r = await _call(broker.addr, promote)
        assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "No accessKey is configured")
        # a controller's notification (masterBrokerId, no toThisBroker) naming another master: refused, unchanged
        demote = make_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {
            "masterBrokerId": 7, "masterAddress": "127.0.0.1:1", "masterEpoch": before + 5,
            "syncStateSetEpoch": 1}, json.dumps({"syncStateSet": [7]}).encode())
        r = await _call(broker.addr, demote)
        assert r.code == ResponseCode.NO_PERMISSION
        # no handler for 905 here (RocketMQ's slave-acting-master); were there one, it would be an admin code too
        assert BROKER_POLICY.is_admin(RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE) and not BROKER_POLICY.public_codes
        r = await _call(broker.addr, promote, USER)
        assert r.code == ResponseCode.NO_PERMISSION
        assert r.remark == f"Need admin permission for request code=1008, but accessKey={USER[0]} is not"
        r = await _call(broker.addr, promote, (ADMIN[0], "notTheSecret"))
        assert r.code == ResponseCode.NO_PERMISSION and "Check signature failed" in (r.remark or "")
        assert broker.replication.role is Role.MASTER and broker.replication.epoch == before
        # signed as a controller signs (SigningRemotingClient with its innerClientAuthenticationCredentials)
        async with SigningRemotingClient(Credentials(*ADMIN)) as signer:
            r = await signer.invoke(broker.addr, promote)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert broker.replication.epoch == before + 5
    finally:
        await broker.stop()


async def test_a_controller_with_acl_refuses_unsigned_changes(tmp_path: Path, acl_file: Path) -> None:
    config = ControllerConfig(port=0, acl_enable=True, acl_file=str(acl_file), startup_grace_ms=0)
    async with ControllerServer(config, LocalLog(tmp_path / "ctl")) as ctl:
        state = ctl.processors.state
        apply_id = make_request(RequestCode.CONTROLLER_APPLY_BROKER_ID, {
            "clusterName": "c", "brokerName": "g", "appliedBrokerId": 1, "registerCheckCode": "127.0.0.1:1;1"})
        elect = make_request(RequestCode.CONTROLLER_ELECT_MASTER, {"clusterName": "c", "brokerName": "g",
                                                                    "brokerId": 1})
        heartbeat = make_request(RequestCode.BROKER_HEARTBEAT, {
            "clusterName": "c", "brokerName": "g", "brokerId": 1, "brokerAddr": "127.0.0.1:1"})
        clean = make_request(RequestCode.CLEAN_BROKER_DATA, {"clusterName": "c", "brokerName": "g"})
        for cmd in (apply_id, elect, heartbeat, clean):
            r = await _call(ctl.addr, cmd)
            assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "No accessKey is configured"), cmd.code
        assert state.group("g") is None and not ctl.processors.heartbeats.group("c", "g")
        r = await _call(ctl.addr, elect, USER)
        assert r.code == ResponseCode.NO_PERMISSION
        assert "Need admin permission for request code=1002" in (r.remark or "")
        # reads stay open, as route reads do
        r = await _call(ctl.addr, make_request(RequestCode.CONTROLLER_GET_METADATA_INFO))
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["isLeader"] == "true"
        # an admin account's signature: the requests are decided (the first election elects the asker)
        r = await _call(ctl.addr, apply_id, ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await _call(ctl.addr, heartbeat, ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await _call(ctl.addr, elect, ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        g = state.group("g")
        assert g is not None and g.master == 1 and g.master_epoch == 1


async def test_a_controller_group_with_acl_fails_over(tmp_path: Path, acl_file: Path) -> None:
    """Controller, nameserver and brokers all with aclEnable=true; brokers sign with innerClientAuthentication-
    Credentials, the controller too. The replica polls the controller only every 60 s here, so it can learn that
    it was elected only from the controller's (signed) NOTIFY_BROKER_ROLE_CHANGED."""
    acl = {"acl_enable": True, "acl_file": str(acl_file)}
    config = ControllerConfig(port=0, scan_interval_s=0.2, heartbeat_timeout_ms=1500, startup_grace_ms=0,
                              inner_credentials=Credentials(*ADMIN), **acl)  # type: ignore[arg-type]
    async with ControllerServer(config, LocalLog(tmp_path / "ctl")) as ctl, \
            NamesrvController(NamesrvConfig(port=0, **acl)) as ns:  # type: ignore[arg-type]
        mode = {"namesrv_addr": ns.addr, "enable_controller_mode": True, "controller_addr": ctl.addr,
                "broker_heartbeat_interval_ms": 100, "controller_heartbeat_timeout_ms": 1500,
                "sync_broker_metadata_period_ms": 60_000, "sync_controller_metadata_period_ms": 1000,
                "broker_name": "g1", "inner_credentials": ADMIN, **acl}
        brokers = [BrokerController(broker_config(tmp_path / f"b{i}", **mode)) for i in (1, 2)]
        for b in brokers:
            await b.start()
        try:
            state = ctl.processors.state

            async def set_of_two() -> bool:
                g = state.group("g1")
                roles = sorted(b.replication.role.name for b in brokers if b.replication.confirmed)
                return roles == ["MASTER", "SLAVE"] and g is not None and len(g.sync_state_set) == 2

            await eventually(set_of_two, timeout=20, what="one master, one replica, a SyncStateSet of two")
            master = next(b for b in brokers if b.replication.role is Role.MASTER)
            replica = next(b for b in brokers if b is not master)
            await master.stop()
            brokers.remove(master)

            async def replica_is_master() -> bool:
                g = state.group("g1")
                return replica.replication.role is Role.MASTER and g is not None and g.master_epoch == 2

            await eventually(replica_is_master, timeout=10, what="the replica elected and told at epoch 2")
        finally:
            for b in brokers:
                await b.stop()


def test_controller_properties(tmp_path: Path) -> None:
    conf = controller_file_from_properties({
        "aclEnable": "true", "aclFile": "/etc/acl.yml", "listenPort": "9000",
        "innerClientAuthenticationCredentials": json.dumps({"accessKey": ADMIN[0], "secretKey": ADMIN[1]}),
        "tls.server.mode": "disabled", "controllerDLegerGroup": "ignored"})
    assert (conf.acl_enable, conf.acl_file, conf.port) == (True, "/etc/acl.yml", 9000)
    assert conf.inner_credentials == Credentials(*ADMIN)
    assert ADMIN[1] not in repr(conf)
    with pytest.raises(ConfigError, match=r"unknown configuration key.*aclEnabled"):
        controller_file_from_properties({"aclEnabled": "true"})
    with pytest.raises(ConfigError, match="aclEnable"):
        controller_file_from_properties({"aclEnable": "maybe"})
    # a bad credentials value names the key, never the secret
    with pytest.raises(ConfigError, match="innerClientAuthenticationCredentials must name both keys") as err:
        controller_file_from_properties({"innerClientAuthenticationCredentials": '{"secretKey": "topSecret99"}'})
    assert "topSecret99" not in str(err.value)
    path = tmp_path / "controller.properties"
    path.write_text("aclEnable=true\nnot a property line\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: line 2")):
        load_controller_conf(path)
    # a nameserver's file: the extras (TLS, the embedded controller's credentials) come apart from its own keys
    ns = tmp_path / "namesrv.properties"
    ns.write_text(f"listenPort=9876\naclEnable=true\ninnerClientAuthenticationCredentials={ADMIN[0]}:{ADMIN[1]}\n"
                  "tls.server.mode=permissive\n")
    own, extras = split_namesrv_properties(ns)
    assert own == {"listenPort": "9876", "aclEnable": "true"}
    assert extras.inner_credentials == Credentials(*ADMIN) and extras.tls.mode.value == "permissive"
    for bad in ("", "noColon", ":sk", "ak:", "{}", '{"accessKey": "a"', "[1]"):
        with pytest.raises(ValueError):
            parse_credentials(bad)
