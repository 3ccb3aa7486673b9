"""QueryAssignment answers as RocketMQ's proxy does when the topic has nothing to read."""

from __future__ import annotations

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint


async def test_assignment_of_a_topic_without_readable_queues_is_forbidden(endpoint: Endpoint) -> None:
    """A write-only topic was answered OK with no assignment, which a consumer takes as "nothing yet" and polls
    for ever; RocketMQ's proxy answers FORBIDDEN "no readable queue"."""
    await endpoint.create_topic("WriteOnly", queues=2, perm=2)
    r = await endpoint.call("QueryAssignment", spb.QueryAssignmentRequest(
        topic=pb.Resource(name="WriteOnly"), group=pb.Resource(name="G")))
    assert r.status.code == pb.Code.FORBIDDEN, r.status
    assert "readable" in r.status.message and not r.assignments
    r = await endpoint.call("QueryAssignment", spb.QueryAssignmentRequest(
        topic=pb.Resource(name="NoSuchTopic"), group=pb.Resource(name="G")))
    assert r.status.code == pb.Code.TOPIC_NOT_FOUND, r.status
