"""The endpoint follows a broker group's new master at once, not at its next route poll (issue [12]).

The endpoint's routes are polled every ``route_refresh_s`` (10 s); a failover must not cost a 5.x client up to
that long. Here the poll is an hour away: the master of broker-a is stopped (the nameserver then routes broker-a
to its replica only) and another broker registers as broker-a's master. A send that fails on the gone master
has the endpoint ask for the route again, and while that route names no master every send asks again
(rate-limited), so sends are acknowledged by the new master within a second of its registration.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request
from cometmq.protocol.route import DataVersion, RegisterBrokerBody, TopicConfig, body_crc32
from tests.grpc.kit import start_endpoint

TOPIC = "FailoverRouteT"


async def _start_broker(data: Path, namesrv: str) -> BrokerController:
    cfg = BrokerConfig(listen_port=0, broker_name="broker-a", namesrv_addr=namesrv)
    store = cfg.store.replace(store_path=data, commitlog_segment_size=8 << 20, consume_queue_units_per_file=10_000,
                              max_hash_slot_num=4096, max_index_num=65536)
    broker = BrokerController(cfg.replace(store=store))
    await broker.start()
    return broker


async def _master_in_route(client: RemotingClient, namesrv: str) -> str | None:
    r = await client.invoke(namesrv, make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}))
    if r.code != 0 or not r.body:
        return None
    route = json.loads(r.body)
    addrs: dict[str, str] = route["brokerDatas"][0]["brokerAddrs"] if route["brokerDatas"] else {}
    return addrs.get("0")


async def test_sends_reach_a_new_master_without_waiting_for_the_route_poll(tmp_path: Path) -> None:
    ep = await start_endpoint(tmp_path / "old", transport="tcp", route_refresh_s=3600)
    namesrv = f"127.0.0.1:{ep.namesrv.port}"
    new: BrokerController | None = None
    try:
        async with RemotingClient() as client:
            await ep.create_topic(TOPIC)
            # a replica of broker-a, registered only (no request ever reaches it): the route keeps broker-a
            body = RegisterBrokerBody((TopicConfig(TOPIC, 4, 4),), DataVersion(1, 1)).encode(False)
            r = await client.invoke(namesrv, make_request(RequestCode.REGISTER_BROKER, {
                "brokerName": "broker-a", "brokerAddr": "127.0.0.3:10911", "clusterName": "DefaultCluster",
                "haServerAddr": "127.0.0.3:10912", "brokerId": 1, "compressed": "false",
                "bodyCrc32": body_crc32(body)}, body))
            assert r.code == 0, r.remark
            assert (await ep.send(TOPIC, b"before")).status.code == pb.OK

            await ep.broker.stop()
            assert await _master_in_route(client, namesrv) is None
            gone = await ep.send(TOPIC, b"to the gone master")
            assert gone.status.code != pb.OK

            new = await _start_broker(tmp_path / "new", namesrv)
            r = await client.invoke(new.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}))
            assert r.code == 0, r.remark
            for _ in range(100):
                if await _master_in_route(client, namesrv) == new.addr:
                    break
                await asyncio.sleep(0.05)
            assert await _master_in_route(client, namesrv) == new.addr
            registered = time.monotonic()
            codes = []
            while time.monotonic() - registered < 5:
                sent = await ep.send(TOPIC, b"after")
                codes.append(sent.status.code)
                if sent.status.code == pb.OK:
                    break
                await asyncio.sleep(0.05)
            assert codes[-1] == pb.OK, [pb.Code.Name(c) for c in codes]
            assert time.monotonic() - registered < 2, [pb.Code.Name(c) for c in codes]
            stats = [await client.invoke(new.addr, make_request(RequestCode.GET_MAX_OFFSET, {
                "topic": TOPIC, "queueId": q})) for q in range(4)]
            assert sum(int(s.ext_fields["offset"]) for s in stats) == 1  # the new master has it
    finally:
        await ep.channel.close()
        await ep.proxy.stop()
        if new is not None:
            await new.stop()
        await ep.namesrv.stop()
