"""ClientInstance: what producers and consumers of one process share — connections, routes, heartbeats.

It asks the nameservers for topic routes (and refreshes them), knows each broker's master address,
sends heartbeats naming its producer and consumer groups to every broker, and answers the brokers'
requests (NOTIFY_CONSUMER_IDS_CHANGED makes the consumer of that group rebalance at once).

Routes are polled every ``poll_namesrv_interval`` (30 s), and refreshed at once after a failure that says the
route may name the wrong broker (:func:`route_stale`: a connection failure, a timeout, a "not the master"
answer), so producers and consumers follow a new master within a nameserver round trip. Those refreshes go
through a :class:`RouteRefresher`: at most one per topic every ``route_refresh_min_interval`` (0.5 s), shared by
everyone who asks meanwhile, so a burst of failures costs one nameserver request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol

from cometmq.client.errors import (
    BrokerError,
    ClientConnectionError,
    ClientTimeoutError,
    InvalidArgumentError,
    NoRouteError,
    reading_reply,
)
from cometmq.client.wire import SdkRemotingClient
from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient, split_address
from cometmq.net.connection import RemotingConnection, RequestTimeoutError
from cometmq.net.tls import sdk_client_context
from cometmq.net.tls_settings import TlsError
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.client_bodies import (
    IS_SUB_CHANGE,
    IS_SUPPORT_HEART_BEAT_V2,
    ConsumerData,
    HeartbeatData,
    MessageQueue,
)
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import RemotingCommand, encode_parts, make_request
from cometmq.protocol.route import TopicRouteData, perm_readable, perm_writable

log = logging.getLogger(__name__)

_instance_ids = itertools.count(1)


class ConsumerLike(Protocol):
    group: str

    def consumer_data(self) -> ConsumerData: ...

    def on_ids_changed(self) -> None: ...


def parse_namesrv(namesrv: str | Iterable[str]) -> list[str]:
    items = namesrv.replace(",", ";").split(";") if isinstance(namesrv, str) else list(namesrv)
    addrs = [a.strip() for a in items if a and a.strip()]
    if not addrs:
        raise InvalidArgumentError("no nameserver address given (expected 'host:port;host:port')")
    for a in addrs:
        try:
            split_address(a)
        except ValueError:
            raise InvalidArgumentError(f"nameserver address {a!r} is not host:port") from None
    return addrs


#: answers after which the broker the route names for a request may no longer be the one to ask: a replica
#: refusing a write (SERVICE_NOT_AVAILABLE, "this broker is a replica"; also a broker whose role is not confirmed
#: or whose lease expired), a broker made read-only (NO_PERMISSION), no replica to take a write
_ROUTE_STALE_CODES = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SLAVE_NOT_AVAILABLE,
                                ResponseCode.NO_PERMISSION})


def route_stale(exc: BaseException) -> bool:
    """True for a failure after which the topic's route should be asked for again at once: the broker could not
    be reached or did not answer, no master was known, or it answered that it does not take the request."""
    if isinstance(exc, ClientConnectionError | ClientTimeoutError | NoRouteError):
        return True
    return isinstance(exc, BrokerError) and exc.code in _ROUTE_STALE_CODES


class RouteRefresher:
    """Runs ``lookup(topic)`` after failures, at most once per ``min_interval`` seconds per topic.

    ``refresh`` starts a lookup when none ran for the topic within the interval and waits for it; a caller that
    comes while one runs waits for that one (concurrent refreshes coalesce); a caller that comes after it ended
    but within the interval gets False at once, and one trailing lookup is scheduled for the end of the interval
    (so a route the nameserver changes a moment later is still learnt without waiting for the poll).
    ``clock`` gives seconds (monotonic); tests pass a fake one.
    """

    def __init__(self, lookup: Callable[[str], Awaitable[object]], *, min_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self.min_interval = min_interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[bool]] = {}
        self._trailing: dict[str, asyncio.Task[None]] = {}
        #: lookups started (for tests and stats)
        self.lookups = 0

    async def refresh(self, topic: str) -> bool:
        """True when a lookup ran for this call (started or joined) and succeeded; False when rate-limited or
        the lookup failed (it is logged, never raised)."""
        running = self._running.get(topic)
        if running is None:
            last = self._last.get(topic)
            wait = 0.0 if last is None else last + self.min_interval - self._clock()
            if wait > 0:
                self._schedule_trailing(topic, wait)
                return False
            running = self._start(topic)
        return await asyncio.shield(running)

    def _start(self, topic: str) -> asyncio.Task[bool]:
        self._last[topic] = self._clock()
        self.lookups += 1
        task = asyncio.ensure_future(self._run(topic))
        self._running[topic] = task

        def done(t: asyncio.Task[bool]) -> None:
            if self._running.get(topic) is t:
                del self._running[topic]

        task.add_done_callback(done)
        return task

    async def _run(self, topic: str) -> bool:
        try:
            await self._lookup(topic)
        except Exception as exc:  # the caller goes on with the route it has; the next failure asks again
            log.warning("refreshing the route of %s after a failure failed: %s", topic, exc)
            return False
        return True

    def _schedule_trailing(self, topic: str, wait: float) -> None:
        if topic in self._trailing:
            return

        async def later() -> None:
            try:
                await asyncio.sleep(wait)
            finally:
                self._trailing.pop(topic, None)
            if topic not in self._running:
                await self._start(topic)

        self._trailing[topic] = asyncio.ensure_future(later())

    async def close(self) -> None:
        tasks = [*self._running.values(), *self._trailing.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        self._trailing.clear()


def _no_route(response: RemotingCommand) -> bool:
    """A nameserver's answer that it has no route for the topic."""
    return response.code == ResponseCode.TOPIC_NOT_EXIST or (response.code == ResponseCode.SUCCESS
                                                             and not response.body)


def credentials_of(credentials: Credentials | tuple[str, str] | None, access_key: str | None = None,
                   secret_key: str | None = None) -> Credentials | None:
    """The SDK's ways of giving keys: a Credentials, an ``(access_key, secret_key)`` pair, or both keywords."""
    if credentials is not None and (access_key or secret_key):
        raise InvalidArgumentError("give credentials= or access_key=/secret_key=, not both")
    if isinstance(credentials, Credentials):
        return credentials
    if credentials is not None:
        access_key, secret_key = credentials
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise InvalidArgumentError("credentials need both an access key and a secret key")
    return Credentials(access_key, secret_key)


def request_error(exc: BaseException, addr: str, what: object) -> BaseException:
    """The SDK error a request to ``addr`` that failed with ``exc`` raises (``what``: the request, for the
    message): a timeout is ClientTimeoutError, a connection failure ClientConnectionError; anything else is
    ``exc`` itself. The one rule of ``ClientInstance.invoke`` and the lean paths (``invoke_now``, the producer's
    inline send)."""
    if isinstance(exc, RequestTimeoutError | TimeoutError):
        return ClientTimeoutError(f"no answer from {addr} in time ({what})")
    if isinstance(exc, OSError | ConnectionError):
        return ClientConnectionError(f"cannot talk to {addr} ({what}): {exc}")
    return exc


class ClientInstance:
    def __init__(self, namesrv: str | Iterable[str], *, instance_name: str | None = None, client_ip: str = "127.0.0.1",
                 request_timeout: float = 3.0, poll_namesrv_interval: float = 30.0,
                 heartbeat_interval: float = 30.0, route_refresh_min_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, tls: bool | ssl.SSLContext | None = None,
                 tls_ca_file: str | None = None, tls_insecure: bool | None = None,
                 credentials: Credentials | tuple[str, str] | None = None, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        self.namesrv_addrs = parse_namesrv(namesrv)
        #: ACL (docs/security.md): every request this instance sends is signed with these, as RocketMQ's
        #: AclClientRPCHook signs; None sends requests unsigned
        self.credentials = credentials_of(credentials, access_key, secret_key)
        # TLS on every connection (nameservers and brokers), as RocketMQ's tls.enable: ``tls`` True verifies the
        # server against ``tls_ca_file`` (else the system's CAs) unless ``tls_insecure``; a context is used as
        # is; None reads $COMETMQ_TLS / $COMETMQ_TLS_CA / $COMETMQ_TLS_INSECURE (net/tls.py)
        try:
            self.tls_context = sdk_client_context(tls, ca_file=tls_ca_file, insecure=tls_insecure)
        except TlsError as exc:
            raise InvalidArgumentError(str(exc)) from None
        self.client_ip = client_ip
        self.client_id = f"{client_ip}@{instance_name or os.getpid()}#{next(_instance_ids)}"
        self.request_timeout = request_timeout
        self.poll_namesrv_interval = poll_namesrv_interval
        self.heartbeat_interval = heartbeat_interval
        #: an SdkRemotingClient: the producer's send writes straight to its connections (client/wire.py)
        self.remoting: RemotingClient = SdkRemotingClient(
            {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_ids_changed,
             RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._on_reset_offset,
             RequestCode.GET_CONSUMER_RUNNING_INFO: self._on_running_info,
             RequestCode.CONSUME_MESSAGE_DIRECTLY: self._on_consume_directly},
            ssl=self.tls_context)
        self.routes: dict[str, TopicRouteData] = {}
        #: broker name -> {broker id: address}
        self.brokers: dict[str, dict[int, str]] = {}
        self.producer_groups: set[str] = set()
        self.consumers: dict[str, ConsumerLike] = {}
        self._namesrv_index = random.randrange(len(self.namesrv_addrs))
        self._services: list[Periodic] = []
        self.route_refresher = RouteRefresher(self._refresh_after_failure, min_interval=route_refresh_min_interval,
                                              clock=clock)
        self._background: set[asyncio.Task[Any]] = set()
        #: heartbeat v2: broker address -> (fingerprint, connection) of the last full heartbeat it took
        self._heartbeat_known: dict[str, tuple[int, RemotingConnection | None]] = {}
        #: fingerprint-only heartbeats a broker accepted (for stats and tests)
        self.heartbeats_lean = 0
        self._users = 0
        self.started = False

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the shared background work (once, however many producers and consumers use it)."""
        self._users += 1
        if self.started:
            return
        self.started = True
        self._services = [Periodic("client-routes", self.poll_namesrv_interval, self._refresh_routes, logger=log),
                          Periodic("client-heartbeat", self.heartbeat_interval, self.heartbeat, logger=log)]
        for service in self._services:
            service.start()

    async def close(self) -> None:
        self._users -= 1
        if self._users > 0 or not self.started:
            return
        self.started = False
        for service in self._services:
            await service.stop()
        await self.route_refresher.close()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.remoting.close()

    # -- requests ---------------------------------------------------------------------------------------------
    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None,
                     context: str = "") -> RemotingCommand:
        """Send a request; connection failures and timeouts become SDK errors, response codes do not."""
        try:
            return await self.remoting.invoke(addr, self.sign(cmd),
                                              self.request_timeout if timeout is None else timeout)
        except (OSError, ConnectionError) as exc:  # (timeouts are OSErrors)
            raise request_error(exc, addr, context or cmd.code) from None

    async def invoke_now(self, addr: str, cmd: RemotingCommand, timeout: float, context: str = "") -> RemotingCommand:
        """:meth:`invoke` written at once on an open :class:`SdkConnection` (``start_request``: no coroutines
        around the wait, no timer per request), with the same errors; :meth:`invoke` itself when that does not
        apply (signed requests, not connected yet)."""
        remoting = self.remoting
        conn = remoting.open_connection(addr) if self.credentials is None and type(remoting) is SdkRemotingClient \
            else None
        if conn is None:
            return await self.invoke(addr, cmd, timeout, context)
        head, body = encode_parts(cmd)
        opaque = cmd.opaque
        try:
            future = conn.start_request(head, body, opaque, cmd.code, timeout)
        except (OSError, ConnectionError) as exc:
            raise request_error(exc, addr, context or cmd.code) from None
        try:
            return await future
        except asyncio.CancelledError:
            conn.forget(opaque, future)
            raise
        except (OSError, ConnectionError) as exc:
            raise request_error(exc, addr, context or cmd.code) from None

    async def invoke_ok(self, addr: str, cmd: RemotingCommand, timeout: float | None = None, context: str = "",
                        ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        response = await self.invoke(addr, cmd, timeout, context)
        if response.code not in set(ok):
            raise BrokerError(response.code, response.remark or "", addr=addr, context=context)
        return response

    def sign(self, cmd: RemotingCommand) -> RemotingCommand:
        """``cmd`` signed with this instance's credentials (itself when it has none)."""
        return cmd if self.credentials is None else sign_request(cmd, self.credentials)

    def send_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        cmd = self.sign(cmd)
        conn = self.remoting.connections.get(addr)
        if conn is not None and not conn.closed:
            conn.send_oneway(cmd)
        else:
            task = asyncio.ensure_future(self._oneway_when_connected(addr, cmd))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _oneway_when_connected(self, addr: str, cmd: RemotingCommand) -> None:
        await self.remoting.invoke_oneway(addr, cmd, self.request_timeout)

    async def namesrv_invoke(self, cmd: RemotingCommand, context: str) -> RemotingCommand:
        """Ask the nameservers in turn until one answers."""
        last: Exception | None = None
        for _ in range(len(self.namesrv_addrs)):
            addr = self.namesrv_addrs[self._namesrv_index % len(self.namesrv_addrs)]
            try:
                return await self.invoke(addr, cmd, context=context)
            except (ClientConnectionError, ClientTimeoutError) as exc:
                last = exc
                self._namesrv_index += 1
        assert last is not None
        raise last

    # -- routes ---------------------------------------------------------------------------------------------
    async def route(self, topic: str, *, refresh: bool = False, keep_known: bool = False) -> TopicRouteData | None:
        """The topic's route, from the cache unless ``refresh``; None when no nameserver knows it. ``keep_known``
        (the periodic poll): a cached route stays when no nameserver knows the topic, as in RocketMQ's client — a
        nameserver that restarted knows no topic until the brokers register again, up to 30 s later, and the
        brokers are up meanwhile (a topic deleted stays routed too, as there; the broker refuses its sends)."""
        if not refresh and topic in self.routes:
            return self.routes[topic]
        response = await self._route_reply(topic)
        if _no_route(response):
            if keep_known and topic in self.routes:
                log.debug("no nameserver knows topic %s now; keeping its route until a broker says otherwise", topic)
                return self.routes[topic]
            self.routes.pop(topic, None)
            return None
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark or "", context=f"route of {topic}")
        with reading_reply("bad route body", context=topic):
            route = TopicRouteData.decode(response.body)
        self.routes[topic] = route
        for bd in route.broker_datas:
            self.brokers[bd.broker_name] = dict(bd.broker_addrs)
        return route

    async def _route_reply(self, topic: str) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC, as :meth:`namesrv_invoke` (from the nameserver in use, the next one after a
        connection failure), and also of the next nameservers while those that answer do not know the topic: a
        nameserver that restarted knows no topic until the brokers registered with it again, so its "no route"
        is not the last word while another has one. The first answer with a route, else the first "no route";
        the last failure when no nameserver answered."""
        cmd = make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        addrs = self.namesrv_addrs
        start = self._namesrv_index
        unknown: RemotingCommand | None = None
        last: Exception | None = None
        for step in range(len(addrs)):
            addr = addrs[(start + step) % len(addrs)]
            try:
                response = await self.invoke(addr, cmd, context=f"route of {topic}")
            except (ClientConnectionError, ClientTimeoutError) as exc:
                last = exc
                if unknown is None:  # none answered yet: the next one becomes the nameserver in use
                    self._namesrv_index = start + step + 1
                continue
            if not _no_route(response):
                return response
            if unknown is None:
                unknown = response
        if unknown is not None:
            return unknown
        assert last is not None
        raise last

    def master_addr(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(0)

    def broker_addr(self, broker_name: str, prefer_id: int = 0) -> str | None:
        addrs = self.brokers.get(broker_name, {})
        return addrs.get(prefer_id) or addrs.get(0) or next(iter(addrs.values()), None)

    @staticmethod
    def queues_of(route: TopicRouteData, topic: str, *, writable: bool, order_conf: bool = True
                  ) -> list[MessageQueue]:
        """The topic's queues to publish to (``writable``) or to read. A route carrying an order conf (``updateTopic
        -o true``: ``brokerName:queueNums;...``) is published to as the conf lists it, whatever the queues'
        permissions and whether the broker is up, as RocketMQ's topicRouteData2TopicPublishInfo: a key whose
        broker is down then fails instead of moving to another broker's queue, out of order. ``order_conf=False``:
        from the queues alone (RocketMQ's proxy does so)."""
        if writable and order_conf and route.order_topic_conf:
            ordered = _order_conf_queues(route.order_topic_conf, topic)
            if ordered:
                return ordered
        masters = {bd.broker_name for bd in route.broker_datas if bd.master_addr is not None}
        out: list[MessageQueue] = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if writable and (not perm_writable(qd.perm) or qd.broker_name not in masters):
                continue
            if not writable and not perm_readable(qd.perm):
                continue
            n = qd.write_queue_nums if writable else qd.read_queue_nums
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(n))
        return out

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        route = await self.route(topic)
        return self.queues_of(route, topic, writable=True) if route else []

    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        route = await self.route(topic, refresh=refresh)
        return self.queues_of(route, topic, writable=False) if route else []

    async def refresh_route(self, topic: str) -> bool:
        """Ask for ``topic``'s route again now, after a failure (rate-limited and shared: :class:`RouteRefresher`).
        Never raises; True when a lookup ran for this call."""
        return await self.route_refresher.refresh(topic)

    def refresh_route_soon(self, topic: str) -> None:
        """:meth:`refresh_route` in the background (for callers that raise the failure right away)."""
        self._spawn(self.refresh_route(topic))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refresh_after_failure(self, topic: str) -> None:
        known = set(self.all_broker_addrs())
        await self.route(topic, refresh=True)
        new = [a for a in self.all_broker_addrs() if a not in known]
        if new and (self.producer_groups or self.consumers):
            # A new master (or replica) hears of this client now rather than at the next 30 s heartbeat: a
            # consumer group's member list there must include it before a rebalance.
            self._spawn(self.heartbeat(new))

    async def _refresh_routes(self) -> None:
        for topic in list(self.routes):
            try:
                await self.route(topic, refresh=True, keep_known=True)
            except Exception as exc:  # a nameserver hiccup must not stop the other topics
                log.warning("refreshing the route of %s failed: %s", topic, exc)
        self.clean_offline_brokers()

    def clean_offline_brokers(self) -> None:
        """Forget the broker addresses no route names any more (RocketMQ's MQClientInstance.cleanOfflineBroker, run
        after each route poll): heartbeats and unregisters go to every known address, and one of a broker taken out
        of service would be tried every 30 s for good. A route that could not be refreshed is kept, and so are its
        brokers."""
        routed = {addr for route in self.routes.values() for bd in route.broker_datas
                  for addr in bd.broker_addrs.values()}
        for name, addrs in list(self.brokers.items()):
            left = {i: a for i, a in addrs.items() if a in routed}
            if len(left) == len(addrs):
                continue
            log.info("broker %s: %s no longer in any route; forgotten", name,
                     ", ".join(a for a in addrs.values() if a not in routed))
            if left:
                self.brokers[name] = left
            else:
                del self.brokers[name]
        for addr in [a for a in self._heartbeat_known if a not in routed]:
            del self._heartbeat_known[addr]

    # -- heartbeats -----------------------------------------------------------------------------------------
    def register_producer(self, group: str) -> None:
        self.producer_groups.add(group)

    def register_consumer(self, consumer: ConsumerLike) -> None:
        if consumer.group in self.consumers:
            raise InvalidArgumentError(f"consumer group {consumer.group} already has a consumer in this instance")
        self.consumers[consumer.group] = consumer

    async def unregister(self, *, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        if producer_group:
            self.producer_groups.discard(producer_group)
        if consumer_group:
            self.consumers.pop(consumer_group, None)
        cmd_fields = {"clientID": self.client_id, "producerGroup": producer_group or "",
                      "consumerGroup": consumer_group or ""}
        await asyncio.gather(*(self._quiet(addr, make_request(RequestCode.UNREGISTER_CLIENT, cmd_fields))
                               for addr in self.all_broker_addrs()))

    def all_broker_addrs(self) -> list[str]:
        return sorted({a for addrs in self.brokers.values() for a in addrs.values()})

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(self.client_id, tuple(sorted(self.producer_groups)),
                             tuple(c.consumer_data() for c in self.consumers.values()))

    async def heartbeat(self, addrs: Iterable[str] | None = None) -> None:
        """Send one heartbeat to every known broker (or to ``addrs``).

        Heartbeat v2 (RocketMQ 5): the heartbeat carries a fingerprint of what it says. A broker that answered
        IS_SUPPORT_HEART_BEAT_V2 and took the full heartbeat with this fingerprint, on the connection in use, is
        sent only the fingerprint (no subscriptions); when it answers IS_SUB_CHANGE (it does not know the group
        or its subscriptions any more, e.g. after a restart) the full heartbeat follows at once."""
        if not self.producer_groups and not self.consumers:
            return
        data = self.heartbeat_data()
        fingerprint = data.compute_fingerprint()
        full = replace(data, fingerprint=fingerprint).encode()
        lean: bytes | None = None
        sends = []
        for addr in (self.all_broker_addrs() if addrs is None else addrs):
            if self._heartbeat_known.get(addr) == (fingerprint, self.remoting.connections.get(addr)):
                if lean is None:
                    lean = data.without_subscriptions(fingerprint).encode()
                sends.append(self._heartbeat_to(addr, fingerprint, full, lean))
            else:
                sends.append(self._heartbeat_to(addr, fingerprint, full, None))
        await asyncio.gather(*sends)

    async def _heartbeat_to(self, addr: str, fingerprint: int, full: bytes, lean: bytes | None) -> None:
        if lean is not None:
            response = await self._heartbeat_once(addr, lean)
            if response is not None and response.ext_fields.get(IS_SUB_CHANGE) != "true":
                self.heartbeats_lean += 1
                return
            self._heartbeat_known.pop(addr, None)
            if response is None:
                return
        response = await self._heartbeat_once(addr, full)
        ext = response.ext_fields if response is not None else {}
        if ext.get(IS_SUPPORT_HEART_BEAT_V2) == "true" and ext.get(IS_SUB_CHANGE) != "true":
            self._heartbeat_known[addr] = (fingerprint, self.remoting.connections.get(addr))
        else:
            self._heartbeat_known.pop(addr, None)

    async def _heartbeat_once(self, addr: str, body: bytes) -> RemotingCommand | None:
        try:
            return await self.invoke_ok(addr, make_request(RequestCode.HEART_BEAT, {}, body),
                                        context=f"request {RequestCode.HEART_BEAT}")
        except Exception as exc:
            log.warning("request %d to %s failed: %s", RequestCode.HEART_BEAT, addr, exc)
            return None

    async def _quiet(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            await self.invoke_ok(addr, cmd, context=f"request {cmd.code}")
        except Exception as exc:
            log.warning("request %d to %s failed: %s", cmd.code, addr, exc)

    async def consumer_ids(self, group: str, broker_name: str) -> list[str]:
        from cometmq.protocol.client_bodies import decode_consumer_list

        addr = self.broker_addr(broker_name)
        if addr is None:
            return []
        response = await self.invoke(addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                        {"consumerGroup": group}), context=f"consumers of {group}")
        if response.code != ResponseCode.SUCCESS:
            return []
        try:
            return decode_consumer_list(response.body)
        except ProtocolError:
            return []

    async def _on_ids_changed(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        consumer = self.consumers.get(cmd.ext_fields.get("consumerGroup", ""))
        if consumer is not None:
            consumer.on_ids_changed()
        return None

    async def _on_running_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO through a broker (mqadmin consumerProgress -s, consumerStatus)."""
        from cometmq.client.consumer_requests import answer_running_info

        return await answer_running_info(self.consumers, ";".join(self.namesrv_addrs), cmd)

    async def _on_consume_directly(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY through a broker (mqadmin queryMsgById -g -d)."""
        from cometmq.client.consumer_requests import answer_consume_directly

        return await answer_consume_directly(self.consumers, cmd)

    async def _on_reset_offset(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (mqadmin resetOffsetByTime through a broker): the broker reset and
        committed the group's offsets; a consumer of the group that can (``reset_offsets``) reads on from them."""
        from cometmq.protocol.admin_bodies import ResetOffsetBody

        group = cmd.ext_fields.get("group", "")
        reset = getattr(self.consumers.get(group), "reset_offsets", None)
        if reset is None:
            return None
        try:
            offsets = ResetOffsetBody.decode(cmd.body or b"").offset_table
        except ProtocolError as exc:
            log.warning("ignoring an offset reset of %s: %s", group, exc)
            return None
        log.info("offsets of %s reset by %s: %s", group, conn.remote_address,
                 {f"{q.topic}/{q.broker_name}/{q.queue_id}": o for q, o in offsets.items()})
        self._spawn(reset(offsets))
        return None


def _order_conf_queues(conf: str, topic: str) -> list[MessageQueue]:
    """The queues an order conf (``brokerName:queueNums;...``) lists, in its order; entries that are not
    ``name:number`` are left out (logged)."""
    out: list[MessageQueue] = []
    for item in conf.split(";"):
        name, _, nums = item.partition(":")
        if not item:
            continue
        if not name or not (nums.isascii() and nums.isdigit()) or int(nums) > 1024:
            log.warning("order conf of topic %s: entry %r is not brokerName:queueNums; left out", topic, item[:100])
            continue
        out.extend(MessageQueue(topic, name, i) for i in range(int(nums)))
    return out
