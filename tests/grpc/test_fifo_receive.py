"""A FIFO group's receive keeps its queue's order even when the endpoint has no Settings of the client: after a
restart of the endpoint (``cometmq serve`` after kill -9) the 5.x clients' receive calls reach it before their
Telemetry stream is open again, and a receive that was not ordered then handed the next messages of a queue whose
earlier ones were still being processed: two consumers on one queue at once."""

from __future__ import annotations

import json

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol.codes import RequestCode
from tests.grpc.kit import Endpoint

OK = pb.Code.OK


async def fifo_group_with_three_messages(endpoint: Endpoint, topic: str, group: str) -> None:
    """A one-queue topic holding m0, m1, m2 of one message group, and an orderly consumer group made by an admin."""
    await endpoint.create_topic(topic, queues=1)
    r = await endpoint.remoting(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(
        {"groupName": group, "consumeMessageOrderly": True}).encode())
    assert r.code == 0, r.remark
    for i in range(3):
        assert (await endpoint.send(topic, f"m{i}".encode(), group="order-1", mtype=pb.FIFO)).status.code == OK


async def test_a_fifo_group_s_receive_without_settings_is_ordered(endpoint: Endpoint) -> None:
    await fifo_group_with_three_messages(endpoint, "FifoNoSettings", "FG")
    endpoint.client_id = "consumer-a"  # (no Telemetry: the endpoint has no session of either consumer)
    code, first = await endpoint.receive("FifoNoSettings", "FG", batch=1)
    assert code == OK and [m.body for m in first] == [b"m0"]
    endpoint.client_id = "consumer-b"
    code, second = await endpoint.receive("FifoNoSettings", "FG", batch=1)
    assert [m.body for m in second] == [], "m1 handed out while m0 of the same queue is still being processed"
    endpoint.client_id = "consumer-a"
    assert (await endpoint.ack("FifoNoSettings", "FG", *first)).status.code == OK
    code, after = await endpoint.receive("FifoNoSettings", "FG", batch=1)
    assert code == OK and [m.body for m in after] == [b"m1"]


async def test_a_heartbeat_before_the_settings_does_not_unorder_a_fifo_group_s_receive(endpoint: Endpoint) -> None:
    """A Heartbeat names the client's group but says nothing of its order: the endpoint took a session made by one
    for Settings of that group (not FIFO) and popped unordered, as if the client had no session at all."""
    await fifo_group_with_three_messages(endpoint, "FifoHeartbeat", "FHG")
    for client in ("consumer-a", "consumer-b"):  # back after a restart of the endpoint: heartbeats come first
        endpoint.client_id = client
        hb = await endpoint.call("Heartbeat", spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER,
                                                                   group=pb.Resource(name="FHG")))
        assert hb.status.code == OK
    endpoint.client_id = "consumer-a"
    code, first = await endpoint.receive("FifoHeartbeat", "FHG", batch=1)
    assert code == OK and [m.body for m in first] == [b"m0"]
    endpoint.client_id = "consumer-b"
    code, second = await endpoint.receive("FifoHeartbeat", "FHG", batch=1)
    assert [m.body for m in second] == [], "m1 handed out while m0 of the same queue is still being processed"
