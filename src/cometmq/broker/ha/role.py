"""What a controller says about a broker group's roles, read from RocketMQ's answers and notifications.

REGISTER_BROKER (1003), ELECT_MASTER (1002), GET_REPLICA_INFO (1004) answers and NOTIFY_BROKER_ROLE_CHANGED
(1008) all carry the master (masterBrokerId, masterAddress, masterEpoch) in their header and the SyncStateSet in
their body: ``{"syncStateSet": [ids], "syncStateSetEpoch": n}`` (SyncStateSet), or, for ELECT_MASTER,
``{"brokerMemberGroup": {...}, "syncStateSet": [ids]}`` with the set epoch in the header. ``masterHaAddress`` is
cometmq's addition (a RocketMQ controller does not know HA addresses; replicas then ask the nameservers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from cometmq.protocol.codes import RemotingError, ResponseCode


@dataclass(frozen=True)
class RoleInfo:
    #: the master's controller-assigned broker id; None when the group has no master
    master_id: int | None
    master_epoch: int
    master_addr: str | None = None
    master_ha_addr: str | None = None
    #: the SyncStateSet in controller ids (the master's own id, not 0); None when the answer carried none
    sync_state_set: frozenset[int] | None = None
    sync_state_set_epoch: int = 0


def _int(fields: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = fields.get(name)
    if raw is None or raw == "" or raw == "null":
        return default
    try:
        return int(raw)
    except ValueError:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} is not an integer: {raw!r}") from None


def role_info(fields: Mapping[str, str], body: bytes) -> RoleInfo:
    """A ``RoleInfo`` from a controller's header fields and body (bad JSON or types: ``RemotingError``)."""
    master_id = _int(fields, "masterBrokerId")
    if master_id is not None and master_id < 0:
        master_id = None  # RocketMQ answers -1 / null when there is no master
    epoch = _int(fields, "masterEpoch", 0)
    set_epoch = _int(fields, "syncStateSetEpoch")
    members: frozenset[int] | None = None
    if body:
        try:
            doc = json.loads(body)
            raw = doc.get("syncStateSet") if isinstance(doc, dict) else None
            if raw is not None:
                members = frozenset(int(i) for i in raw)
            if set_epoch is None and isinstance(doc, dict) and doc.get("syncStateSetEpoch") is not None:
                set_epoch = int(doc["syncStateSetEpoch"])
        except (ValueError, TypeError, AttributeError) as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"bad SyncStateSet body: {exc}") from None
    assert epoch is not None
    return RoleInfo(master_id, epoch, fields.get("masterAddress") or None, fields.get("masterHaAddress") or None,
                    members, set_epoch or 0)


def sync_state_set_body(members: frozenset[int], epoch: int) -> bytes:
    """RocketMQ's SyncStateSet body."""
    return json.dumps({"syncStateSet": sorted(members), "syncStateSetEpoch": epoch}).encode()
