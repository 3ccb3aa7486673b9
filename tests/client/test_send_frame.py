"""The producer's single-send fast path writes the request frame the general path encodes, byte for byte, and
builds the result the general path builds.

``Producer._start_send`` (the SEND_MESSAGE_V2 frame head from ``client/send_frame.py``'s template, written to the
connection) against ``encode_parts(Producer._request(...))`` (the header dict, the command, the codec), with the
same message id, opaque and born timestamp, on messages hypothesis varies: keys, tags, user properties (control
characters, quotes, ``%``, DEL, non-ASCII, lone surrogates), delay levels, timer fields, flags, queue ids, topics
and groups. ``ProducerKeys`` gives the keys ``UniqKeyGenerator`` gives.
"""

from __future__ import annotations

import array
import asyncio
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cometmq.client.producer as producer_module
from cometmq.client import Message, MessageQueue, Producer
from cometmq.client.send_frame import ProducerKeys, SendFrameTemplate
from cometmq.client.transaction_producer import TransactionProducer
from cometmq.client.wire import SdkConnection
from cometmq.protocol.msgid import UniqKeyGenerator
from cometmq.protocol.remoting import decode, encode_parts, make_request, make_response

ADDR = "127.0.0.1:10911"


class _Capture:
    """Stands for the open connection: keeps what start_request was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bytes, int, int, float]] = []

    def start_request(self, head: bytes, body: bytes, opaque: int, code: int, timeout: float) -> Any:
        self.calls.append((head, body, opaque, code, timeout))
        return object()


def _producer(group: str = "pg", cls: type[Producer] = Producer, **kwargs: Any) -> tuple[Producer, _Capture]:
    p = cls(group, namesrv="127.0.0.1:1", **kwargs)
    p.instance.brokers["broker-a"] = {0: ADDR}
    capture = _Capture()
    p.instance.remoting.open_connection = lambda addr: capture if addr == ADDR else None  # type: ignore
    return p, capture


def _reference(p: Producer, q: MessageQueue, msg: Message, uniq: str, opaque: int, born: int) -> bytes:
    """The general path's frame for the same send: _request with this id, opaque and clock."""
    with mock.patch.object(producer_module, "next_opaque", lambda: opaque), \
            mock.patch.object(producer_module, "_now_ms", lambda: born), \
            mock.patch.object(p._uniq, "new_key", lambda: uniq):
        cmd, key = p._request(q, msg)
    assert key == uniq
    head, body = encode_parts(cmd)
    return head + body


def _fast(p: Producer, capture: _Capture, q: MessageQueue, msg: Message) -> tuple[bytes, str, int, int] | None:
    started = p._start_send(q, msg, 3.0)
    if started is None:
        return None
    _, conn, opaque, uniq, addr = started
    assert conn is capture and addr == ADDR
    head, body, sent_opaque, code, timeout = capture.calls[-1]
    assert (sent_opaque, code, timeout) == (opaque, 310, 3.0)
    frame = head + body
    born = int(decode(frame).ext_fields["g"])
    return frame, uniq, opaque, born


_ascii = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("\x00\x03\x7f\t\n\"\\%/"),
                max_size=12)
_unicode = st.text(st.characters(codec="utf-8") | st.sampled_from("\x01\x02\u00e9\ud800"), max_size=8)
_text = st.one_of(_ascii, _ascii, _ascii, _ascii, _unicode)
_name = st.text(st.sampled_from("abcXYZ019%|-_"), min_size=1, max_size=20)
_keys = st.none() | _text | st.lists(_text, max_size=3)
_props = st.dictionaries(_text.filter(lambda k: k not in ("TAGS", "KEYS", "UNIQ_KEY", "DELAY", "WAIT")),
                         _text, max_size=3)


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    msg = Message(draw(_name), draw(st.binary(min_size=1, max_size=64)), tags=draw(st.none() | _text),
                  keys=draw(_keys), properties=draw(_props), delay_level=draw(st.integers(0, 18)),
                  flag=draw(st.integers(-(2**31), 2**31 - 1)))
    timer = draw(st.sampled_from(["none", "at", "delay"]))
    if timer == "at":
        msg.deliver_at = draw(st.integers(0, 2**45))
    elif timer == "delay":
        msg.delay = draw(st.floats(0, 1e6))
    return msg


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=_messages(), queue_id=st.integers(0, 2**31 - 1), group=st.one_of(_name, _name, _text.filter(bool)))
def test_fast_frame_is_the_general_frame(msg: Message, queue_id: int, group: str) -> None:
    async def go() -> None:
        p, capture = _producer(group)
        q = MessageQueue(msg.topic, "broker-a", queue_id)
        try:
            got = _fast(p, capture, q, msg)
        except Exception as exc:  # the same error the general path raises (a reserved property)
            try:
                p._request(q, msg)
            except Exception as ref:
                assert type(ref) is type(exc) and str(ref) == str(exc)
                return
            raise
        if msg.delay is not None:
            return  # the timer's deliver time is computed from the clock at each call: compared below without
        if got is None:  # only a group or topic the template does not take
            assert not (group.isascii() and msg.topic.isascii())
            return
        frame, uniq, opaque, born = got
        assert frame == _reference(p, q, msg, uniq, opaque, born)

    asyncio.run(go())


async def test_plain_messages_take_the_fast_path_and_match() -> None:
    p, capture = _producer()
    q = MessageQueue("T", "broker-a", 3)
    for msg in [Message("T", b"x"), Message("T", bytearray(b"ba")), Message("T", memoryview(b"mv")),
                Message("T", b"y", tags="a", keys="k1 k2", properties={"p": "v\t\"%\x7f"}, delay_level=3, flag=7)]:
        got = _fast(p, capture, q, msg)
        assert got is not None
        frame, uniq, opaque, born = got
        assert frame == _reference(p, q, msg, uniq, opaque, born)


async def test_the_general_path_where_the_fast_one_does_not_apply() -> None:
    q = MessageQueue("T", "broker-a", 0)
    p, capture = _producer(compress_over=10)
    assert p._start_send(q, Message("T", b"z" * 10), 3.0) is None  # compressed
    assert p._start_send(q, Message("T", b"z" * 9), 3.0) is not None
    assert p._start_send(q, Message("T", memoryview(array.array("i", [1, 2, 3]))), 3.0) is None  # 12 bytes
    assert p._start_send(MessageQueue("T", "broker-b", 0), Message("T", b"z"), 3.0) is None  # no master known
    assert p._start_send(q, Message("T\u00e9", b"z"), 3.0) is None  # a topic that is not ASCII: no template
    accented = Message("T", b"z", properties={"a": "\u00e9"})  # escaped as the codec escapes it
    got = _fast(p, capture, q, accented)
    assert got is not None and got[0] == _reference(p, q, accented, *got[1:])
    assert p._start_send(q, Message("T", b"z", flag=True), 3.0) is None  # not an int: str(True) on the wire
    signed, _ = _producer(credentials=("ak", "sk"))
    assert signed._start_send(q, Message("T", b"z"), 3.0) is None  # signed requests: instance.sign
    tx, _ = _producer(cls=TransactionProducer)
    assert tx._start_send(q, Message("T", b"z"), 3.0) is None  # a subclass building its own request
    p.group = "other"  # a changed group gets a new template
    got = _fast(p, capture, q, Message("T", b"g"))
    assert got is not None and b'"a":"other"' in got[0]


def test_templates_refuse_what_they_cannot_cut() -> None:
    p, _ = _producer()
    assert SendFrameTemplate.build("T1357913579", p._v2_fields) is None  # holds a probe value
    assert SendFrameTemplate.build("T%", p._v2_fields) is not None
    assert SendFrameTemplate.build("T\u00e9", p._v2_fields) is None


def test_producer_keys_are_the_generator_keys() -> None:
    now = [1_795_000_000_000]
    fast = ProducerKeys("10.1.2.3", clock_ms=lambda: now[0])
    ref = UniqKeyGenerator("10.1.2.3", clock_ms=lambda: now[0])
    ref._salt = fast._salt
    ref._pid = fast._pid
    keys: list[tuple[str, str]] = []
    for step in [0, 0, 1, 0, -5, 40 * 24 * 3600 * 1000, 0, 3]:  # same ms, next ms, clock back, next month
        now[0] += step
        keys.append((fast.new_key(), ref.new_key()))
        keys.append((fast.new_keys(2)[1], ref.new_keys(2)[1]))
    assert [a for a, _ in keys] == [b for _, b in keys]
    assert len({a for a, _ in keys}) == len(keys)
    wall = ProducerKeys()
    assert wall._wall and len(wall.new_key()) == 32


async def test_the_connection_is_an_sdk_connection(cluster: Any) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        r = await p.send(Message("FastT", b"first"))  # connects the general way
        conns = p.instance.remoting.connections
        assert r.ok and all(type(c) is SdkConnection for c in conns.values())
        r2 = await p.send(Message("FastT", b"second"))
        assert r2.ok and r2.msg_id != r.msg_id and len(r2.offset_msg_id) == 32


_answer = st.one_of(st.none(), st.integers(-5, 2**40).map(str), st.sampled_from(["", "x", "1.5", " 7", "٣"]))


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from([0, 10, 11, 12, 1, 17, 206]), remark=st.none() | st.text(max_size=5),
       offset=_answer, queue_id=_answer, msg_id=st.none() | st.text(st.sampled_from("AB,"), max_size=8),
       recall=st.none() | st.sampled_from(["", "v1 handle"]), own_queue=st.integers(0, 7))
def test_result_one_is_the_general_result(code: int, remark: str | None, offset: str | None, queue_id: str | None,
                                          msg_id: str | None, recall: str | None, own_queue: int) -> None:
    fields = {"queueOffset": offset, "queueId": queue_id, "msgId": msg_id, "recallHandle": recall}
    response = make_response(make_request(310), code, remark, {k: v for k, v in fields.items() if v is not None})
    q = MessageQueue("T", "broker-a", own_queue)
    uniq = "7F000001" + "0" * 24
    try:
        expected = Producer._result(response, q, uniq, ADDR)[0]
    except Exception as exc:
        for one in (Producer._result_one, Producer._result_one_py):
            with pytest.raises(type(exc)) as raised:
                one(response, q, uniq, ADDR)
            assert str(raised.value) == str(exc)
        return
    for got in (Producer._result_one(response, q, uniq, ADDR), Producer._result_one_py(response, q, uniq, ADDR)):
        assert got == expected and type(got.queue_offset) is int and type(got.queue.queue_id) is int
    status = producer_module._STATUS[code]
    if producer_module._C_RESULT is not None:  # the C helper: the same result, or None (then Python builds it)
        c_got = producer_module._C_RESULT(status, response.ext_fields, q, uniq)
        assert c_got is None or c_got == expected
        assert (c_got is None) == (expected.queue.queue_id != own_queue)

