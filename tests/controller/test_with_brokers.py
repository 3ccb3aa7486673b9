"""The real controller with real brokers in controller mode (broker/ha/controller_client.py): the group gets a
master, and when the master stops, the replica is elected and takes over."""

from __future__ import annotations

from pathlib import Path

from cometmq.broker.controller import BrokerController
from cometmq.broker.ha.service import Role
from cometmq.controller.log import LocalLog
from cometmq.controller.server import ControllerConfig, ControllerServer
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from tests.broker.conftest import broker_config
from tests.kit import eventually


async def test_failover_with_brokers(tmp_path: Path) -> None:
    config = ControllerConfig(port=0, scan_interval_s=0.2, heartbeat_timeout_ms=1500, startup_grace_ms=0)
    # the master's heartbeats state its HA address; the controller names it to the replicas (masterHaAddress)
    async with ControllerServer(config, LocalLog(tmp_path / "ctl")) as ctl, \
            NamesrvController(NamesrvConfig(port=0)) as ns:
        mode = {"namesrv_addr": ns.addr, "enable_controller_mode": True, "controller_addr": ctl.addr,
                "broker_heartbeat_interval_ms": 100,
                "controller_heartbeat_timeout_ms": 1500, "sync_broker_metadata_period_ms": 200,
                "sync_controller_metadata_period_ms": 1000, "broker_name": "g1"}
        brokers = [BrokerController(broker_config(tmp_path / f"b{i}", **mode)) for i in (1, 2)]
        for b in brokers:
            await b.start()
        try:
            state = ctl.processors.state

            async def one_master() -> bool:
                roles = sorted(b.replication.role.name for b in brokers if b.replication.confirmed)
                return roles == ["MASTER", "SLAVE"]

            await eventually(one_master, timeout=20, what="one master, one replica")
            master = next(b for b in brokers if b.replication.role is Role.MASTER)
            replica = next(b for b in brokers if b is not master)
            g = state.group("g1")
            assert g is not None and g.master_epoch == 1

            async def set_of_two() -> bool:
                g = state.group("g1")
                return g is not None and len(g.sync_state_set) == 2

            await eventually(set_of_two, timeout=20, what="a SyncStateSet of two")
            await master.stop()
            brokers.remove(master)

            async def replica_is_master() -> bool:
                g = state.group("g1")
                return replica.replication.role is Role.MASTER and g is not None and g.master_epoch == 2

            await eventually(replica_is_master, timeout=20, what="the replica elected at epoch 2")
            from cometmq.net.client import RemotingClient
            from cometmq.protocol.codes import RequestCode
            from cometmq.protocol.remoting import make_request

            async with RemotingClient() as raw:
                async def names_the_ha_address() -> bool:  # the port is bound at the promotion (HA port 0 here)
                    info = await raw.invoke(ctl.addr, make_request(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                                                   {"brokerName": "g1"}))
                    return info.ext_fields.get("masterHaAddress") == replica.ha_addr

                await eventually(names_the_ha_address, timeout=10, what="masterHaAddress of the new master")
        finally:
            for b in brokers:
                await b.stop()
