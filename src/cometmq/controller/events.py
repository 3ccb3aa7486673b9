"""The controller's decisions: the entries of its replicated log, and their bytes (compact, sorted-key JSON).

An event carries everything ``ControllerState.apply`` needs to check it again on any node: the epochs and master
it was decided against, and for decisions that depend on liveness the heartbeat records relied on (``evidence``)
with the time of the decision. Names follow RocketMQ's events (controller/impl/event/*.java).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .heartbeats import LiveInfo


@dataclass(frozen=True)
class ApplyBrokerId:
    """A broker takes a persistent id in its group (APPLY_BROKER_ID); the first id creates the group."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str
    check_code: str  # registerCheckCode: "address;timestamp", written by the broker next to its id


@dataclass(frozen=True)
class UpdateBrokerAddress:
    """A registered broker came back at another address (REGISTER_BROKER)."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str


@dataclass(frozen=True)
class ElectMaster:
    """A new master (``new_master``), or none left (None) after the old one was lost (ELECT_MASTER)."""

    cluster: str
    broker_name: str
    master_epoch: int  # the group's epochs and master this was decided against
    sync_state_set_epoch: int
    old_master: int | None
    new_master: int | None
    requester: int | None  # the broker that asked; None when the controller triggered it (RocketMQ's -1)
    designate: bool  # designateElect: the requester wants itself
    unclean: bool  # enableElectUncleanMaster when decided
    decided_at_ms: int
    evidence: tuple[LiveInfo, ...]


@dataclass(frozen=True)
class AlterSyncStateSet:
    """The master changes its SyncStateSet (ALTER_SYNC_STATE_SET)."""

    cluster: str
    broker_name: str
    master_id: int
    master_epoch: int
    sync_state_set_epoch: int
    new_set: frozenset[int]
    decided_at_ms: int
    evidence: tuple[LiveInfo, ...]


@dataclass(frozen=True)
class CleanBrokerData:
    """An operator removes dead replicas (``broker_ids``) or the whole group (None) (CLEAN_BROKER_DATA)."""

    cluster: str
    broker_name: str
    broker_ids: frozenset[int] | None
    clean_living: bool
    decided_at_ms: int
    evidence: tuple[LiveInfo, ...]


Event = ApplyBrokerId | UpdateBrokerAddress | ElectMaster | AlterSyncStateSet | CleanBrokerData

_TYPES: dict[str, type[Any]] = {cls.__name__: cls for cls in
                                 (ApplyBrokerId, UpdateBrokerAddress, ElectMaster, AlterSyncStateSet, CleanBrokerData)}


class EventDecodeError(ValueError):
    """Bytes that are not an event: a log entry of another version, or a bug. Never silently skipped."""


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise EventDecodeError(f"not a string: {v!r}")
    return v


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise EventDecodeError(f"not an integer: {v!r}")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise EventDecodeError(f"not a boolean: {v!r}")
    return v


def _opt_int(v: object) -> int | None:
    return None if v is None else _int(v)


def _ids(v: object) -> frozenset[int]:
    if not isinstance(v, list):
        raise EventDecodeError(f"not a list of ids: {v!r}")
    return frozenset(_int(i) for i in v)


def _opt_ids(v: object) -> frozenset[int] | None:
    return None if v is None else _ids(v)


def _evidence(v: object) -> tuple[LiveInfo, ...]:
    if not isinstance(v, list) or not all(isinstance(d, dict) for d in v):
        raise EventDecodeError(f"not a list of heartbeat records: {v!r}")
    try:
        return tuple(LiveInfo.from_json(d) for d in v)
    except (KeyError, ValueError) as exc:
        raise EventDecodeError(f"bad heartbeat record: {exc}") from exc


#: how each field is read back; fields of the same name mean the same thing in every event
_FIELD_DECODERS: dict[str, Callable[[object], object]] = {
    "cluster": _str, "broker_name": _str, "address": _str, "check_code": _str,
    "broker_id": _int, "master_id": _int, "master_epoch": _int, "sync_state_set_epoch": _int, "decided_at_ms": _int,
    "old_master": _opt_int, "new_master": _opt_int, "requester": _opt_int,
    "designate": _bool, "unclean": _bool, "clean_living": _bool,
    "new_set": _ids, "broker_ids": _opt_ids, "evidence": _evidence,
}


def _to_json(value: object) -> object:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return [info.to_json() for info in value]
    return value


def encode_event(event: Event) -> bytes:
    doc: dict[str, object] = {f.name: _to_json(getattr(event, f.name)) for f in fields(event)}
    doc["type"] = type(event).__name__
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_event(data: bytes) -> Event:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise EventDecodeError("not an object")
    kind = doc.pop("type", None)
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventDecodeError("unknown event type")
    names = [f.name for f in fields(cls)]
    if set(doc) != set(names):
        raise EventDecodeError(f"{cls.__name__}: fields {sorted(doc)} != {sorted(names)}")
    event: Event = cls(**{name: _FIELD_DECODERS[name](doc[name]) for name in names})
    return event
