"""A broker group's metadata on its replicas: the master serves its tables, replicas copy them every 10 s.

RocketMQ's slaves copy from the master (SlaveSynchronize.java) the topic configs (GET_ALL_TOPIC_CONFIG 21), the
consumer offsets (GET_ALL_CONSUMER_OFFSET 43), the delay-level progress (GET_ALL_DELAY_OFFSET 45), the subscription
groups (GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201), the message request modes (402) and the timer checkpoint
(GET_TIMER_CHECK_POINT 60), so that a replica promoted to master serves the same topics and groups and resumes
consumers, delay levels and timers where the old master left them.

``MetadataProcessor`` answers the codes ``AdminProcessor`` does not (43, 45, 60, 402), with RocketMQ's JSON shapes;
the timer checkpoint is cometmq's own (JSON, not Java's 56 bytes: its wheel is not Java's). ``SlaveMetadataSync``
is the copying side: each table is fetched and applied on its own, so one failing fetch leaves the others' copies
current, and a failing master leaves the replica's tables as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from cometmq.broker.groups import SubscriptionGroupConfig, SubscriptionGroupManager
from cometmq.broker.offsets import ConsumerOffsetManager
from cometmq.broker.schedule import ScheduleMessageService
from cometmq.broker.topics import TopicConfigManager
from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import dumps
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from cometmq.protocol.route import TopicConfig, decode_json

log = logging.getLogger(__name__)

Handler = Callable[[RemotingConnection, RemotingCommand], Awaitable[RemotingCommand | None]]

DEFAULT_SYNC_INTERVAL_S = 10.0


class TimerCheckpoints(Protocol):
    """What the tables' copy needs of the timer (broker/timer_bridge.py, timer/replica.py)."""

    @property
    def loaded(self) -> bool: ...

    @property
    def deliver(self) -> bool: ...

    def checkpoint_info(self) -> dict[str, Any]: ...

    def apply_master_checkpoint(self, info: Mapping[str, Any]) -> bool: ...


def _ok(cmd: RemotingCommand, body: object) -> RemotingCommand:
    return make_response(cmd, ResponseCode.SUCCESS, None, {}, dumps(body))


class MetadataProcessor:
    """The master's side: the tables a replica copies, as RocketMQ serves them."""

    def __init__(self, *, offsets: ConsumerOffsetManager, schedule: ScheduleMessageService,
                 timer: TimerCheckpoints | None) -> None:
        self.offsets = offsets
        self.schedule = schedule
        self.timer = timer

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_consumer_offsets,
            RequestCode.GET_ALL_DELAY_OFFSET: self.all_delay_offsets,
            RequestCode.GET_TIMER_CHECK_POINT: self.timer_checkpoint,
            RequestCode.GET_ALL_MESSAGE_REQUEST_MODE: self.all_message_request_modes,
        }

    async def all_consumer_offsets(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # ConsumerOffsetSerializeWrapper; queue ids as strings (fastjson writes them bare: both parse)
        table = {key: {str(q): o for q, o in sorted(queues.items())}
                 for key, queues in sorted(self.offsets.table.items())}
        return _ok(cmd, {"offsetTable": table})

    async def all_delay_offsets(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # What ScheduleMessageService persists (delayOffset.json), as RocketMQ answers with that file's content.
        return _ok(cmd, {"offsetTable": {str(level): o for level, o in sorted(self.schedule.offsets.items())}})

    async def timer_checkpoint(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        timer = self.timer
        if timer is None or not timer.loaded:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "The checkpoint is null")  # RocketMQ's answer
        return _ok(cmd, timer.checkpoint_info())

    async def all_message_request_modes(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # cometmq keeps no per-group request modes (SET_MESSAGE_REQUEST_MODE is not served): an empty table.
        return _ok(cmd, {"messageRequestModeMap": {}})


# -- the replica's side ----------------------------------------------------------------------------------------
def _table(raw: Mapping[str, Any], key: str, what: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RemoteProtocolError(f"{what}: {key!r} must be a JSON object")
    return value


def parse_topic_configs(raw: Mapping[str, Any]) -> tuple[list[TopicConfig], int]:
    table = _table(raw, "topicConfigTable", "topic configs")
    configs = [TopicConfig.from_json(cfg) for cfg in table.values()]
    version = _table(raw, "dataVersion", "topic configs")
    try:
        counter = int(version.get("counter", 0))
    except (TypeError, ValueError):
        raise RemoteProtocolError("topic configs: dataVersion.counter is not an integer") from None
    return configs, counter


def parse_groups(raw: Mapping[str, Any]) -> list[SubscriptionGroupConfig]:
    table = _table(raw, "subscriptionGroupTable", "subscription groups")
    try:
        return [SubscriptionGroupConfig.from_json(dict(cfg)) for cfg in table.values()]
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"subscription groups: {exc}") from None


def parse_offsets(raw: Mapping[str, Any], what: str) -> dict[str, dict[int, int]]:
    table = _table(raw, "offsetTable", what)
    try:
        return {str(key): {int(q): int(o) for q, o in queues.items()} for key, queues in table.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"{what}: {exc}") from None


def parse_delay_offsets(raw: Mapping[str, Any]) -> dict[int, int]:
    table = _table(raw, "offsetTable", "delay offsets")
    try:
        return {int(level): int(offset) for level, offset in table.items()}
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"delay offsets: {exc}") from None


class SlaveMetadataSync:
    """Copies the master's tables into this replica's managers every ``interval_s`` (RocketMQ: 10 s).

    ``master_addr`` gives the current master's remoting address, or None while there is none to copy from (this
    broker is the master, or the master is unknown); it is read before every pass, so a new master is followed."""

    def __init__(self, client: RemotingClient, master_addr: Callable[[], str | None], *,
                 topics: TopicConfigManager, groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager,
                 schedule: ScheduleMessageService, timer: TimerCheckpoints | None,
                 interval_s: float = DEFAULT_SYNC_INTERVAL_S, timeout_s: float = 3.0) -> None:
        self.client = client
        self.master_addr = master_addr
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.schedule = schedule
        self.timer = timer
        self.timeout_s = timeout_s
        #: passes that reached a master, and fetches that failed (by table name), for logs and tests
        self.passes = 0
        self.failures: dict[str, int] = {}
        self._loop = Periodic("replica-metadata-sync", interval_s, self.sync_once, logger=log)

    @property
    def interval_s(self) -> float:
        return self._loop.interval_s

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def wakeup(self) -> None:
        """Copy now (e.g. right after this broker learned a new master)."""
        self._loop.wakeup()

    async def sync_once(self) -> list[str]:
        """Fetch and apply every table once; returns the names of those that could not be copied."""
        addr = self.master_addr()
        if addr is None:
            return []
        steps: list[tuple[str, int, Callable[[Mapping[str, Any]], bool]]] = [
            ("topics", RequestCode.GET_ALL_TOPIC_CONFIG, self._apply_topics),
            ("consumer offsets", RequestCode.GET_ALL_CONSUMER_OFFSET, self._apply_offsets),
            ("delay offsets", RequestCode.GET_ALL_DELAY_OFFSET, self._apply_delay_offsets),
            ("subscription groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self._apply_groups),
        ]
        timer = self.timer
        if timer is not None and timer.loaded and not timer.deliver:  # (a timer built, following its master)
            steps.append(("timer checkpoint", RequestCode.GET_TIMER_CHECK_POINT, self._apply_timer))
        failed: list[str] = []
        for name, code, apply in steps:
            try:
                raw = await self._fetch(addr, code, name)
                if self.master_addr() != addr:
                    # This broker was promoted, or follows another master, while the fetch was out: what came is a
                    # former master's past, which must not replace the tables this broker now owns or gets elsewhere.
                    log.info("replica: %s is no longer this broker's master: its %s and the rest of this pass are "
                             "dropped", addr, name)
                    break
                if apply(raw):
                    log.info("replica: copied the %s of master %s", name, addr)
            except Exception as exc:  # one table's failure must not keep the others from being copied
                failed.append(name)
                self.failures[name] = self.failures.get(name, 0) + 1
                log.warning("replica: cannot copy the %s from master %s: %s", name, addr, exc)
        if len(failed) < len(steps):
            self.passes += 1
        return failed

    async def _fetch(self, addr: str, code: int, what: str) -> Mapping[str, Any]:
        reply = await self.client.invoke(addr, make_request(code, {}), self.timeout_s)
        if reply.code != ResponseCode.SUCCESS:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"the master answered {reply.code}: {reply.remark}")
        raw = decode_json(reply.body or b"{}", what)
        if not isinstance(raw, Mapping):
            raise RemoteProtocolError(f"{what}: the body is not a JSON object")
        return raw

    def _apply_topics(self, raw: Mapping[str, Any]) -> bool:
        configs, version = parse_topic_configs(raw)
        return self.topics.replace_all(configs, version)

    def _apply_offsets(self, raw: Mapping[str, Any]) -> bool:
        return self.offsets.replace_all(parse_offsets(raw, "consumer offsets"))

    def _apply_delay_offsets(self, raw: Mapping[str, Any]) -> bool:
        return self.schedule.replace_offsets(parse_delay_offsets(raw))

    def _apply_groups(self, raw: Mapping[str, Any]) -> bool:
        return self.groups.replace_all(parse_groups(raw))

    def _apply_timer(self, raw: Mapping[str, Any]) -> bool:
        timer = self.timer
        if timer is None or not timer.loaded or timer.deliver:
            return False  # a master keeps its own checkpoint (RocketMQ: only while dequeue is not running)
        return timer.apply_master_checkpoint(raw)


__all__ = ["MetadataProcessor", "SlaveMetadataSync"]
