"""The replication part of the admin client (docs/replication.md): a broker's HA status and epoch list, and
role changes (promote a replica, make a broker follow a master). ``Admin`` (client/admin.py) has these methods."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cometmq.client.errors import BrokerError, InvalidArgumentError
from cometmq.client.instance import ClientInstance
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request


# -- results (a broker group's master and replicas; docs/replication.md) ------------------------------------
@dataclass(frozen=True, slots=True)
class HAStatus:
    """One broker's replication state (GET_BROKER_HA_STATUS 907). The master-only and replica-only fields are
    None (or empty) on the other role; ``raw`` is the broker's JSON as it came."""

    addr: str
    #: "MASTER" or "SLAVE"
    role: str
    broker_id: int
    #: the broker's master epoch (its last epoch entry)
    epoch: int
    #: its epoch entries, oldest first: (epoch, start offset)
    epochs: tuple[tuple[int, int], ...]
    #: the commit log's end
    max_offset: int
    #: master: the SyncStateSet (broker ids, 0 = the master) and its epoch
    sync_state_set: tuple[int, ...] | None = None
    sync_state_set_epoch: int | None = None
    #: master: below this every member has the log (consumers see nothing above it)
    confirm_offset: int | None = None
    #: master: each linked replica's acknowledged log end (-1: linked, nothing acked yet)
    replica_acks: Mapping[int, int] = field(default_factory=dict)
    #: replica: the master's HA address it copies from, and whether the link is up
    master_ha_addr: str | None = None
    connected: bool | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_master(self) -> bool:
        return self.role == "MASTER"

    @classmethod
    def from_json(cls, addr: str, raw: Mapping[str, Any]) -> HAStatus:
        master = raw.get("role") == "MASTER"
        acks = raw.get("replicas") or {}
        sync = raw.get("syncStateSet")
        return cls(addr=addr, role=str(raw["role"]), broker_id=int(raw["brokerId"]), epoch=int(raw["epoch"]),
                   epochs=tuple((int(e), int(o)) for e, o in raw.get("epochs") or ()),
                   max_offset=int(raw["maxOffset"]),
                   sync_state_set=tuple(int(i) for i in sync) if master and sync is not None else None,
                   sync_state_set_epoch=int(raw["syncStateSetEpoch"]) if master else None,
                   confirm_offset=int(raw["confirmOffset"]) if master else None,
                   replica_acks={int(k): int(v) for k, v in acks.items()},
                   master_ha_addr=raw.get("masterAddr") or None,
                   connected=bool(raw["connected"]) if "connected" in raw else None, raw=dict(raw))


@dataclass(frozen=True, slots=True)
class EpochRange:
    """One entry of a broker's epoch cache: the log range [start_offset, end_offset) written in ``epoch``."""

    epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class EpochCache:
    """A broker's epoch list (GET_BROKER_EPOCH_CACHE 1007, RocketMQ's JSON)."""

    cluster: str
    broker_name: str
    broker_id: int
    epochs: tuple[EpochRange, ...]
    max_offset: int


@dataclass(frozen=True, slots=True)
class RoleChange:
    """A broker's answer to a role change (NOTIFY_BROKER_ROLE_CHANGED 1008): its id and epoch now."""

    addr: str
    broker_id: int
    epoch: int


def _parsed(what: str, addr: str, parse: Any) -> Any:
    """``parse()``, a reply missing a field or holding a bad one turned into BrokerError(SYSTEM_ERROR)."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"{what}: unexpected reply ({type(exc).__name__}: {exc})",
                          addr=addr) from None


def _ha_port_plus_one(addr: str) -> str:
    """The HA address a broker at ``addr`` has by default (haListenPort = listenPort + 1)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"broker address {addr!r} is not host:port")
    return f"{host}:{int(port) + 1}"


class ReplicationAdmin:
    """Mixed into ``Admin``, whose ``_check`` gives the started client instance."""

    _check: Callable[[], ClientInstance]

    # -- calls ----------------------------------------------------------------------------------------
    async def ha_status(self, broker_addr: str) -> HAStatus:
        """The replication state of the broker at ``broker_addr`` (GET_BROKER_HA_STATUS): its role, id, epoch,
        log end, and the SyncStateSet, confirm offset and replica acks (master) or its master link (replica)."""
        r = await self._check().invoke_ok(broker_addr, make_request(RequestCode.GET_BROKER_HA_STATUS),
                                          context="HA status")
        raw = _json_object(r.body, f"HA status of {broker_addr}")
        status: HAStatus = _parsed("HA status", broker_addr, lambda: HAStatus.from_json(broker_addr, raw))
        return status

    async def epoch_cache(self, broker_addr: str) -> EpochCache:
        """The broker's epoch list, each entry with the log range written in it (GET_BROKER_EPOCH_CACHE)."""
        r = await self._check().invoke_ok(broker_addr, make_request(RequestCode.GET_BROKER_EPOCH_CACHE),
                                          context="epoch cache")
        raw = _json_object(r.body, f"epoch cache of {broker_addr}")
        cache: EpochCache = _parsed("epoch cache", broker_addr, lambda: EpochCache(
            str(raw["clusterName"]), str(raw["brokerName"]), int(raw["brokerId"]),
            tuple(EpochRange(int(e["epoch"]), int(e["startOffset"]), int(e["endOffset"]))
                  for e in raw.get("epochList") or ()),
            int(raw["maxOffset"])))
        return cache

    async def promote(self, broker_addr: str, epoch: int | None = None) -> RoleChange:
        """Make the broker at ``broker_addr`` its group's master at ``epoch`` (default: its own epoch + 1, read
        with ``ha_status``), with NOTIFY_BROKER_ROLE_CHANGED. An epoch not above the broker's own is refused:
        ``BrokerError`` with CONTROLLER_FENCED_MASTER_EPOCH (2000).

        This is what a controller does after an election ([12]); by hand, first make sure the old master is
        gone (killed, or demoted after this call): a group with two masters takes writes on both."""
        if epoch is None:
            epoch = (await self.ha_status(broker_addr)).epoch + 1
        _check_epoch(epoch)
        return await self._role_change(broker_addr, {"masterEpoch": epoch, "toThisBroker": "true"}, "promote")

    async def demote(self, broker_addr: str, master_addr: str, *, epoch: int | None = None,
                     broker_id: int | None = None, master_ha_addr: str | None = None) -> RoleChange:
        """Make the broker at ``broker_addr`` follow the master at ``master_addr`` (remoting address) as a
        replica, with NOTIFY_BROKER_ROLE_CHANGED. It truncates what the new master does not have (its divergent
        tail) and copies the rest.

        ``epoch``: the master's epoch (default: read with ``ha_status(master_addr)``); it must not be below the
        broker's own, nor equal to it while the broker is a master (CONTROLLER_FENCED_MASTER_EPOCH).
        ``broker_id``: the broker's replica id, 1 or more (default: the one it has; 1 for a former master).
        ``master_ha_addr``: where the master's HA port is (default: what the master's HA status says when the
        epoch is read from it, else its host and port + 1)."""
        if broker_id is not None and (isinstance(broker_id, bool) or not isinstance(broker_id, int)
                                      or broker_id < 1):
            raise InvalidArgumentError(f"a replica's broker id is 1 or more, not {broker_id!r}")
        ha_addr = master_ha_addr
        if epoch is None:
            status = await self.ha_status(master_addr)
            epoch = status.epoch
            ha_addr = ha_addr or str(status.raw.get("haAddr") or "") or None
        ha_addr = ha_addr or _ha_port_plus_one(master_addr)
        _check_epoch(epoch)
        fields: dict[str, object] = {"masterEpoch": epoch, "masterAddress": master_addr, "masterHaAddress": ha_addr,
                                     "masterBrokerId": 0,
                                     # an operator's order, not a controller's notification (broker/ha/processor.py)
                                     "toThisBroker": "false"}
        if broker_id is not None:
            fields["brokerId"] = broker_id
        return await self._role_change(broker_addr, fields, "demote")

    async def _role_change(self, addr: str, fields: dict[str, object], what: str) -> RoleChange:
        r = await self._check().invoke_ok(addr, make_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, fields),
                                          context=what)
        change: RoleChange = _parsed(what, addr, lambda: RoleChange(addr, int(r.ext_fields["brokerId"]),
                                                                   int(r.ext_fields["masterEpoch"])))
        return change


def _check_epoch(epoch: object) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise InvalidArgumentError(f"a master epoch is a positive integer, not {epoch!r}")


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"{what}: body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"{what}: body is not a JSON object")
    return raw
