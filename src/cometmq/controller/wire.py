"""The controller's request fields and JSON bodies, as RocketMQ's controller headers and bodies name them.

Header fields are strings on the wire (``ext_fields``); a missing or malformed one is the peer's mistake and is
answered with CONTROLLER_INVALID_REQUEST (2005) naming the field. Bodies follow RocketMQ's classes:
``SyncStateSet`` (``{"syncStateSet": [ids], "syncStateSetEpoch": n}``), ``ElectMasterResponseBody``
(``{"brokerMemberGroup": {"cluster", "brokerName", "brokerAddrs": {id: addr}}, "syncStateSet": [ids]}``) and
``BrokerReplicasInfo`` (``{"replicasInfoTable": {brokerName: ReplicasInfo}}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..protocol.codes import RemotingError, ResponseCode
from ..protocol.remoting import RemotingCommand
from .state import BrokerGroup

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _bad(cmd: RemotingCommand, what: str) -> RemotingError:
    return RemotingError(ResponseCode.CONTROLLER_INVALID_REQUEST, f"request {cmd.code}: {what}")


def text(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if not value:
        raise _bad(cmd, f"header field {key!r} is missing or empty")
    return value


def opt_int(cmd: RemotingCommand, key: str) -> int | None:
    """An integer field; None when absent, empty or "null" (Java leaves null fields out)."""
    raw = cmd.ext_fields.get(key)
    if raw is None or raw in ("", "null"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _bad(cmd, f"header field {key!r} = {raw[:40]!r} is not an integer") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _bad(cmd, f"header field {key!r} is out of range")
    return value


def integer(cmd: RemotingCommand, key: str) -> int:
    value = opt_int(cmd, key)
    if value is None:
        raise _bad(cmd, f"header field {key!r} is missing")
    return value


def flag(cmd: RemotingCommand, key: str) -> bool:
    return cmd.ext_fields.get(key, "false").strip().lower() in ("true", "1")


def _json(cmd: RemotingCommand) -> object:
    try:
        return json.loads(cmd.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(cmd, f"body is not JSON: {exc}") from None


def sync_state_set_of(cmd: RemotingCommand) -> tuple[frozenset[int], int]:
    """The members and epoch of a SyncStateSet body."""
    doc = _json(cmd)
    members = doc.get("syncStateSet") if isinstance(doc, dict) else None
    epoch = doc.get("syncStateSetEpoch") if isinstance(doc, dict) else None
    if not isinstance(members, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in members) \
            or not isinstance(epoch, int) or isinstance(epoch, bool):
        raise _bad(cmd, "body is not a SyncStateSet {syncStateSet: [ids], syncStateSetEpoch: n}")
    return frozenset(members), epoch


def broker_ids_of(cmd: RemotingCommand, key: str) -> frozenset[int] | None:
    """A ";"-separated list of broker ids (CLEAN_BROKER_DATA's brokerControllerIdsToClean); None when absent."""
    raw = cmd.ext_fields.get(key)
    if raw is None or not raw.strip() or raw == "null":
        return None
    ids: set[int] = set()
    for part in raw.split(";"):
        try:
            ids.add(int(part.strip()))
        except ValueError:
            raise _bad(cmd, f"header field {key!r} = {raw[:40]!r} is not a ';'-separated list of ids") from None
    return frozenset(ids)


def broker_names_of(cmd: RemotingCommand) -> list[str]:
    """GET_SYNC_STATE_DATA's body: a JSON list of broker names."""
    doc = _json(cmd)
    if not isinstance(doc, list) or not all(isinstance(n, str) for n in doc):
        raise _bad(cmd, "body is not a JSON list of broker names")
    return doc


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def sync_state_set_body(g: BrokerGroup) -> bytes:
    return _dumps({"syncStateSet": sorted(g.sync_state_set), "syncStateSetEpoch": g.sync_state_set_epoch})


def master_fields(g: BrokerGroup) -> dict[str, object]:
    """masterBrokerId, masterAddress, masterEpoch, syncStateSetEpoch; a group without a master leaves the first
    two out (null in Java, which its serializer omits)."""
    fields: dict[str, object] = {"masterEpoch": g.master_epoch, "syncStateSetEpoch": g.sync_state_set_epoch}
    if g.master is not None:
        fields["masterBrokerId"] = g.master
        address = g.address_of(g.master)
        if address is not None:
            fields["masterAddress"] = address
    return fields


def elect_body(g: BrokerGroup) -> bytes:
    return _dumps({"brokerMemberGroup": {"cluster": g.cluster, "brokerName": g.broker_name,
                                         "brokerAddrs": {str(i): r.address for i, r in sorted(g.replicas.items())}},
                   "syncStateSet": sorted(g.sync_state_set)})


def replicas_info_body(groups: list[BrokerGroup], is_alive: Callable[[BrokerGroup, int], bool]) -> bytes:
    """BrokerReplicasInfo for the groups: each replica in or out of the SyncStateSet, with its liveness."""
    table: dict[str, object] = {}
    for g in groups:
        def identity(i: int, g: BrokerGroup = g) -> dict[str, object]:
            return {"brokerName": g.broker_name, "brokerId": i, "brokerAddress": g.replicas[i].address,
                    "alive": is_alive(g, i)}

        table[g.broker_name] = {
            "masterBrokerId": g.master, "masterAddress": g.address_of(g.master), "masterEpoch": g.master_epoch,
            "syncStateSetEpoch": g.sync_state_set_epoch,
            "inSyncReplicas": [identity(i) for i in sorted(g.replicas) if i in g.sync_state_set],
            "notInSyncReplicas": [identity(i) for i in sorted(g.replicas) if i not in g.sync_state_set]}
    return _dumps({"replicasInfoTable": table})
