"""The nameserver's KV configs (RocketMQ's KVConfigManager): namespace -> key -> value, set by the tools with
PUT_KV_CONFIG and read with GET_KV_CONFIG / GET_KVLIST_BY_NAMESPACE. The one namespace with a meaning here is
``ORDER_TOPIC_CONFIG``: ``topic -> "brokerName:queueNums;..."``, which ``updateTopic -o true`` writes and the
route answers carry as ``orderTopicConf``. Written through to ``kvConfigPath`` (RocketMQ's file and shape:
``{"configTable": {namespace: {key: value}}}``, atomically, at each change) when the nameserver has one — ``cometmq
serve`` keeps it in its data folder — so a restarted nameserver keeps them; without a path they live in memory."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cometmq.common.atomic_file import read_optional, write_atomic

log = logging.getLogger(__name__)

#: RocketMQ's NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfigError(ValueError):
    """A kvConfig.json that cannot be read (the message names the file)."""


class KVConfigManager:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._table: dict[str, dict[str, str]] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        raw = read_optional(path)
        if raw is None:
            return
        try:
            table = json.loads(raw).get("configTable", {})
            if not isinstance(table, dict) or not all(
                    isinstance(keys, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items())
                    for keys in table.values()):
                raise ValueError("configTable must map namespaces to {key: value} strings")
        except (ValueError, AttributeError) as exc:
            raise KVConfigError(f"{path}: not a KV config file ({exc})") from None
        self._table = {str(ns): dict(keys) for ns, keys in table.items() if keys}
        log.info("KV configs loaded from %s: %d namespaces", path, len(self._table))

    def _commit(self, table: dict[str, dict[str, str]]) -> None:
        """Make ``table`` the KV configs: written to the file first, so a write that fails (disk full, the file
        not writable) raises and leaves both the file and the configs in memory as they were."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({"configTable": table}, indent=1, sort_keys=True).encode())
        self._table = table

    def put(self, namespace: str, key: str, value: str) -> None:
        table = dict(self._table)
        table[namespace] = {**table.get(namespace, {}), key: value}
        self._commit(table)

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        keys = self._table.get(namespace)
        if keys is None or key not in keys:
            return
        table = dict(self._table)
        rest = {k: v for k, v in keys.items() if k != key}
        if rest:
            table[namespace] = rest
        else:
            del table[namespace]
        self._commit(table)

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """Every key of ``namespace`` (None when it has none)."""
        keys = self._table.get(namespace)
        return dict(keys) if keys else None
