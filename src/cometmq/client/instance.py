"""ClientInstance: what producers and consumers of one process share — connections, routes, heartbeats.

It asks the nameservers for topic routes (and refreshes them), knows each broker's master address,
sends heartbeats naming its producer and consumer groups to every broker, and answers the brokers'
requests (NOTIFY_CONSUMER_IDS_CHANGED makes the consumer of that group rebalance at once).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from collections.abc import Iterable
from typing import Protocol

from cometmq.client.errors import (
    BrokerError,
    ClientConnectionError,
    ClientTimeoutError,
    InvalidArgumentError,
    reading_reply,
)
from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient, split_address
from cometmq.net.connection import RemotingConnection, RequestTimeoutError
from cometmq.protocol.client_bodies import ConsumerData, HeartbeatData, MessageQueue
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import RemotingCommand, make_request
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


class ClientInstance:
    def __init__(self, namesrv: str | Iterable[str], *, instance_name: str | None = None, client_ip: str = "127.0.0.1",
                 request_timeout: float = 3.0, poll_namesrv_interval: float = 30.0,
                 heartbeat_interval: float = 30.0) -> None:
        self.namesrv_addrs = parse_namesrv(namesrv)
        self.client_ip = client_ip
        self.client_id = f"{client_ip}@{instance_name or os.getpid()}#{next(_instance_ids)}"
        self.request_timeout = request_timeout
        self.poll_namesrv_interval = poll_namesrv_interval
        self.heartbeat_interval = heartbeat_interval
        self.remoting = RemotingClient({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_ids_changed})
        self.routes: dict[str, TopicRouteData] = {}
        #: broker name -> {broker id: address}
        self.brokers: dict[str, dict[int, str]] = {}
        self.producer_groups: set[str] = set()
        self.consumers: dict[str, ConsumerLike] = {}
        self._namesrv_index = random.randrange(len(self.namesrv_addrs))
        self._services: list[Periodic] = []
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
        await self.remoting.close()

    # -- requests ---------------------------------------------------------------------------------------------
    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None,
                     context: str = "") -> RemotingCommand:
        """Send a request; connection failures and timeouts become SDK errors, response codes do not."""
        try:
            return await self.remoting.invoke(addr, cmd, self.request_timeout if timeout is None else timeout)
        except (RequestTimeoutError, TimeoutError):
            raise ClientTimeoutError(f"no answer from {addr} in time ({context or cmd.code})") from None
        except (OSError, ConnectionError) as exc:
            raise ClientConnectionError(f"cannot talk to {addr} ({context or cmd.code}): {exc}") from None

    async def invoke_ok(self, addr: str, cmd: RemotingCommand, timeout: float | None = None, context: str = "",
                        ok: Iterable[int] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        response = await self.invoke(addr, cmd, timeout, context)
        if response.code not in set(ok):
            raise BrokerError(response.code, response.remark or "", addr=addr, context=context)
        return response

    def send_oneway(self, addr: str, cmd: RemotingCommand) -> None:
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
    async def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        """The topic's route, from the cache unless ``refresh``; None when no nameserver knows it."""
        if not refresh and topic in self.routes:
            return self.routes[topic]
        response = await self.namesrv_invoke(make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
                                             f"route of {topic}")
        if response.code == ResponseCode.TOPIC_NOT_EXIST or (response.code == 0 and not response.body):
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

    def master_addr(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(0)

    def broker_addr(self, broker_name: str, prefer_id: int = 0) -> str | None:
        addrs = self.brokers.get(broker_name, {})
        return addrs.get(prefer_id) or addrs.get(0) or next(iter(addrs.values()), None)

    @staticmethod
    def queues_of(route: TopicRouteData, topic: str, *, writable: bool) -> list[MessageQueue]:
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

    async def _refresh_routes(self) -> None:
        for topic in list(self.routes):
            try:
                await self.route(topic, refresh=True)
            except Exception as exc:  # a nameserver hiccup must not stop the other topics
                log.warning("refreshing the route of %s failed: %s", topic, exc)

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

    async def heartbeat(self) -> None:
        """Send one heartbeat to every known broker."""
        if not self.producer_groups and not self.consumers:
            return
        body = self.heartbeat_data().encode()
        await asyncio.gather(*(self._quiet(addr, make_request(RequestCode.HEART_BEAT, {}, body))
                               for addr in self.all_broker_addrs()))

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
