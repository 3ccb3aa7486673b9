"""Consumer offsets per (topic, group, queue), persisted atomically every few seconds and at shutdown."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.protocol.codes import RemotingError, ResponseCode

log = logging.getLogger(__name__)

#: the largest offset a client may commit: a Java long's largest value (RocketMQ parses the header as one)
MAX_COMMIT_OFFSET = (1 << 63) - 1


def check_commit_offset(offset: int) -> None:
    """RemotingError(SYSTEM_ERROR) for a commitOffset that is negative or past a Java long. RocketMQ cannot parse
    the latter; kept, it was answered to QUERY_CONSUMER_OFFSET and GET_CONSUME_STATS, which a Java consumer or tool
    cannot read (the queue's consumer never started), and written to consumerOffset.json."""
    if not 0 <= offset <= MAX_COMMIT_OFFSET:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"commitOffset {offset} is not within 0..{MAX_COMMIT_OFFSET}")


class ConsumerOffsetManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        #: "topic@group" -> {queueId: next offset to consume}
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False

    def load(self) -> None:
        raw = read_optional(self.path)
        if not raw:
            return
        try:
            table = json.loads(raw)["offsetTable"]
            self.table = {key: {int(q): int(o) for q, o in queues.items()} for key, queues in table.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("cannot read %s (%s); starting without consumer offsets", self.path, exc)
            self.path.rename(self.path.with_name(self.path.name + ".bad"))

    def persist(self) -> None:
        body = {"offsetTable": {k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self.table.items())}}
        write_atomic(self.path, json.dumps(body, indent=1).encode())
        self.dirty = False

    def persist_if_dirty(self) -> None:
        if self.dirty:
            self.persist()

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.setdefault(f"{topic}@{group}", {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for this queue."""
        return self.table.get(f"{topic}@{group}", {}).get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> set[str]:
        return {k.split("@", 1)[1] for k in self.table if k.split("@", 1)[0] == topic}

    def topics_of_group(self, group: str) -> set[str]:
        return {k.split("@", 1)[0] for k in self.table if k.split("@", 1)[1] == group}

    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self.table if k.split("@", 1)[0] == topic]:
            del self.table[key]
            self.dirty = True

    def delete_group(self, group: str) -> int:
        """Forget every committed offset of ``group`` (RocketMQ's removeOffset); the number of topics it had."""
        keys = [k for k in self.table if k.split("@", 1)[1] == group]
        for key in keys:
            del self.table[key]
        if keys:
            self.dirty = True
        return len(keys)

    def replace_all(self, table: dict[str, dict[int, int]]) -> bool:
        """Take the master's table (a replica's copy, broker/ha/metadata.py): written by the next periodic
        persist, as every change here is."""
        if table == self.table:
            return False
        self.table = {key: dict(queues) for key, queues in table.items()}
        self.dirty = True
        return True

    def reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.table[f"{topic}@{group}"] = dict(offsets)
        self.dirty = True
