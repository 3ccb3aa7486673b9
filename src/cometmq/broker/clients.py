"""Who is connected: consumer groups (with their subscriptions and channels) and producer groups.

Membership changes (a new client, one leaving, a channel closing or expiring) notify the group's
clients with a oneway NOTIFY_CONSUMER_IDS_CHANGED, so they rebalance without waiting for their periodic
timer. The notices of a group are coalesced (leading and trailing edge): the first change is told at
once and opens a window of 1 ms per member, at most ``notify_window_ms``; changes within it are told
once, when it ends (which opens the next window). A burst of N joins to a large group thus costs a few
notices to the group, not N; a lone join is still told at once, and a small group (whose notices cost
little) is told of every change almost at once.

Each group keeps its member list sorted and its GET_CONSUMER_LIST_BY_GROUP body encoded, both rebuilt
only after a membership change (``version``), and the heartbeat fingerprints (RocketMQ 5's heartbeat v2)
that were last seen with its current subscriptions: a heartbeat that carries only such a fingerprint
(no subscription data) is enough to keep a member alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from cometmq.net.connection import ConnectionClosedError, RemotingConnection
from cometmq.protocol.client_bodies import CLUSTERING, ConsumerData, SubscriptionData, encode_consumer_list
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
    #: bumped by every membership change; the cached list and body below belong to ``_cached_version``
    version: int = 0
    #: heartbeat v2 fingerprints last seen in full heartbeats that carried the current subscriptions
    fingerprints: set[int] = field(default_factory=set)
    _cached_version: int = -1
    _cached_ids: list[str] = field(default_factory=list)
    _cached_body: bytes | None = None

    def client_ids(self) -> list[str]:
        """The members' client ids, sorted (a fresh list; rebuilt once per membership change)."""
        return list(self._ids())

    def _ids(self) -> list[str]:
        if self._cached_version != self.version:
            self._cached_ids = sorted({c.client_id for c in self.channels.values()})
            self._cached_body = None
            self._cached_version = self.version
        return self._cached_ids

    def consumer_list_body(self) -> bytes:
        """GET_CONSUMER_LIST_BY_GROUP's body, encoded once per membership change."""
        ids = self._ids()
        if self._cached_body is None:
            self._cached_body = encode_consumer_list(ids)
        return self._cached_body


#: at most this many fingerprints are remembered per group (members whose heartbeats differ elsewhere, e.g.
#: in their producer groups, have different ones); beyond it the set starts again
MAX_FINGERPRINTS = 64


class ConsumerManager:
    #: a group's notice window is this many ms per member, up to ``notify_window_ms``
    notify_window_per_member_ms = 1.0

    def __init__(self, clock: Callable[[], int], channel_expired_ms: int = 120_000, *,
                 notify_window_ms: int = 0, notify_enable: bool = True) -> None:
        self.clock = clock
        self.channel_expired_ms = channel_expired_ms
        #: the coalescing window of a group's NOTIFY_CONSUMER_IDS_CHANGED (0: every change told at once)
        self.notify_window_ms = notify_window_ms
        #: False: no notices at all (RocketMQ's broker-wide notifyConsumerIdsChangedEnable)
        self.notify_enable = notify_enable
        self.groups: dict[str, ConsumerGroupInfo] = {}
        #: called with (group, client ids) when a group's membership changes
        self.listeners: list[Callable[[str, list[str]], None]] = []
        #: groups whose notice window is open, and those with a change to tell when it ends
        self._windows: dict[str, asyncio.TimerHandle] = {}
        self._pending: set[str] = set()
        #: NOTIFY_CONSUMER_IDS_CHANGED sent (one per member per notice; for stats and tests)
        self.notices_sent = 0
        #: client id -> channels it has in any group (for :meth:`has_client`)
        self._client_channels: dict[str, int] = {}

    def register(self, conn: RemotingConnection, client_id: str, language: str, version: int,
                 data: ConsumerData, *, notify: bool = True, fingerprint: int = 0,
                 without_sub: bool = False) -> bool:
        """Record a heartbeat; returns True when membership or subscriptions changed. Either change notifies
        the group's clients (unless the group turned notifications off), as RocketMQ does.

        ``without_sub`` (heartbeat v2): the heartbeat carries no subscriptions; the group's stay as they are.
        Otherwise a non-zero ``fingerprint`` is remembered as one that stands for the group's subscriptions."""
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
            if channel is not None:
                self._forget_client(channel.client_id)
            info.channels[conn] = ClientChannel(conn, client_id, language, version, now)
            self._client_channels[client_id] = self._client_channels.get(client_id, 0) + 1
            info.version += 1
        else:
            assert channel is not None
            channel.last_update_ms = now
        subs_changed = False
        if not without_sub:
            new_subs = {s.topic: s for s in data.subscriptions}
            subs_changed = {t: (s.sub_string, s.expression_type) for t, s in new_subs.items()} != {
                t: (s.sub_string, s.expression_type) for t, s in info.subscriptions.items()}
            if subs_changed:
                info.subscriptions = new_subs
                info.fingerprints.clear()
            if fingerprint:
                if len(info.fingerprints) >= MAX_FINGERPRINTS:
                    info.fingerprints.clear()
                info.fingerprints.add(fingerprint)
        changed = members_changed or subs_changed
        if changed and notify:
            self._notify(info)
        return changed

    def knows_fingerprint(self, group: str, fingerprint: int) -> bool:
        """True when a heartbeat with this fingerprint and no subscriptions is enough for ``group``: the group
        is known and a full heartbeat with the same fingerprint gave its current subscriptions."""
        info = self.groups.get(group)
        return info is not None and fingerprint != 0 and fingerprint in info.fingerprints

    def has_client(self, client_id: str) -> bool:
        """True while ``client_id`` is a member of some group."""
        return self._client_channels.get(client_id, 0) > 0

    def _forget_client(self, client_id: str) -> None:
        left = self._client_channels.get(client_id, 0) - 1
        if left > 0:
            self._client_channels[client_id] = left
        else:
            self._client_channels.pop(client_id, None)

    def _drop(self, info: ConsumerGroupInfo, conn: RemotingConnection) -> ClientChannel:
        channel = info.channels.pop(conn)
        self._forget_client(channel.client_id)
        info.version += 1
        return channel

    def unregister(self, group: str, client_id: str, conn: RemotingConnection | None = None) -> None:
        """``client_id`` leaves ``group``: its channel on ``conn`` (as RocketMQ: a request leaves only for the
        connection it came on, not another's), or every channel of it when ``conn`` is None."""
        info = self.groups.get(group)
        if info is None:
            return
        gone = [c for c, ch in info.channels.items() if ch.client_id == client_id and (conn is None or c is conn)]
        for conn in gone:
            self._drop(info, conn)
        if gone:
            self._after_removal(info)

    def connection_closed(self, conn: RemotingConnection) -> None:
        for info in list(self.groups.values()):
            if conn in info.channels:
                self._drop(info, conn)
                self._after_removal(info)

    def scan_expired(self) -> None:
        limit = self.clock() - self.channel_expired_ms
        for info in list(self.groups.values()):
            expired = [c for c, ch in info.channels.items() if ch.last_update_ms < limit]
            for conn in expired:
                log.info("consumer %s of %s silent for %d ms: dropped", info.channels[conn].client_id,
                         info.group, self.channel_expired_ms)
                self._drop(info, conn)
                conn.close()
            if expired:
                self._after_removal(info)

    def _after_removal(self, info: ConsumerGroupInfo) -> None:
        if not info.channels:
            del self.groups[info.group]
        self._notify(info)

    def _notify(self, info: ConsumerGroupInfo) -> None:
        """The group's membership (or subscriptions) changed: tell its listeners, and its clients now or when
        the group's notice window ends."""
        if self.listeners:
            ids = info.client_ids()
            for listener in self.listeners:
                listener(info.group, ids)
        if not self.notify_enable:
            return
        group = info.group
        if group in self._windows:
            self._pending.add(group)  # told at the window's end, with whatever else changes meanwhile
            return
        self._send_notice(group)
        self._open_window(group)

    def _window_ms(self, group: str) -> float:
        """The group's notice window: what a notice costs grows with the members (each asks for the list, which
        grows too), so small groups are told at once, as RocketMQ does, and large ones at most every
        ``notify_window_ms``."""
        info = self.groups.get(group)
        members = len(info.channels) if info is not None else 0
        return min(self.notify_window_ms, members * self.notify_window_per_member_ms)

    def _open_window(self, group: str) -> None:
        window = self._window_ms(group)
        if window <= 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving the manager by hand): nothing to coalesce with
            return
        self._windows[group] = loop.call_later(window / 1000, self._window_end, group)

    def _window_end(self, group: str) -> None:
        self._windows.pop(group, None)
        if group in self._pending:
            self._pending.discard(group)
            self._send_notice(group)
            self._open_window(group)

    def _send_notice(self, group: str) -> None:
        info = self.groups.get(group)
        if info is None:
            return
        cmd = make_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True)
        for channel in list(info.channels.values()):
            if not channel.conn.closed:
                try:
                    channel.conn.send_oneway(cmd)
                except ConnectionClosedError:
                    # its transport is closing (connection_lost is yet to run): it leaves the group then; the
                    # other members are still told, and the heartbeat or close that changed the group goes on
                    continue
                self.notices_sent += 1

    def close(self) -> None:
        """Cancel the open notice windows (the broker is stopping)."""
        for handle in self._windows.values():
            handle.cancel()
        self._windows.clear()
        self._pending.clear()

    def client_ids(self, group: str) -> list[str]:
        info = self.groups.get(group)
        return info.client_ids() if info else []

    def consumer_list_body(self, group: str) -> bytes | None:
        """GET_CONSUMER_LIST_BY_GROUP's body (cached per membership change); None when no member is online."""
        info = self.groups.get(group)
        return info.consumer_list_body() if info is not None and info.channels else None

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

    def unregister(self, group: str, client_id: str, conn: RemotingConnection | None = None) -> None:
        """As ``ConsumerManager.unregister``: only the channel on ``conn`` when given."""
        channels = self.groups.get(group, {})
        for gone in [c for c, ch in channels.items() if ch.client_id == client_id and (conn is None or c is conn)]:
            del channels[gone]
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
