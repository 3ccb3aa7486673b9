"""Who is connected: consumer groups (with their subscriptions and channels) and producer groups.

Membership changes (a new client, one leaving, a channel closing or expiring) notify the group's
other clients at once with a oneway NOTIFY_CONSUMER_IDS_CHANGED, so they rebalance without waiting
for their periodic timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import CLUSTERING, ConsumerData, SubscriptionData
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request

log = logging.getLogger(__name__)


@dataclass
class ClientChannel:
    conn: RemotingConnection
    client_id: str
    language: str
    version: int
    last_update_ms: int


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    channels: dict[RemotingConnection, ClientChannel] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values()})


class ConsumerManager:
    def __init__(self, clock: Callable[[], int], channel_expired_ms: int = 120_000) -> None:
        self.clock = clock
        self.channel_expired_ms = channel_expired_ms
        self.groups: dict[str, ConsumerGroupInfo] = {}
        #: called with (group, client ids) when a group's membership changes
        self.listeners: list[Callable[[str, list[str]], None]] = []

    def register(self, conn: RemotingConnection, client_id: str, language: str, version: int,
                 data: ConsumerData, *, notify: bool = True) -> bool:
        """Record a heartbeat; returns True when membership or subscriptions changed. Either change notifies
        the group's clients (unless the group turned notifications off), as RocketMQ does."""
        info = self.groups.get(data.group_name)
        if info is None:
            info = self.groups[data.group_name] = ConsumerGroupInfo(
                data.group_name, data.consume_type, data.message_model, data.consume_from_where)
        info.consume_type, info.message_model = data.consume_type, data.message_model
        info.consume_from_where = data.consume_from_where
        now = self.clock()
        channel = info.channels.get(conn)
        members_changed = channel is None or channel.client_id != client_id
        if members_changed:
            info.channels[conn] = ClientChannel(conn, client_id, language, version, now)
        else:
            assert channel is not None
            channel.last_update_ms = now
        new_subs = {s.topic: s for s in data.subscriptions}
        subs_changed = {t: (s.sub_string, s.expression_type) for t, s in new_subs.items()} != {
            t: (s.sub_string, s.expression_type) for t, s in info.subscriptions.items()}
        if subs_changed:
            info.subscriptions = new_subs
        changed = members_changed or subs_changed
        if changed and notify:
            self._notify(info)
        return changed

    def unregister(self, group: str, client_id: str) -> None:
        info = self.groups.get(group)
        if info is None:
            return
        gone = [c for c, ch in info.channels.items() if ch.client_id == client_id]
        for conn in gone:
            del info.channels[conn]
        if gone:
            self._after_removal(info)

    def connection_closed(self, conn: RemotingConnection) -> None:
        for info in list(self.groups.values()):
            if info.channels.pop(conn, None) is not None:
                self._after_removal(info)

    def scan_expired(self) -> None:
        limit = self.clock() - self.channel_expired_ms
        for info in list(self.groups.values()):
            expired = [c for c, ch in info.channels.items() if ch.last_update_ms < limit]
            for conn in expired:
                log.info("consumer %s of %s silent for %d ms: dropped", info.channels[conn].client_id,
                         info.group, self.channel_expired_ms)
                del info.channels[conn]
                conn.close()
            if expired:
                self._after_removal(info)

    def _after_removal(self, info: ConsumerGroupInfo) -> None:
        if not info.channels:
            del self.groups[info.group]
        self._notify(info)

    def _notify(self, info: ConsumerGroupInfo) -> None:
        ids = info.client_ids()
        for listener in self.listeners:
            listener(info.group, ids)
        for channel in list(info.channels.values()):
            if not channel.conn.closed:
                channel.conn.send_oneway(make_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                      {"consumerGroup": info.group}, oneway=True))

    def client_ids(self, group: str) -> list[str]:
        info = self.groups.get(group)
        return info.client_ids() if info else []

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return info.subscriptions.get(topic) if info else None

    def is_clustering(self, group: str) -> bool:
        info = self.groups.get(group)
        return info is None or info.message_model == CLUSTERING

    def channels(self, group: str) -> list[ClientChannel]:
        info = self.groups.get(group)
        return list(info.channels.values()) if info else []


class ProducerManager:
    def __init__(self, clock: Callable[[], int], channel_expired_ms: int = 120_000) -> None:
        self.clock = clock
        self.channel_expired_ms = channel_expired_ms
        #: group -> conn -> channel
        self.groups: dict[str, dict[RemotingConnection, ClientChannel]] = {}

    def register(self, conn: RemotingConnection, client_id: str, language: str, version: int, group: str) -> None:
        channels = self.groups.setdefault(group, {})
        ch = channels.get(conn)
        if ch is None:
            channels[conn] = ClientChannel(conn, client_id, language, version, self.clock())
        else:
            ch.last_update_ms = self.clock()

    def unregister(self, group: str, client_id: str) -> None:
        channels = self.groups.get(group, {})
        for conn in [c for c, ch in channels.items() if ch.client_id == client_id]:
            del channels[conn]
        if not channels:
            self.groups.pop(group, None)

    def connection_closed(self, conn: RemotingConnection) -> None:
        for group in list(self.groups):
            self.groups[group].pop(conn, None)
            if not self.groups[group]:
                del self.groups[group]

    def scan_expired(self) -> None:
        limit = self.clock() - self.channel_expired_ms
        for group in list(self.groups):
            for conn in [c for c, ch in self.groups[group].items() if ch.last_update_ms < limit]:
                del self.groups[group][conn]
            if not self.groups[group]:
                del self.groups[group]

    def any_channel(self, group: str) -> ClientChannel | None:
        """A live channel of the group (for transaction checks)."""
        for ch in self.groups.get(group, {}).values():
            if not ch.conn.closed:
                return ch
        return None
