"""ACL on the settings a client announces over Telemetry (RocketMQ 5's proxy checks the same): a producer may name
only topics it may publish to, a consumer only a group and topics it may consume as. A refused settings command
is answered with its status, changes nothing and ends the stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint, start_secured, stop_endpoint
from tests.kit.acl import one_user

pytestmark = pytest.mark.timeout(60)

USER = ("teleUser01", "teleSecret01")
ACL = one_user(USER, topic_perms={"TeleOk": "PUB|SUB", "TeleSubOnly": "SUB"},
               group_perms={"TeleGroup": "SUB"})


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Endpoint]:
    ep = await start_secured(tmp_path, ACL, USER, ("TeleOk", "TeleSubOnly"))
    yield ep
    await stop_endpoint(ep)


def producer(*topics: str) -> pb.Settings:
    return pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics]))


def consumer(group: str, *topics: str) -> pb.Settings:
    return pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name=group), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t)) for t in topics]))


async def exchange(ep: Endpoint, *settings: pb.Settings) -> list[pb.Status]:
    """Send each settings command on one stream, reading the answer of each; a last ``None`` when the server ended
    the stream after them (a refusal), not the client."""
    call = ep.stub.Telemetry(metadata=ep.metadata(), timeout=10)
    out: list[pb.Status | None] = []
    for s in settings:
        await call.write(spb.TelemetryCommand(settings=s))
        reply = await call.read()
        out.append(reply.status)
        if reply.status.code != pb.Code.OK:
            out.append(None if await call.read() is grpc.aio.EOF else reply.status)
            break
    call.cancel()
    return out  # type: ignore[return-value]


async def test_settings_name_only_what_the_account_may_use(secured: Endpoint,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cometmq.acl")
    session = secured.proxy.sessions.get(secured.client_id)
    ok, refused, end = await exchange(secured, producer("TeleOk"), producer("TeleOk", "TeleSubOnly"))
    assert ok.code == pb.Code.OK
    assert refused.code == pb.Code.FORBIDDEN and end is None
    assert refused.message == f"No permission for topic=TeleSubOnly (accessKey={USER[0]}, needs PUB)"
    assert session.topics == {"TeleOk"}  # the refused settings changed nothing
    assert "refused gRPC Telemetry from 127.0.0.1: No permission for topic=TeleSubOnly" in caplog.text

    # sending traces is always allowed, but does not carry the other topics through
    refused, end = await exchange(secured, producer("RMQ_SYS_TRACE_TOPIC", "TeleNone"))
    assert refused.code == pb.Code.FORBIDDEN and "topic=TeleNone" in refused.message and end is None
    # the ACL lets the trace topic through; then the name check (RocketMQ's proxy's, after its ACL) refuses it as a
    # system topic, and the stream ends
    refused, end = await exchange(secured, producer("RMQ_SYS_TRACE_TOPIC", "TeleOk"))
    assert refused.code == pb.Code.ILLEGAL_TOPIC and "system topic" in refused.message and end is None
    assert session.topics == {"TeleOk"}

    assert [s.code for s in await exchange(secured, consumer("TeleGroup", "TeleOk", "TeleSubOnly"))] == [pb.Code.OK]
    assert session.group == "TeleGroup"
    refused, end = await exchange(secured, consumer("OtherGroup", "TeleOk"))
    assert refused.code == pb.Code.FORBIDDEN and "group=OtherGroup" in refused.message and end is None
    refused, end = await exchange(secured, consumer("TeleGroup", "TeleOk", "TeleNone"))
    assert refused.code == pb.Code.FORBIDDEN and "topic=TeleNone" in refused.message and "needs SUB" in refused.message
    refused, _ = await exchange(secured, consumer("TeleGroup", "%RETRY%OtherGroup"))  # a retry topic is its group
    assert refused.code == pb.Code.FORBIDDEN and "group=OtherGroup" in refused.message
    assert session.group == "TeleGroup"

    refused, end = await exchange(secured, pb.Settings(client_type=pb.PRODUCER))
    assert refused.code == pb.Code.BAD_REQUEST and end is None
    assert refused.message == "settings command doesn't have publishing or subscription"


async def test_settings_are_checked_against_the_acl_in_force(secured: Endpoint) -> None:
    """A stream lives long: each settings command is checked when it arrives, against the ACL read last."""
    acl = secured.proxy.service.acl
    assert acl is not None
    call = secured.stub.Telemetry(metadata=secured.metadata(), timeout=10)
    await call.write(spb.TelemetryCommand(settings=producer("TeleOk")))
    assert (await call.read()).status.code == pb.Code.OK
    acl.path.write_text(ACL.replace("TeleOk=PUB|SUB", "TeleOk=SUB") + "\n")
    await acl.reload_settled()
    await call.write(spb.TelemetryCommand(settings=producer("TeleOk")))
    reply = await call.read()
    assert reply.status.code == pb.Code.FORBIDDEN and "topic=TeleOk" in reply.status.message
    assert await call.read() is grpc.aio.EOF
    call.cancel()
