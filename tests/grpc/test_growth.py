"""What the endpoint keeps per name a client makes up stays bounded."""

from __future__ import annotations

import asyncio

from cometmq.grpc.backend import GROUP_CONFIG_CACHE_MAX
from cometmq.grpc.sessions import OUTBOX_MAX, OUTBOX_MAX_BYTES
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


async def test_a_telemetry_client_that_never_reads_holds_a_bounded_outbox(endpoint: Endpoint) -> None:
    """The endpoint answered each Settings command into an unbounded queue that waited for the client to read the
    stream: a client writing large Settings and reading nothing made the endpoint hold every answer (each as large
    as the command), ~100 MB for 2,000 commands. Now a full outbox stops the endpoint reading the client's commands
    (flow control holds its writes), and every answer still comes, in order, once the client reads."""
    await endpoint.create_topic("Quiet", queues=1)
    # ~50 KB a command (and its answer): 500 topic names of 100 characters
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="Quiet")] + [pb.Resource(name=f"{i:03d}" + "T" * 97) for i in range(499)]))
    total = 2000
    call = endpoint.stub.Telemetry(metadata=endpoint.metadata(), timeout=120)

    async def write_all() -> None:
        for _ in range(total):
            await call.write(spb.TelemetryCommand(settings=settings))

    writer = asyncio.get_running_loop().create_task(write_all())
    try:
        await asyncio.wait([writer], timeout=5)  # (all 2,000 went in ~4 s before: the endpoint read them all)
        session = endpoint.proxy.sessions.find(endpoint.client_id)
        assert session is not None and session.outbox is not None
        assert len(session.outbox) <= OUTBOX_MAX and session.outbox.size_bytes <= OUTBOX_MAX_BYTES + \
            settings.ByteSize() + 64, (len(session.outbox), session.outbox.size_bytes)
        assert not writer.done()  # held by flow control
        for _ in range(total):  # nothing was dropped: every command is answered, in order
            reply = await asyncio.wait_for(call.read(), 30)
            assert reply.status.code == pb.Code.OK and len(reply.settings.publishing.topics) == 500
        await asyncio.wait_for(writer, 30)
    finally:
        writer.cancel()
        call.cancel()
