"""Topic configs: create, auto-create, delete, persist.

The table is kept in ``config/topics.json`` (RocketMQ's ``{"topicConfigTable": …, "dataVersion": …}``, written
atomically) plus a journal beside it, ``topics.json.log``: each change appends one JSON line and syncs it, so a
change costs the same with 10 topics or 10,000. When the journal holds as many lines as half the table, the
table is written whole and the journal emptied (and at every start and replica copy). Loading reads the table,
then replays the journal; a torn last line (a crash while appending, never acknowledged) is dropped.

Our rule, RocketMQ's (TopicConfigManager.createTopicInSendMessageBackMethod persists the table and forces it to
disk before it returns): a topic is on disk before the request that created it is answered, so it survives a
SIGKILL or a power loss after the answer. The topics one request creates (a heartbeat's retry topics, one per
clustering group) share one journal write and one sync (``create_system_topics``): a sync each made a heartbeat
naming N new groups cost N syncs on the event loop (4000 took ~10 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from cometmq.common.atomic_file import fsync_dir, read_optional, write_atomic
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.names import (
    DLQ_TOPIC_PREFIX,
    RETRY_TOPIC_PREFIX,
    TOPIC_MESSAGE_TYPES,
    TOPIC_NAME_MAX,
    has_name_chars_only,
    is_system_topic,
)
from cometmq.protocol.route import MAX_QUEUE_NUMS, PERM_INHERIT, PERM_READ_WRITE, TopicConfig

log = logging.getLogger(__name__)

AUTO_CREATE_TOPIC_KEY = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
#: Topics clients may not send to (RocketMQ's TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET, answered NO_PERMISSION
#: "Sending message to topic[...] is forbidden"): the broker's own logs, written through its appender only. cometmq
#: adds TBW102 (the auto-create template: what is sent there no consumer reads), the timer's topic and the POP log
#: topic, whose records the broker would act on. Retry (%RETRY%) and DLQ topics stay open, as in RocketMQ: the
#: Java client's sendMessageBack falls back to a plain send to %RETRY%group.
NOT_ALLOWED_SEND_TOPICS = frozenset({
    SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    SELF_TEST_TOPIC, "OFFSET_MOVED_EVENT", AUTO_CREATE_TOPIC_KEY, "rmq_sys_wheel_timer", "rmq_sys_POP_LOG",
})


def check_send_allowed(topic: str) -> None:
    """Raise RemotingError(NO_PERMISSION) for a client send to a reserved topic (``NOT_ALLOWED_SEND_TOPICS``)."""
    if topic in NOT_ALLOWED_SEND_TOPICS:
        raise RemotingError(ResponseCode.NO_PERMISSION,
                            f"Sending message to topic[{topic}] is forbidden: it is reserved for the broker")


def check_topic_name(topic: str) -> None:
    """Raise RemotingError(MESSAGE_ILLEGAL) naming what is wrong with ``topic``."""
    if not topic or not topic.strip():
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "the topic name is empty")
    if len(topic) > TOPIC_NAME_MAX:
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"the topic name is longer than {TOPIC_NAME_MAX} characters")
    if not has_name_chars_only(topic):  # (a regex with $ also took a name ending in a newline)
        raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                            f"the topic name {topic!r} may only contain letters, digits, %, |, - and _")


def check_admin_topic(cfg: TopicConfig) -> None:
    """What an admin's create or update of a topic may set (RocketMQ's AdminBrokerProcessor and TopicAttributes):
    RemotingError naming the problem, before anything changes. The broker's own topics are made by the broker."""
    check_topic_name(cfg.topic_name)
    if is_system_topic(cfg.topic_name):  # (TBW102 too: rewriting the template changed what auto-creation makes)
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"The topic[{cfg.topic_name}] is conflict with system topic.")
    if not 0 <= cfg.perm <= 7:  # PermName.isValid
        raise RemotingError(ResponseCode.SYSTEM_ERROR,
                            f"topic perm {cfg.perm} is invalid: 0..7 (4 read, 2 write, 1 inherit)")
    if cfg.message_type not in TOPIC_MESSAGE_TYPES:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"message.type {cfg.message_type!r} is not one of "
                                                       f"{', '.join(sorted(TOPIC_MESSAGE_TYPES))}")
    if not (1 <= cfg.read_queue_nums <= MAX_QUEUE_NUMS and 1 <= cfg.write_queue_nums <= MAX_QUEUE_NUMS):
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"queue numbers must be within 1..{MAX_QUEUE_NUMS}")


def check_read_queue(cfg: TopicConfig, queue_id: int) -> None:
    """SYSTEM_ERROR (RocketMQ's answer) when ``queue_id`` is none of the topic's read queues."""
    if queue_id < 0 or queue_id >= cfg.read_queue_nums:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"queueId {queue_id} is out of range: {cfg.topic_name} has "
                                                       f"{cfg.read_queue_nums} read queues")


def retry_topic(group: str) -> str:
    return RETRY_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_TOPIC_PREFIX + group


#: journal lines always allowed before the table is rewritten whole (beyond: half the table's size)
JOURNAL_MIN_LINES = 256

#: told of each change: the topic's name and its new config (None: deleted); may return an awaitable that is
#: done once the change is registered with the nameservers (``routes_settled`` waits for it)
ChangeListener = Callable[[str, TopicConfig | None], Awaitable[object] | None]


class TopicConfigManager:
    def __init__(self, path: Path, *, default_queue_nums: int = 4, broker_perm: int = PERM_READ_WRITE,
                 on_change: ChangeListener | None = None) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + ".log")
        self.default_queue_nums = default_queue_nums
        self.broker_perm = broker_perm
        self.topics: dict[str, TopicConfig] = {}
        self.on_change = on_change
        self.data_version = 0
        self._journal_lines = 0
        self._registering: set[asyncio.Future[object]] = set()

    def load(self) -> None:
        raw = read_optional(self.path)
        if raw:
            try:
                doc = json.loads(raw)
                table = doc["topicConfigTable"]
                self.topics = {name: TopicConfig.from_json(cfg) for name, cfg in table.items()}
                version = doc.get("dataVersion") or {}
                self.data_version = int(version.get("counter", 0)) if isinstance(version, dict) else 0
            except (ValueError, KeyError, TypeError, AttributeError, ProtocolError) as exc:
                bad = self.path.with_name(self.path.name + ".bad")
                log.error("cannot read %s (%s); set aside as %s", self.path, exc, bad)
                self.path.rename(bad)
                self.topics = {}
        self._replay_journal()
        # System topics RocketMQ clients expect to exist.
        self._ensure(TopicConfig(AUTO_CREATE_TOPIC_KEY, 8, 8, PERM_READ_WRITE | PERM_INHERIT))
        self._ensure(TopicConfig(SELF_TEST_TOPIC, 1, 1))
        self._ensure(TopicConfig(SCHEDULE_TOPIC, 18, 18))

    def _ensure(self, cfg: TopicConfig) -> None:
        if cfg.topic_name not in self.topics:
            self.topics[cfg.topic_name] = cfg

    def _replay_journal(self) -> None:
        raw = read_optional(self.journal_path)
        if not raw:
            return
        lines = raw.split(b"\n")
        complete, torn = lines[:-1], lines[-1]
        if torn:
            log.warning("%s ends in a torn line (%d bytes, a crash while appending); dropped",
                        self.journal_path, len(torn))
        applied = 0
        for number, line in enumerate(complete, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if "put" in entry:
                    cfg = TopicConfig.from_json(entry["put"])
                    self.topics[cfg.topic_name] = cfg
                else:
                    self.topics.pop(str(entry["delete"]), None)
                self.data_version = max(self.data_version, int(entry.get("v", 0)))
                applied += 1
            except (ValueError, KeyError, TypeError, AttributeError, ProtocolError) as exc:
                log.error("%s line %d is unreadable (%s); skipped", self.journal_path, number, exc)
        self._journal_lines = len(complete)
        log.info("replayed %d topic changes from %s", applied, self.journal_path)

    def persist(self) -> None:
        """Write the whole table, then empty the journal (replaying it over this table changes nothing)."""
        body = {"topicConfigTable": {n: c.to_json() for n, c in sorted(self.topics.items())},
                "dataVersion": {"timestamp": 0, "counter": self.data_version}}
        write_atomic(self.path, json.dumps(body, indent=1).encode())
        if self._journal_lines or self.journal_path.exists():
            self.journal_path.unlink(missing_ok=True)
            fsync_dir(self.journal_path.parent)
        self._journal_lines = 0

    def _journal(self, lines: list[bytes]) -> None:
        """Make changes durable with one sync: their journal lines, or the whole table when the journal has grown
        to half of it (so rewriting costs O(1) a change, amortised) or there is no table file yet."""
        if self._journal_lines + len(lines) > max(JOURNAL_MIN_LINES, len(self.topics) // 2) \
                or not self.path.exists():
            self.persist()
            return
        created = not self.journal_path.exists()
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(b"".join(lines))
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.journal_path.parent)
        self._journal_lines += len(lines)

    def _journal_line(self, name: str, cfg: TopicConfig | None) -> bytes:
        entry: dict[str, object] = {"v": self.data_version}
        if cfg is None:
            entry["delete"] = name
        else:
            entry["put"] = cfg.to_json()
        return json.dumps(entry, separators=(",", ":")).encode() + b"\n"

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def existing(self, topic: str) -> TopicConfig:
        """The topic's config; TOPIC_NOT_EXIST when this broker has none."""
        cfg = self.topics.get(topic)
        if cfg is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist on this broker")
        return cfg

    def put(self, cfg: TopicConfig) -> TopicConfig:
        check_topic_name(cfg.topic_name)
        if not (1 <= cfg.read_queue_nums <= MAX_QUEUE_NUMS and 1 <= cfg.write_queue_nums <= MAX_QUEUE_NUMS):
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"queue numbers must be within 1..{MAX_QUEUE_NUMS}")
        self.topics[cfg.topic_name] = cfg
        self._changed(cfg.topic_name, cfg)
        return cfg

    def delete(self, topic: str) -> bool:
        if self.topics.pop(topic, None) is None:
            return False
        self._changed(topic, None)
        return True

    def _changed(self, name: str, cfg: TopicConfig | None) -> None:
        self._changed_many([(name, cfg)])

    def _changed_many(self, changes: list[tuple[str, TopicConfig | None]]) -> None:
        """Journal the changes (already in the table) with one sync, then tell the listener of each."""
        lines = []
        for name, cfg in changes:
            self.data_version += 1
            lines.append(self._journal_line(name, cfg))
        self._journal(lines)
        if self.on_change is None:
            return
        for name, cfg in changes:
            waiting = self.on_change(name, cfg)
            if waiting is not None:
                future = asyncio.ensure_future(waiting)
                self._registering.add(future)
                future.add_done_callback(self._registering.discard)

    async def routes_settled(self, timeout_s: float = 3.0) -> None:
        """Wait (at most ``timeout_s``) until the changes made so far are registered with the nameservers, so
        a route asked for after an admin's create shows the topic (RocketMQ answers UPDATE_AND_CREATE_TOPIC
        after registering it too). A registration that fails or times out is left to the periodic round."""
        if self._registering:
            await asyncio.wait(list(self._registering), timeout=timeout_s)

    def create_in_send(self, topic: str, default_topic: str, queue_nums: int, sys_flag: int = 0) -> TopicConfig | None:
        """Auto-create ``topic`` from its default topic (TBW102) when that one allows it (INHERIT)."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        base = self.topics.get(default_topic)
        if base is None or not (base.perm & PERM_INHERIT):
            return None
        nums = max(1, min(queue_nums, base.write_queue_nums))
        return self.put(TopicConfig(topic, nums, nums, PERM_READ_WRITE, topic_sys_flag=sys_flag))

    def topic_for_send(self, topic: str, default_topic: str, queue_nums: int, remote: str) -> TopicConfig:
        """The config a send to ``topic`` writes under: the topic's own, a retry topic made on first use, or
        one auto-created from ``default_topic`` (TBW102) when that allows it; else TOPIC_NOT_EXIST."""
        check_topic_name(topic)
        cfg = self.topics.get(topic)
        if cfg is not None:
            return cfg
        if topic.startswith(RETRY_TOPIC_PREFIX):
            return self.create_system_topic(topic, 1)
        created = self.create_in_send(topic, default_topic or AUTO_CREATE_TOPIC_KEY, queue_nums)
        if created is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST,
                                f"topic {topic} does not exist and may not be auto-created (from {remote})")
        log.info("auto-created topic %s with %d queues for %s", topic, created.write_queue_nums, remote)
        return created

    def create_system_topic(self, topic: str, queue_nums: int = 1, perm: int = PERM_READ_WRITE) -> TopicConfig:
        """Retry, DLQ and other broker-made topics."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        return self.put(TopicConfig(topic, queue_nums, queue_nums, perm))

    def create_system_topics(self, wanted: Iterable[tuple[str, int]]) -> None:
        """Create the ``(topic, queue_nums)`` not there yet, durable together with one sync (a heartbeat's retry
        topics). Every name is checked before any is created: a bad one changes nothing."""
        new: dict[str, TopicConfig] = {}
        for topic, queue_nums in wanted:
            if topic not in self.topics and topic not in new:
                check_topic_name(topic)
                new[topic] = TopicConfig(topic, queue_nums, queue_nums, PERM_READ_WRITE)
        if new:
            self.topics.update(new)
            self._changed_many(list(new.items()))

    def all(self) -> list[TopicConfig]:
        return list(self.topics.values())

    def replace_all(self, configs: Iterable[TopicConfig], data_version: int) -> bool:
        """Take the master's table and data version (a replica's copy, broker/ha/metadata.py); persisted when
        anything changed. The registrar is not told: the nameserver reads topics from the master only."""
        table = {cfg.topic_name: cfg for cfg in configs}
        if table == self.topics and data_version == self.data_version:
            return False
        self.topics = table
        self.data_version = data_version
        self.persist()
        return True
