"""The endpoint test kit: an in-process nameserver + broker + gRPC endpoint, and a client stub generated
from cometmq's own protos. The ``endpoint`` fixture runs every test twice: with the endpoint reaching the broker
in process (``cometmq.net.local``, as ``cometmq serve`` embeds it) and over loopback TCP (as ``cometmq proxy``).

Real sockets on free 127.0.0.1 ports, data in a temporary folder. The stub calls carry the metadata the 5.x
clients send (client id, date-time, and a signature when ``Endpoint.credentials`` is set).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.grpc.auth import authorization_header, date_time_now
from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.server import GrpcProxy
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.grpc.v2 import service_pb2_grpc
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.client import RemotingClient
from cometmq.net.local import local_connector
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import RemotingCommand, make_request

_ids = itertools.count(1)


def new_message_id() -> str:
    """34 hex characters like the 5.x clients' ids (version byte 01 + 16 bytes)."""
    return "01" + os.urandom(16).hex().upper()


@dataclass
class Endpoint:
    namesrv: NamesrvController
    broker: BrokerController
    proxy: GrpcProxy
    channel: Any
    stub: Any
    client_id: str = field(default_factory=lambda: f"test-client-{next(_ids)}")
    credentials: tuple[str, str] | None = None

    @property
    def broker_name(self) -> str:
        return self.broker.config.broker_name

    def metadata(self) -> list[tuple[str, str]]:
        now = date_time_now()
        md = [("x-mq-client-id", self.client_id), ("x-mq-date-time", now), ("x-mq-language", "PYTHON"),
              ("x-mq-protocol", "v2"), ("x-mq-client-version", "test")]
        if self.credentials is not None:
            md.append(("authorization", authorization_header(self.credentials[0], self.credentials[1], now)))
        return md

    async def call(self, method: str, request: Any, timeout: float = 10.0) -> Any:
        return await getattr(self.stub, method)(request, metadata=self.metadata(), timeout=timeout)

    async def stream(self, method: str, request: Any, timeout: float = 10.0) -> list[Any]:
        return [item async for item in getattr(self.stub, method)(request, metadata=self.metadata(), timeout=timeout)]

    async def create_topic(self, topic: str, queues: int = 4, **extra: object) -> None:
        """Create ``topic`` on the broker and wait until the nameserver routes it."""
        async with RemotingClient() as client:
            r = await client.invoke(self.broker.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6, **extra}))
            assert r.code == 0, r.remark
            for _ in range(100):
                r = await client.invoke(f"127.0.0.1:{self.namesrv.port}",
                                        make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
                if r.code == 0 and r.body:
                    return
                await asyncio.sleep(0.05)
        raise AssertionError(f"no route for {topic}")

    async def remoting(self, code: int, ext: dict[str, object], body: bytes = b"") -> RemotingCommand:
        async with RemotingClient() as client:
            return await client.invoke(self.broker.addr, make_request(code, ext, body))

    def queue(self, topic: str, qid: int = 0) -> pb.MessageQueue:
        return pb.MessageQueue(topic=pb.Resource(name=topic), id=qid, broker=pb.Broker(name=self.broker_name))

    async def send(self, topic: str, body: bytes = b"x", *, tag: str | None = None, group: str | None = None,
                   delivery_ms: int | None = None, mtype: int = pb.NORMAL, **user: str) -> spb.SendMessageResponse:
        sp = pb.SystemProperties(message_id=new_message_id(), message_type=mtype, body_encoding=pb.IDENTITY)  # type: ignore[arg-type]
        if tag is not None:
            sp.tag = tag
        if group is not None:
            sp.message_group = group
        if delivery_ms is not None:
            sp.delivery_timestamp.seconds = delivery_ms // 1000
            sp.delivery_timestamp.nanos = delivery_ms % 1000 * 1_000_000
        msg = pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp, user_properties=user)
        response: spb.SendMessageResponse = await self.call("SendMessage", spb.SendMessageRequest(messages=[msg]))
        return response

    async def receive(self, topic: str, group: str, *, batch: int = 32, invisible_ms: int = 10_000,
                      poll_ms: int = 0, expression: str = "*", sql: bool = False) -> tuple[int, list[pb.Message]]:
        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name=group), message_queue=self.queue(topic), batch_size=batch,
            filter_expression=pb.FilterExpression(type=pb.SQL if sql else pb.TAG, expression=expression))
        req.invisible_duration.FromMilliseconds(invisible_ms)
        req.long_polling_timeout.FromMilliseconds(poll_ms)
        items = await self.stream("ReceiveMessage", req, timeout=poll_ms / 1000 + 5)
        statuses = [i.status.code for i in items if i.HasField("status")]
        assert len(statuses) == 1, items
        return statuses[0], [i.message for i in items if i.HasField("message")]

    async def ack(self, topic: str, group: str, *msgs: pb.Message) -> spb.AckMessageResponse:
        response: spb.AckMessageResponse = await self.call("AckMessage", spb.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            entries=[spb.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle) for m in msgs]))
        return response


#: how the endpoint reaches its broker: "local" (in process, as embedded in ``cometmq serve``) or "tcp" (loopback
#: remoting, as ``cometmq proxy`` in front of a cluster)
TRANSPORTS = ("local", "tcp")


async def start_secured(tmp: Path, acl_text: str, user: tuple[str, str], topics: tuple[str, ...]) -> Endpoint:
    """An endpoint whose broker has ACL on with ``acl_text`` (plain_acl.yml), calling as ``user``, with ``topics``
    created (one queue each)."""
    acl = tmp / "plain_acl.yml"
    acl.write_text(acl_text)
    ep = await start_endpoint(tmp, acl_file=str(acl))
    ep.credentials = user
    for topic in topics:
        await ep.create_topic(topic, queues=1)
    return ep


async def start_endpoint(tmp: Path, broker_changes: dict[str, Any] | None = None, *, transport: str = "local",
                         **proxy_changes: Any) -> Endpoint:
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    cfg = BrokerConfig(listen_port=0, broker_name="broker-a", namesrv_addr=f"127.0.0.1:{ns.port}",
                       enable_property_filter=True, **(broker_changes or {}))
    store = cfg.store.replace(store_path=tmp / "broker-a", commitlog_segment_size=8 << 20,
                              consume_queue_units_per_file=10_000, max_hash_slot_num=4096, max_index_num=65536)
    broker = BrokerController(cfg.replace(store=store))
    await broker.start()
    assert transport in TRANSPORTS, transport
    assert broker.server is not None
    local = {broker.addr: local_connector(broker.server, broker.addr)} if transport == "local" else None
    proxy = GrpcProxy(ProxyConfig(namesrv=f"127.0.0.1:{ns.port}", port=0, **proxy_changes), local=local)
    await proxy.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}")
    return Endpoint(ns, broker, proxy, channel, service_pb2_grpc.MessagingServiceStub(channel))  # type: ignore[no-untyped-call]


async def stop_endpoint(ep: Endpoint) -> None:
    await ep.channel.close()
    await ep.proxy.stop()
    await ep.broker.stop()
    await ep.namesrv.stop()


@pytest.fixture(params=TRANSPORTS)
async def endpoint(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Endpoint]:
    ep = await start_endpoint(tmp_path, transport=request.param)
    yield ep
    await stop_endpoint(ep)


@pytest.fixture(params=TRANSPORTS)
async def quick_endpoint(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Endpoint]:
    """``endpoint`` that lets a receive ask for a 1 s invisible time (``min_receive_invisible_ms``, RocketMQ's
    10 s by default): for tests that wait for a message to come back."""
    ep = await start_endpoint(tmp_path, transport=request.param, min_receive_invisible_ms=1000)
    yield ep
    await stop_endpoint(ep)
