"""Topic and consumer group names, checked as RocketMQ 5's proxy checks them (GrpcValidator): letters, digits and
``%|-_``, topics up to 127 characters and groups up to 120, no system topic (TBW102, RMQ_SYS_TRACE_TOPIC, ...,
``rmq_sys_*``) and no system group (``CID_RMQ_SYS_*``); ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP, nothing changed."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint

OK = pb.Code.OK
BAD_TOPICS = [("T" * 128, "longer than 127"), ("a b", "characters"), ("tópico", "characters"), (" ", "blank"),
              ("", "blank"), ("TBW102", "system topic"), ("RMQ_SYS_TRACE_TOPIC", "system topic"),
              ("rmq_sys_anything", "system topic")]
BAD_GROUPS = [("G" * 121, "longer than 120"), ("a.b", "characters"), ("", "blank"),
              ("CID_RMQ_SYS_TRANS", "system group")]


async def test_topic_names(endpoint: Endpoint) -> None:
    longest = "T" * 127
    await endpoint.create_topic(longest, queues=1)
    r = await endpoint.call("QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name=longest)))
    assert r.status.code == OK, r.status
    assert (await endpoint.send(longest, b"fits")).status.code == OK
    before = endpoint.broker.store.commitlog.max_offset
    for name, problem in BAD_TOPICS:
        r = await endpoint.call("QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name=name)))
        assert r.status.code == pb.Code.ILLEGAL_TOPIC and problem in r.status.message, (name, r.status)
        r = await endpoint.send(name, b"refused")
        assert r.status.code == pb.Code.ILLEGAL_TOPIC and problem in r.status.message, (name, r.status)
    assert endpoint.broker.store.commitlog.max_offset == before


async def test_group_names(endpoint: Endpoint) -> None:
    """A receive with a bad group takes nothing: the message's first delivery goes to the next good receive."""
    await endpoint.create_topic("Named", queues=1)
    await endpoint.send("Named", b"n")
    for name, problem in BAD_GROUPS:
        items = await endpoint.stream("ReceiveMessage", spb.ReceiveMessageRequest(
            group=pb.Resource(name=name), message_queue=endpoint.queue("Named"), batch_size=1,
            invisible_duration=Duration(seconds=30)))
        assert [i.status.code for i in items] == [pb.Code.ILLEGAL_CONSUMER_GROUP], (name, items)
        assert problem in items[0].status.message
    for name, problem in BAD_TOPICS[:3]:
        items = await endpoint.stream("ReceiveMessage", spb.ReceiveMessageRequest(
            group=pb.Resource(name="G"), message_queue=endpoint.queue(name), batch_size=1,
            invisible_duration=Duration(seconds=30)))
        assert [i.status.code for i in items] == [pb.Code.ILLEGAL_TOPIC], (name, items)
        assert problem in items[0].status.message
    longest = "G" * 120
    code, msgs = await endpoint.receive("Named", longest)
    assert code == OK and [m.system_properties.delivery_attempt for m in msgs] == [1]
    assert (await endpoint.ack("Named", longest, *msgs)).status.code == OK


def _topic_group_requests(topic: str, group: str, handle: str) -> list[tuple[str, Any]]:
    t, g = pb.Resource(name=topic), pb.Resource(name=group)
    return [
        ("QueryAssignment", spb.QueryAssignmentRequest(topic=t, group=g)),
        ("AckMessage", spb.AckMessageRequest(topic=t, group=g, entries=[
            spb.AckMessageEntry(message_id="m", receipt_handle=handle)])),
        ("ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(
            topic=t, group=g, receipt_handle=handle, message_id="m", invisible_duration=Duration(seconds=30))),
        ("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueRequest(
            topic=t, group=g, receipt_handle=handle, message_id="m", max_delivery_attempts=16)),
    ]


@pytest.mark.parametrize("rpc", ["QueryAssignment", "AckMessage", "ChangeInvisibleDuration",
                                 "ForwardMessageToDeadLetterQueue"])
async def test_consumer_rpcs_check_topic_and_group(endpoint: Endpoint, rpc: str) -> None:
    await endpoint.create_topic("Rpcs", queues=1)
    await endpoint.send("Rpcs", b"r")
    _, msgs = await endpoint.receive("Rpcs", "G")
    handle = msgs[0].system_properties.receipt_handle
    for topic, group, code in (("a b", "G", pb.Code.ILLEGAL_TOPIC), ("TBW102", "G", pb.Code.ILLEGAL_TOPIC),
                               ("Rpcs", "a b", pb.Code.ILLEGAL_CONSUMER_GROUP),
                               ("Rpcs", "CID_RMQ_SYS_X", pb.Code.ILLEGAL_CONSUMER_GROUP)):
        request = dict(_topic_group_requests(topic, group, handle))[rpc]
        r = await endpoint.call(rpc, request)
        assert r.status.code == code, (topic, group, r.status)
    # the refused calls did nothing: the delivery is still the current one, and the DLQ empty
    assert len(endpoint.broker.store.get_messages("%DLQ%G", 0, 0, 10).buffers) == 0
    r = await endpoint.call(rpc, dict(_topic_group_requests("Rpcs", "G", handle))[rpc])
    assert r.status.code == OK, r.status


async def test_producer_rpcs_and_settings_check_names(endpoint: Endpoint) -> None:
    for rpc, request in (
            ("EndTransaction", spb.EndTransactionRequest(topic=pb.Resource(name="rmq_sys_x"), message_id="m",
                                                         transaction_id="t", resolution=pb.COMMIT)),
            ("RecallMessage", spb.RecallMessageRequest(topic=pb.Resource(name="a|b c"), recall_handle="h"))):
        r = await endpoint.call(rpc, request)
        assert r.status.code == pb.Code.ILLEGAL_TOPIC, (rpc, r.status)
    r = await endpoint.call("Heartbeat", spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER,
                                                              group=pb.Resource(name="G" * 121)))
    assert r.status.code == pb.Code.ILLEGAL_CONSUMER_GROUP, r.status
    r = await endpoint.call("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER))
    assert r.status.code == OK, r.status  # a producer names no group
    for settings, code in (
            (pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="a b")])),
             pb.Code.ILLEGAL_TOPIC),
            (pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(name="%"*121))),
             pb.Code.ILLEGAL_CONSUMER_GROUP)):
        call = endpoint.stub.Telemetry(metadata=endpoint.metadata(), timeout=10)
        await call.write(spb.TelemetryCommand(settings=settings))
        reply = await call.read()
        call.cancel()
        assert reply.status.code == code, reply
    session = endpoint.proxy.sessions.find(endpoint.client_id)
    assert session is None or not session.topics
