"""The send path's shortcuts (batch-level skip of the delay/timer/transaction checks, a held pull answered
synchronously) keep the behaviour of the per-message path: over real sockets against a real broker."""

from __future__ import annotations

import asyncio

from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id

from .conftest import StartBroker, props, pull_request, send_request


async def test_batch_with_a_delay_level_is_still_scheduled(start_broker: StartBroker,
                                                          client: RemotingClient) -> None:
    b = await start_broker()
    body = encode_batch([(b"plain", {"UNIQ_KEY": "P0"}, 0), (b"later", {"UNIQ_KEY": "P1", "DELAY": "1"}, 0)])
    r = await client.invoke(b.addr, send_request("FastT", body, 0, batch="1"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, pull_request("FastT", 0, 0))
    # Only the plain message is visible now; the delayed one went to the schedule topic.
    assert [x.body for x in iter_records(r.body)] == [b"plain"]
    assert b.store.max_offset("SCHEDULE_TOPIC_XXXX", 0) == 1


async def test_batch_marker_in_a_body_is_no_property(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    # The property names appear in the bodies, not as properties: nothing is delayed or refused (only each item's
    # properties are searched for them, so the batch stays on the plain path).
    bodies = [b"DELAY\x01 in a body", b"TIMER_DELIVER_MS", b"TRAN_MSG\x01true"]
    body = encode_batch([(x, {"UNIQ_KEY": f"M{i}", "TAGS": "t"}, 7) for i, x in enumerate(bodies)])
    r = await client.invoke(b.addr, send_request("FastT2", body, 1, batch="1"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    ids = r.ext_fields["msgId"].split(",")
    r = await client.invoke(b.addr, pull_request("FastT2", 0, 1))
    recs = list(iter_records(r.body, check_crc=True))
    assert [x.body for x in recs] == bodies
    assert [x.properties["UNIQ_KEY"] for x in recs] == ["M0", "M1", "M2"]
    assert [x.flag for x in recs] == [7, 7, 7] and [x.tags for x in recs] == ["t", "t", "t"]
    assert [decode_offset_msg_id(i).offset for i in ids] == [x.physical_offset for x in recs]


async def test_transactional_batch_is_still_refused(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    body = encode_batch([(b"a", {"UNIQ_KEY": "T0"}, 0), (b"b", {"UNIQ_KEY": "T1", "TRAN_MSG": "true"}, 0)])
    r = await client.invoke(b.addr, send_request("FastT3", body, 0, batch="1"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "transactional" in (r.remark or "")
    assert b.store.max_offset("FastT3", 0) == 0


async def test_single_timer_send_still_gets_a_recall_handle(start_broker: StartBroker,
                                                            client: RemotingClient) -> None:
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("FastT4", b"x", 0, props(UNIQ_KEY="U1", TIMER_DELAY_SEC="60")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields.get("recallHandle")
    r = await client.invoke(b.addr, send_request("FastT4", b"y", 0, props(UNIQ_KEY="U2")))
    assert r.code == ResponseCode.SUCCESS and "recallHandle" not in r.ext_fields


async def test_held_pull_is_answered_by_an_arrival(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    await client.invoke(b.addr, send_request("FastT5", b"first", 0))
    held = asyncio.ensure_future(client.invoke(b.addr, pull_request("FastT5", 1, 0, suspend_ms=20000), 30))
    for _ in range(200):
        if b.hold.held_count:
            break
        await asyncio.sleep(0.01)
    assert b.hold.held_count == 1
    r = await client.invoke(b.addr, send_request("FastT5", b"second", 0))
    assert r.code == ResponseCode.SUCCESS
    answer = await asyncio.wait_for(held, 10)  # generous: a lost wake-up would wait the 20 s suspend
    assert answer.code == ResponseCode.SUCCESS
    assert [x.body for x in iter_records(answer.body)] == [b"second"]
    assert b.hold.held_count == 0 and b.hold.woken_by_arrival >= 1
