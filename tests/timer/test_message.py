"""The send-path rewrite, recall handles and the records put back on delivery or roll."""

from __future__ import annotations

import base64

import pytest

from cometmq.protocol.message import MessageRecord, decode_record, encode_record, pack_host
from cometmq.protocol.properties import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    decode_properties,
    encode_properties,
)
from cometmq.store.message import MessageInner
from cometmq.timer.message import (
    TIMER_DEL_UNIQKEY,
    TIMER_OUT_MS,
    TIMER_ROLL_TIMES,
    TIMER_SRC_PHY,
    TIMER_TOPIC,
    RecallHandle,
    Rewrite,
    delete_key,
    delete_marker,
    delivery_message,
    parse_timer_record,
    recall_handle_for,
    rewrite_for_timer,
    roll_message,
    strip_timer_request,
)

NOW = 1_790_000_000_000
MAX = 86_400_000


def msg(**props: str) -> MessageInner:
    return MessageInner(topic="T", body=b"b", queue_id=3, properties={"UNIQ_KEY": "U1", **props})


def test_rewrite_parks_under_the_timer_topic() -> None:
    m = msg(**{TIMER_DELIVER_MS: str(NOW + 5000)})
    r = rewrite_for_timer(m, NOW, MAX)
    assert r.outcome is Rewrite.SCHEDULED and r.deliver_ms == NOW + 5000
    assert (m.topic, m.queue_id) == (TIMER_TOPIC, 0)
    assert m.properties_raw == encode_properties(m.properties)  # encoded once, when its size was checked
    assert m.properties[TIMER_OUT_MS] == str(NOW + 5000)
    assert (m.properties[REAL_TOPIC], m.properties[REAL_QID]) == ("T", "3")
    # a second pass (a rolled record, a retry) leaves it alone
    assert rewrite_for_timer(m, NOW, MAX).outcome is Rewrite.NOT_TIMER


def test_delay_forms_win_over_the_absolute_time() -> None:
    m = msg(**{TIMER_DELIVER_MS: str(NOW + 1), TIMER_DELAY_SEC: "10", TIMER_DELAY_MS: "20"})
    assert rewrite_for_timer(m, NOW, MAX).deliver_ms == NOW + 10_000
    m = msg(**{TIMER_DELIVER_MS: str(NOW + 1), TIMER_DELAY_MS: "20"})
    assert rewrite_for_timer(m, NOW, MAX).deliver_ms == NOW + 20


def test_past_bad_and_too_far() -> None:
    m = msg(**{TIMER_DELIVER_MS: str(NOW - 1)})
    assert rewrite_for_timer(m, NOW, MAX).outcome is Rewrite.DUE_NOW and m.topic == "T"
    assert rewrite_for_timer(msg(**{TIMER_DELAY_SEC: "x"}), NOW, MAX).outcome is Rewrite.ILLEGAL
    r = rewrite_for_timer(msg(**{TIMER_DELAY_MS: str(MAX + 1)}), NOW, MAX)
    assert r.outcome is Rewrite.ILLEGAL and "timerMaxDelaySec" in r.remark
    assert rewrite_for_timer(msg(), NOW, MAX).outcome is Rewrite.NOT_TIMER
    marker = msg(**{TIMER_DELIVER_MS: str(NOW - 1), TIMER_DEL_UNIQKEY: "T+U1"})
    assert rewrite_for_timer(marker, NOW, MAX).outcome is Rewrite.ILLEGAL
    prepared = MessageInner(topic="T", body=b"", properties={TIMER_DELAY_SEC: "5"}, sys_flag=0x4)
    assert rewrite_for_timer(prepared, NOW, MAX).outcome is Rewrite.NOT_TIMER


def test_strip_timer_request() -> None:
    m = msg(**{TIMER_DELAY_SEC: "5", TIMER_DELIVER_MS: "1"})
    m.properties_raw = b"x"
    strip_timer_request(m)
    assert TIMER_DELAY_SEC not in m.properties and m.properties_raw is None


def test_recall_handle_matches_rocketmq_v1() -> None:
    h = RecallHandle("T", "broker-a", "1790000005000", "U1")
    raw = base64.urlsafe_b64decode(h.encode()).decode()
    assert raw == "v1 T broker-a 1790000005000 U1"
    assert RecallHandle.decode(h.encode()) == h
    # Java's Base64.getUrlEncoder() pads; a handle without padding decodes too
    assert RecallHandle.decode(h.encode().rstrip("=")) == h
    for bad in ("", "!!!", base64.urlsafe_b64encode(b"v2 a b c d").decode(),
                base64.urlsafe_b64encode(b"v1 a b").decode()):
        with pytest.raises(ValueError):
            RecallHandle.decode(bad)


def test_recall_handle_for_a_scheduled_message() -> None:
    m = msg(**{TIMER_DELAY_MS: "5000"})
    assert recall_handle_for(m, "b") is None  # not parked yet
    rewrite_for_timer(m, NOW, MAX)
    h = RecallHandle.decode(recall_handle_for(m, "b") or "")
    assert (h.topic, h.broker_name, h.timestamp, h.message_id) == ("T", "b", str(NOW + 5000), "U1")
    retry = MessageInner(topic="%RETRY%g", body=b"", properties={"UNIQ_KEY": "U", TIMER_DELAY_MS: "9"})
    rewrite_for_timer(retry, NOW, MAX)
    assert recall_handle_for(retry, "b") is None


def test_delete_marker_names_its_message() -> None:
    m = delete_marker("T", "U1", NOW + 5000, producer_group="pg", born_ms=NOW, born_host=b"\x7f\0\0\1\0\0\0\1")
    assert m.properties[TIMER_DEL_UNIQKEY] == delete_key("T", "U1") == "T+U1"
    assert rewrite_for_timer(m, NOW, MAX).outcome is Rewrite.SCHEDULED
    assert m.topic == TIMER_TOPIC and m.properties[TIMER_OUT_MS] == str(NOW + 5000)
    assert recall_handle_for(m, "b") is None


def test_delivery_and_roll_copies() -> None:
    props = {"UNIQ_KEY": "U1", "TAGS": "t", TIMER_OUT_MS: "5", REAL_TOPIC: "T", REAL_QID: "2", "k": "v"}
    raw = encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"hello", queue_offset=9, properties=props,
                                      flag=3, born_host=("10.0.0.1", 1234), born_timestamp=77, reconsume_times=1))
    rec = parse_timer_record(memoryview(raw))
    assert rec is not None and rec.is_timer_topic and rec.queue_offset == 9
    d = delivery_message(rec, 4242)
    assert d is not None
    assert (d.topic, d.queue_id, d.body, d.flag, d.born_timestamp, d.reconsume_times) == ("T", 2, b"hello", 3, 77, 1)
    assert REAL_TOPIC not in d.properties and REAL_QID not in d.properties
    assert d.properties["UNIQ_KEY"] == "U1" and d.properties[TIMER_OUT_MS] == "5"
    assert d.properties[TIMER_SRC_PHY] == "4242" and d.properties["k"] == "v"
    assert d.properties_raw is not None and decode_properties(d.properties_raw) == d.properties
    rec = parse_timer_record(memoryview(raw))  # the re-put functions consume the parsed record
    assert rec is not None
    r = roll_message(rec, 4242)
    assert (r.topic, r.queue_id) == (TIMER_TOPIC, 0)
    assert r.properties[TIMER_ROLL_TIMES] == "1" and r.properties[REAL_TOPIC] == "T"
    rec2 = parse_timer_record(memoryview(encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"",
                                                                     properties=r.properties))))
    assert rec2 is not None and roll_message(rec2, 1).properties[TIMER_ROLL_TIMES] == "2"
    # a rolled record delivered: its TIMER_SRC_PHY is replaced, not repeated
    rolled = encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"", properties=r.properties))
    rec3 = parse_timer_record(memoryview(rolled))
    assert rec3 is not None
    d3 = delivery_message(rec3, 777)
    assert d3 is not None and d3.properties_raw is not None
    assert d3.properties_raw.count(b"TIMER_SRC_PHY") == 1 and decode_properties(d3.properties_raw) == d3.properties
    assert d3.properties[TIMER_SRC_PHY] == "777" and REAL_TOPIC not in d3.properties
    decoded, _ = decode_record(raw)
    assert decoded.born_host == ("10.0.0.1", 1234)
    assert parse_timer_record(memoryview(raw[:-1])) is None


def test_a_property_given_twice_is_reencoded() -> None:
    raw = encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"", properties={"UNIQ_KEY": "U"}))
    rec = parse_timer_record(memoryview(raw))
    assert rec is not None
    rec.text = "REAL_TOPIC\x01A\x02UNIQ_KEY\x01U\x02REAL_TOPIC\x01B\x02"
    rec.properties = {"REAL_TOPIC": "B", "UNIQ_KEY": "U"}
    d = delivery_message(rec, 1)
    assert d is not None and d.topic == "B" and d.properties_raw is not None
    assert decode_properties(d.properties_raw) == {"UNIQ_KEY": "U", TIMER_SRC_PHY: "1"}


def test_a_record_without_real_topic_is_not_delivered() -> None:
    raw = encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"", properties={"UNIQ_KEY": "U"}))
    rec = parse_timer_record(memoryview(raw))
    assert rec is not None and delivery_message(rec, 1) is None


@pytest.mark.parametrize(("born", "store"), [(("2001:db8::9", 1234), ("10.0.0.2", 1)),
                                             (("10.0.0.1", 1234), ("::1", 1)),
                                             (("fe80::1", 1234), ("::1", 1))])
def test_timer_records_with_ipv6_hosts(born: tuple[str, int], store: tuple[str, int]) -> None:
    """An IPv6 host moves the fields after it: the re-put reads them where the record's sys flag says."""
    props = {"UNIQ_KEY": "U1", TIMER_OUT_MS: "5", REAL_TOPIC: "T", REAL_QID: "2"}
    raw = encode_record(MessageRecord(topic=TIMER_TOPIC, body=b"hello", queue_offset=9, properties=props, flag=3,
                                      born_host=born, store_host=store, born_timestamp=77, reconsume_times=4,
                                      sys_flag=0x2))
    rec = parse_timer_record(memoryview(raw))
    assert rec is not None and rec.is_timer_topic
    assert (rec.queue_offset, rec.flag, rec.born_timestamp, rec.reconsume_times, rec.body) == (9, 3, 77, 4, b"hello")
    assert rec.born_host == pack_host(*born) and rec.sys_flag & 0x2
    d = delivery_message(rec, 1)
    assert d is not None and d.born_host == pack_host(*born) and d.properties["UNIQ_KEY"] == "U1"
    assert parse_timer_record(memoryview(raw[:-1])) is None
    assert parse_timer_record(memoryview(raw[:100])) is None
