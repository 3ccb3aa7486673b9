"""EtcdLog on a real etcd cluster (subprocesses on loopback, tests/kit/etcd.py): leadership by lease, fencing of a
deposed leader, the same entries in the same order on every node, failover, etcd members lost, and ControllerServers
over it. Skipped when etcd is not installed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from cometmq.controller.etcd_log import EtcdLog
from cometmq.controller.log import LogError, NotLeaderError, ReplicatedLog
from cometmq.controller.server import ControllerConfig, ControllerServer
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode as Req
from cometmq.protocol.codes import ResponseCode as RC
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.kit import EtcdCluster, eventually

pytest.importorskip("aetcd")

_names = itertools.count()


class Node:
    """An EtcdLog and what its subscriber saw."""

    def __init__(self, endpoints: list[str], name: str, address: str, **kw: object) -> None:
        self.address = address
        self.seen: list[tuple[int, bytes]] = []
        self.log = EtcdLog(endpoints, name, address, **kw)
        self.log.subscribe(lambda index, entry: self.seen.append((index, entry)))

    async def start(self) -> Node:
        await self.log.start()
        return self


@pytest.fixture
async def etcd3(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(tmp_path, size=3) as cluster:
        yield cluster


@pytest.fixture
async def etcd1(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(tmp_path, size=1) as cluster:
        yield cluster


async def nodes(etcd: EtcdCluster, n: int, **kw: object) -> list[Node]:
    name = f"t{next(_names)}"
    return [await Node(etcd.endpoints, name, f"127.0.0.1:{9870 + i}", **kw).start() for i in range(n)]


async def the_leader(group: list[Node], timeout: float = 15) -> Node:
    await eventually(lambda: sum(n.log.is_leader for n in group) == 1, timeout, what="one leader")
    return next(n for n in group if n.log.is_leader)


async def stop_all(group: list[Node]) -> None:
    for n in group:
        await n.log.stop()


async def test_single_node_appends_and_replays_across_a_restart(etcd1: EtcdCluster) -> None:
    [node] = await nodes(etcd1, 1)
    typed: ReplicatedLog = node.log
    await the_leader([node])
    assert typed.leader_address == node.address
    indexes = [await typed.append(b"e%d" % i) for i in range(3)]
    assert indexes == sorted(indexes) and len(set(indexes)) == 3
    assert node.seen == [(i, b"e%d" % k) for k, i in enumerate(indexes)]
    assert typed.applied_index == indexes[-1]
    with pytest.raises(LogError):
        node.log.subscribe(lambda index, entry: None)
    await node.log.stop()
    with pytest.raises(LogError):
        await node.log.append(b"late")

    again = await Node(etcd1.endpoints, node.log.name, node.address).start()
    assert again.seen == node.seen  # replayed before start returned
    assert again.log.applied_index == indexes[-1]
    await the_leader([again])  # the previous lease was revoked on stop: no wait for its TTL
    assert await again.log.append(b"e3") > indexes[-1]
    await again.log.stop()


async def test_replay_survives_an_etcd_compaction(etcd1: EtcdCluster) -> None:
    aetcd = pytest.importorskip("aetcd")
    [node] = await nodes(etcd1, 1)
    await the_leader([node])
    indexes = [await node.log.append(b"e%d" % i) for i in range(3)]
    host, port = etcd1.endpoints[0].split(":")
    async with aetcd.Client(host, int(port)) as client:
        await client.compact(indexes[-1], physical=True)  # the history below is gone, the keys stay
    late = await Node(etcd1.endpoints, node.log.name, "127.0.0.1:9999").start()
    assert late.seen == node.seen
    index = await node.log.append(b"e3")
    await eventually(lambda: late.log.applied_index == index, what="the late node follows")
    await late.log.stop()
    await node.log.stop()


async def test_three_nodes_one_leader_followers_redirect_same_order(etcd3: EtcdCluster) -> None:
    group = await nodes(etcd3, 3)
    try:
        leader = await the_leader(group)
        followers = [n for n in group if n is not leader]
        await eventually(lambda: all(n.log.leader_address == leader.address for n in group), what="leader known")
        for f in followers:
            with pytest.raises(NotLeaderError) as info:
                await f.log.append(b"nope")
            assert info.value.leader_address == leader.address
        indexes = await asyncio.gather(*(leader.log.append(b"c%d" % i) for i in range(20)))
        assert len(set(indexes)) == 20
        last = max(indexes)
        await eventually(lambda: all(n.log.applied_index == last for n in group), what="all applied")
        assert all(n.seen == leader.seen for n in group)
        assert [i for i, _ in leader.seen] == sorted(indexes)
        assert {e for _, e in leader.seen} == {b"c%d" % i for i in range(20)}
        assert sum(n.log.is_leader for n in group) == 1
    finally:
        await stop_all(group)


async def test_leader_stopped_or_gone_silent_another_takes_over(etcd3: EtcdCluster) -> None:
    group = await nodes(etcd3, 3)
    loop = asyncio.get_running_loop()
    try:
        leader = await the_leader(group)
        first = await leader.log.append(b"before")

        # a clean stop revokes the lease: the handover is immediate
        t0 = loop.time()
        await leader.log.stop()
        rest = [n for n in group if n is not leader]
        second = await the_leader(rest)
        after = await second.log.append(b"after stop")
        clean_s = loop.time() - t0
        assert after > first

        # a leader that goes silent (its tasks gone, as if frozen): it steps down on its own before the TTL
        # ends, and another node leads once etcd expires the lease
        t0 = loop.time()
        for task in second.log._tasks:
            task.cancel()
        await eventually(lambda: not second.log.is_leader, 3, what="the silent leader steps down")
        stepped_down_s = loop.time() - t0
        third = next(n for n in rest if n is not second)
        await eventually(lambda: third.log.is_leader, 15, what="the last node leads")
        last = await third.log.append(b"after silence")
        silent_s = loop.time() - t0
        assert stepped_down_s < second.log.lease_ttl_s
        with pytest.raises(NotLeaderError):
            await second.log.append(b"stale")
        print(f"failover: clean stop {clean_s * 1000:.0f} ms, silent leader {silent_s:.2f} s "
              f"(stepped down after {stepped_down_s:.2f} s)")
        await eventually(lambda: third.log.applied_index == last, what="applied")
        assert [e for _, e in third.seen] == [b"before", b"after stop", b"after silence"]
    finally:
        await stop_all(group)


async def test_deposed_leader_cannot_append(etcd3: EtcdCluster) -> None:
    aetcd = pytest.importorskip("aetcd")
    group = await nodes(etcd3, 3)
    host, port = etcd3.endpoints[1].split(":")
    client = aetcd.Client(host, int(port))
    try:
        leader = await the_leader(group)
        await leader.log.append(b"ok")
        # blind the leader (no watch), then delete its key behind its back: it still believes it leads
        leader.log._tasks[0].cancel()
        await asyncio.sleep(0.05)
        await client.delete(leader.log._leader_key)
        assert leader.log.is_leader
        with pytest.raises(NotLeaderError):
            await leader.log.append(b"fenced")  # the transaction's compare on the key's create revision fails
        assert not leader.log.is_leader
        others = [n for n in group if n is not leader]
        successor = await the_leader(group)
        assert successor in others
        await successor.log.append(b"next")
        await eventually(lambda: all(n.log.applied_index == successor.log.applied_index for n in others),
                         what="followers applied")
        for n in others:
            assert [e for _, e in n.seen] == [b"ok", b"next"]

        # the successor's lease revoked behind its back: it steps down, the third node leads
        lease = successor.log._lease_id
        await client.revoke_lease(lease)
        await eventually(lambda: not successor.log.is_leader, 5, what="step down after revoke")
        third = await the_leader(group)
        with pytest.raises(NotLeaderError) as info:
            await successor.log.append(b"fenced")
        await eventually(lambda: successor.log.leader_address == third.address, what="new leader named")
        assert info.value.leader_address in (None, third.address)
    finally:
        await client.close()
        await stop_all(group)


async def test_an_etcd_member_killed_appends_still_work(etcd3: EtcdCluster) -> None:
    group = await nodes(etcd3, 3)
    try:
        leader = await the_leader(group)
        await leader.log.append(b"a")
        await etcd3.kill(0)  # every client is connected to the first endpoint: they move on

        async def appended() -> bool:
            current = next((n for n in group if n.log.is_leader), None)
            if current is None:
                return False
            try:
                await current.log.append(b"b")
            except LogError:
                return False
            return True

        await eventually(appended, 15, what="an append with a member down", step=0.2)
        await etcd3.restart(0)
        current = await the_leader(group)
        last = await current.log.append(b"c")
        await eventually(lambda: all(n.log.applied_index == last for n in group), what="all applied")
        assert all(n.seen == current.seen for n in group)
        assert [e for _, e in current.seen] == [b"a", b"b", b"c"]
    finally:
        await stop_all(group)


async def test_etcd_down_appends_fail_in_bounded_time_and_leader_steps_down(etcd1: EtcdCluster) -> None:
    [node] = await nodes(etcd1, 1, request_timeout_s=1.0, retry_interval_s=0.1)
    loop = asyncio.get_running_loop()
    try:
        await the_leader([node])
        await node.log.append(b"a")
        await etcd1.kill(0)
        t0 = loop.time()
        with pytest.raises(LogError):
            await node.log.append(b"b")
        assert loop.time() - t0 < 3
        await eventually(lambda: not node.log.is_leader, node.log.lease_ttl_s, what="step down without etcd")
        await etcd1.restart(0)
        await the_leader([node])
        index = await node.log.append(b"c")
        assert [e for _, e in node.seen] == [b"a", b"c"] and node.log.applied_index == index
    finally:
        await node.log.stop()


# -- ControllerServers on EtcdLog ---------------------------------------------------------------------------------

def controller(endpoints: list[str], name: str, i: int) -> ControllerServer:
    server: ControllerServer | None = None

    def address() -> str:
        assert server is not None
        return server.addr  # raises until bound: the log does not campaign before

    log = EtcdLog(endpoints, name, address)
    server = ControllerServer(ControllerConfig(port=0, scan_interval_s=3600, startup_grace_ms=0, node_id=f"n{i}"),
                              log)
    return server


async def call(client: RemotingClient, ctl: ControllerServer, code: int, **fields: object) -> RemotingCommand:
    return await client.invoke(ctl.addr, make_request(code, fields, b""), 5)


async def test_controller_servers_on_etcd_redirect_to_the_leader(etcd3: EtcdCluster) -> None:
    cluster = f"ctl{next(_names)}"
    servers = [controller(etcd3.endpoints, cluster, i) for i in range(3)]
    name = "g1"
    for s in servers:
        await s.start()
    running = list(servers)
    is_leader: Callable[[ControllerServer], bool] = lambda s: s.processors.log.is_leader  # noqa: E731
    try:
        async with RemotingClient() as client:
            await eventually(lambda: sum(map(is_leader, servers)) == 1, 15, what="one leader")
            leader = next(s for s in servers if is_leader(s))
            follower = next(s for s in servers if s is not leader)
            await eventually(lambda: follower.processors.log.leader_address == leader.addr, what="leader known")
            reply = await call(client, follower, Req.CONTROLLER_GET_NEXT_BROKER_ID, clusterName="c1", brokerName=name)
            assert reply.code == RC.CONTROLLER_NOT_LEADER
            assert leader.addr in (reply.remark or "")
            meta = await call(client, follower, Req.CONTROLLER_GET_METADATA_INFO)
            assert meta.ext_fields.get("controllerLeaderAddress") == leader.addr
            assert meta.ext_fields.get("isLeader") == "false"

            async def join(ctl: ControllerServer, addr: str) -> int:
                reply = await call(client, ctl, Req.CONTROLLER_GET_NEXT_BROKER_ID, clusterName="c1", brokerName=name)
                assert reply.code == RC.SUCCESS, reply.remark
                broker_id = int(reply.ext_fields["nextBrokerId"])
                reply = await call(client, ctl, Req.CONTROLLER_APPLY_BROKER_ID, clusterName="c1", brokerName=name,
                                   appliedBrokerId=broker_id, registerCheckCode=f"{addr};1")
                assert reply.code == RC.SUCCESS, reply.remark
                return broker_id

            assert await join(leader, "127.0.0.1:1001") == 1
            await eventually(lambda: all(s.processors.state.group(name) is not None for s in servers),
                             what="the group applied everywhere")

            await leader.stop()
            running.remove(leader)
            await eventually(lambda: sum(map(is_leader, running)) == 1, 15, what="a new leader")
            new = next(s for s in running if is_leader(s))
            assert await join(new, "127.0.0.1:1002") == 2  # the new leader decides on the applied state
            other = next(s for s in running if s is not new)
            await eventually(lambda: other.processors.log.leader_address == new.addr, what="leader known")
            reply = await call(client, other, Req.CONTROLLER_GET_NEXT_BROKER_ID, clusterName="c1", brokerName=name)
            assert reply.code == RC.CONTROLLER_NOT_LEADER and new.addr in (reply.remark or "")
    finally:
        for s in running:
            await s.stop()
