"""Renewal of auto-renewing receives (grpc/renewal.py, RocketMQ proxy's ReceiptHandleProcessor): a push consumer's
message stays invisible while the client holds it, its ack with the handle it was given works after renewals, and
what a client that goes away held is visible again in about a second. Small invisible times and renew periods
through ProxyConfig keep the tests short."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from cometmq.grpc import renewal
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint, start_endpoint, stop_endpoint

OK = pb.Code.OK
#: pops hide a message for 1 s; a renewal 0.6 s before that ends sets 1 s again; the deliveries are looked at every
#: 0.1 s
QUICK: dict[str, Any] = {"default_invisible_ms": 1000, "renew_ahead_ms": 600, "renew_period_ms": 100,
                         "renew_steps_ms": (1000,)}


async def _endpoint(tmp_path: Path, **changes: Any) -> AsyncIterator[Endpoint]:
    ep = await start_endpoint(tmp_path, **changes)
    yield ep
    await stop_endpoint(ep)


@pytest.fixture
async def quick(tmp_path: Path) -> AsyncIterator[Endpoint]:
    async for ep in _endpoint(tmp_path, **QUICK):
        yield ep


@pytest.fixture
async def bounded(tmp_path: Path) -> AsyncIterator[Endpoint]:
    async for ep in _endpoint(tmp_path, renew_max_per_client=2, renew_max_handles=3):
        yield ep


async def _push_receive(ep: Endpoint, topic: str, group: str = "G", batch: int = 32) -> list[pb.Message]:
    """A receive as the 5.x push consumers make it: auto_renew, no invisible duration of its own."""
    req = spb.ReceiveMessageRequest(group=pb.Resource(name=group), message_queue=ep.queue(topic), batch_size=batch,
                                    auto_renew=True, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.long_polling_timeout.FromMilliseconds(0)
    items = await ep.stream("ReceiveMessage", req)
    return [i.message for i in items if i.HasField("message")]


async def _other_client_receive(ep: Endpoint, topic: str, group: str = "G") -> list[pb.Message]:
    """What another consumer of the group gets now (a plain receive, 10 s invisible)."""
    other = Endpoint(ep.namesrv, ep.broker, ep.proxy, ep.channel, ep.stub)
    _, msgs = await other.receive(topic, group)
    return msgs


async def _terminate(ep: Endpoint) -> None:
    r = await ep.call("NotifyClientTermination", spb.NotifyClientTerminationRequest(group=pb.Resource(name="G")))
    assert r.status.code == OK


async def test_a_message_held_past_its_invisible_time_is_renewed_and_its_first_handle_acks(quick: Endpoint) -> None:
    """The endpoint popped push consumers' messages for 60 s and never renewed them: a listener running longer got its
    message delivered again (to another consumer, or to itself), and its ack was refused as stale. Now the
    endpoint renews the delivery while the client holds it and acks the latest renewal for the original handle."""
    ep = quick
    await ep.create_topic("Renew", queues=1)
    await ep.send("Renew", b"slow")
    [m] = await _push_receive(ep, "Renew")
    assert m.system_properties.invisible_duration.ToMilliseconds() == 1000
    deadline = time.monotonic() + 1.6  # "processing": past the invisible time
    while time.monotonic() < deadline:
        assert await _other_client_receive(ep, "Renew") == [], "delivered again while held"
        await asyncio.sleep(0.1)
    assert ep.proxy.service.renewer.held(ep.client_id) == 1
    ack = await ep.ack("Renew", "G", m)
    assert ack.status.code == OK, ack
    assert ep.proxy.service.renewer.held(ep.client_id) == 0
    assert await _other_client_receive(ep, "Renew") == []


async def test_what_a_terminated_client_held_is_visible_again_in_a_second(endpoint: Endpoint) -> None:
    """A push consumer shutting down with messages in its cache left them hidden for the rest of their 60 s. RocketMQ's
    proxy gives them back with invisibleTimeMillisWhenClear (1 s) when the client ends; so does the endpoint now."""
    ep = endpoint
    await ep.create_topic("Leave", queues=1)
    for body in (b"a", b"b"):
        await ep.send("Leave", body)
    held = await _push_receive(ep, "Leave")
    assert len(held) == 2 and held[0].system_properties.invisible_duration.ToMilliseconds() == 60_000
    await _terminate(ep)
    t0 = time.monotonic()
    back: list[pb.Message] = []
    while len(back) < 2 and time.monotonic() - t0 < 2.5:
        back += await _other_client_receive(ep, "Leave")
        await asyncio.sleep(0.1)
    assert sorted(m.body for m in back) == [b"a", b"b"], f"not back after {time.monotonic() - t0:.1f} s"
    assert {m.system_properties.delivery_attempt for m in back} == {2}


async def test_held_deliveries_are_forgotten_on_ack_change_and_client_end(endpoint: Endpoint) -> None:
    ep = endpoint
    renewer = ep.proxy.service.renewer
    await ep.create_topic("Forget", queues=1)
    for i in range(3):
        await ep.send("Forget", b"%d" % i)
    a, b, c = await _push_receive(ep, "Forget")
    assert renewer.held(ep.client_id) == 3 and len(renewer) == 3
    assert (await ep.ack("Forget", "G", a)).status.code == OK
    assert renewer.held(ep.client_id) == 2
    r = await ep.call("ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="G"), topic=pb.Resource(name="Forget"), message_id=b.system_properties.message_id,
        receipt_handle=b.system_properties.receipt_handle, invisible_duration=Duration(seconds=30)))
    assert r.status.code == OK and renewer.held(ep.client_id) == 1
    await _terminate(ep)
    assert renewer.held(ep.client_id) == 0 and len(renewer) == 0
    assert c.system_properties.receipt_handle  # (given back: see the test above)


async def test_a_silent_client_is_given_up(quick: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that stops calling (its session expires) is treated as one that ended: what it held is given back."""
    monkeypatch.setattr(renewal, "SESSION_EXPIRY_S", 0.3)
    ep = quick
    await ep.create_topic("Silent", queues=1)
    await ep.send("Silent", b"s")
    assert len(await _push_receive(ep, "Silent")) == 1
    t0 = time.monotonic()
    while ep.proxy.service.renewer.held(ep.client_id) and time.monotonic() - t0 < 2:
        await asyncio.sleep(0.05)
    assert ep.proxy.service.renewer.held(ep.client_id) == 0
    back: list[pb.Message] = []
    while not back and time.monotonic() - t0 < 2.5:
        back = await _other_client_receive(ep, "Silent")
        await asyncio.sleep(0.1)
    assert [m.body for m in back] == [b"s"]


async def test_the_tables_are_bounded(bounded: Endpoint) -> None:
    """At most renew_max_per_client deliveries per client and renew_max_handles in all; past them a delivery is
    not renewed (it keeps its invisible time) and still acks."""
    ep = bounded
    renewer = ep.proxy.service.renewer
    await ep.create_topic("Bound", queues=1)
    for i in range(5):
        await ep.send("Bound", b"%d" % i)
    first = await _push_receive(ep, "Bound", batch=3)
    assert len(first) == 3 and renewer.held(ep.client_id) == 2
    second = Endpoint(ep.namesrv, ep.broker, ep.proxy, ep.channel, ep.stub)
    assert len(await _push_receive(second, "Bound", batch=2)) == 2
    assert renewer.held(second.client_id) == 1 and len(renewer) == 3
    assert (await ep.ack("Bound", "G", *first)).status.code == OK
    assert len(renewer) == 1


async def test_with_renewal_off_an_auto_renewing_receive_is_a_plain_one(tmp_path: Path) -> None:
    """enableProxyAutoRenew=false (RocketMQ's key): the request's invisible duration is used, and checked, and
    nothing is renewed."""
    async for ep in _endpoint(tmp_path, auto_renew=False):
        await ep.create_topic("Off", queues=1)
        await ep.send("Off", b"o")
        req = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=ep.queue("Off"), auto_renew=True,
                                        invisible_duration=Duration(seconds=20), batch_size=1,
                                        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        [m] = [i.message for i in await ep.stream("ReceiveMessage", req) if i.HasField("message")]
        assert m.system_properties.invisible_duration.seconds == 20
        assert len(ep.proxy.service.renewer) == 0
        req.invisible_duration.FromMilliseconds(1000)
        statuses = [i.status.code for i in await ep.stream("ReceiveMessage", req) if i.HasField("status")]
        assert statuses == [pb.Code.ILLEGAL_INVISIBLE_TIME]
