"""The broker's side of the nameserver protocol: register with every nameserver now and every 30 s.

Each round goes to all nameservers in parallel; one that is down or slow is logged and does not hold up or
fail the others. What is sent is proportional to what changed (RocketMQ's answers to its issues #5296/#7326):

* a topic created, updated or deleted bumps the data version; created and updated topics are registered alone
  at once (RocketMQ's registerIncrementBrokerData: a REGISTER_BROKER carrying just them, or with
  ``enableSingleTopicRegister`` REGISTER_TOPIC_IN_NAMESRV per topic);
* the periodic round first asks each nameserver for the data version it holds (QUERY_DATA_VERSION, RocketMQ's
  needRegister) and sends the full table only where it differs, or always with ``forceRegister``; a replica
  always sends it, since the reply names its master;
* a full table is deflated in Java's compact layout (``compressedRegister``; topics with a topicSysFlag, which
  that layout cannot carry, go in a JSON body beside it) and split into several registrations of one data
  version when ``enableSplitRegistration`` asks (``splitRegistrationSize`` topics each) or when one body
  would not fit a frame;
* a nameserver reached over a new connection (it restarted, or dropped us) gets the full table before any
  incremental one, so it never holds a partial table under the current version (RocketMQ #9411).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient, split_address
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import DEFAULT_MAX_FRAME_SIZE, make_request
from cometmq.protocol.route import (
    MASTER_ID,
    PERM_READ_WRITE,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    RegisterBrokerResult,
    TopicConfig,
    TopicRouteData,
    body_crc32,
)

log = logging.getLogger(__name__)

#: RocketMQ's registerBrokerTimeoutMills
DEFAULT_REGISTER_TIMEOUT_S = 24.0
DEFAULT_UNREGISTER_TIMEOUT_S = 3.0
#: RocketMQ's splitRegistrationSize
DEFAULT_SPLIT_SIZE = 800
#: the largest registration body sent in one frame: the frame limit less room for the header
DEFAULT_MAX_BODY_BYTES = DEFAULT_MAX_FRAME_SIZE - 64 * 1024
_NO_RESULT = RegisterBrokerResult(None, None)


def parse_namesrv_addrs(text: str) -> list[str]:
    """``"a:9876;b:9876"`` -> ``["a:9876", "b:9876"]`` (RocketMQ's ``namesrvAddr`` form; blanks and repeats
    dropped). Raises ``ValueError`` naming the first entry that is not ``host:port``."""
    addrs: list[str] = []
    for entry in text.split(";"):
        addr = entry.strip()
        if not addr:
            continue
        try:
            split_address(addr)
        except ValueError:
            raise ValueError(f"nameserver address {addr!r} is not host:port (a port 1-65535)") from None
        if addr not in addrs:
            addrs.append(addr)
    return addrs


class NamesrvRegistrar:
    """Keeps one broker registered with a set of nameservers.

    ``topics`` is read at every periodic round; a topic change between rounds is told with ``topics_changed``
    (the broker's TopicConfigManager does), which registers just that change at once.
    ``frames`` counts what was sent, by kind: ``full`` (REGISTER_BROKER frames of full tables), ``increment``
    (REGISTER_BROKER frames of changed topics), ``topic`` (REGISTER_TOPIC_IN_NAMESRV), ``query``
    (QUERY_DATA_VERSION); ``full_bytes`` the bodies of full registrations.
    """

    def __init__(
        self,
        client: RemotingClient,
        namesrv_addrs: list[str],
        cluster: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        ha_addr: str,
        topics: Callable[[], Iterable[TopicConfig]],
        interval_s: float = 30.0,
        *,
        timeout_s: float = DEFAULT_REGISTER_TIMEOUT_S,
        state_version: int = 0,
        compressed: bool = True,
        force_register: bool = False,
        split_registration: bool = False,
        split_size: int = DEFAULT_SPLIT_SIZE,
        single_topic_register: bool = False,
        broker_perm: int = PERM_READ_WRITE,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if split_size < 1:
            raise ValueError(f"splitRegistrationSize must be at least 1, got {split_size}")
        self.client = client
        self.namesrv_addrs = list(namesrv_addrs)
        self.cluster = cluster
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.broker_addr = broker_addr
        self.ha_addr = ha_addr
        self.topics = topics
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.compressed = compressed
        self.force_register = force_register
        self.split_registration = split_registration
        self.split_size = split_size
        self.single_topic_register = single_topic_register
        self.broker_perm = broker_perm
        self.max_body_bytes = max_body_bytes
        #: the state version is the master epoch: of two brokers claiming id 0, nameservers keep the higher
        self.data_version = DataVersion(int(time.time() * 1000), 0, state_version)
        #: the last successful answer of each nameserver (the one that answered last, last)
        self.results: dict[str, RegisterBrokerResult] = {}
        #: nameservers whose last registration failed: their answer in ``results`` may be stale
        self._unanswered: set[str] = set()
        self.frames: Counter[str] = Counter()
        #: the table as registered under ``data_version`` (None before the first round)
        self._table: dict[str, TopicConfig] | None = None
        #: the full registration's bodies for one data version: (version, [(body, compressed), ...])
        self._encoded: tuple[DataVersion, list[tuple[bytes, bool]]] | None = None
        #: the connection each nameserver last took a whole full registration over
        self._full_conn: dict[str, object] = {}
        #: bumped when the table changed without ``topics_changed``: a full registration begun before is stale
        self._untold = 0
        #: a topic was deleted: the next round registers in full (a nameserver that drops the topics a full
        #: table leaves out, RocketMQ's deleteTopicWithBrokerRegistration, learns of it then)
        self._full_due = False
        self._locks: dict[str, asyncio.Lock] = {}
        #: topic changes not yet registered (None: deleted) and who waits for them
        self._pending: dict[str, TopicConfig | None] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._periodic = Periodic(f"register-{broker_name}", interval_s, self._round, logger=log)
        self._started = False
        self._rounds: set[asyncio.Future[Any]] = set()
        self._stopped = False

    async def set_identity(self, broker_id: int, state_version: int, ha_addr: str | None = None) -> None:
        """Register from now on as ``broker_id`` at ``state_version`` (a role change), starting with a round now.
        The old id is not unregistered, as in RocketMQ (ReplicasManager registers again under the new id): a
        nameserver moves an address that registers under a new id out of its old slot. Unregistering first
        dropped the whole broker group, queues included, when this address was its last member (a replica
        promoted after its master died, a master demoted before the new one registered): the topics had no
        route until a master registered them again."""
        self.broker_id = broker_id
        if ha_addr is not None:
            self.ha_addr = ha_addr
        dv = self.data_version
        self.data_version = DataVersion(int(time.time() * 1000), dv.counter + 1, state_version)
        await self.register_now(force=True)

    def _current_results(self) -> list[RegisterBrokerResult]:
        """The answers to go by: those of the nameservers whose last registration got through (one that stopped
        answering may name a master long gone); the last answers when none did."""
        answered = [result for addr, result in self.results.items() if addr not in self._unanswered]
        return answered or list(reversed(self.results.values()))  # (the latest answer first)

    @property
    def master_ha_addr(self) -> str | None:
        """The group master's HA address as some nameserver reported it (replicas only)."""
        for result in self._current_results():
            if result.ha_server_addr:
                return result.ha_server_addr
        return None

    @property
    def master_addr(self) -> str | None:
        """The master's address as some nameserver reported it (replicas only)."""
        for result in self._current_results():
            if result.master_addr:
                return result.master_addr
        return None

    async def start(self) -> None:
        """Register at once, then every ``interval_s`` in the background."""
        if self._started:
            raise RuntimeError("registrar already started")
        self._started = True
        await self.register_now(force=True)
        self._periodic.start()

    async def stop(self) -> None:
        """Stop registering (rounds in flight are cancelled) and, if ``start()`` ran, unregister from every
        nameserver (best effort: failures are only logged). Later ``register_now()`` calls do nothing."""
        self._stopped = True
        started, self._started = self._started, False
        # Cancel rounds still in flight too, so no registration lands after the unregister. One already
        # written reaches the nameserver first on the same connection, so it cannot undo the unregister.
        rounds: list[asyncio.Future[Any]] = list(self._rounds)
        if self._flusher is not None:
            rounds.append(self._flusher)
        for pending in rounds:
            pending.cancel()
        await self._periodic.stop()
        await asyncio.gather(*rounds, return_exceptions=True)
        self._release_waiters(self._waiters)
        self._waiters = []
        if started:  # unregister only what start() registered
            await asyncio.gather(*(self._unregister_one(addr) for addr in self.namesrv_addrs))

    # -- topic changes between rounds -----------------------------------------------------------------------
    def topics_changed(self, changed: Iterable[TopicConfig] = (), deleted: Iterable[str] = ()) -> asyncio.Future[None]:
        """Topics were created or updated (``changed``) or deleted: bump the data version and register the
        created and updated ones alone with every nameserver, now. The future is done when that is over (it
        never fails: errors are logged, and the next round repairs what did not arrive). Deletions send
        nothing by themselves, as in RocketMQ (the tool deletes the route from the nameservers); the new
        version makes the next round re-register the table in full."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self._stopped or not self._started:
            done.set_result(None)  # start() reads the whole table anyway
            return done
        for config in changed:
            self._pending[config.topic_name] = config
        for name in deleted:
            self._pending[name] = None
            self._full_due = True
        self._waiters.append(done)
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return done

    async def _flush(self) -> None:
        while self._pending and not self._stopped:
            batch, self._pending = self._pending, {}
            waiters, self._waiters = self._waiters, []
            try:
                self.data_version = self.data_version.next_version(int(time.time() * 1000))
                if self._table is not None:
                    for name, config in batch.items():
                        if config is None:
                            self._table.pop(name, None)
                        else:
                            self._table[name] = config
                configs = sorted((c for c in batch.values() if c is not None), key=lambda c: c.topic_name)
                outcomes = await asyncio.gather(*(self._increment_one(addr, configs) for addr in self.namesrv_addrs),
                                                return_exceptions=True)
                for addr, outcome in zip(self.namesrv_addrs, outcomes, strict=True):
                    if isinstance(outcome, RegisterBrokerResult):
                        self.results.pop(addr, None)
                        self.results[addr] = outcome
                        self._unanswered.discard(addr)
                    elif isinstance(outcome, Exception):
                        self._unanswered.add(addr)
                        log.warning("registering topic changes of %s with nameserver %s failed: %s",
                                    self.broker_name, addr, outcome)
                    elif isinstance(outcome, BaseException):
                        raise outcome
            finally:
                self._release_waiters(waiters)

    @staticmethod
    def _release_waiters(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _increment_one(self, addr: str, configs: Sequence[TopicConfig]) -> RegisterBrokerResult | None:
        async with self._lock(addr):
            if not self._is_current(addr):
                # This nameserver has not had the full table over the connection in use (new, restarted, or
                # never reached): a partial one now would stand for the whole table under this version.
                return await self._register_full(addr)
            if not configs:
                return None  # deletions only (see topics_changed)
            try:
                if self.single_topic_register:
                    for config in configs:
                        await self._register_topic(addr, self._as_registered(config))
                    return None
                # Under the current version: everything else in the table under it has reached this
                # nameserver already (in full, or as an earlier change on this same connection).
                body = RegisterBrokerBody(tuple(self._as_registered(c) for c in configs), self.data_version).encode()
                self.frames["increment"] += 1
                return await self._register_body(addr, body, compressed=False)
            except RemotingError as exc:  # refused (RocketMQ's nameserver: "register broker failed"): send it all
                log.info("nameserver %s refused the topic changes of %s (%s); registering the full table",
                         addr, self.broker_name, exc)
                return await self._register_full(addr)
            except BaseException:
                self._full_conn.pop(addr, None)  # unknown whether it arrived: the next round sends it all
                raise

    # -- rounds -----------------------------------------------------------------------------------------------
    async def register_now(self, *, force: bool = False) -> dict[str, RegisterBrokerResult | Exception]:
        """One round now: with every nameserver in parallel, register the full table where it is needed
        (``force``, ``forceRegister``, a replica, a new connection, or a data version the nameserver does not
        hold, asked with QUERY_DATA_VERSION).

        Returns each nameserver's answer or error by address (the last answer where nothing was sent); errors
        are logged, never raised."""
        if self._stopped:
            return {}
        try:
            self._refresh_table()
        except Exception:
            log.exception("cannot read the topic table of %s; skipping this round", self.broker_name)
            return {}
        round_ = asyncio.gather(*(self._round_one(addr, force) for addr in self.namesrv_addrs),
                                return_exceptions=True)
        self._rounds.add(round_)
        try:
            outcomes = await round_
        finally:
            self._rounds.discard(round_)
        results: dict[str, RegisterBrokerResult | Exception] = {}
        for addr, outcome in zip(self.namesrv_addrs, outcomes, strict=True):
            if isinstance(outcome, RegisterBrokerResult):
                self.results.pop(addr, None)
                self.results[addr] = outcome
                self._unanswered.discard(addr)
            elif isinstance(outcome, Exception):
                self._unanswered.add(addr)
                log.warning("registering %s with nameserver %s failed: %s", self.broker_name, addr, outcome)
            else:  # a BaseException such as cancellation of a child: not ours to swallow
                raise outcome
            results[addr] = outcome
        return results

    async def _round(self) -> None:
        await self.register_now()

    def _refresh_table(self) -> None:
        """Read the topic table; a change not told through ``topics_changed`` (a replica's copy from its
        master, a test's list) bumps the data version here."""
        table = {config.topic_name: config for config in self.topics()}
        if self._table is not None and table != self._table:
            self.data_version = self.data_version.next_version(int(time.time() * 1000))
            self._untold += 1
            self._full_conn.clear()
        self._table = table
        if self._full_due:
            self._full_due = False
            self._untold += 1
            self._full_conn.clear()

    async def _round_one(self, addr: str, force: bool) -> RegisterBrokerResult:
        async with self._lock(addr):
            need = force or self.force_register or self.broker_id != MASTER_ID or not self._is_current(addr)
            if not need:
                need = await self._nameserver_changed(addr)
            if need:
                return await self._register_full(addr)
            return self.results.get(addr, _NO_RESULT)

    async def _nameserver_changed(self, addr: str) -> bool:
        """QUERY_DATA_VERSION (RocketMQ's needRegister): whether ``addr`` holds another data version than ours.
        Any failure, or a nameserver that does not know the request, counts as changed. It also keeps this
        broker alive there (the nameserver refreshes its last-update time)."""
        request = make_request(RequestCode.QUERY_DATA_VERSION, {
            "brokerAddr": self.broker_addr, "brokerId": self.broker_id, "brokerName": self.broker_name,
            "clusterName": self.cluster}, self.data_version.encode())
        self.frames["query"] += 1
        try:
            reply = await self.client.invoke(addr, request, self.timeout_s)
        except Exception as exc:
            log.info("QUERY_DATA_VERSION to %s failed (%s); registering in full", addr, exc)
            return True
        if reply.code != ResponseCode.SUCCESS:
            return True
        if reply.body:
            try:
                if DataVersion.decode(reply.body) != self.data_version:
                    return True
            except ProtocolError:
                return True
        return reply.ext_fields.get("changed", "true").strip().lower() != "false"

    # -- full registration ------------------------------------------------------------------------------------
    async def _register_full(self, addr: str) -> RegisterBrokerResult:
        """The whole table, in one or more bodies of one data version. Marks ``addr`` current only when every
        body went through over one connection."""
        untold = self._untold
        bodies = await self._full_bodies()
        self._full_conn.pop(addr, None)
        result = _NO_RESULT
        conn = None
        for index, (body, compressed) in enumerate(bodies):
            self.frames["full"] += 1
            self.frames["full_bytes"] += len(body)
            reply = await self._register_body(addr, body, compressed=compressed)
            if index == 0 or reply.master_addr:
                result = reply
            now = self.client.connections.get(addr)
            if conn is not None and now is not conn:
                return result  # reconnected between bodies: the next round sends it all again
            conn = now
        # Topics told changed since these bodies were built follow as increments (they wait on this lock).
        if conn is not None and self._untold == untold:
            self._full_conn[addr] = conn
        return result

    async def _full_bodies(self) -> list[tuple[bytes, bool]]:
        """The full table's bodies for the current data version (built once per version, in a thread)."""
        version = self.data_version
        if self._encoded is not None and self._encoded[0] == version:
            return self._encoded[1]
        table = self._table if self._table is not None else {}
        configs = [self._as_registered(table[name]) for name in sorted(table)]
        bodies = await asyncio.to_thread(self._encode_full, configs, version)
        if self.data_version == version:
            self._encoded = (version, bodies)
        return bodies

    def _encode_full(self, configs: list[TopicConfig], version: DataVersion) -> list[tuple[bytes, bool]]:
        if self.compressed:
            packed = [c for c in configs if RegisterBrokerBody.compressible(c)]
            plain = [c for c in configs if not RegisterBrokerBody.compressible(c)]
        else:
            packed, plain = [], configs
        out: list[tuple[bytes, bool]] = []
        for group, compress in ((packed, True), (plain, False)):
            step = self.split_size if self.split_registration else max(len(group), 1)
            for i in range(0, len(group), step):
                out += self._encode_fitting(group[i:i + step], version, compress)
        if not out:  # an empty table is registered too
            out = [(RegisterBrokerBody((), version).encode(self.compressed), self.compressed)]
        return out

    def _encode_fitting(self, configs: list[TopicConfig], version: DataVersion,
                        compress: bool) -> list[tuple[bytes, bool]]:
        """``configs`` in one body, or halved until each body fits ``max_body_bytes`` (RocketMQ #7326: a
        registration larger than the nameserver's frame limit fails)."""
        body = RegisterBrokerBody(tuple(configs), version).encode(compress)
        if len(body) <= self.max_body_bytes or len(configs) <= 1:
            return [(body, compress)]
        half = len(configs) // 2
        return self._encode_fitting(configs[:half], version, compress) + \
            self._encode_fitting(configs[half:], version, compress)

    def _as_registered(self, config: TopicConfig) -> TopicConfig:
        """As RocketMQ: a broker that is not both readable and writable registers its topics' permissions
        masked with its own (``brokerPermission``)."""
        if self.broker_perm & PERM_READ_WRITE == PERM_READ_WRITE:
            return config
        return dataclasses.replace(config, perm=config.perm & self.broker_perm)

    # -- frames -------------------------------------------------------------------------------------------------
    def _lock(self, addr: str) -> asyncio.Lock:
        lock = self._locks.get(addr)
        if lock is None:
            lock = self._locks[addr] = asyncio.Lock()
        return lock

    def _is_current(self, addr: str) -> bool:
        conn = self.client.connections.get(addr)
        return conn is not None and self._full_conn.get(addr) is conn

    async def _register_body(self, addr: str, body: bytes, *, compressed: bool) -> RegisterBrokerResult:
        request = make_request(
            RequestCode.REGISTER_BROKER,
            {
                "brokerAddr": self.broker_addr,
                "brokerId": self.broker_id,
                "brokerName": self.broker_name,
                "clusterName": self.cluster,
                "haServerAddr": self.ha_addr,
                "compressed": "true" if compressed else "false",
                "bodyCrc32": body_crc32(body),
            },
            body,
        )
        reply = await self.client.invoke(addr, request, self.timeout_s)
        if reply.code != ResponseCode.SUCCESS:
            raise RemotingError(reply.code, reply.remark or "")
        return RegisterBrokerResult(reply.ext_fields.get("masterAddr"), reply.ext_fields.get("haServerAddr"))

    async def _register_topic(self, addr: str, config: TopicConfig) -> None:
        """REGISTER_TOPIC_IN_NAMESRV (RocketMQ's registerSingleTopicAll): one topic's queues, as a route body."""
        route = TopicRouteData((QueueData.from_topic_config(self.broker_name, config),))
        self.frames["topic"] += 1
        reply = await self.client.invoke(
            addr, make_request(RequestCode.REGISTER_TOPIC_IN_NAMESRV, {"topic": config.topic_name}, route.encode()),
            self.timeout_s)
        if reply.code != ResponseCode.SUCCESS:
            raise RemotingError(reply.code, reply.remark or "")

    async def _unregister_one(self, addr: str) -> None:
        request = make_request(
            RequestCode.UNREGISTER_BROKER,
            {
                "brokerAddr": self.broker_addr,
                "brokerId": self.broker_id,
                "brokerName": self.broker_name,
                "clusterName": self.cluster,
            },
        )
        self._full_conn.pop(addr, None)
        try:
            reply = await self.client.invoke(addr, request, DEFAULT_UNREGISTER_TIMEOUT_S)
        except Exception as exc:
            log.warning("unregistering %s from nameserver %s failed: %s", self.broker_name, addr, exc)
            return
        if reply.code != ResponseCode.SUCCESS:
            log.warning("nameserver %s refused to unregister %s: %s", addr, self.broker_name, reply.remark)
        self.results.pop(addr, None)
