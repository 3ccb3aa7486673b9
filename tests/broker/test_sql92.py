"""SQL92 property filters on the broker: only matching messages cross the network, and only matching
arrivals wake a held pull."""

from __future__ import annotations

import asyncio
import time

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import iter_records

from .conftest import StartBroker, props, pull_request, send_request


async def test_sql92_pull_filters_on_properties(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker(enable_property_filter=True)
    for i in range(10):
        extra = {"a": str(i)} if i != 3 else {}
        await client.invoke(b.addr, send_request("S", f"m{i}".encode(), 0, props(region="eu" if i % 2 else "us",
                                                                                  **extra)))
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a BETWEEN 2 AND 6 AND region = 'eu'",
                                                 sys_flag=4, expressionType="SQL92"))
    assert r.code == ResponseCode.SUCCESS
    assert [x.body for x in iter_records(r.body)] == [b"m5"]  # m3 has no 'a': BETWEEN a NULL is unknown
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a IS NULL", sys_flag=4,
                                                 expressionType="SQL92"))
    assert [x.body for x in iter_records(r.body)] == [b"m3"]
    # RocketMQ's lopsided NULL: '<>' with the missing property on its right is TRUE, on its left unknown
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="'7' <> a AND region = 'eu'", sys_flag=4,
                                                 expressionType="SQL92"))
    assert [x.body for x in iter_records(r.body)] == [b"m1", b"m3", b"m5", b"m9"]
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a <> '7' AND region = 'eu'", sys_flag=4,
                                                 expressionType="SQL92"))
    assert [x.body for x in iter_records(r.body)] == [b"m1", b"m5", b"m9"]
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a > 100", sys_flag=4, expressionType="SQL92"))
    assert r.code == ResponseCode.PULL_RETRY_IMMEDIATELY and r.ext_fields["nextBeginOffset"] == "10"
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a >", sys_flag=4, expressionType="SQL92"))
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "SQL92" in (r.remark or "")


async def test_sql92_needs_the_broker_switch(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    await client.invoke(b.addr, send_request("S", b"x"))
    r = await client.invoke(b.addr, pull_request("S", 0, subscription="a = 1", sys_flag=4, expressionType="SQL92"))
    assert r.code == ResponseCode.SYSTEM_ERROR and "enablePropertyFilter" in (r.remark or "")


async def test_held_sql92_pull_wakes_only_for_matching_arrivals(start_broker: StartBroker,
                                                                client: RemotingClient) -> None:
    b = await start_broker(enable_property_filter=True)
    await client.invoke(b.addr, send_request("W", b"first"))
    held = asyncio.ensure_future(client.invoke(
        b.addr, pull_request("W", 1, subscription="kind = 'wanted'", suspend_ms=20_000, expressionType="SQL92"), 30))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.005)
    await client.invoke(b.addr, send_request("W", b"other", 0, props(kind="other")))
    await asyncio.sleep(0.1)
    assert not held.done() and b.hold.woken_by_arrival == 0
    await client.invoke(b.addr, send_request("W", b"match", 0, props(kind="wanted")))
    r = await asyncio.wait_for(held, 10)
    assert [x.body for x in iter_records(r.body)] == [b"match"]
    assert b.hold.woken_by_arrival == 1


async def test_huge_sql92_expression_is_refused_at_once(start_broker: StartBroker, client: RemotingClient) -> None:
    # A 4 MB IN list took ~5 s of the event loop to compile, and up to 1,024 such filters stayed cached.
    b = await start_broker(enable_property_filter=True)
    await client.invoke(b.addr, send_request("H", b"x", 0, props(a="x")))
    huge = "a IN (" + ",".join(["'x'"] * 1_000_000) + ")"
    start = time.monotonic()
    r = await client.invoke(b.addr, pull_request("H", 0, subscription=huge, sys_flag=4, expressionType="SQL92"), 30)
    assert time.monotonic() - start < 3  # typically a few ms; the bound catches only the stall
    assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "longer than" in (r.remark or "") and len(r.remark or "") < 1000
    r = await client.invoke(b.addr, pull_request("H", 0, subscription="a IN ('x')", sys_flag=4,
                                                 expressionType="SQL92"))
    assert [x.body for x in iter_records(r.body)] == [b"x"]


async def test_a_failed_evaluation_skips_the_message(start_broker: StartBroker, client: RemotingClient) -> None:
    # RocketMQ's evaluation throws for a property that does not convert ('x' against 5) and for TRUE = a; its
    # broker then skips the message, whatever the rest of the expression says. OR stops at a TRUE left side.
    b = await start_broker(enable_property_filter=True)
    for i, kv in enumerate([{"a": "9"}, {"a": "x", "kind": "wanted"}, {"a": "2", "kind": "wanted"}, {"kind": "wanted"},
                            {"a": "true", "kind": "wanted"}]):
        await client.invoke(b.addr, send_request("E", f"m{i}".encode(), 0, props(**kv)))

    async def pulled(expression: str) -> list[bytes]:
        r = await client.invoke(b.addr, pull_request("E", 0, subscription=expression, sys_flag=4,
                                                     expressionType="SQL92"))
        return [x.body for x in iter_records(r.body)] if r.code == ResponseCode.SUCCESS else []

    assert await pulled("a > 5 OR kind = 'wanted'") == [b"m0", b"m2", b"m3"]
    assert await pulled("kind = 'wanted' OR a > 5") == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert await pulled("TRUE = a OR kind = 'wanted'") == [b"m3"]  # a missing: TRUE = a is FALSE
    assert await pulled("a = TRUE OR kind = 'wanted'") == [b"m1", b"m2", b"m3", b"m4"]

    # a held pull is not woken by an arrival whose evaluation fails, and is by one that matches
    held = asyncio.ensure_future(client.invoke(
        b.addr, pull_request("E", 5, subscription="a > 5 OR kind = 'wanted'", suspend_ms=20_000,
                             expressionType="SQL92"), 30))
    while b.hold.held_count == 0:
        await asyncio.sleep(0.005)
    await client.invoke(b.addr, send_request("E", b"bad", 0, props(a="x", kind="wanted")))
    await asyncio.sleep(0.1)
    assert not held.done() and b.hold.woken_by_arrival == 0
    await client.invoke(b.addr, send_request("E", b"good", 0, props(a="7")))
    r = await asyncio.wait_for(held, 10)
    assert [x.body for x in iter_records(r.body)] == [b"good"]
