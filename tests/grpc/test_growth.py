"""What the endpoint keeps per name a client makes up stays bounded."""

from __future__ import annotations

from cometmq.grpc.backend import GROUP_CONFIG_CACHE_MAX
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint


async def test_settings_of_many_made_up_groups_keep_a_bounded_cache(endpoint: Endpoint) -> None:
    """Each consumer Settings looks its group's config up and cached it under the group's name for good: a
    client naming a new group in every Settings command grew the endpoint's memory without end."""
    await endpoint.create_topic("Groups", queues=1)
    call = endpoint.stub.Telemetry(metadata=endpoint.metadata(), timeout=120)
    try:
        for i in range(GROUP_CONFIG_CACHE_MAX + 200):
            await call.write(spb.TelemetryCommand(settings=pb.Settings(
                client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
                    group=pb.Resource(name=f"made-up-{i}"),
                    subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="Groups"))]))))
            reply = await call.read()
            assert reply.status.code == pb.Code.OK, reply
    finally:
        call.cancel()
    assert len(endpoint.proxy.backend._group_configs) <= GROUP_CONFIG_CACHE_MAX
