"""The nameserver's route table: which brokers are alive, which topics they hold, and the routes built from that.

Pure and synchronous: the processors call it from the event loop, so no lock is needed; time comes from an
injected clock and connections are opaque hashable tokens, so tests need neither sockets nor sleeps.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cometmq.protocol.route import (
    MASTER_ID,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerResult,
    TopicConfig,
    TopicRouteData,
)

log = logging.getLogger(__name__)

DEFAULT_BROKER_EXPIRY_S = 120.0
#: body digests remembered per broker and data version (a split registration sends several bodies)
MAX_BODY_DIGESTS = 64


class ExpiredBroker(NamedTuple):
    addr: str
    conn: Hashable | None


@dataclass(slots=True)
class BrokerLiveInfo:
    cluster: str
    broker_name: str
    broker_id: int
    last_update: float
    data_version: DataVersion
    ha_server_addr: str
    conn: Hashable | None
    timeout_s: float
    #: the topics its registrations carried under ``data_version`` (a master's only)
    seen: set[str] = field(default_factory=set)
    #: digests of the register bodies taken under ``data_version``: the same body again needs no decoding
    digests: set[bytes] = field(default_factory=set)


class _Holder(NamedTuple):
    addr: str
    state_version: int


@dataclass(slots=True)
class _BrokerGroup:
    cluster: str
    broker_name: str
    addrs: dict[int, str]
    #: topics whose queues an operator changed (WIPE/ADD_WRITE_PERM_OF_BROKER): a registration under a data
    #: version held here does not read them again, only one under a new version does
    pinned: set[str] = field(default_factory=set)

    def snapshot(self) -> BrokerData:
        return BrokerData(self.cluster, self.broker_name, self.addrs)


class RouteInfoManager:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, broker_expiry_s: float = DEFAULT_BROKER_EXPIRY_S
    ) -> None:
        self._clock = clock
        self.broker_expiry_s = broker_expiry_s
        self._topics: dict[str, dict[str, QueueData]] = {}  # topic -> broker name -> its queues
        self._groups: dict[str, _BrokerGroup] = {}  # broker name -> cluster and addresses by id
        self._clusters: dict[str, set[str]] = {}  # cluster -> broker names
        self._live: dict[str, BrokerLiveInfo] = {}  # broker address -> liveness
        self._filter_servers: dict[str, list[str]] = {}  # broker address -> filter servers
        self._by_conn: dict[Hashable, set[str]] = {}  # connection -> broker addresses registered over it

    # -- registration ------------------------------------------------------------------------------------
    def register_broker(
        self,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        broker_id: int,
        ha_addr: str,
        topic_configs: Iterable[TopicConfig],
        data_version: DataVersion,
        conn: Hashable | None = None,
        *,
        filter_servers: Sequence[str] | None = (),
        timeout_s: float | None = None,
        body_digest: bytes | None = None,
    ) -> RegisterBrokerResult:
        """Register (or refresh) one broker. ``topic_configs`` are read as RocketMQ does: all of them when the
        data version is new to this nameserver (or the broker is); under a version it has, only the topics
        not yet seen under it (the later bodies of a split registration), so a topic deleted here, or write
        permission wiped, is not undone by a re-registration of the same table. ``filter_servers`` None keeps
        the broker's list; ``body_digest`` remembers the body so ``known_body_version`` can skip decoding it
        when it comes again."""
        holder = self._conflicting_holder(broker_name, broker_addr, broker_id, data_version)
        if holder is not None:
            # #6316: another live broker holds this id at a higher state version (a newer controller epoch);
            # this one is stale, e.g. an isolated former master. As RocketMQ, it is answered with an empty
            # result and changes nothing, so it neither takes the id back nor learns a master to follow.
            log.warning("broker %s id %d: %s (state version %d) is refused; %s holds the id at state version %d",
                        broker_name, broker_id, broker_addr, data_version.state_version, holder.addr,
                        holder.state_version)
            return RegisterBrokerResult(None, None)
        prev = self._live.get(broker_addr)
        if prev is not None and prev.broker_name != broker_name:
            # The address now belongs to another broker group (renamed broker): forget its old membership.
            self._remove_addr(broker_addr)
            prev = None

        group = self._groups.get(broker_name)
        first = group is None
        if group is None:
            group = self._groups[broker_name] = _BrokerGroup(cluster, broker_name, {})
        elif group.cluster != cluster:
            self._leave_cluster(group.cluster, broker_name)
            group.cluster = cluster
        self._clusters.setdefault(cluster, set()).add(broker_name)

        # A replica promoted in place re-registers its address under id 0: drop the address's other ids.
        for other_id, addr in list(group.addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del group.addrs[other_id]
        old_addr = group.addrs.get(broker_id)
        group.addrs[broker_id] = broker_addr
        if old_addr is not None and old_addr != broker_addr:
            # Another machine took over this id; the old one no longer has a slot to be alive in.
            log.info("broker %s id %d moved from %s to %s", broker_name, broker_id, old_addr, broker_addr)
            self._forget_live(old_addr)
            self._filter_servers.pop(old_addr, None)
        first = first or old_addr != broker_addr

        # Only the master's topic table defines the queues. Topics it leaves out are kept, not removed: 5.x
        # Java brokers register just the changed topics after creating one, under the current data version.
        fresh = first or prev is None or prev.data_version != data_version
        seen: set[str] = set() if fresh or prev is None else prev.seen
        digests: set[bytes] = set() if fresh or prev is None else prev.digests
        if broker_id == MASTER_ID and (fresh or body_digest is None or body_digest not in digests):
            topics = self._topics
            pinned = group.pinned
            for config in topic_configs:
                name = config.topic_name
                if fresh or name not in seen:
                    seen.add(name)
                    if pinned and name in pinned:
                        if not fresh:
                            # Under a held version, e.g. a forced full registration after a new topic was
                            # registered alone: as RocketMQ, a topic held here is not read again.
                            continue
                        pinned.discard(name)
                    topics.setdefault(name, {})[broker_name] = QueueData.from_topic_config(broker_name, config)
        if body_digest is not None:
            if len(digests) >= MAX_BODY_DIGESTS:
                digests.clear()
            digests.add(body_digest)

        if prev is not None and prev.conn is not conn:
            self._unindex_conn(prev.conn, broker_addr)
        self._live[broker_addr] = BrokerLiveInfo(
            cluster,
            broker_name,
            broker_id,
            self._clock(),
            data_version,
            ha_addr,
            conn,
            self.broker_expiry_s if timeout_s is None else timeout_s,
            seen,
            digests,
        )
        if conn is not None:
            self._by_conn.setdefault(conn, set()).add(broker_addr)
        if prev is None:
            log.info("broker registered: %s %s id %d at %s", cluster, broker_name, broker_id, broker_addr)
        if filter_servers:
            self._filter_servers[broker_addr] = list(filter_servers)
        elif filter_servers is not None:
            self._filter_servers.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = group.addrs.get(MASTER_ID)
            master = self._live.get(master_addr) if master_addr is not None else None
            if master_addr is not None and master is not None:
                return RegisterBrokerResult(master_addr, master.ha_server_addr)
        return RegisterBrokerResult(None, None)

    def known_body_version(self, broker_name: str, broker_addr: str, broker_id: int,
                           body_digest: bytes) -> DataVersion | None:
        """The data version of a register body this nameserver took from this broker already, under the
        version the broker still holds here, or None. Such a body changes no topic again (every topic in it
        is seen), so the caller may register with its version and no topics instead of decoding it."""
        info = self._live.get(broker_addr)
        group = self._groups.get(broker_name)
        if (info is None or group is None or info.broker_name != broker_name or info.broker_id != broker_id
                or group.addrs.get(broker_id) != broker_addr or body_digest not in info.digests):
            return None
        return info.data_version

    def query_data_version(self, cluster: str, broker_addr: str,
                           data_version: DataVersion) -> tuple[bool, DataVersion | None]:
        """QUERY_DATA_VERSION (RocketMQ's isBrokerTopicConfigChanged and queryBrokerTopicConfig): whether the
        broker's data version differs from the one held here, and the one held (None: not registered). A
        known broker counts as alive from now, as after a registration."""
        info = self._live.get(broker_addr)
        if info is None or info.cluster != cluster:
            return True, None
        info.last_update = self._clock()
        return info.data_version != data_version, info.data_version

    def register_topic(self, topic: str, queue_datas: Sequence[QueueData]) -> bool:
        """REGISTER_TOPIC_IN_NAMESRV (RocketMQ's registerTopic): add or replace the queues of ``topic`` on the
        named brokers. Nothing changes when one of them is not registered (False), as in RocketMQ."""
        if not queue_datas or any(qd.broker_name not in self._groups for qd in queue_datas):
            return False
        queues = self._topics.setdefault(topic, {})
        for qd in queue_datas:
            queues[qd.broker_name] = qd
        return True

    def _conflicting_holder(self, broker_name: str, broker_addr: str, broker_id: int,
                            data_version: DataVersion) -> _Holder | None:
        """The live broker that keeps ``broker_id`` against this registration, if any.

        The higher ``state_version`` (the controller's master epoch) wins; on a tie the current holder keeps the
        id, so two claimants at one version cannot take turns in the routes (RocketMQ lets a tie replace; with
        state version 0, i.e. without a controller, a new machine takes an id over once the old one's
        registration is gone: unregistered, disconnected or expired)."""
        group = self._groups.get(broker_name)
        if group is None:
            return None
        held_by = group.addrs.get(broker_id)
        if held_by is None or held_by == broker_addr:
            return None
        info = self._live.get(held_by)
        if info is None or info.last_update + info.timeout_s < self._clock():
            return None  # silent past its timeout: gone, even if the scan has not removed it yet
        held = info.data_version.state_version
        if held < data_version.state_version:
            return None
        return _Holder(held_by, held)

    def unregister_broker(self, cluster: str, broker_name: str, broker_addr: str, broker_id: int) -> bool:
        """Remove one broker (a clean shutdown). False when no broker ``broker_id`` was at ``broker_addr``:
        a late unregister from a replaced process must not evict its successor."""
        group = self._groups.get(broker_name)
        if group is None or group.addrs.get(broker_id) != broker_addr:
            return False
        del group.addrs[broker_id]
        info = self._live.get(broker_addr)
        if info is not None and info.broker_name == broker_name:
            self._forget_live(broker_addr)
        self._filter_servers.pop(broker_addr, None)
        if not group.addrs:
            self._drop_group(broker_name)
        log.info("broker unregistered: %s %s id %d at %s", cluster, broker_name, broker_id, broker_addr)
        return True

    def scan_inactive(self, now: float | None = None) -> list[ExpiredBroker]:
        """Remove brokers silent for longer than their timeout; returns them so the caller can close their
        connections."""
        now = self._clock() if now is None else now
        expired = [
            ExpiredBroker(addr, info.conn)
            for addr, info in self._live.items()
            if info.last_update + info.timeout_s < now
        ]
        for broker in expired:
            log.warning("broker %s expired: no registration for %.0f s", broker.addr, self._live[broker.addr].timeout_s)
            self._remove_addr(broker.addr)
        return expired

    def on_connection_closed(self, conn: Hashable) -> list[str]:
        """Remove the brokers that registered over ``conn`` (their process is gone); returns their addresses."""
        removed = []
        for addr in sorted(self._by_conn.pop(conn, ())):
            info = self._live.get(addr)
            if info is not None and info.conn is conn:
                log.info("broker %s disconnected; removing its routes", addr)
                self._remove_addr(addr)
                removed.append(addr)
        return removed

    def conn_in_use(self, conn: Hashable) -> bool:
        """Whether any live broker registered over ``conn``."""
        return bool(self._by_conn.get(conn))

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget ``topic`` (only its queues on ``cluster``'s brokers when given); its brokers' next
        registration brings it back only if their data version changed."""
        queues = self._topics.get(topic)
        if queues is None:
            return False
        if cluster is None:
            del self._topics[topic]
            return True
        names = self._clusters.get(cluster, set())
        removed = [name for name in queues if name in names]
        for name in removed:
            del queues[name]
        if not queues:
            del self._topics[topic]
        return bool(removed)

    # -- queries -----------------------------------------------------------------------------------------
    def pick_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``, or None when no live broker holds it."""
        queues = self._topics.get(topic)
        if not queues:
            return None
        queue_datas: list[QueueData] = []
        broker_datas: list[BrokerData] = []
        filters: dict[str, tuple[str, ...]] = {}
        for name in sorted(queues):
            group = self._groups.get(name)
            if group is None:  # a queue whose broker group is unknown would break clients (gotcha 6)
                continue
            queue_datas.append(queues[name])
            broker_datas.append(group.snapshot())
            for addr in group.addrs.values():
                servers = self._filter_servers.get(addr)
                if servers:
                    filters[addr] = tuple(servers)
        if not broker_datas:
            return None
        return TopicRouteData(tuple(queue_datas), tuple(broker_datas), "", filters)

    def update_write_perm(self, broker_name: str, *, wipe: bool) -> int:
        """Take write permission away from (``wipe``) or give it back to every topic of ``broker_name``
        (WIPE/ADD_WRITE_PERM_OF_BROKER); the number of topics changed. The change holds until the broker
        registers a new topic table, as in RocketMQ."""
        changed = []
        for topic, queues in self._topics.items():
            qd = queues.get(broker_name)
            if qd is None:
                continue
            queues[broker_name] = dataclasses.replace(qd, perm=qd.perm & ~PERM_WRITE if wipe else qd.perm | PERM_WRITE)
            changed.append(topic)
        group = self._groups.get(broker_name)
        if group is not None:
            group.pinned = set(changed)
        return len(changed)

    def system_topics(self) -> tuple[list[str], str | None]:
        """RocketMQ's system topic list: every cluster and broker name, and some broker's address (where the
        tools ask for the broker's own system topics)."""
        names = set(self._clusters)
        for brokers in self._clusters.values():
            names |= brokers
        addr = next((group.addrs[min(group.addrs)] for _, group in sorted(self._groups.items()) if group.addrs),
                    None)
        return sorted(names), addr

    def all_topics(self) -> list[str]:
        return sorted(self._topics)

    def topics_with_sys_flag(self, test: Callable[[int], bool]) -> list[str]:
        """The topics some broker holds with a topicSysFlag that passes ``test`` (the unit topic lists)."""
        return sorted(topic for topic, queues in self._topics.items()
                      if any(test(qd.topic_sys_flag) for qd in queues.values()))

    def topics_by_cluster(self, cluster: str) -> list[str]:
        names = self._clusters.get(cluster, set())
        return sorted(topic for topic, queues in self._topics.items() if not names.isdisjoint(queues))

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            {name: self._groups[name].snapshot() for name in sorted(self._groups)},
            {cluster: tuple(sorted(names)) for cluster, names in sorted(self._clusters.items())},
        )

    def live_brokers(self) -> dict[str, BrokerLiveInfo]:
        """A snapshot of the live table by broker address."""
        return dict(self._live)

    # -- internals ---------------------------------------------------------------------------------------
    def _remove_addr(self, addr: str) -> None:
        """Forget everything about the broker at ``addr`` (expired, disconnected or renamed)."""
        self._forget_live(addr)
        self._filter_servers.pop(addr, None)
        for name, group in list(self._groups.items()):
            for broker_id in [i for i, a in group.addrs.items() if a == addr]:
                del group.addrs[broker_id]
            if not group.addrs:
                self._drop_group(name)

    def _forget_live(self, addr: str) -> None:
        info = self._live.pop(addr, None)
        if info is not None:
            self._unindex_conn(info.conn, addr)

    def _unindex_conn(self, conn: Hashable | None, addr: str) -> None:
        if conn is None:
            return
        addrs = self._by_conn.get(conn)
        if addrs is not None:
            addrs.discard(addr)
            if not addrs:
                del self._by_conn[conn]

    def _drop_group(self, broker_name: str) -> None:
        """The last address of a group is gone: the group, its cluster membership and its queues go too."""
        group = self._groups.pop(broker_name, None)
        if group is not None:
            self._leave_cluster(group.cluster, broker_name)
        for topic in [t for t, queues in self._topics.items() if broker_name in queues]:
            queues = self._topics[topic]
            del queues[broker_name]
            if not queues:
                del self._topics[topic]

    def _leave_cluster(self, cluster: str, broker_name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._clusters[cluster]
