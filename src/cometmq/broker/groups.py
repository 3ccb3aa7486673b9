"""Subscription group configs (retry limits, consume permissions), persisted like topics."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cometmq.common.atomic_file import read_optional, write_atomic

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

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SubscriptionGroupConfig:
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class SubscriptionGroupManager:
    def __init__(self, path: Path, *, auto_create: bool = True, default_retry_max: int = 16) -> None:
        self.path = path
        self.auto_create = auto_create
        self.default_retry_max = default_retry_max
        self.groups: dict[str, SubscriptionGroupConfig] = {}

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

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; auto-created (and persisted) when allowed."""
        cfg = self.groups.get(group)
        if cfg is None and self.auto_create:
            cfg = SubscriptionGroupConfig(group, retryMaxTimes=self.default_retry_max)
            self.groups[group] = cfg
            self.persist()
        return cfg

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
