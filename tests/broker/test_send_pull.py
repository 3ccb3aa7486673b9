"""Send and pull over real sockets, with the broker's answers for good and bad requests."""

from __future__ import annotations

import asyncio
import time
import zlib

from cometmq.broker.filters import tag_filter_for
from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import make_request

from .conftest import StartBroker, create_topics, props, pull_request, send_request


async def test_send_then_pull(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("T1", b"hello", 1, props(TAGS="a", UNIQ_KEY="U1", KEYS="k1")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields["queueId"] == "1" and r.ext_fields["queueOffset"] == "0"
    mid = decode_offset_msg_id(r.ext_fields["msgId"])
    assert (mid.host, mid.port, mid.offset) == ("127.0.0.1", int(b.addr.split(":")[1]), 0)
    r = await client.invoke(b.addr, pull_request("T1", 0, 1))
    assert r.code == ResponseCode.SUCCESS
    assert (r.ext_fields["nextBeginOffset"], r.ext_fields["minOffset"], r.ext_fields["maxOffset"]) == ("1", "0", "1")
    [rec] = list(iter_records(r.body, check_crc=True))
    assert (rec.topic, rec.body, rec.queue_id, rec.queue_offset, rec.tags) == ("T1", b"hello", 1, 0, "a")
    assert rec.store_host == ("127.0.0.1", int(b.addr.split(":")[1]))
    assert rec.physical_offset == 0


async def test_v2_header_and_batches(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    h = SendMessageRequestHeader(producer_group="pg", topic="T2", queue_id=0, properties=props(TAGS="v2"))
    r = await client.invoke(b.addr, make_request(RequestCode.SEND_MESSAGE_V2, send_header_to_v2(h), b"v2-body"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    body = encode_batch([(f"m{i}".encode(), {"UNIQ_KEY": f"B{i}", "TAGS": "bt"}, 0) for i in range(5)])
    for flag in ("1", "true"):
        r = await client.invoke(b.addr, send_request("T2", body, 0, batch=flag))
        assert r.code == ResponseCode.SUCCESS and len(r.ext_fields["msgId"].split(",")) == 5
    r = await client.invoke(b.addr, send_request("T2", zlib.compress(body), 0, batch="1", sysFlag=1))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, pull_request("T2", 0, 0))
    recs = list(iter_records(r.body))
    assert [x.body for x in recs] == [b"v2-body"] + [f"m{i}".encode() for i in range(5)] * 3
    assert all(x.sys_flag & 1 == 0 for x in recs)
    assert [x.queue_offset for x in recs] == list(range(16))


async def test_bad_sends_are_refused_with_a_remark(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(auto_create_topic_enable=False)
    r = await client.invoke(b.addr, send_request("NoSuchTopic", b"x"))
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in (r.remark or "")
    r = await client.invoke(b.addr, send_request("bad topic!", b"x"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "topic" in (r.remark or "")
    # A name ending in a newline passed the name check (a regex whose $ matches before a final newline), and the
    # topic was created with it (an operator's UPDATE_AND_CREATE_TOPIC, a send with auto-creation).
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "Newline\n", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}))
    assert r.code != ResponseCode.SUCCESS and "letters, digits" in (r.remark or ""), r.remark
    assert "Newline\n" not in b.topics.topics
    r = await client.invoke(b.addr, send_request("T", b"x", queueId="zero"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "queueId" in (r.remark or "")
    # A reserved topic (RocketMQ's TopicValidator.isNotAllowedSendTopic) refuses client sends (issue [15]).
    r = await client.invoke(b.addr, send_request("SELF_TEST_TOPIC", b"x"))
    assert r.code == ResponseCode.NO_PERMISSION and "forbidden" in (r.remark or "")
    b.topics.create_system_topic("Known", 1)
    r = await client.invoke(b.addr, send_request("Known", b"x", queue_id=7))
    assert r.code == ResponseCode.SYSTEM_ERROR and "out of range" in (r.remark or "")
    r = await client.invoke(b.addr, send_request("Known", b"x" * (256 * 1024 + 1)))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    r = await client.invoke(b.addr, send_request("Known", b"junk", batch="1"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "batch" in (r.remark or "")
    assert b.store.commitlog.max_offset == 0
    # The server is still there and works.
    r = await client.invoke(b.addr, send_request("Known", b"fine"))
    assert r.code == ResponseCode.SUCCESS


async def test_pull_statuses(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    for i in range(3):
        await client.invoke(b.addr, send_request("P", f"{i}".encode(), 0, props(TAGS="A" if i != 1 else "B")))
    r = await client.invoke(b.addr, pull_request("P", 0, subscription="A"))
    assert [x.body for x in iter_records(r.body)] == [b"0", b"2"]
    r = await client.invoke(b.addr, pull_request("P", 1, subscription="B || C", sys_flag=4))
    assert [x.body for x in iter_records(r.body)] == [b"1"]
    r = await client.invoke(b.addr, pull_request("P", 3, sys_flag=4))
    assert r.code == ResponseCode.PULL_NOT_FOUND and r.ext_fields["nextBeginOffset"] == "3"
    r = await client.invoke(b.addr, pull_request("P", 100, sys_flag=4))
    assert r.code == ResponseCode.PULL_OFFSET_MOVED and r.ext_fields["maxOffset"] == "3"
    r = await client.invoke(b.addr, pull_request("Missing", 0, sys_flag=4))
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    r = await client.invoke(b.addr, pull_request("P", 0, queue_id=9, sys_flag=4))
    assert r.code == ResponseCode.SYSTEM_ERROR
    r = await client.invoke(b.addr, pull_request("P", 0, sys_flag=0))  # no subscription known for the group
    assert r.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


async def test_tag_expressions_are_trimmed_as_java_trims(start_broker: StartBroker, client: RemotingClient) -> None:
    # RocketMQ (FilterAPI) splits on "||" and String.trim()s each tag: chars <= ' ' go, other white space stays.
    b = await start_broker()
    tags = ["A", "A\u3000", "A\xa0", "B"]
    for i, tag in enumerate(tags):
        await client.invoke(b.addr, send_request("JT", str(i).encode(), 0, props(TAGS=tag)))
    for expression, wanted in [("A\u3000", [b"1"]), ("\xa0A\xa0 || A\xa0", [b"2"]),
                               ("A\x00 || \x01B\x1b", [b"0", b"3"]), ("\tA\u3000 ||\x0bA\n", [b"0", b"1"])]:
        r = await client.invoke(b.addr, pull_request("JT", 0, subscription=expression, sys_flag=4))
        assert [x.body for x in iter_records(r.body)] == wanted, repr(expression)


async def test_huge_tag_expression_is_refused_at_once(start_broker: StartBroker, client: RemotingClient) -> None:
    # A tag expression of 1,000,000 tags took ~5 s of the event loop, and up to 1,024 such filters stayed cached.
    b = await start_broker()
    await client.invoke(b.addr, send_request("HT", b"x", 0, props(TAGS="A")))
    huge = " || ".join(f"{i:x}" for i in range(1_000_000))
    start = time.monotonic()
    r = await client.invoke(b.addr, pull_request("HT", 0, subscription=huge, sys_flag=4), 30)
    assert time.monotonic() - start < 3  # typically a few ms; the bound catches only the stall
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "longer than" in (r.remark or "") and len(r.remark or "") < 1000
    # Ever-new long expressions: only a few stay cached; a short one stays meanwhile.
    short = tag_filter_for("A || B")
    first = tag_filter_for(" || ".join(f"0-{j}" for j in range(300)))
    for i in range(1, 40):
        tag_filter_for(" || ".join(f"{i}-{j}" for j in range(300)))
    assert tag_filter_for(" || ".join(f"0-{j}" for j in range(300))) is not first
    assert tag_filter_for("A || B") is short
    r = await client.invoke(b.addr, pull_request("HT", 0, subscription="B || A", sys_flag=4))
    assert [x.body for x in iter_records(r.body)] == [b"x"]


async def test_long_poll_is_woken_by_the_arrival(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    await client.invoke(b.addr, send_request("L", b"first"))
    held = asyncio.ensure_future(client.invoke(b.addr, pull_request("L", 1, suspend_ms=20_000), 30))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    await client.invoke(b.addr, send_request("L", b"second"))
    r = await asyncio.wait_for(held, 10)
    waited = time.perf_counter() - t0
    assert r.code == ResponseCode.SUCCESS and [x.body for x in iter_records(r.body)] == [b"second"]
    assert waited < 2.0  # woken by the arrival, not by the 5 s re-check or the 20 s timeout
    assert b.hold.woken_by_arrival == 1 and b.hold.woken_by_check == 0


async def test_long_poll_ignores_non_matching_tags_and_times_out(start_broker: StartBroker,
                                                                 client: RemotingClient) -> None:
    b = await start_broker()
    await client.invoke(b.addr, send_request("F", b"x", 0, props(TAGS="A")))
    held = asyncio.ensure_future(client.invoke(b.addr, pull_request("F", 1, subscription="B", suspend_ms=700), 10))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.005)
    await client.invoke(b.addr, send_request("F", b"y", 0, props(TAGS="A")))
    await asyncio.sleep(0.1)
    assert not held.done()
    r = await asyncio.wait_for(held, 10)
    assert r.code in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND)
    assert r.ext_fields["nextBeginOffset"] == "2"
    assert b.hold.woken_by_timeout == 1


async def test_short_polling_answers_after_the_short_interval(start_broker: StartBroker,
                                                              client: RemotingClient) -> None:
    b = await start_broker(long_polling_enable=False, short_polling_time_ms=300)
    await client.invoke(b.addr, send_request("S", b"x"))
    t0 = time.perf_counter()
    r = await client.invoke(b.addr, pull_request("S", 1, suspend_ms=15_000), 10)
    elapsed = time.perf_counter() - t0
    assert r.code == ResponseCode.PULL_NOT_FOUND
    assert 0.25 < elapsed < 5


async def test_held_pull_of_a_closed_connection_is_dropped(start_broker: StartBroker) -> None:
    b = await start_broker()
    c = RemotingClient()
    await c.invoke(b.addr, send_request("D", b"x"))
    fut = asyncio.ensure_future(c.invoke(b.addr, pull_request("D", 1, suspend_ms=20_000), 30))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.005)
    await c.close()
    for _ in range(200):
        if b.hold.held_count == 0:
            break
        await asyncio.sleep(0.01)
    assert b.hold.held_count == 0
    fut.cancel()
    client2 = RemotingClient()
    r = await client2.invoke(b.addr, send_request("D", b"y"))
    assert r.code == ResponseCode.SUCCESS
    await client2.close()


async def test_many_long_polls_on_one_connection_leave_nothing_behind(start_broker: StartBroker,
                                                                      client: RemotingClient) -> None:
    b = await start_broker()
    await client.invoke(b.addr, send_request("M", b"0"))
    for i in range(1, 40):
        held = asyncio.ensure_future(client.invoke(b.addr, pull_request("M", i, suspend_ms=20_000), 30))
        while b.hold.held_count == 0:
            await asyncio.sleep(0.002)
        await client.invoke(b.addr, send_request("M", f"{i}".encode()))
        r = await asyncio.wait_for(held, 10)
        assert [x.body for x in iter_records(r.body)] == [f"{i}".encode()]
    conn = next(iter(b.server.connections))  # type: ignore[union-attr]
    assert len(conn._close_callbacks) < 5  # a fixed few, not one per held pull (39 here)
    assert all(not held for held in b.hold._by_conn.values())


async def test_one_connection_holds_at_most_its_cap_of_pulls(start_broker: StartBroker, client: RemotingClient) -> None:
    """A held pull's handler has returned, so the connection's cap on handlers in flight did not count it, and its
    timeout is the client's (here 31 years): one connection could pile up held pulls without bound, ~1.8 KB of the
    broker's memory for each 315-byte request, for as long as it stayed connected. Beyond the cap a pull is
    answered at once, as one that asked for no suspending."""
    from cometmq.net.connection import DEFAULT_MAX_INFLIGHT
    from cometmq.protocol.remoting import FrameDecoder, encode

    b = await start_broker()
    await client.invoke(b.addr, send_request("H", b"first"))
    cap = DEFAULT_MAX_INFLIGHT  # (the hold service's default cap: the connection's on handlers in flight)
    n = cap + 200
    host, port = b.addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"".join(encode(pull_request("H", 1, suspend_ms=10**12)) for _ in range(n)))
        await writer.drain()
        decoder, answers = FrameDecoder(), []
        deadline = time.monotonic() + 60
        while b.hold.held_count + len(answers) < n and time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(1 << 16), 0.2)
            except TimeoutError:
                continue
            answers.extend(decoder.feed(chunk))
        assert b.hold.held_count == cap
        assert len(answers) == n - cap and {a.code for a in answers} == {ResponseCode.PULL_NOT_FOUND}
    finally:
        writer.close()
    for _ in range(200):  # its held pulls go with the connection
        if b.hold.held_count == 0:
            break
        await asyncio.sleep(0.01)
    assert b.hold.held_count == 0


async def test_a_batch_to_a_retry_topic_is_refused(start_broker: StartBroker, client: RemotingClient) -> None:
    """As RocketMQ's sendBatchMessage: MESSAGE_ILLEGAL, nothing stored (it was stored, each item under the
    header's reconsumeTimes). A single send to a retry topic is still taken."""
    b = await start_broker()
    body = encode_batch([(f"m{i}".encode(), {"UNIQ_KEY": f"B{i}"}, 0) for i in range(2)])
    r = await client.invoke(b.addr, send_request("%RETRY%cg", body, 0, batch="1"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "retry" in (r.remark or ""), (r.code, r.remark)
    assert b.store.commitlog.max_offset == 0
    r = await client.invoke(b.addr, send_request("%RETRY%cg", b"one", 0))
    assert r.code == ResponseCode.SUCCESS, r.remark


async def test_numbers_past_their_java_type_are_refused_and_change_nothing(start_broker: StartBroker,
                                                                           client: RemotingClient) -> None:
    """Every numeric header field is an int or a long in RocketMQ's header classes, which cannot read a value past
    it: the broker refuses one at the header parser, with the request's bad-request code and a remark naming the
    field and the range, whatever path the request takes (the single send's fast reader leaves it to the parser)."""
    b = await start_broker()
    await create_topics(client, b.addr, "TR")
    assert (await client.invoke(b.addr, send_request("TR", b"kept", 0))).code == ResponseCode.SUCCESS
    group = {"consumerGroup": "cg", "topic": "TR", "queueId": "0"}
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {**group, "commitOffset": "1"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    stored, topics = b.store.commitlog.max_offset, set(b.topics.topics)
    v2 = send_header_to_v2(SendMessageRequestHeader(producer_group="pg", topic="TR", queue_id=0))
    java_int, java_long = "int [-2147483648, 2147483647]", "long [-9223372036854775808, 9223372036854775807]"
    pop = {**group, "queueId": "-1", "maxMsgNums": "1", "pollTime": "0", "bornTime": "0", "initMode": "0"}
    cases = [  # request code, extFields, body, the field's name, its bad value, its Java type
        (RequestCode.SEND_MESSAGE_V2, {**v2, "e": str(2**40)}, b"x", "queueId", 2**40, java_int),
        # (taken as -1, "any queue", and stored)
        (RequestCode.SEND_MESSAGE_V2, {**v2, "e": str(-(2**40))}, b"x", "queueId", -(2**40), java_int),
        # (these three reached the commit log's struct.pack: SYSTEM_ERROR and a logged traceback)
        (RequestCode.SEND_MESSAGE_V2, {**v2, "f": str(2**31)}, b"x", "sysFlag", 2**31, java_int),
        (RequestCode.SEND_MESSAGE_V2, {**v2, "h": str(-(2**31) - 1)}, b"x", "flag", -(2**31) - 1, java_int),
        (RequestCode.SEND_MESSAGE, send_request("TR", b"x", 0, bornTimestamp=str(2**63)).ext_fields, b"x",
         "bornTimestamp", 2**63, java_long),
        (RequestCode.PULL_MESSAGE, pull_request("TR", 0, maxMsgNums=str(10**30)).ext_fields, b"",
         "maxMsgNums", 10**30, java_int),
        (RequestCode.PULL_MESSAGE, pull_request("TR", 5, suspendTimeoutMillis=str(10**20)).ext_fields, b"",
         "suspendTimeoutMillis", 10**20, java_long),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {**group, "commitOffset": str(2**63)}, b"", "commitOffset", 2**63,
         java_long),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {**group, "commitOffset": "2", "queueId": str(2**32)}, b"", "queueId",
         2**32, java_int),
        (RequestCode.QUERY_CONSUMER_OFFSET, {**group, "queueId": str(2**32)}, b"", "queueId", 2**32, java_int),
        (RequestCode.POP_MESSAGE, {**pop, "invisibleTime": str(2**64)}, b"", "invisibleTime", 2**64, java_long),
    ]
    for code, ext, body, key, bad, java_type in cases:
        r = await client.invoke(b.addr, make_request(code, ext, body), timeout=5)
        # (the codes the dispatch answers a malformed header of each request with: codes.bad_request_code)
        want = ResponseCode.MESSAGE_ILLEGAL if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2,
                                                        RequestCode.POP_MESSAGE) else ResponseCode.SYSTEM_ERROR
        assert (r.code, r.remark) == (want, f"header field {key!r} = '{bad}' is out of range for a Java {java_type}")
    # nothing stored, committed, held or created; in-range values (the largest int) are served
    assert (b.store.commitlog.max_offset, set(b.topics.topics), b.hold.held_count) == (stored, topics, 0)
    r = await client.invoke(b.addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, group))
    assert (r.code, r.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "1")
    r = await client.invoke(b.addr, make_request(RequestCode.SEND_MESSAGE_V2, {**v2, "h": str(2**31 - 1)}, b"x"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, pull_request("TR", 0, maxMsgNums=str(2**31 - 1)))
    assert [(x.body, x.flag) for x in iter_records(r.body)] == [(b"kept", 0), (b"x", 2**31 - 1)]
