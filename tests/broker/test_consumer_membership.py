"""Consumer group membership at scale: coalesced NOTIFY_CONSUMER_IDS_CHANGED, heartbeat v2 (fingerprints), the
cached member list, and 4.x full heartbeats (issue 18, "Consumers")."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.client_bodies import (
    ConsumerData,
    HeartbeatData,
    SubscriptionData,
    decode_consumer_list,
)
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request

from .conftest import StartBroker


def consumer(group: str, topic: str = "T", expression: str = "*") -> ConsumerData:
    return ConsumerData(group, subscriptions=(SubscriptionData(topic, expression),))


def heartbeat(data: HeartbeatData) -> RemotingCommand:
    return make_request(RequestCode.HEART_BEAT, {}, data.encode())


class Member:
    """One consumer client on its own connection, counting the notices it is sent."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.notices: list[float] = []
        self.noticed = asyncio.Event()
        self.client = RemotingClient({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_notice})

    async def _on_notice(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        assert cmd.ext_fields["consumerGroup"] == "cg"
        self.notices.append(time.monotonic())
        self.noticed.set()

    async def join(self, addr: str, group: str = "cg") -> RemotingCommand:
        r = await self.client.invoke(addr, heartbeat(HeartbeatData(self.client_id, (), (consumer(group),))))
        assert r.code == ResponseCode.SUCCESS
        return r


async def test_a_burst_of_joins_is_told_in_a_few_notices(start_broker: StartBroker, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b", notify_consumer_ids_changed_window_ms=300)
    b.consumers.notify_window_per_member_ms = 100  # a full 300 ms window from the first member on
    first = Member("first")
    members = [Member(f"m{i:02d}") for i in range(40)]
    try:
        await first.join(b.addr)
        await asyncio.sleep(0.5)  # the window the first join opened has closed
        first.notices.clear()
        for m in members:
            await m.join(b.addr)
        last_join = time.monotonic()
        await asyncio.sleep(1.0)  # a window and more: the trailing notice has gone out
        # 41 joins would have been 40 notices to the first member; coalesced they are a few (one per window)
        assert 1 <= len(first.notices) <= 8, first.notices
        # the last change is always told: a notice came after the last join
        assert max(first.notices) >= last_join
        # each of the members got at most a few too, and the last to join heard of the group's final state
        assert all(len(m.notices) <= 8 for m in members)
        assert members[-1].notices and max(members[-1].notices) >= last_join - 0.01
        assert b.consumers.client_ids("cg") == sorted(["first", *(m.client_id for m in members)])

        # A lone change after a quiet spell is told at once (the leading edge), not after the window.
        await asyncio.sleep(0.5)
        first.noticed.clear()
        late = Member("late")
        t0 = time.monotonic()
        await late.join(b.addr)
        await asyncio.wait_for(first.noticed.wait(), 5)
        assert first.notices[-1] - t0 < 0.25  # generous, but well inside the 300 ms window
        await late.client.close()  # a member leaving is told too
        first.noticed.clear()
        await asyncio.wait_for(first.noticed.wait(), 5)
        assert "late" not in b.consumers.client_ids("cg")
    finally:
        for m in (first, *members):
            await m.client.close()


async def test_a_small_group_is_told_of_every_change_at_once(start_broker: StartBroker, tmp_path: Path) -> None:
    # The window is 1 ms per member: two members hear of a join right after another change (an orderly consumer
    # waits for the other to give its queues up).
    b = await start_broker(tmp_path / "b", notify_consumer_ids_changed_window_ms=500)
    a, c = Member("a"), Member("c")
    try:
        await a.join(b.addr)
        await asyncio.wait_for(a.noticed.wait(), 5)
        a.noticed.clear()
        t0 = time.monotonic()
        await c.join(b.addr)  # within what would be a 500 ms window of a's join
        await asyncio.wait_for(a.noticed.wait(), 5)
        assert a.notices[-1] - t0 < 0.2  # generous: the window is 1-2 ms
    finally:
        await a.client.close()
        await c.client.close()


async def test_window_zero_tells_every_change(start_broker: StartBroker, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b", notify_consumer_ids_changed_window_ms=0)
    first, members = Member("first"), [Member(f"m{i}") for i in range(5)]
    try:
        await first.join(b.addr)
        for m in members:
            await m.join(b.addr)
        for _ in range(50):
            if len(first.notices) >= 6:
                break
            await asyncio.sleep(0.05)
        assert len(first.notices) == 6
    finally:
        for m in (first, *members):
            await m.client.close()


async def test_member_list_is_cached_per_membership_change(start_broker: StartBroker, client: RemotingClient,
                                                            tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    members = [Member(f"c{i}") for i in range(3)]
    try:
        for m in members[:2]:
            await m.join(b.addr)
        ask = make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
        r1 = await client.invoke(b.addr, ask)
        r2 = await client.invoke(b.addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                      {"consumerGroup": "cg"}))
        assert decode_consumer_list(r1.body) == ["c0", "c1"] and r1.body == r2.body
        body = b.consumers.consumer_list_body("cg")
        assert body is b.consumers.consumer_list_body("cg")  # not rebuilt without a change
        await members[2].join(b.addr)
        r3 = await client.invoke(b.addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                      {"consumerGroup": "cg"}))
        assert decode_consumer_list(r3.body) == ["c0", "c1", "c2"]
        await members[0].client.close()
        for _ in range(100):
            if "c0" not in b.consumers.client_ids("cg"):
                break
            await asyncio.sleep(0.02)
        r4 = await client.invoke(b.addr, make_request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                      {"consumerGroup": "cg"}))
        assert decode_consumer_list(r4.body) == ["c1", "c2"]
        assert not b.consumers.has_client("c0") and b.consumers.has_client("c1")
    finally:
        for m in members:
            await m.client.close()


async def test_fingerprint_heartbeat(start_broker: StartBroker, tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    full = HeartbeatData("c1", ("pg",), (consumer("cg", "T", "a || b"),))
    fp = full.compute_fingerprint()
    c1, c2 = RemotingClient(), RemotingClient()
    try:
        # The first heartbeat is the full one, with its fingerprint: the broker takes it and says it does v2.
        r = await c1.invoke(b.addr, heartbeat(HeartbeatData(full.client_id, full.producer_groups, full.consumers,
                                                            fp)))
        assert r.code == ResponseCode.SUCCESS
        assert r.ext_fields["IS_SUPPORT_HEART_BEAT_V2"] == "true" and r.ext_fields["IS_SUB_CHANGE"] == "false"
        sub = b.consumers.subscription("cg", "T")
        assert sub is not None and sub.sub_string == "a || b"

        # Then the fingerprint alone: no subscriptions on the wire, and the broker keeps those it has.
        lean = full.without_subscriptions(fp)
        raw = json.loads(lean.encode())
        assert raw["withoutSub"] is True and raw["heartbeatFingerprint"] == fp
        assert raw["consumerDataSet"][0]["subscriptionDataSet"] == []
        r = await c1.invoke(b.addr, heartbeat(lean))
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["IS_SUB_CHANGE"] == "false"
        sub = b.consumers.subscription("cg", "T")
        assert sub is not None and sub.sub_string == "a || b"

        # Another member whose heartbeat has the same fingerprint joins with the fingerprint alone.
        r = await c2.invoke(b.addr, heartbeat(HeartbeatData("c2", ("pg",), lean.consumers, fp, True)))
        assert r.ext_fields["IS_SUB_CHANGE"] == "false"
        assert b.consumers.client_ids("cg") == ["c1", "c2"]

        # A fingerprint the broker was never given in full: it asks for the full heartbeat (and keeps the subs).
        r = await c2.invoke(b.addr, heartbeat(HeartbeatData("c2", ("pg",), lean.consumers, fp + 1, True)))
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["IS_SUB_CHANGE"] == "true"
        sub = b.consumers.subscription("cg", "T")
        assert sub is not None and sub.sub_string == "a || b"

        # A changed subscription comes in full; the old fingerprint no longer stands for the group.
        changed = HeartbeatData("c1", ("pg",), (consumer("cg", "T", "c"),))
        fp2 = changed.compute_fingerprint()
        assert fp2 != fp
        r = await c1.invoke(b.addr, heartbeat(HeartbeatData("c1", ("pg",), changed.consumers, fp2)))
        assert r.ext_fields["IS_SUB_CHANGE"] == "false"
        sub = b.consumers.subscription("cg", "T")
        assert sub is not None and sub.sub_string == "c"
        r = await c2.invoke(b.addr, heartbeat(lean.__class__("c2", ("pg",), lean.consumers, fp, True)))
        assert r.ext_fields["IS_SUB_CHANGE"] == "true"

        # A restarted broker does not know the group: the fingerprint alone is not enough there.
        await b.stop()
        b2 = await start_broker(tmp_path / "b")
        r = await c1.invoke(b2.addr, heartbeat(changed.without_subscriptions(fp2)))
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["IS_SUB_CHANGE"] == "true"
        r = await c1.invoke(b2.addr, heartbeat(HeartbeatData("c1", ("pg",), changed.consumers, fp2)))
        assert r.ext_fields["IS_SUB_CHANGE"] == "false"
        r = await c1.invoke(b2.addr, heartbeat(changed.without_subscriptions(fp2)))
        assert r.ext_fields["IS_SUB_CHANGE"] == "false"
        sub = b2.consumers.subscription("cg", "T")
        assert sub is not None and sub.sub_string == "c"
    finally:
        await c1.close()
        await c2.close()


async def test_4x_full_heartbeat_still_works(start_broker: StartBroker, client: RemotingClient,
                                             tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    # What a 4.x client (the C++ one, Java 4.9) sends: no heartbeatFingerprint, no withoutSub.
    body = json.dumps({"clientID": "cpp@1", "producerDataSet": [{"groupName": "pg"}], "consumerDataSet": [
        {"groupName": "cg", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False, "subscriptionDataSet": [
             {"topic": "T", "subString": "x", "subVersion": 1, "expressionType": "TAG", "tagsSet": ["x"],
              "codeSet": []}]}]}).encode()
    assert HeartbeatData.decode(body).fingerprint == 0
    r = await client.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, body))
    assert r.code == ResponseCode.SUCCESS
    assert r.ext_fields["IS_SUB_CHANGE"] == "true"  # as RocketMQ 5 answers a v1 heartbeat
    sub = b.consumers.subscription("cg", "T")
    assert sub is not None and sub.sub_string == "x"
    assert b.consumers.client_ids("cg") == ["cpp@1"]
    # and our encoding of a heartbeat without a fingerprint is the 4.x one
    assert b"heartbeatFingerprint" not in HeartbeatData("c", ("pg",), (consumer("cg"),)).encode()
    # a withoutSub flag without a fingerprint is not v2: the (empty) subscriptions are taken as they are
    r = await client.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, json.dumps(
        {"clientID": "cpp@1", "consumerDataSet": [{"groupName": "cg"}], "withoutSub": True}).encode()))
    assert r.code == ResponseCode.SUCCESS and b.consumers.subscription("cg", "T") is None


def test_heartbeat_v2_fields_as_rocketmq_5_writes_them() -> None:
    # A Java 5.x client's body (fastjson names isWithoutSub "withoutSub"; the fingerprint is a signed int)
    java = (b'{"clientID":"10.1.5.9@40700#1","consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_PASSIVELY",'
            b'"messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[],'
            b'"unitMode":false}],"heartbeatFingerprint":-1187411733,"producerDataSet":[],"withoutSub":true}')
    data = HeartbeatData.decode(java)
    assert data.fingerprint == -1187411733 and data.without_sub and data.consumers[0].subscriptions == ()
    again = HeartbeatData.decode(data.encode())
    assert (again.fingerprint, again.without_sub) == (data.fingerprint, True)
    # the fingerprint leaves out the client id and the subscriptions' versions, and is never 0
    a = HeartbeatData("a", ("pg",), (ConsumerData("cg", subscriptions=(SubscriptionData("T", "x", 1),)),))
    b = HeartbeatData("b", ("pg",), (ConsumerData("cg", subscriptions=(SubscriptionData("T", "x", 2),)),))
    c = HeartbeatData("a", ("pg",), (ConsumerData("cg", subscriptions=(SubscriptionData("T", "y", 1),)),))
    assert a.compute_fingerprint() == b.compute_fingerprint() != c.compute_fingerprint()
    assert a.compute_fingerprint() != 0 and -(1 << 31) <= a.compute_fingerprint() < 1 << 31


async def test_unregister_takes_out_only_the_callers_own_registration(start_broker: StartBroker) -> None:
    """UNREGISTER_CLIENT removed every channel of the named client id, whichever connection it came on: any peer
    could take a live consumer (its id is in GET_CONSUMER_LIST_BY_GROUP's answer) or producer out of its group,
    the group rebalancing its queues away while it still consumed them. As RocketMQ, a request now leaves only
    for the connection it came on."""
    b = await start_broker()
    victim = RemotingClient()
    try:
        r = await victim.invoke(b.addr, make_request(RequestCode.HEART_BEAT, {}, HeartbeatData(
            "victim", ("pg",), (consumer("cg"),)).encode()))
        assert r.code == ResponseCode.SUCCESS
        async with RemotingClient() as other:
            r = await other.invoke(b.addr, make_request(RequestCode.UNREGISTER_CLIENT, {
                "clientID": "victim", "consumerGroup": "cg", "producerGroup": "pg"}))
            assert r.code == ResponseCode.SUCCESS
        assert b.consumers.client_ids("cg") == ["victim"] and b.producers.any_channel("pg") is not None
        r = await victim.invoke(b.addr, make_request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": "victim", "consumerGroup": "cg", "producerGroup": "pg"}))
        assert r.code == ResponseCode.SUCCESS
        assert b.consumers.client_ids("cg") == [] and b.producers.any_channel("pg") is None
    finally:
        await victim.close()


async def test_a_member_whose_transport_is_closing_does_not_stop_the_others_being_told(
        start_broker: StartBroker, tmp_path: Path) -> None:
    """A transport the event loop has begun to close (a failed write) is closing until connection_lost runs in a
    later turn, and its member is still in the group meanwhile: the notice to it raised, which failed whatever had
    changed the group (a heartbeat answered SYSTEM_ERROR, a closing connection's cleanup cut short) and left the
    members after it untold."""
    b = await start_broker(tmp_path / "b", notify_consumer_ids_changed_window_ms=0)
    a, c, d = Member("a"), Member("c"), Member("d")
    try:
        for m in (a, c, d):
            await m.join(b.addr)
        conns = {ch.client_id: conn for conn, ch in b.consumers.groups["cg"].channels.items()}
        transport = conns["a"]._transport
        assert transport is not None
        d.noticed.clear()
        # in one loop turn, as it happens: the loop closes a's transport, then c leaves (its UNREGISTER_CLIENT)
        transport.close()
        assert not conns["a"].closed
        b.consumers.unregister("cg", "c", conns["c"])
        await asyncio.wait_for(d.noticed.wait(), 5)
    finally:
        for m in (a, c, d):
            await m.client.close()
