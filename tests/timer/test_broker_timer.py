"""Timer messages through the broker: every send path, the recall handle, RECALL_MESSAGE (370),
GET_TIMER_METRICS, long polling woken by a delivery, a restart, the service built on first use, and broker.conf
keys."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cometmq.broker.config import broker_config_from_properties
from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2
from cometmq.protocol.message import MessageRecord, iter_records
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, encode_properties
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.timer.message import REPUT_GROWTH, TIMER_OUT_MS, TIMER_ROLL_TIMES, TIMER_TOPIC, RecallHandle
from tests.broker.conftest import StartBroker, props, pull_request, send_request
from tests.kit import eventually


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def pull_all(client: RemotingClient, addr: str, topic: str, queue_id: int = 0,
                   suspend_ms: int = 0) -> list[MessageRecord]:
    out: list[MessageRecord] = []
    offset = 0
    while True:
        sys_flag = 6 if suspend_ms and not out else 4
        r = await client.invoke(addr, pull_request(topic, offset, queue_id, sys_flag=sys_flag,
                                                   suspend_ms=suspend_ms), timeout=suspend_ms / 1000 + 5)
        if r.code != ResponseCode.SUCCESS:
            return out
        out.extend(iter_records(r.body))
        offset = int(r.ext_fields["nextBeginOffset"])


def recall_request(topic: str, handle: str) -> RemotingCommand:
    return make_request(RequestCode.RECALL_MESSAGE, {"producerGroup": "pg", "topic": topic, "recallHandle": handle})


async def test_send_timer_message_then_long_poll_wakes_on_delivery(start_broker: StartBroker,
                                                                   client: RemotingClient) -> None:
    b = await start_broker()
    sent = now_ms()
    r = await client.invoke(b.addr, send_request("TT", b"later", 1, props(UNIQ_KEY="U1", TAGS="a",
                                                                          TIMER_DELAY_MS="400")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    handle = RecallHandle.decode(r.ext_fields["recallHandle"])
    assert (handle.topic, handle.broker_name, handle.message_id) == ("TT", b.config.broker_name, "U1")
    due = int(handle.timestamp)
    assert sent + 400 <= due <= now_ms() + 400
    assert b.store.max_offset("TT", 1) == 0 and b.store.max_offset(TIMER_TOPIC, 0) == 1
    [rec] = await pull_all(client, b.addr, "TT", 1, suspend_ms=5000)
    got = now_ms()
    assert rec.body == b"later" and rec.uniq_key == "U1" and rec.tags == "a" and rec.queue_id == 1
    assert int(rec.properties[TIMER_OUT_MS]) == due <= rec.store_timestamp
    assert got - due < 1000  # the held pull was woken by the delivery


async def test_v2_and_batch_sends(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    deliver = now_ms() + 300
    h = SendMessageRequestHeader(producer_group="pg", topic="TB", queue_id=0,
                                 properties=props(UNIQ_KEY="V2", TIMER_DELIVER_MS=str(deliver)))
    r = await client.invoke(b.addr, make_request(RequestCode.SEND_MESSAGE_V2, send_header_to_v2(h), b"v2"))
    assert r.code == ResponseCode.SUCCESS and "recallHandle" in r.ext_fields
    body = encode_batch([(f"m{i}".encode(), {"UNIQ_KEY": f"B{i}", "TIMER_DELAY_SEC": "1"}, 0) for i in range(5)])
    r = await client.invoke(b.addr, send_request("TB", body, 0, batch="1"))
    assert r.code == ResponseCode.SUCCESS and "recallHandle" not in r.ext_fields
    assert b.store.max_offset("TB", 0) == 0
    await eventually(lambda: b.store.max_offset("TB", 0) == 6, 5, what="6 messages in TB")
    recs = await pull_all(client, b.addr, "TB")
    assert sorted(x.uniq_key or "" for x in recs) == ["B0", "B1", "B2", "B3", "B4", "V2"]


async def test_delay_level_wins_and_bad_timer_requests_are_refused(start_broker: StartBroker,
                                                                   client: RemotingClient) -> None:
    b = await start_broker(timer_max_delay_sec=3600)
    r = await client.invoke(b.addr, send_request("TD", b"x", 0, props(UNIQ_KEY="L", DELAY="1",
                                                                      TIMER_DELAY_SEC="3000")))
    assert r.code == ResponseCode.SUCCESS and "recallHandle" not in r.ext_fields
    await eventually(lambda: b.store.max_offset("TD", 0) == 1, 5,
                     what="the level-1 delayed message in TD")  # level 1 = 300 ms in these tests
    [rec] = await pull_all(client, b.addr, "TD")
    assert "TIMER_DELAY_SEC" not in rec.properties
    r = await client.invoke(b.addr, send_request("TD", b"x", 0, props(TIMER_DELAY_SEC="3601")))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timerMaxDelaySec" in (r.remark or "")
    r = await client.invoke(b.addr, send_request("TD", b"x", 0, props(TIMER_DELIVER_MS="soon")))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL
    r = await client.invoke(b.addr, send_request("TD", b"x", 0, props(UNIQ_KEY="P", TIMER_DELIVER_MS="1")))
    assert r.code == ResponseCode.SUCCESS and b.store.max_offset("TD", 0) == 2  # past: delivered at once


async def test_a_timer_message_must_leave_room_for_its_roll(start_broker: StartBroker,
                                                             client: RemotingClient) -> None:
    """A roll adds TIMER_ROLL_TIMES and TIMER_SRC_PHY: a message whose properties would then pass the store's limit
    is refused at the send, not acknowledged and then dropped when it rolls."""
    b = await start_broker(timer_precision_ms=100, timer_roll_window_slot=8)  # a 0.8 s window: 2.5 s rolls

    def sized(uniq: str, parked_size: int) -> str:
        base = {"UNIQ_KEY": uniq, "TIMER_DELAY_MS": "2500"}
        parked = {**base, "X": "", TIMER_OUT_MS: "1" * 13, "REAL_TOPIC": "TH", "REAL_QID": "0"}
        return props(**base, X="a" * (parked_size - len(encode_properties(parked))))

    room = MAX_PROPERTIES_LENGTH - REPUT_GROWTH
    for uniq, size in (("NEAR", MAX_PROPERTIES_LENGTH - 30), ("OVER", room + 1)):
        r = await client.invoke(b.addr, send_request("TH", b"x", 0, sized(uniq, size)))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timer message" in (r.remark or ""), (uniq, r.code)
    r = await client.invoke(b.addr, send_request("TH", b"x", 0, sized("FITS", room)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.max_offset(TIMER_TOPIC, 0) == 1
    await eventually(lambda: b.store.max_offset("TH", 0) == 1, 8, what="the message that fits, delivered")
    [rec] = await pull_all(client, b.addr, "TH")
    assert rec.uniq_key == "FITS" and int(rec.properties[TIMER_ROLL_TIMES]) >= 1 and len(rec.properties["X"]) > 32000
    assert b.timer.service is not None and b.timer.service.stats.illegal == 0


async def test_recall_before_due(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("TR", b"x", 0, props(UNIQ_KEY="GONE", TIMER_DELAY_MS="600")))
    r2 = await client.invoke(b.addr, send_request("TR", b"y", 0, props(UNIQ_KEY="STAYS", TIMER_DELAY_MS="600")))
    assert r.code == r2.code == ResponseCode.SUCCESS
    rr = await client.invoke(b.addr, recall_request("TR", r.ext_fields["recallHandle"]))
    assert rr.code == ResponseCode.SUCCESS, rr.remark
    assert rr.ext_fields["msgId"] == "GONE"
    await eventually(lambda: b.store.max_offset("TR", 0) == 1, 5, what="the message in TR")
    await asyncio.sleep(0.3)
    assert [x.uniq_key for x in await pull_all(client, b.addr, "TR")] == ["STAYS"]
    m = await client.invoke(b.addr, make_request(RequestCode.GET_TIMER_METRICS))
    metrics = json.loads(m.body)
    assert (metrics["cancelled"], metrics["delivered"], metrics["scheduled"]) == (1, 1, 0)


async def test_recall_refusals(start_broker: StartBroker, client: RemotingClient) -> None:
    b = await start_broker()
    r = await client.invoke(b.addr, send_request("TQ", b"x", 0, props(UNIQ_KEY="Q", TIMER_DELAY_MS="300")))
    handle = r.ext_fields["recallHandle"]
    other = RecallHandle("TQ", "another-broker", RecallHandle.decode(handle).timestamp, "Q").encode()
    cases = [
        (recall_request("TQ", "not-a-handle"), ResponseCode.ILLEGAL_OPERATION),
        (recall_request("TQ", other), ResponseCode.ILLEGAL_OPERATION),
        (recall_request("NoSuchTopic", handle), ResponseCode.TOPIC_NOT_EXIST),
        (make_request(RequestCode.RECALL_MESSAGE, {"topic": "TQ"}), ResponseCode.SYSTEM_ERROR),
    ]
    await client.invoke(b.addr, send_request("TQ2", b"x", 0))
    cases.append((recall_request("TQ2", handle), ResponseCode.ILLEGAL_OPERATION))  # topic does not match
    for req, code in cases:
        resp = await client.invoke(b.addr, req)
        assert resp.code == code, (req.ext_fields, resp.remark)
    await eventually(lambda: b.store.max_offset("TQ", 0) == 1, 5, what="the message in TQ")
    late = await client.invoke(b.addr, recall_request("TQ", handle))  # after its time
    assert late.code == ResponseCode.ILLEGAL_OPERATION and "timestamp invalid" in (late.remark or "")


async def test_recall_disabled_and_timer_disabled(start_broker: StartBroker, client: RemotingClient,
                                                  tmp_path: Path) -> None:
    b = await start_broker(recall_message_enable=False)
    r = await client.invoke(b.addr, send_request("TX", b"x", 0, props(UNIQ_KEY="X", TIMER_DELAY_MS="5000")))
    rr = await client.invoke(b.addr, recall_request("TX", r.ext_fields["recallHandle"]))
    assert rr.code == ResponseCode.NO_PERMISSION
    b2 = await start_broker(tmp_path / "no-timer", timer_wheel_enable=False)
    r = await client.invoke(b2.addr, send_request("TX", b"x", 0, props(TIMER_DELAY_MS="5000")))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timerWheelEnable" in (r.remark or "")
    r = await client.invoke(b2.addr, send_request("TX", b"x", 0))
    assert r.code == ResponseCode.SUCCESS
    m = await client.invoke(b2.addr, make_request(RequestCode.GET_TIMER_METRICS))
    assert json.loads(m.body) == {"enabled": False}
    assert not b2.timer.built  # (disabled, it is never built)


async def test_the_service_is_built_by_the_first_timer_message_only(start_broker: StartBroker,
                                                                    client: RemotingClient, tmp_path: Path) -> None:
    """An idle broker does not build the timer service (broker/timer_bridge.py): plain sends, pulls and a metrics
    scrape leave it unbuilt, and so does a restart without timer state. The first timer message is answered, then
    builds it, loaded and started; it indexes that message from the timer topic's queue and delivers it once."""
    from cometmq.metrics.collector import BrokerCollector

    path = tmp_path / "first-use"
    b = await start_broker(path)
    assert (await client.invoke(b.addr, send_request("TF", b"plain", 0))).code == ResponseCode.SUCCESS
    assert [x.body for x in await pull_all(client, b.addr, "TF")] == [b"plain"]
    timing = {m.name: m.samples[0].value for m in BrokerCollector(b).collect() if "tim" in m.name}
    assert timing == dict.fromkeys(("rocketmq_timing_messages", "rocketmq_timer_enqueue", "rocketmq_timer_dequeue",
                                    "rocketmq_timer_enqueue_lag"), 0)  # a scrape reads zeros...
    assert not b.timer.built and b.timer.service is None  # ...and builds nothing
    await b.stop()
    b = await start_broker(path)
    assert not b.timer.built  # (no timer state: still not built)
    r = await client.invoke(b.addr, send_request("TF", b"later", 0, props(UNIQ_KEY="F1", TIMER_DELAY_MS="300")))
    assert r.code == ResponseCode.SUCCESS and "recallHandle" in r.ext_fields
    await eventually(lambda: b.timer.built, 5, what="the timer service built")
    assert b.timer.loaded and b.timer.service is not None and b.timer.service.deliver
    await eventually(lambda: b.store.max_offset("TF", 0) == 2, 5, what="the timer message delivered")
    await asyncio.sleep(0.3)
    assert [x.uniq_key for x in await pull_all(client, b.addr, "TF")][1:] == ["F1"]  # once
    timing = {m.name: m.samples[0].value for m in BrokerCollector(b).collect() if "tim" in m.name}
    assert timing["rocketmq_timer_enqueue"] == timing["rocketmq_timer_dequeue"] == 1  # the scrape reads it now


async def test_pending_timers_survive_a_broker_restart_once(start_broker: StartBroker, client: RemotingClient,
                                                            tmp_path: Path) -> None:
    path = tmp_path / "restart"
    b = await start_broker(path)
    for i in range(20):
        r = await client.invoke(b.addr, send_request("TS", b"x", 0, props(UNIQ_KEY=f"S{i}",
                                                                          TIMER_DELAY_MS=str(300 + i * 40))))
        assert r.code == ResponseCode.SUCCESS
    await eventually(lambda: b.store.max_offset("TS", 0) >= 3, 5,
                     what="3 messages in TS before the restart", step=0.001)
    await b.stop()
    b2 = await start_broker(path)
    assert b2.timer.loaded  # the broker holds timer state: the service is built and loaded at the start
    await eventually(lambda: b2.store.max_offset("TS", 0) >= 20, 5, what="20 messages in TS after the restart")
    await asyncio.sleep(0.3)
    keys = [x.uniq_key for x in await pull_all(client, b2.addr, "TS")]
    assert sorted(keys) == sorted(f"S{i}" for i in range(20))


async def test_a_first_build_that_fails_is_tried_again_and_loses_nothing(start_broker: StartBroker,
                                                                          client: RemotingClient) -> None:
    """The wheel's file cannot be opened when the first timer message arrives (a directory in its place): the build
    fails and is logged, the service is not kept half built, and the build is tried again a second later (then
    after 2, 4... s). Once the file can be made it is built, and both messages are delivered, the one sent while it
    could not be from the timer topic's queue."""
    b = await start_broker()
    blocker = Path(b.config.store.store_path) / "timerwheel"
    blocker.mkdir()
    r = await client.invoke(b.addr, send_request("TG", b"a", 0, props(UNIQ_KEY="G1", TIMER_DELAY_MS="200")))
    assert r.code == ResponseCode.SUCCESS
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not b.timer.built
    r = await client.invoke(b.addr, send_request("TG", b"b", 0, props(UNIQ_KEY="G2", TIMER_DELAY_MS="200")))
    assert r.code == ResponseCode.SUCCESS
    blocker.rmdir()
    await eventually(lambda: b.store.max_offset("TG", 0) == 2, 10, what="both timer messages delivered")
    assert sorted(x.uniq_key or "" for x in await pull_all(client, b.addr, "TG")) == ["G1", "G2"]


def test_broker_conf_timer_keys() -> None:
    cfg = broker_config_from_properties({"timerPrecisionMs": "50", "timerMaxDelaySec": "3456000",
                                         "timerRollWindowSlot": "345600", "timerWheelEnable": "false",
                                         "timerFlushIntervalMs": "500", "mappedFileSizeTimerLog": "1048576",
                                         "recallMessageEnable": "false"})
    assert (cfg.timer_precision_ms, cfg.timer_max_delay_sec, cfg.timer_roll_window_slot) == (50, 3456000, 345600)
    assert not cfg.timer_wheel_enable and not cfg.recall_message_enable
    assert (cfg.timer_flush_interval_ms, cfg.timer_log_file_size) == (500, 1048576)
