"""The endpoint's remoting side: routes from the nameservers, requests to brokers, and the proxy's own
registration as a producer so brokers can ask it to check transactions (RocketMQ's cluster-mode proxy).

One :class:`Backend` per endpoint. It reuses the SDK's :class:`ClientInstance` (nameserver failover, route
cache and refresh, heartbeats) with a remoting client whose dispatcher also serves the brokers'
CHECK_TRANSACTION_STATE requests. Brokers that live in the same process (``cometmq serve``, ``cometmq broker``)
can be given as ``local`` connectors: the same remoting requests then go through an in-process connection
(``cometmq.net.local``) instead of loopback TCP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from ssl import SSLContext
from typing import Any

from cometmq.client.errors import BrokerError, ClientConnectionError, ClientTimeoutError
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.grpc.status import GrpcError
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.net.client import LocalConnector, RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.route import TopicRouteData

log = logging.getLogger(__name__)

#: the producer group the proxy sends transactional messages under and registers with every broker
PROXY_PRODUCER_GROUP = "CID_COMETMQ_GRPC_PROXY"

#: how long a subscription group's config is kept, and how many groups' configs at most (the group is the
#: client's to name)
GROUP_CONFIG_TTL_S = 10.0
GROUP_CONFIG_CACHE_MAX = 1024

CheckHandler = Callable[[str, RemotingCommand], Awaitable[None]]


def any_master(route: TopicRouteData) -> bool:
    """Whether some broker of the route has its master in it."""
    return any(bd.master_addr is not None for bd in route.broker_datas)


class Backend:
    def __init__(self, namesrv: str, *, request_timeout: float = 3.0, route_refresh_s: float = 10.0,
                 heartbeat_s: float = 30.0, local: Mapping[str, LocalConnector] | None = None,
                 ssl: SSLContext | None = None, credentials: tuple[str, str] | None = None) -> None:
        # ``credentials``: what the endpoint signs its remoting requests with (brokers with aclEnable=true)
        self.instance = ClientInstance(namesrv, instance_name=f"cometmq-grpc-proxy-{id(self):x}",
                                       request_timeout=request_timeout, poll_namesrv_interval=route_refresh_s,
                                       heartbeat_interval=heartbeat_s, tls=ssl or False, credentials=credentials)
        # ``local``: brokers in this process (the embedded endpoint's own) are reached without TCP
        self.instance.remoting = RemotingClient({RequestCode.CHECK_TRANSACTION_STATE: self._on_check}, local=local,
                                                ssl=ssl)
        self.instance.register_producer(PROXY_PRODUCER_GROUP)
        self.request_timeout = request_timeout
        self.check_handler: CheckHandler | None = None
        self._heartbeated: set[str] = set()
        self._group_configs: dict[str, tuple[float, dict[str, object]]] = {}
        self._writable: dict[str, tuple[TopicRouteData, list[MessageQueue]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.instance.start()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.instance.close()

    # -- routes -----------------------------------------------------------------------------------------------
    async def route(self, topic: str) -> TopicRouteData:
        cached = self.instance.routes.get(topic)
        if cached is not None:  # the hot path: refreshed in the background every route_refresh_s
            return cached
        try:
            route = await self.instance.route(topic)
        except (ClientConnectionError, ClientTimeoutError) as exc:
            raise GrpcError(pb.Code.PROXY_TIMEOUT, f"no nameserver answered for {topic}: {exc}") from None
        except BrokerError as exc:
            raise GrpcError(pb.Code.INTERNAL_SERVER_ERROR, f"route of {topic}: {exc}") from None
        if route is None:
            raise GrpcError(pb.Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        self._heartbeat_new_brokers()
        return route

    async def routed(self, topic: str, has_master: Callable[[TopicRouteData], bool]) -> TopicRouteData:
        """The topic's route, asked for again now (rate-limited) when the cached one fails ``has_master``: its
        master is gone (a failover under way?) and the nameserver may already name the new one."""
        route = await self.route(topic)
        if not has_master(route) and await self.instance.refresh_route(topic):
            route = await self.route(topic)
        return route

    def writable_queues(self, route: TopicRouteData, topic: str) -> list[MessageQueue]:
        hit = self._writable.get(topic)
        if hit is not None and hit[0] is route:
            return hit[1]
        # (as RocketMQ's proxy: its MessageQueueView is made from the queue data, not from an order conf)
        queues = ClientInstance.queues_of(route, topic, writable=True, order_conf=False)
        self._writable[topic] = (route, queues)
        return queues

    async def broker_addr(self, topic: str, broker_name: str) -> str:
        """The master address of ``broker_name``. When no master is known (a broker not seen yet, or one whose
        master is gone) the topic's route is asked for now (rate-limited) rather than at the next poll."""
        addr = self.instance.master_addr(broker_name)
        if addr is None:
            if topic in self.instance.routes:
                await self.instance.refresh_route(topic)
            else:
                await self.route(topic)
            addr = self.instance.master_addr(broker_name)
        if addr is None:
            raise GrpcError(pb.Code.NOT_FOUND, f"broker {broker_name} has no master in the route of {topic}")
        return addr

    async def is_broker(self, addr: str, topic: str) -> bool:
        """Whether ``addr`` is one of the cluster's brokers as the routes seen name them (``topic``'s route asked
        for again first when it is not): where the endpoint may send what an id written by a client names."""
        if addr in self.instance.all_broker_addrs():
            return True
        if topic:
            try:
                if topic in self.instance.routes:
                    await self.instance.refresh_route(topic)
                else:
                    await self.route(topic)
            except GrpcError:
                return False
        return addr in self.instance.all_broker_addrs()

    # -- requests ---------------------------------------------------------------------------------------------
    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None, *,
                     topic: str | None = None) -> RemotingCommand:
        """A request to a broker. With ``topic`` (the request goes to that topic's master): a failure that says
        the route may be stale (the broker cannot be reached or does not answer, or answers that it does not take
        the request: ``route_stale``) has the topic's route asked for again in the background, so the next request
        goes to a newly elected master within a nameserver round trip, not at the next route poll."""
        try:
            response = await self.instance.invoke(addr, cmd, timeout)
        except ClientTimeoutError as exc:
            self._route_failed(topic, exc)
            raise GrpcError(pb.Code.PROXY_TIMEOUT, str(exc)) from None
        except ClientConnectionError as exc:
            self._route_failed(topic, exc)
            raise GrpcError(pb.Code.INTERNAL_SERVER_ERROR, str(exc)) from None
        if response.code != 0 and topic is not None:
            self._route_failed(topic, BrokerError(response.code, response.remark or "", addr=addr))
        return response

    def _route_failed(self, topic: str | None, exc: Exception) -> None:
        if topic is not None and route_stale(exc):
            self.instance.refresh_route_soon(topic)

    async def group_config(self, topic: str, group: str) -> dict[str, object]:
        """The subscription group's config on a broker of ``topic`` (cached for GROUP_CONFIG_TTL_S; {} when
        unknown)."""
        hit = self._group_configs.get(group)
        now = time.monotonic()
        if hit is not None and now - hit[0] < GROUP_CONFIG_TTL_S:
            return hit[1]
        config: dict[str, object] = {}
        try:
            route = await self.route(topic)
            for bd in route.broker_datas:
                if bd.master_addr is None:
                    continue
                r = await self.invoke(bd.master_addr, make_request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
                if r.code == 0 and r.body:
                    table = json.loads(r.body).get("subscriptionGroupTable", {})
                    found = table.get(group)
                    if isinstance(found, dict):
                        config = found
                        break
        except (GrpcError, ValueError) as exc:
            log.debug("group config of %s: %s", group, exc)
        cache = self._group_configs
        cache.pop(group, None)  # re-inserted last: the dict stays in the order the entries were made
        if len(cache) >= GROUP_CONFIG_CACHE_MAX:
            for name in [name for name, (at, _) in cache.items() if now - at >= GROUP_CONFIG_TTL_S]:
                del cache[name]
            while len(cache) >= GROUP_CONFIG_CACHE_MAX:
                del cache[next(iter(cache))]  # the oldest
        cache[group] = (now, config)
        return config

    # -- registration as a producer -----------------------------------------------------------------------------
    def _heartbeat_new_brokers(self) -> None:
        """Register at once with a broker seen for the first time (the periodic heartbeat is 30 s away), so
        its transaction checks can reach this proxy."""
        new = set(self.instance.all_broker_addrs()) - self._heartbeated
        if not new:
            return
        self._heartbeated |= new
        self.spawn(self.instance.heartbeat())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, kept until it ends or the endpoint closes (RuntimeError: no running
        loop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def addr_of(self, conn: RemotingConnection) -> str | None:
        for addr, c in self.instance.remoting.connections.items():
            if c is conn:
                return addr
        return None

    async def _on_check(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        addr = self.addr_of(conn)
        if addr is None or self.check_handler is None:
            log.warning("transaction check from an unknown connection or with no handler; ignored")
            return None
        try:
            await self.check_handler(addr, cmd)
        except Exception:
            log.exception("handling a transaction check from %s failed", addr)
        return None
