"""ForwardMessageToDeadLetterQueue with a handle that no longer names the current delivery: refused, and the
dead-letter queue is left as it was."""

from __future__ import annotations

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint


def _forward(group: str, topic: str, m: pb.Message) -> spb.ForwardMessageToDeadLetterQueueRequest:
    return spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic),
        receipt_handle=m.system_properties.receipt_handle, message_id=m.system_properties.message_id,
        delivery_attempt=m.system_properties.delivery_attempt, max_delivery_attempts=16)


def _dlq(endpoint: Endpoint, group: str) -> int:
    return len(endpoint.broker.store.get_messages(f"%DLQ%{group}", 0, 0, 10).buffers)


async def test_forward_with_a_stale_or_foreign_handle_changes_nothing(quick_endpoint: Endpoint) -> None:
    """The message was copied to the DLQ first and the handle checked only by the ack after it: a stale handle
    (the message redelivered since, to this consumer or another) put a copy in the DLQ while the message stayed
    live, and a group that never received it got one in its DLQ too."""
    endpoint = quick_endpoint  # receives with a 1 s invisible time (RocketMQ's minimum, the default, is 10 s)
    await endpoint.create_topic("DlqStale", queues=1)
    await endpoint.send("DlqStale", b"poison")
    _, first = await endpoint.receive("DlqStale", "GS", invisible_ms=1000)
    code, second = await endpoint.receive("DlqStale", "GS", invisible_ms=30_000, poll_ms=4000)
    assert code == pb.Code.OK and second[0].system_properties.delivery_attempt == 2
    r = await endpoint.call("ForwardMessageToDeadLetterQueue", _forward("GS", "DlqStale", first[0]))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE, r.status
    r = await endpoint.call("ForwardMessageToDeadLetterQueue", _forward("Other", "DlqStale", second[0]))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE, r.status
    assert _dlq(endpoint, "GS") == 0 and _dlq(endpoint, "Other") == 0
    # the current delivery is untouched: forwarding it works, once
    r = await endpoint.call("ForwardMessageToDeadLetterQueue", _forward("GS", "DlqStale", second[0]))
    assert r.status.code == pb.Code.OK, r.status
    assert _dlq(endpoint, "GS") == 1
    code, _ = await endpoint.receive("DlqStale", "GS")
    assert code == pb.Code.MESSAGE_NOT_FOUND
