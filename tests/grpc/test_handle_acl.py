"""ACL on the RPCs that act through a receipt handle (AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue): the handle is the client's to write, and the topic it names is the one the
broker acts on, so the account must be allowed that topic, not only the one the request names beside it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.grpc.handles import ReceiptHandle
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.pop import ExtraInfo
from tests.broker.conftest import send_request
from tests.grpc.kit import Endpoint, start_endpoint, start_secured, stop_endpoint
from tests.kit.acl import one_user

pytestmark = pytest.mark.timeout(60)

USER = ("handleUser1", "handleSecret1")
ACL = one_user(USER, topic_perms={"HOk": "PUB|SUB", "HDenied": "DENY"},
               group_perms={"HGroup": "SUB"})


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Endpoint]:
    ep = await start_secured(tmp_path, ACL, USER, ("HOk", "HDenied"))
    yield ep
    await stop_endpoint(ep)


def _forged(ep: Endpoint, topic: str, commit_log_offset: int) -> str:
    info = ExtraInfo(0, int(time.time() * 1000), 60_000, 0, "0", ep.broker_name, 0, 0)
    return ReceiptHandle(ep.broker_name, topic, info, commit_log_offset).encode()


async def test_a_receipt_handle_cannot_carry_the_call_to_a_denied_topic(secured: Endpoint) -> None:
    # a message of the topic the user may not touch (sent to the broker directly: it has no ACL of its own here)
    r = await secured.remoting(RequestCode.SEND_MESSAGE, send_request("HDenied", b"not yours").ext_fields,
                               b"not yours")
    assert r.code == 0, r.remark
    handle = _forged(secured, "HDenied", decode_offset_msg_id(r.ext_fields["msgId"]).offset)
    group, allowed = pb.Resource(name="HGroup"), pb.Resource(name="HOk")

    dlq = await secured.call("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueRequest(
        group=group, topic=allowed, receipt_handle=handle, message_id="x", delivery_attempt=1,
        max_delivery_attempts=16))
    assert not secured.broker.store.get_messages("%DLQ%HGroup", 0, 0, 10).buffers, "the message was copied"
    assert dlq.status.code == pb.Code.FORBIDDEN, dlq.status
    assert "topic=HDenied" in dlq.status.message

    ack = await secured.call("AckMessage", spb.AckMessageRequest(group=group, topic=allowed, entries=[
        spb.AckMessageEntry(message_id="x", receipt_handle=handle)]))
    assert ack.status.code == pb.Code.FORBIDDEN, ack.status
    change = spb.ChangeInvisibleDurationRequest(group=group, topic=allowed, receipt_handle=handle, message_id="x")
    change.invisible_duration.FromMilliseconds(1000)
    changed = await secured.call("ChangeInvisibleDuration", change)
    assert changed.status.code == pb.Code.FORBIDDEN, changed.status


async def test_the_handles_of_an_allowed_topic_still_work(secured: Endpoint) -> None:
    assert (await secured.send("HOk", b"mine")).status.code == pb.Code.OK
    code, msgs = await secured.receive("HOk", "HGroup")
    assert code == pb.Code.OK and [m.body for m in msgs] == [b"mine"]
    change = spb.ChangeInvisibleDurationRequest(group=pb.Resource(name="HGroup"), topic=pb.Resource(name="HOk"),
                                                receipt_handle=msgs[0].system_properties.receipt_handle,
                                                message_id=msgs[0].system_properties.message_id)
    change.invisible_duration.FromMilliseconds(60_000)
    changed = await secured.call("ChangeInvisibleDuration", change)
    assert changed.status.code == pb.Code.OK, changed.status
    msgs[0].system_properties.receipt_handle = changed.receipt_handle
    assert (await secured.ack("HOk", "HGroup", msgs[0])).status.code == pb.Code.OK


TX_ADMIN = ("handleAdmin1", "handleAdminSecret1")


async def test_a_transaction_id_cannot_end_a_half_of_a_denied_topic(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL + f"  - accessKey: {TX_ADMIN[0]}\n    secretKey: {TX_ADMIN[1]}\n    admin: true\n")
    ep = await start_endpoint(tmp_path, acl_file=str(acl))
    try:
        for topic in ("HOk", "HDenied"):
            await ep.create_topic(topic, queues=1)
        ep.credentials = TX_ADMIN  # a producer allowed the denied topic leaves a half there
        half = (await ep.send("HDenied", b"undecided", mtype=pb.TRANSACTION)).entries[0]
        assert half.status.code == pb.Code.OK and half.transaction_id
        # the user, allowed to publish to HOk only, ends it by naming HOk beside the transaction id (which it can
        # write itself: it is plain base64 of the broker's address and the half's offsets)
        ep.credentials = USER
        r = await ep.call("EndTransaction", spb.EndTransactionRequest(
            topic=pb.Resource(name="HOk"), message_id=half.message_id, transaction_id=half.transaction_id,
            resolution=pb.ROLLBACK, source=pb.SOURCE_CLIENT))
        assert r.status.code != pb.Code.OK, "the user rolled back a transaction of a topic it may not publish to"
        # the half is still the producer's to commit
        ep.credentials = TX_ADMIN
        r = await ep.call("EndTransaction", spb.EndTransactionRequest(
            topic=pb.Resource(name="HDenied"), message_id=half.message_id, transaction_id=half.transaction_id,
            resolution=pb.COMMIT, source=pb.SOURCE_CLIENT))
        assert r.status.code == pb.Code.OK, r.status
        code, msgs = await ep.receive("HDenied", "HGroup", poll_ms=3000)
        assert code == pb.Code.OK and [m.body for m in msgs] == [b"undecided"]
    finally:
        await stop_endpoint(ep)
