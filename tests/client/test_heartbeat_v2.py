"""The SDK's heartbeat v2: the full heartbeat once, then the fingerprint alone while nothing changed; the full one
again when the broker asks (it lost the group) or the subscriptions change (issue 18, "Consumers")."""

from __future__ import annotations

import asyncio

from cometmq.client.admin import Admin
from cometmq.client.consume_types import ConsumeStatus
from cometmq.client.message import MessageExt
from cometmq.client.push_consumer import PushConsumer
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import RemotingCommand

from .conftest import Cluster


async def _ok(msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


async def test_unchanged_heartbeat_sends_the_fingerprint_only(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    bodies: list[bytes] = []
    original = broker.admin.heartbeat

    async def spy(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        bodies.append(cmd.body)
        return await original(conn, cmd)

    broker.dispatcher[RequestCode.HEART_BEAT] = spy  # the broker's handler, watched
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("HB2")
    c = PushConsumer("hb2", namesrv=cluster.namesrv_addr, listener=_ok, rebalance_interval=60)
    c.subscribe("HB2", "a || b")
    async with c:
        inst = c.instance
        assert b'"withoutSub":false' in bodies[0] and b"a || b" in bodies[0]  # the first one is full
        sent = len(bodies)
        await inst.heartbeat()
        assert len(bodies) == sent + 1 and b'"withoutSub":true' in bodies[-1] and b"a || b" not in bodies[-1]
        assert inst.heartbeats_lean >= 1
        sub = broker.consumers.subscription("hb2", "HB2")
        assert sub is not None and sub.sub_string == "a || b"
        assert inst.client_id in broker.consumers.client_ids("hb2")

        # The broker loses the group (as a restarted one would): the fingerprint-only heartbeat is answered
        # IS_SUB_CHANGE and the full one follows at once, in the same heartbeat round.
        broker.consumers.groups.pop("hb2")
        sent = len(bodies)
        await inst.heartbeat()
        assert len(bodies) == sent + 2
        assert b'"withoutSub":true' in bodies[-2] and b"a || b" in bodies[-1] and b'"withoutSub":false' in bodies[-1]
        sub = broker.consumers.subscription("hb2", "HB2")
        assert sub is not None and sub.sub_string == "a || b"
        assert inst.client_id in broker.consumers.client_ids("hb2")

        # A changed subscription goes out in full (a new fingerprint), then lean again.
        sent = len(bodies)
        c.subscribe("HB2", "c")
        await inst.heartbeat()
        assert any(b'"subString":"c"' in x and b'"withoutSub":false' in x for x in bodies[sent:])
        assert not any(b'"withoutSub":true' in x for x in bodies[sent:])
        sub = broker.consumers.subscription("hb2", "HB2")
        assert sub is not None and sub.sub_string == "c"
        await inst.heartbeat()
        assert b'"withoutSub":true' in bodies[-1]


async def test_a_new_connection_gets_the_full_heartbeat(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    async with Admin(namesrv=cluster.namesrv_addr) as admin:
        await admin.create_topic("HB3")
    c = PushConsumer("hb3", namesrv=cluster.namesrv_addr, listener=_ok, rebalance_interval=60)
    c.subscribe("HB3")
    async with c:
        inst = c.instance
        await inst.heartbeat()
        lean = inst.heartbeats_lean
        assert lean >= 1
        # The connection drops (a broker restart, a network cut): the next heartbeat is the full one.
        for conn in list(inst.remoting.connections.values()):
            conn.close()
        await asyncio.sleep(0.05)
        await inst.heartbeat()
        assert inst.heartbeats_lean == lean
        assert inst.client_id in broker.consumers.client_ids("hb3")
        await inst.heartbeat()
        assert inst.heartbeats_lean == lean + 1
