"""Subscription group configs (retry limits, consume permissions), persisted like topics."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.group_policy import check_retry_policy
from cometmq.protocol.names import group_name_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    consumeMessageOrderly: bool = False
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True
    #: RocketMQ 5's GroupRetryPolicy: {"type": "CUSTOMIZED"|"EXPONENTIAL", "customizedRetryPolicy": {"next":
    #: [ms, ...]}, "exponentialRetryPolicy": {"initial": ms, "max": ms, "multiplier": n}}; kept and shown (the
    #: broker's retry delays follow the delay levels)
    groupRetryPolicy: dict[str, Any] = field(default_factory=lambda: {"type": "CUSTOMIZED"})
    #: the group's attributes (``updateSubGroup --attributes +k=v,-k``)
    attributes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SubscriptionGroupConfig:
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        policy = known.get("groupRetryPolicy")
        if policy is None:
            known.pop("groupRetryPolicy", None)
        else:
            known["groupRetryPolicy"] = check_retry_policy(policy)
        attributes = known.get("attributes")
        if attributes is None:
            known.pop("attributes", None)
        elif not isinstance(attributes, dict):
            raise TypeError("attributes must be an object")
        else:
            known["attributes"] = {str(k): "" if v is None else str(v) for k, v in attributes.items()}
        return cls(**known)


def check_group_name(name: object) -> None:
    """An admin's create or update of a group (RocketMQ's AdminBrokerProcessor): INVALID_PARAMETER naming what is
    wrong with the name (TopicValidator.validateGroup), before anything changes."""
    problem = group_name_problem(name) if isinstance(name, str) else "is not a string"
    if problem is not None:
        shown = repr(name if not isinstance(name, str) or len(name) <= 200 else name[:200] + "...")
        raise RemotingError(ResponseCode.INVALID_PARAMETER, f"the group name {shown} {problem}")


def alter_attributes(current: dict[str, str], change: dict[str, str], *, create: bool) -> dict[str, str]:
    """RocketMQ's attribute change (AttributeUtil.alterCurrentAttributes): ``+key`` adds or updates, ``-key``
    deletes (the key must exist); creating a group takes ``+key`` only. ValueError names what is wrong."""
    out = dict(current)
    seen: set[str] = set()
    for raw_key, value in change.items():
        sign, key = raw_key[:1], raw_key[1:]
        if not key or "+" in key or "-" in key or "=" in key or "," in key:
            raise ValueError(f"attribute key {raw_key!r} is malformed (+key=value adds, -key deletes)")
        if key in seen:
            raise ValueError(f"attribute {key!r} is changed twice")
        seen.add(key)
        if sign == "+":
            out[key] = value
        elif sign == "-" and not create:
            if key not in current:
                raise ValueError(f"attempt to delete a nonexistent attribute: {key}")
            del out[key]
        else:
            raise ValueError(f"attribute {raw_key!r}: only +key=value is taken when creating a group"
                             if create else f"attribute {raw_key!r} needs + (add) or - (delete)")
    return out


class SubscriptionGroupManager:
    def __init__(self, path: Path, *, auto_create: bool = True, default_retry_max: int = 16) -> None:
        self.path = path
        self.auto_create = auto_create
        self.default_retry_max = default_retry_max
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        #: groups were auto-created since the table was last written (``persist_if_dirty`` writes it)
        self.dirty = False

    def load(self) -> None:
        raw = read_optional(self.path)
        if not raw:
            return
        try:
            table = json.loads(raw)["subscriptionGroupTable"]
            self.groups = {n: SubscriptionGroupConfig.from_json(c) for n, c in table.items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot read %s (%s); starting without group configs", self.path, exc)
            self.path.rename(self.path.with_name(self.path.name + ".bad"))

    def persist(self) -> None:
        body = {"subscriptionGroupTable": {n: asdict(c) for n, c in sorted(self.groups.items())}}
        write_atomic(self.path, json.dumps(body, indent=1).encode())
        self.dirty = False

    def persist_if_dirty(self) -> None:
        if self.dirty:
            self.persist()

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; auto-created when allowed, and written with the next ``persist_if_dirty`` (the
        broker's housekeeping): writing the whole table at each one made a request naming N new groups cost O(N^2)
        on the event loop. One lost in a crash is the config the next use creates again.

        As RocketMQ 5 (TopicValidator.validateGroup), a name that is blank, longer than 120 characters or has other
        characters than letters, digits and ``%|-_`` is not created: every request naming a made-up name (of any
        length) wrote it into this table and the offsets' for good."""
        cfg = self.groups.get(group)
        if cfg is None and self.auto_create and group_name_problem(group) is None:
            cfg = SubscriptionGroupConfig(group, retryMaxTimes=self.default_retry_max)
            self.groups[group] = cfg
            self.dirty = True
        return cfg

    def require(self, group: str) -> SubscriptionGroupConfig:
        """``find``, or RemotingError(SUBSCRIPTION_GROUP_NOT_EXIST) saying why there is none."""
        cfg = self.find(group)
        if cfg is None:
            problem = group_name_problem(group) if self.auto_create else None
            shown = repr(group if len(group) <= 200 else group[:200] + "...")
            raise RemotingError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group {shown} does not exist"
                                + (f" and is not created: its name {problem}" if problem else ""))
        return cfg

    def with_attributes(self, cfg: SubscriptionGroupConfig, change: object) -> SubscriptionGroupConfig:
        """``cfg`` (an update request) with its attributes: the group's current ones changed by ``change``
        (``{"+key": value, "-key": ""}``, RocketMQ's request form), or kept when ``change`` is empty."""
        current = self.groups.get(cfg.groupName)
        if not change:
            return replace(cfg, attributes=dict(current.attributes) if current is not None else {})
        if not isinstance(change, dict):
            raise ValueError("attributes must be an object")
        final = alter_attributes(current.attributes if current is not None else {},
                                 {str(k): "" if v is None else str(v) for k, v in change.items()},
                                 create=current is None)
        return replace(cfg, attributes=final)

    def put(self, cfg: SubscriptionGroupConfig) -> None:
        self.groups[cfg.groupName] = cfg
        self.persist()

    def replace_all(self, groups: Iterable[SubscriptionGroupConfig]) -> bool:
        """Take the master's table (a replica's copy, broker/ha/metadata.py); persisted when anything changed."""
        table = {cfg.groupName: cfg for cfg in groups}
        if table == self.groups:
            return False
        self.groups = table
        self.persist()
        return True

    def delete(self, group: str) -> bool:
        if self.groups.pop(group, None) is None:
            return False
        self.persist()
        return True
