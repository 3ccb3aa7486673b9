"""A partition of the HA link, as processes, through the fault proxy (tests/kit/faultproxy.py).

Master b0 and replica b1 with allAck and minInSyncReplicas 2; b1 reaches b0's HA port through a FaultProxy (in
this process). The link is blackholed (sockets stay open, bytes vanish):

- sends stop being acknowledged: stored but answered FLUSH_SLAVE_TIMEOUT while b1 is still in the set, refused
  with the in-sync error once it left (haMaxTimeSlaveNotCatchup 3 s); never SEND_OK;
- a reader of the master never gets a message above the confirm offset (while b1 is in the set, the unacked
  messages stay invisible);
- after healing, b1 reconnects, catches up and rejoins the set, sends are acknowledged again, and the two logs
  are byte-identical.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import encode_record
from tests.broker.conftest import send_request
from tests.ha.cluster import Broker, Cluster
from tests.kit import eventually
from tests.kit.faultproxy import Direction, FaultProxy

TOPIC = "HAPartition"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, {"minInSyncReplicas": "2", "slaveTimeout": "700"})
    try:
        yield c
    finally:
        await c.close()


async def send(cluster: Cluster, b: Broker, body: str) -> tuple[int, str]:
    cmd = send_request(TOPIC, body.encode())
    reply = await cluster.request(b.addr, cmd.code, cmd.ext_fields, body.encode())
    return reply.code, reply.remark or ""


async def visible_end(cluster: Cluster, b: Broker) -> int:
    """Where the last message a reader of ``b`` gets ends in the commit log (0: none)."""
    pulled = await cluster.pull_queue(b.addr, TOPIC, 0)
    return max((r.physical_offset + len(encode_record(r)) for r in pulled.records), default=0)


async def linked_through_proxy(cluster: Cluster, proxy: FaultProxy, b0: Broker, b1: Broker) -> None:
    await cluster.create_topic(b0, TOPIC, 1)
    await b1.start()
    reply = await cluster.request(b1.addr, RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                  {"masterEpoch": "1", "masterAddress": b0.addr, "masterHaAddress": proxy.addr,
                                   "brokerId": "1"})
    assert reply.code == 0, reply.remark
    await cluster.wait_sync_set(b0, {0, 1})


async def test_a_blackholed_link_stops_acks_and_heals(cluster: Cluster) -> None:
    b0, b1 = await cluster.start(1) + [cluster.add_broker(1)]
    async with FaultProxy(("127.0.0.1", b0.ha_port)) as proxy:
        await linked_through_proxy(cluster, proxy, b0, b1)
        for i in range(20):
            assert await send(cluster, b0, f"before-{i}") == (ResponseCode.SUCCESS, "")

        proxy.blackhole(Direction.BOTH)
        t_cut = time.monotonic()
        outcomes: list[tuple[float, int, str]] = []
        peeks: list[tuple[int, int, list[int]]] = []  # visible end, confirm offset, set

        async def peek() -> list[int]:
            end = await visible_end(cluster, b0)
            status = await cluster.status(b0)
            members: list[int] = status["syncStateSet"]
            peeks.append((end, int(status["confirmOffset"]), members))
            return members

        async def send_and_peek(body: str) -> None:
            code, remark = await send(cluster, b0, body)
            outcomes.append((time.monotonic() - t_cut, code, remark))
            await peek()

        # b1 still in the set (3 s): stored, not acknowledged. (No send is in flight when the set shrinks: see
        # test_a_send_waiting_when_the_set_shrinks_below_the_minimum_is_not_acknowledged.)
        for i in range(2):
            await send_and_peek(f"unacked-{i}")

        async def left() -> bool:
            return await peek() == [0]

        await eventually(left, 10, what="b1 leaving the set", step=0.1)
        for i in range(5):
            await send_and_peek(f"refused-{i}")
        codes = Counter(code for _, code, _ in outcomes)
        print(f"\nduring the blackhole: {dict(codes)}; the set shrank "
              f"{next(i for i, p in enumerate(peeks) if p[2] == [0])} looks in")
        assert [c for _, c, _ in outcomes] == [ResponseCode.FLUSH_SLAVE_TIMEOUT] * 2 + [ResponseCode.SYSTEM_ERROR] * 5
        assert all("in-sync replicas not enough" in r for _, c, r in outcomes[2:])
        for end, confirm, members in peeks:
            assert end <= confirm, (end, confirm, members)
        assert any(members == [0, 1] and end < confirm + 1 for end, confirm, members in peeks)

        proxy.heal()
        t_heal = time.monotonic()
        await cluster.wait_sync_set(b0, {0, 1}, timeout=15)
        rejoined_s = time.monotonic() - t_heal
        print(f"the replica rejoined the set {rejoined_s:.2f}s after the heal")
        for i in range(10):
            assert (await send(cluster, b0, f"after-{i}"))[0] == ResponseCode.SUCCESS
        end = await cluster.wait_caught_up(b1, b0)
        await b1.stop()
    await b0.stop()
    m_log, r_log = b0.log(), b1.log()
    assert m_log.end == r_log.end == end
    assert m_log.data[:end] == r_log.data[:end]
    bodies = [r.body.decode() for r in r_log.records if r.topic == TOPIC]
    assert bodies == [f"before-{i}" for i in range(20)] + ["unacked-0", "unacked-1"] + [f"after-{i}" for i in
                                                                                        range(10)]


async def test_a_send_waiting_when_the_set_shrinks_below_the_minimum_is_not_acknowledged(cluster: Cluster) -> None:
    # slaveTimeout 10 s: the send is still waiting when b1 leaves the set (haMaxTimeSlaveNotCatchup 3 s)
    b0, b1 = await cluster.start(1, {"slaveTimeout": "10000"}) + [cluster.add_broker(1, {"slaveTimeout": "10000"})]
    async with FaultProxy(("127.0.0.1", b0.ha_port)) as proxy:
        await linked_through_proxy(cluster, proxy, b0, b1)
        assert (await send(cluster, b0, "acked"))[0] == ResponseCode.SUCCESS
        proxy.blackhole(Direction.BOTH)
        t_cut = time.monotonic()
        code, _ = await send(cluster, b0, "held only by the master")
        waited = time.monotonic() - t_cut
        status = await cluster.status(b0)
        assert status["syncStateSet"] == [0]
        assert code != ResponseCode.SUCCESS, f"SEND_OK after {waited:.2f}s with only the master holding it"
