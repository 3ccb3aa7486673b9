"""The admin SDK's controller calls (client/admin_controller.py) against an in-process ControllerServer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cometmq.client.admin import Admin
from cometmq.client.errors import BrokerError, InvalidArgumentError
from cometmq.controller.log import LocalLog
from cometmq.controller.server import ControllerConfig, ControllerServer
from cometmq.protocol.codes import ResponseCode as RC
from tests.controller.test_server import CLUSTER, NAME, FakeClock, heartbeat, join


async def test_metadata_sync_state_and_elections(tmp_path: Path) -> None:
    from cometmq.net.client import RemotingClient

    clock = FakeClock()
    async with ControllerServer(ControllerConfig(port=0, scan_interval_s=3600), LocalLog(tmp_path), clock) as ctl, \
            RemotingClient() as raw, Admin(namesrv=ctl.addr) as admin:
        meta = await admin.get_controller_metadata(ctl.addr)
        assert meta.is_leader and meta.leader_addr == ctl.addr and meta.leader_id == "n0"

        assert await join(raw, ctl, "127.0.0.1:1") == 1
        assert await join(raw, ctl, "127.0.0.1:2") == 2
        await heartbeat(raw, ctl, 1, "127.0.0.1:1")
        result = await admin.elect_master(ctl.addr, CLUSTER, NAME, 1)
        assert (result.master_id, result.master_addr, result.master_epoch) == (1, "127.0.0.1:1", 1)
        assert result.sync_state_set == (1,) and result.broker_addrs == {1: "127.0.0.1:1", 2: "127.0.0.1:2"}
        with pytest.raises(BrokerError) as err:  # broker 2 is not in the SyncStateSet
            await admin.elect_master(ctl.addr, CLUSTER, NAME, 2)
        assert err.value.code == RC.CONTROLLER_ELECT_MASTER_FAILED
        with pytest.raises(BrokerError) as err:  # the controller's choice: the master is alive
            await admin.elect_master(ctl.addr, CLUSTER, NAME)
        assert err.value.code == RC.CONTROLLER_MASTER_STILL_EXIST

        groups = await admin.get_sync_state_data(ctl.addr, [NAME, "unknown"])
        assert list(groups) == [NAME]
        g = groups[NAME]
        assert (g.master_id, g.master_epoch, g.sync_state_set_epoch) == (1, 1, 1)
        assert [(r.broker_id, r.alive) for r in g.in_sync] == [(1, True)]
        assert [(r.broker_id, r.address, r.alive) for r in g.not_in_sync] == [(2, "127.0.0.1:2", False)]


async def test_clean_broker_data(tmp_path: Path) -> None:
    """CLEAN_BROKER_DATA forgets a dead replica; an alive broker, a group with a master and a malformed id list
    are refused and change nothing."""
    from cometmq.net.client import RemotingClient
    from cometmq.protocol.codes import RequestCode
    from cometmq.protocol.remoting import make_request

    clock = FakeClock()
    async with ControllerServer(ControllerConfig(port=0, scan_interval_s=3600), LocalLog(tmp_path), clock) as ctl, \
            RemotingClient() as raw, Admin(namesrv=ctl.addr) as admin:
        assert await join(raw, ctl, "127.0.0.1:1") == 1
        assert await join(raw, ctl, "127.0.0.1:2") == 2
        await heartbeat(raw, ctl, 1, "127.0.0.1:1")
        await admin.elect_master(ctl.addr, CLUSTER, NAME, 1)

        for ids, living in (([1], False), (None, False)):  # 1 is alive; the group still has its master
            with pytest.raises(BrokerError) as err:
                await admin.clean_broker_data(ctl.addr, CLUSTER, NAME, ids, clean_living=living)
            assert err.value.code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
        bad = make_request(RequestCode.CLEAN_BROKER_DATA, {"clusterName": CLUSTER, "brokerName": NAME,
                                                             "brokerControllerIdsToClean": "2;x"})
        r = await raw.invoke(ctl.addr, bad)
        assert r.code == RC.CONTROLLER_INVALID_REQUEST and "brokerControllerIdsToClean" in (r.remark or "")
        g = (await admin.get_sync_state_data(ctl.addr, [NAME]))[NAME]
        assert [r.broker_id for r in g.not_in_sync] == [2]

        with pytest.raises(InvalidArgumentError, match="names no broker id"):  # (not "the whole group")
            await admin.clean_broker_data(ctl.addr, CLUSTER, NAME, [], clean_living=True)
        await admin.clean_broker_data(ctl.addr, CLUSTER, NAME, [2])  # 2 never heartbeat: dead
        g = (await admin.get_sync_state_data(ctl.addr, [NAME]))[NAME]
        assert [r.broker_id for r in g.in_sync] == [1] and g.not_in_sync == ()
