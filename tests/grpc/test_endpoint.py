"""The gRPC endpoint in process, driven by a stub generated from cometmq's own protos: every RPC's answers,
failures as statuses, and the remoting state they leave behind on the broker."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from google.protobuf.duration_pb2 import Duration

from cometmq.grpc.backend import PROXY_PRODUCER_GROUP
from cometmq.grpc.handles import ReceiptHandle
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import Endpoint

OK = pb.Code.OK


async def test_query_route_points_every_queue_at_the_endpoint(endpoint: Endpoint) -> None:
    await endpoint.create_topic("RouteT", queues=3)
    eps = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host="10.1.2.3", port=8081)])
    r = await endpoint.call("QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="RouteT"), endpoints=eps))
    assert r.status.code == OK
    assert sorted(q.id for q in r.message_queues) == [0, 1, 2]
    for q in r.message_queues:
        assert q.broker.name == endpoint.broker_name and q.broker.id == 0
        assert q.broker.endpoints == eps  # what the client dialed, not the broker's remoting address
        assert q.permission == pb.READ_WRITE
        assert set(q.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}


async def test_query_route_of_an_unknown_topic_is_topic_not_found(endpoint: Endpoint) -> None:
    r = await endpoint.call("QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="NoSuchTopic")))
    assert r.status.code == pb.Code.TOPIC_NOT_FOUND
    assert not r.message_queues


async def test_telemetry_settings_handshake_for_producer_and_consumer(endpoint: Endpoint) -> None:
    async def one(settings: pb.Settings) -> spb.TelemetryCommand:
        call = endpoint.stub.Telemetry(metadata=endpoint.metadata(), timeout=10)
        await call.write(spb.TelemetryCommand(settings=settings))
        reply: spb.TelemetryCommand = await call.read()
        await call.done_writing()
        call.cancel()
        return reply

    prod = await one(pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="T")])))
    assert prod.status.code == OK
    assert prod.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert [t.name for t in prod.settings.publishing.topics] == ["T"]
    assert prod.settings.backoff_policy.max_attempts >= 1
    assert not prod.settings.metric.on  # metrics cost the client time per call: on for push consumers only
    cons = await one(pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name="G"), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="T"))])))
    assert cons.status.code == OK
    sub = cons.settings.subscription
    assert sub.group.name == "G" and not sub.fifo
    assert sub.long_polling_timeout.seconds > 0
    assert cons.settings.backoff_policy.max_attempts == 17  # retryMaxTimes 16 + the first delivery
    assert len(cons.settings.backoff_policy.customized_backoff.next) > 0
    assert cons.settings.metric.on and cons.settings.metric.endpoints.addresses  # the Python push consumer needs it
    simple = await one(pb.Settings(client_type=pb.SIMPLE_CONSUMER, metric=pb.Metric(on=True),
                                   subscription=pb.Subscription(group=pb.Resource(name="G"), subscriptions=[
                                       pb.SubscriptionEntry(topic=pb.Resource(name="T"))])))
    assert simple.status.code == OK and not simple.settings.metric.on


async def test_send_receive_ack_round_trip(endpoint: Endpoint) -> None:
    await endpoint.create_topic("RT")
    sent = await endpoint.send("RT", b"hello", tag="TagA", color="red")
    assert sent.status.code == OK and len(sent.entries) == 1
    code, msgs = await endpoint.receive("RT", "G1")
    assert code == OK and len(msgs) == 1
    m = msgs[0]
    assert m.body == b"hello" and m.topic.name == "RT"
    sp = m.system_properties
    assert sp.message_id == sent.entries[0].message_id
    assert sp.tag == "TagA" and dict(m.user_properties) == {"color": "red"}
    assert sp.body_digest.type == pb.MD5 and sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert sp.delivery_attempt == 1 and sp.receipt_handle
    ack = await endpoint.ack("RT", "G1", m)
    assert ack.status.code == OK and ack.entries[0].status.code == OK
    # acked: a second ack of the same handle is harmless, and nothing is left to receive
    assert (await endpoint.ack("RT", "G1", m)).status.code == OK
    code, msgs = await endpoint.receive("RT", "G1")
    assert code == pb.Code.MESSAGE_NOT_FOUND and msgs == []


async def test_unacked_message_comes_back_after_its_invisible_time(quick_endpoint: Endpoint) -> None:
    endpoint = quick_endpoint  # receives with a 1 s invisible time (RocketMQ's minimum, the default, is 10 s)
    await endpoint.create_topic("Redeliver", queues=1)
    await endpoint.send("Redeliver", b"again")
    _, first = await endpoint.receive("Redeliver", "G", invisible_ms=1000)
    assert len(first) == 1
    code, second = await endpoint.receive("Redeliver", "G", invisible_ms=5000, poll_ms=4000)
    assert code == OK and len(second) == 1
    assert second[0].system_properties.message_id == first[0].system_properties.message_id
    assert second[0].system_properties.delivery_attempt == 2
    # the first delivery's handle is stale now
    stale = await endpoint.ack("Redeliver", "G", first[0])
    assert stale.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    assert (await endpoint.ack("Redeliver", "G", second[0])).status.code == OK


async def test_change_invisible_duration_issues_a_new_handle(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Change", queues=1)
    await endpoint.send("Change", b"c")
    _, msgs = await endpoint.receive("Change", "G", invisible_ms=30_000)
    m = msgs[0]
    r = await endpoint.call("ChangeInvisibleDuration", spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="G"), topic=pb.Resource(name="Change"),
        receipt_handle=m.system_properties.receipt_handle, invisible_duration=Duration(seconds=0),
        message_id=m.system_properties.message_id))
    assert r.status.code == OK and r.receipt_handle != m.system_properties.receipt_handle
    # invisible time 0: visible again at once, with the old handle refused
    code, again = await endpoint.receive("Change", "G", poll_ms=3000)
    assert code == OK and again[0].system_properties.message_id == m.system_properties.message_id
    assert (await endpoint.ack("Change", "G", m)).status.code == pb.Code.INVALID_RECEIPT_HANDLE


async def test_garbage_receipt_handle_is_invalid(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Garbage")
    r = await endpoint.call("AckMessage", spb.AckMessageRequest(
        group=pb.Resource(name="G"), topic=pb.Resource(name="Garbage"),
        entries=[spb.AckMessageEntry(message_id="x", receipt_handle="not-a-handle")]))
    assert r.status.code == pb.Code.INVALID_RECEIPT_HANDLE


async def test_empty_long_poll_answers_not_found_before_the_deadline(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Empty")
    t0 = time.monotonic()
    code, msgs = await endpoint.receive("Empty", "G", poll_ms=1500)
    assert code == pb.Code.MESSAGE_NOT_FOUND and msgs == []
    assert time.monotonic() - t0 < 4.5  # held about the polling time, answered before the 6.5 s deadline


async def test_long_poll_wakes_on_arrival(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Wake")
    task = asyncio.ensure_future(endpoint.receive("Wake", "G", poll_ms=8000))
    await asyncio.sleep(0.5)
    await endpoint.send("Wake", b"late")
    code, msgs = await asyncio.wait_for(task, 7)
    assert code == OK and [m.body for m in msgs] == [b"late"]


async def test_fifo_group_goes_to_one_queue(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Fifo", queues=8)
    offsets_by_group: dict[str, list[int]] = {}
    for i in range(12):
        g = f"order-{i % 3}"
        r = await endpoint.send("Fifo", f"{g}:{i}".encode(), group=g, mtype=pb.FIFO)
        assert r.status.code == OK
        offsets_by_group.setdefault(g, []).append(r.entries[0].offset)
    for offsets in offsets_by_group.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == 4  # consecutive offsets of one queue
    _, msgs = await endpoint.receive("Fifo", "FG", batch=32)
    by_group: dict[str, set[int]] = {}
    for m in msgs:
        by_group.setdefault(m.system_properties.message_group, set()).add(m.system_properties.queue_id)
    assert all(len(q) == 1 for q in by_group.values())


async def test_tag_and_sql_filters(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Filter", queues=1)
    await endpoint.send("Filter", b"a", tag="A", n="1")
    await endpoint.send("Filter", b"b", tag="B", n="5")
    _, msgs = await endpoint.receive("Filter", "GT", expression="B")
    assert [m.body for m in msgs] == [b"b"]
    _, msgs = await endpoint.receive("Filter", "GS", expression="n < 3", sql=True)
    assert [m.body for m in msgs] == [b"a"]
    code, _ = await endpoint.receive("Filter", "GX", expression="n <<< 3", sql=True)
    assert code != OK


async def test_delay_message_recall_and_delivery(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Delay", queues=1)
    due = int(time.time() * 1000) + 1500
    kept = await endpoint.send("Delay", b"kept", delivery_ms=due, mtype=pb.DELAY)
    gone = await endpoint.send("Delay", b"gone", delivery_ms=due, mtype=pb.DELAY)
    assert kept.entries[0].recall_handle and gone.entries[0].recall_handle
    r = await endpoint.call("RecallMessage", spb.RecallMessageRequest(
        topic=pb.Resource(name="Delay"), recall_handle=gone.entries[0].recall_handle))
    assert r.status.code == OK and r.message_id == gone.entries[0].message_id
    code, msgs = await endpoint.receive("Delay", "G")
    assert code == pb.Code.MESSAGE_NOT_FOUND  # not due yet
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not got:
        _, msgs = await endpoint.receive("Delay", "G", poll_ms=2000)
        got += [m.body for m in msgs]
    assert got == [b"kept"]
    assert time.time() * 1000 >= due


async def test_delivery_timestamp_given_in_milliseconds_as_seconds_is_understood(endpoint: Endpoint) -> None:
    """The Python 5.x client puts the caller's number into Timestamp.seconds unchanged."""
    await endpoint.create_topic("DelayMs", queues=1)
    due_ms = int(time.time() * 1000) + 60_000
    r = await endpoint.send("DelayMs", b"x", mtype=pb.DELAY, delivery_ms=0)
    assert r.status.code == OK  # delivery at 0 = now: a plain message
    req_msg = pb.Message(topic=pb.Resource(name="DelayMs"), body=b"y", system_properties=pb.SystemProperties(
        message_id="01" + "AB" * 16, message_type=pb.DELAY))
    req_msg.system_properties.delivery_timestamp.seconds = due_ms  # milliseconds in the seconds field
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[req_msg]))
    assert r.status.code == OK and r.entries[0].recall_handle  # parked in the timer, about a minute away


async def test_forward_to_dead_letter_queue(endpoint: Endpoint) -> None:
    await endpoint.create_topic("ToDlq", queues=1)
    await endpoint.send("ToDlq", b"poison")
    _, msgs = await endpoint.receive("ToDlq", "GD")
    m = msgs[0]
    r = await endpoint.call("ForwardMessageToDeadLetterQueue", spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="GD"), topic=pb.Resource(name="ToDlq"),
        receipt_handle=m.system_properties.receipt_handle, message_id=m.system_properties.message_id,
        delivery_attempt=1, max_delivery_attempts=16))
    assert r.status.code == OK
    code, _ = await endpoint.receive("ToDlq", "GD")
    assert code == pb.Code.MESSAGE_NOT_FOUND  # acked on the topic
    dlq = endpoint.broker.store.get_messages("%DLQ%GD", 0, 0, 10)
    assert len(dlq.buffers) == 1


async def test_offsets_and_pull(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Pull", queues=1)
    for i in range(3):
        await endpoint.send("Pull", f"p{i}".encode())
    mq = endpoint.queue("Pull", 0)
    q = await endpoint.call("QueryOffset", spb.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.END))
    assert q.status.code == OK and q.offset == 3
    q = await endpoint.call("QueryOffset", spb.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.BEGINNING))
    assert q.offset == 0
    items = await endpoint.stream("PullMessage", spb.PullMessageRequest(
        group=pb.Resource(name="PG"), message_queue=mq, offset=1, batch_size=10,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*")))
    assert [i.message.body for i in items if i.HasField("message")] == [b"p1", b"p2"]
    assert [i.next_offset for i in items if i.HasField("next_offset")] == [3]
    g = await endpoint.call("GetOffset", spb.GetOffsetRequest(group=pb.Resource(name="PG"), message_queue=mq))
    # nothing stored: RocketMQ's broker answers 0 while the queue still starts at 0
    assert (g.status.code, g.offset) in ((pb.Code.OFFSET_NOT_FOUND, 0), (OK, 0))
    u = await endpoint.call("UpdateOffset", spb.UpdateOffsetRequest(group=pb.Resource(name="PG"), message_queue=mq,
                                                                     offset=2))
    assert u.status.code == OK
    g = await endpoint.call("GetOffset", spb.GetOffsetRequest(group=pb.Resource(name="PG"), message_queue=mq))
    assert g.status.code == OK and g.offset == 2


async def test_query_assignment_gives_one_pop_queue_per_broker(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Assign")
    r = await endpoint.call("QueryAssignment", spb.QueryAssignmentRequest(
        topic=pb.Resource(name="Assign"), group=pb.Resource(name="G")))
    assert r.status.code == OK
    assert [(a.message_queue.broker.name, a.message_queue.id) for a in r.assignments] == [(endpoint.broker_name, -1)]


async def test_bad_sends_are_refused_with_a_status(endpoint: Endpoint) -> None:
    await endpoint.create_topic("Bad")
    r = await endpoint.call("SendMessage", spb.SendMessageRequest(messages=[]))
    assert r.status.code == pb.Code.BAD_REQUEST
    r = await endpoint.send("Bad", b"x", UNIQ_KEY="mine")
    assert r.status.code == pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    r = await endpoint.send("Bad", b"x", tag="a|b")
    assert r.status.code == pb.Code.ILLEGAL_MESSAGE_TAG
    r = await endpoint.send("NoSuchTopic", b"x")
    assert r.status.code == pb.Code.TOPIC_NOT_FOUND
    r = await endpoint.send("Bad", b"z" * (4 * 1024 * 1024 + 1))
    assert r.status.code == pb.Code.MESSAGE_BODY_TOO_LARGE


async def test_unsupported_and_unknown_transaction(endpoint: Endpoint) -> None:
    r = await endpoint.call("SyncLiteSubscription", spb.SyncLiteSubscriptionRequest())
    assert r.status.code == pb.Code.UNSUPPORTED
    r = await endpoint.call("EndTransaction", spb.EndTransactionRequest(
        topic=pb.Resource(name="T"), message_id="m", transaction_id="garbage", resolution=pb.COMMIT))
    assert r.status.code == pb.Code.INVALID_TRANSACTION_ID


async def test_heartbeat_and_termination(endpoint: Endpoint) -> None:
    r = await endpoint.call("Heartbeat", spb.HeartbeatRequest(client_type=pb.PRODUCER))
    assert r.status.code == OK
    assert endpoint.proxy.sessions.find(endpoint.client_id) is not None
    r = await endpoint.call("NotifyClientTermination", spb.NotifyClientTerminationRequest())
    assert r.status.code == OK
    assert endpoint.proxy.sessions.find(endpoint.client_id) is None


async def test_proxy_registers_as_producer_for_transaction_checks(endpoint: Endpoint) -> None:
    """After its first route look-up the proxy has sent a HEART_BEAT naming its producer group, so the broker
    can send it CHECK_TRANSACTION_STATE for half messages it stored."""
    await endpoint.create_topic("Reg")
    await endpoint.call("QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="Reg")))
    for _ in range(50):
        if endpoint.broker.producers.groups.get(PROXY_PRODUCER_GROUP):
            break
        await asyncio.sleep(0.1)
    assert endpoint.broker.producers.groups.get(PROXY_PRODUCER_GROUP)


def test_receipt_handle_names_what_the_ack_needs() -> None:
    from cometmq.protocol.pop import ExtraInfo

    h = ReceiptHandle("b", "T", ExtraInfo(1, 2, 3, 0, "0", "b", 4, 5), 99)
    assert ReceiptHandle.decode(h.encode()) == h


async def _until(cond: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_receive_cancelled_mid_poll_does_not_hide_what_its_pop_takes(endpoint: Endpoint) -> None:
    """A client that gives up its long poll (a consumer shutting down, a cancelled call) leaves the broker's POP
    waiting: what it takes once a message arrives reaches nobody. The endpoint gives it back (RocketMQ's proxy nacks
    a message it could not write, invisible for 1 s) rather than leaving it hidden for the receive's 60 s."""
    await endpoint.create_topic("CancelPoll", queues=1)
    req = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=endpoint.queue("CancelPoll"),
                                    batch_size=4, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromMilliseconds(60_000)
    req.long_polling_timeout.FromMilliseconds(8000)
    call = endpoint.stub.ReceiveMessage(req, metadata=endpoint.metadata(), timeout=12)
    pop = endpoint.broker.pop
    await _until(lambda: pop.waiting() > 0, "the POP to wait")
    call.cancel()
    await endpoint.send("CancelPoll", b"for whoever is there")
    t0 = time.monotonic()
    code, msgs = await endpoint.receive("CancelPoll", "G", poll_ms=5000)
    assert code == OK and [m.body for m in msgs] == [b"for whoever is there"], (code, msgs)
    assert time.monotonic() - t0 < 4
    assert (await endpoint.ack("CancelPoll", "G", *msgs)).status.code == OK


async def test_receive_cancelled_mid_stream_gives_back_the_messages_not_written(endpoint: Endpoint) -> None:
    """A client that cancels while the answer is streamed (messages held by HTTP/2 flow control) did not get the
    rest: those come back after 1 s, not after the receive's invisible time."""
    await endpoint.create_topic("CancelStream", queues=4)
    bodies = [bytes([65 + i]) * (60 << 10) for i in range(16)]  # one POP takes them all (256 KiB a queue)
    for body in bodies:
        assert (await endpoint.send("CancelStream", body)).status.code == OK
    req = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=endpoint.queue("CancelStream"),
                                    batch_size=16, filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.FromMilliseconds(60_000)
    req.long_polling_timeout.FromMilliseconds(0)
    call = endpoint.stub.ReceiveMessage(req, metadata=endpoint.metadata(), timeout=12)
    first = await call.read()
    assert first.status.code == OK
    call.cancel()
    got: list[bytes] = []
    deadline = time.monotonic() + 4
    # (the messages grpc took before the client left count as sent: some may not come back)
    while len(got) < len(bodies) // 2 and time.monotonic() < deadline:
        _, msgs = await endpoint.receive("CancelStream", "G", poll_ms=1500)
        got += [m.body for m in msgs]
    assert len(got) >= len(bodies) // 2 and set(got) <= set(bodies), [len(b) for b in got]
