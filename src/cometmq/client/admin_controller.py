"""The controller part of the admin client (docs/controller.md): the controller's metadata, each broker group's
SyncStateSet and epochs, and an election by hand (RocketMQ's mqadmin getControllerMetaData, getSyncStateSet,
electMaster). ``Admin`` (client/admin.py) has these methods."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cometmq.client.admin_ha import _json_object, _parsed
from cometmq.client.errors import BrokerError, InvalidArgumentError
from cometmq.client.instance import ClientInstance
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request


@dataclass(frozen=True, slots=True)
class ControllerMetadata:
    """GET_METADATA_INFO: the controller group, its leader, and whether the asked node is the leader."""

    addr: str
    group: str | None
    leader_id: str | None
    leader_addr: str | None
    is_leader: bool
    peers: str | None


@dataclass(frozen=True, slots=True)
class ReplicaState:
    broker_id: int
    address: str
    alive: bool


@dataclass(frozen=True, slots=True)
class GroupSyncState:
    """One broker group as the controller has it (GET_SYNC_STATE_DATA's ReplicasInfo)."""

    broker_name: str
    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set_epoch: int
    in_sync: tuple[ReplicaState, ...]
    not_in_sync: tuple[ReplicaState, ...]

    @classmethod
    def from_json(cls, name: str, raw: dict[str, Any]) -> GroupSyncState:
        def replicas(key: str) -> tuple[ReplicaState, ...]:
            return tuple(ReplicaState(int(r["brokerId"]), str(r.get("brokerAddress") or r.get("address") or ""),
                                      bool(r.get("alive", False))) for r in raw.get(key) or ())

        master = raw.get("masterBrokerId")
        return cls(name, int(master) if master is not None and int(master) >= 0 else None,
                   raw.get("masterAddress") or None, int(raw["masterEpoch"]), int(raw["syncStateSetEpoch"]),
                   replicas("inSyncReplicas"), replicas("notInSyncReplicas"))


@dataclass(frozen=True, slots=True)
class ElectResult:
    """ELECT_MASTER's answer: the group's master (None: no candidate was alive), epochs and set."""

    broker_name: str
    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: tuple[int, ...]
    broker_addrs: dict[int, str]


class ControllerAdmin:
    """Mixed into ``Admin``, whose ``_check`` gives the started client instance. A follower's
    CONTROLLER_NOT_LEADER answer is followed once to the leader it names (GET_METADATA_INFO)."""

    _check: Callable[[], ClientInstance]

    async def get_controller_metadata(self, controller_addr: str) -> ControllerMetadata:
        r = await self._check().invoke_ok(controller_addr, make_request(RequestCode.CONTROLLER_GET_METADATA_INFO),
                                          context="controller metadata")
        f = r.ext_fields
        return ControllerMetadata(controller_addr, f.get("group") or None, f.get("controllerLeaderId") or None,
                                  f.get("controllerLeaderAddress") or None, f.get("isLeader", "").lower() == "true",
                                  f.get("peers") or None)

    async def get_sync_state_data(self, controller_addr: str, broker_names: Iterable[str]
                                  ) -> dict[str, GroupSyncState]:
        """Each named group's master, epochs and replicas in and out of the SyncStateSet; unknown names are
        left out."""
        body = json.dumps(list(broker_names)).encode()
        r = await self._on_leader(controller_addr, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, {}, body,
                                  "sync state data")
        raw = _json_object(r.body, f"sync state data from {controller_addr}")
        table: dict[str, GroupSyncState] = _parsed("sync state data", controller_addr, lambda: {
            str(name): GroupSyncState.from_json(str(name), info)
            for name, info in (raw.get("replicasInfoTable") or {}).items()})
        return table

    async def elect_master(self, controller_addr: str, cluster: str, broker_name: str,
                           broker_id: int | None = None) -> ElectResult:
        """Elect a master for the group: ``broker_id`` if given (it must be an alive member of the SyncStateSet),
        else the controller's choice when the master is lost. ``BrokerError`` with the controller's code otherwise
        (2011: the master is still alive; 2012: no candidate)."""
        fields: dict[str, object] = {"clusterName": cluster, "brokerName": broker_name,
                                     "brokerId": -1 if broker_id is None else broker_id,
                                     "designateElect": broker_id is not None, "invokeTime": 0}
        r = await self._on_leader(controller_addr, RequestCode.CONTROLLER_ELECT_MASTER, fields, b"", "elect master")
        raw = _json_object(r.body, f"election of {broker_name}") if r.body else {}

        def parse() -> ElectResult:
            f = r.ext_fields
            master = f.get("masterBrokerId")
            group = raw.get("brokerMemberGroup") or {}
            return ElectResult(broker_name, int(master) if master else None, f.get("masterAddress") or None,
                               int(f["masterEpoch"]), int(f["syncStateSetEpoch"]),
                               tuple(int(i) for i in raw.get("syncStateSet") or ()),
                               {int(k): str(v) for k, v in (group.get("brokerAddrs") or {}).items()})

        result: ElectResult = _parsed("elect master", controller_addr, parse)
        return result

    async def clean_broker_data(self, controller_addr: str, cluster: str, broker_name: str,
                                broker_ids: Iterable[int] | None = None, *, clean_living: bool = False) -> None:
        """Forget brokers of a group at the controller (CLEAN_BROKER_DATA; mqadmin cleanBrokerMetadata): the
        dead ``broker_ids``, or the whole group when none are named and its master is gone. ``clean_living``
        forgets them even if alive. ``BrokerError`` 2009 when refused (a broker still alive, a master still
        recorded, an unknown group)."""
        fields: dict[str, object] = {"clusterName": cluster, "brokerName": broker_name,
                                     "isCleanLivingBroker": clean_living, "invokeTime": 0}
        if broker_ids is not None:
            ids = sorted(set(broker_ids))
            if not ids:  # an empty field is read as no ids named: the whole group would be forgotten
                raise InvalidArgumentError("broker_ids names no broker id (None forgets the whole group)")
            fields["brokerControllerIdsToClean"] = ";".join(map(str, ids))
        await self._on_leader(controller_addr, RequestCode.CLEAN_BROKER_DATA, fields, b"", "clean broker data")

    async def _on_leader(self, addr: str, code: int, fields: dict[str, object], body: bytes,
                         context: str) -> RemotingCommand:
        instance = self._check()
        r = await instance.invoke(addr, make_request(code, fields, body), context=context)
        if r.code == ResponseCode.CONTROLLER_NOT_LEADER:
            leader = (await self.get_controller_metadata(addr)).leader_addr
            if leader and leader != addr:
                addr = leader
                r = await instance.invoke(addr, make_request(code, fields, body), context=context)
        if r.code != ResponseCode.SUCCESS:
            raise BrokerError(r.code, r.remark or "", addr=addr, context=context)
        return r
