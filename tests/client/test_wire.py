"""client/wire.py: SdkConnection's lean request (one timer per connection for deadlines) and its lone-reply
decoder, which must build the command the codec builds from the same bytes; the producer's fast path under
timeouts, cancellation and retries."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cometmq.client import ClientTimeoutError, Message, Producer, wire
from cometmq.client.wire import SdkConnection, _lone_reply_py
from cometmq.net.connection import ConnectionClosedError, RemotingConnection, RequestTimeoutError
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    RemotingCommand,
    SerializeType,
    decode,
    encode,
    make_request,
)
from tests.kit.transport import MemoryTransport

from .conftest import Cluster


def _open(cls: type[RemotingConnection] = SdkConnection) -> tuple[Any, MemoryTransport]:
    conn = cls()
    transport = MemoryTransport(("127.0.0.1", 10911), ("127.0.0.1", 40000))
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def _reply(opaque: int, **fields: Any) -> bytes:
    return encode(RemotingCommand(0, opaque=opaque, flag=1, ext_fields=fields.pop("ext", {"msgId": "X"}), **fields))


async def test_start_request_writes_and_completes() -> None:
    conn, transport = _open()
    future = conn.start_request(b"head", b"body", 7, 310, 3.0)
    assert transport.written == [b"headbody"] and conn.pending_requests == 1
    conn.data_received(_reply(7, remark="fine", body=b"b"))
    result = await future
    assert result == decode(_reply(7, remark="fine", body=b"b")) and conn.pending_requests == 0
    big = b"x" * 70_000
    conn.start_request(b"h", big, 8, 310, 3.0)
    assert transport.written[-1] == b"h" + big
    with pytest.raises(ValueError, match="opaque 8 is already waiting"):
        conn.start_request(b"h", b"", 8, 310, 3.0)
    conn.close()
    with pytest.raises(ConnectionClosedError):
        conn.start_request(b"h", b"", 9, 310, 3.0)


async def test_deadlines_fire_in_order_with_one_timer() -> None:
    conn, _ = _open()
    t0 = time.monotonic()
    slow = conn.start_request(b"a", b"", 1, 310, 0.6)
    fast = conn.start_request(b"b", b"", 2, 11, 0.05)  # a shorter deadline after a longer one: the timer moves
    with pytest.raises(RequestTimeoutError, match=r"no reply to request code 11 \(opaque 2\) from 127.0.0.1:10911 "
                                                  r"within 0.05s"):
        await fast
    assert time.monotonic() - t0 < 0.5 and not slow.done() and conn.pending_requests == 1
    answered = conn.start_request(b"c", b"", 3, 310, 0.05)
    conn.data_received(_reply(3))
    assert (await answered).opaque == 3
    with pytest.raises(RequestTimeoutError, match=r"opaque 1\b"):
        await slow
    assert 0.55 < time.monotonic() - t0 < 2 and conn.pending_requests == 0
    assert conn._sweep_handle is None and not conn._deadlines


async def test_close_fails_pending_and_stops_the_timer() -> None:
    conn, _ = _open()
    future = conn.start_request(b"a", b"", 1, 310, 30)
    assert conn._sweep_handle is not None
    conn.close()
    with pytest.raises(ConnectionClosedError):
        await future
    assert conn._sweep_handle is None and not conn._deadlines


async def test_forget_drops_a_cancelled_wait() -> None:
    conn, _ = _open()
    future = conn.start_request(b"a", b"", 1, 310, 30)
    future.cancel()
    conn.forget(1, future)
    assert conn.pending_requests == 0
    conn.data_received(_reply(1))  # a late reply has no waiter: dropped, as the base class drops it
    conn.close()


async def test_frames_the_fast_decoder_leaves_to_the_codec() -> None:
    conn, _ = _open()
    futures = [conn.start_request(b"", b"", n, 310, 30) for n in (1, 2, 3, 4)]
    two = _reply(1) + _reply(2)
    conn.data_received(two)  # two frames in one chunk
    split = _reply(3, body=b"123")
    conn.data_received(split[:10])
    conn.data_received(split[10:])  # a frame in two chunks
    conn.data_received(encode(RemotingCommand(0, opaque=4, flag=1, serialize_type=SerializeType.ROCKETMQ)))
    results = [await f for f in futures]
    assert [r.opaque for r in results] == [1, 2, 3, 4] and results[2].body == b"123"
    assert results[3].serialize_type is SerializeType.ROCKETMQ
    request = make_request(99, {"a": "b"})  # a request from the peer: the base class dispatches it (unsupported)
    conn.data_received(encode(request))
    conn.close()


_str = st.text(max_size=10)
_int32 = st.integers(-(2**31), 2**31 - 1)
_scalar = st.one_of(_str, _int32, st.booleans(), st.none(), st.floats(allow_nan=True), st.integers(2**31, 2**70))


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    """JSON headers of all shapes a peer may send: the usual one (half the time), and fields of the wrong type or
    range, missing, or bytes that are not JSON."""
    usual = draw(st.booleans())
    header: dict[str, Any] = {
        "code": draw(_int32 if usual else _int32 | _scalar), "opaque": draw(_int32 if usual else _int32 | _scalar),
        "flag": draw(st.sampled_from([1, 3]) if usual else st.sampled_from([1, 3, 0, 2]) | _scalar),
        "version": draw(_int32 if usual else _int32 | _scalar),
        "language": draw(st.sampled_from(["JAVA", "CPP", "PYTHON"]) if usual else st.just("GO") | _scalar)}
    if not usual:
        for name in draw(st.sets(st.sampled_from(list(header)))):
            del header[name]
    if draw(st.booleans()):
        header["remark"] = draw(_str if usual else _str | _scalar)
    ext = draw(st.dictionaries(_str, _str) if usual else
               st.none() | st.dictionaries(_str, _scalar, max_size=2) | _scalar)
    if ext is not None or draw(st.booleans()):
        header["extFields"] = ext
    compact = draw(st.booleans())  # as the brokers write it (read without the JSON decoder), or spaced
    raw = json.dumps(header, ensure_ascii=draw(st.booleans()), separators=(",", ":") if compact else None
                     ).encode("utf-8", "surrogatepass")
    if compact and draw(st.integers(0, 3)) == 0:  # the compact reader's edges: each either read or left alone
        raw = raw[:-1] + draw(st.sampled_from(_COMPACT_EDGES)) + b"}"
    return raw if usual or draw(st.booleans()) else draw(st.sampled_from([raw[:-1], raw + b"x", b"[1]", b"\xff"]))


_COMPACT_EDGES = [b',"code":5', b',"x":007', b',"x":-0', b',"x":-', b',"x":1.5', b',"x":1e3', b',"x":true',
                  b',"x":{"a":1}', b',"x":{"a":"b","a":"c"}', b',"x":{}', b',"x":[]', b',"x":"\\u00e9"',
                  b',"x":"a\\"b"', b', "x":1', b',"x" :1', b',"x":123456789012345678', b',"x":-123456789012345678',
                  b',"x":1234567890123456789', b',"x":"\xc3\xa9"', b',"x":"\xed\xa0\x80"', b',"x":null',
                  b',"x":nul', b',"x":"a\tb"', b',"x":{"a":"b"', b',"x":{"a":"b",}', b',"x":', b',', b',"x":"']


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=_headers(), body=st.binary(max_size=16), cut=st.sampled_from([0, 0, 0, -1, 1, 2]),
       stype=st.sampled_from([0, 0, 0, 1]))
def test_lone_reply_is_the_codec_s_command(header: bytes, body: bytes, cut: int, stype: int) -> None:
    frame = struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body
    if cut:
        frame = frame[:cut] if cut < 0 else frame + b"\x00" * cut
    got = _lone_reply_py(frame, DEFAULT_MAX_FRAME_SIZE)
    if wire._C_HELPER is not None:  # the C helper decodes the same frames to the same commands
        c_got = wire._C_HELPER.lone_reply(frame, DEFAULT_MAX_FRAME_SIZE)
        assert c_got == got and (c_got is None or _types(c_got) == _types(got))  # type: ignore[arg-type]
        assert c_got is None or list(c_got.ext_fields.items()) == list(got.ext_fields.items())  # type: ignore[union-attr]
        assert wire._C_HELPER.lone_reply(frame, len(frame) - 5) is None or len(frame) <= 12
    try:
        expected: RemotingCommand | None = decode(frame)
    except ProtocolError:
        expected = None
    if got is not None:
        assert expected is not None and got == expected and got.flag & 1 and _types(got) == _types(expected)
    assert _lone_reply_py(frame, len(frame) - 5) is None or len(frame) <= 12


def _types(cmd: RemotingCommand) -> list[type]:
    return [type(getattr(cmd, name)) for name in ("code", "language", "version", "opaque", "flag", "remark",
                                                  "ext_fields", "body", "serialize_type")]


def test_the_c_helper_is_used_when_built() -> None:
    import os

    from cometmq.common.native import PURE_PYTHON_ENV

    if wire._C_HELPER is None:
        assert os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0") or pytest.skip("the C helper is not built")
        assert wire._lone_reply is _lone_reply_py
    else:
        assert wire._lone_reply is wire._C_HELPER.lone_reply
        frame = _reply(5, remark="r", body=b"xyz", ext={"a": "b"})
        assert wire._lone_reply(frame, DEFAULT_MAX_FRAME_SIZE) == _lone_reply_py(frame, DEFAULT_MAX_FRAME_SIZE) \
            == decode(frame)
        with pytest.raises(TypeError):
            wire._C_HELPER.lone_reply(frame)


async def test_producer_send_timeout_and_retries(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr, retries=2) as p:
        assert (await p.send(Message("TO", b"connect"))).ok  # the connection is open from here on
        addr = p.instance.master_addr("broker-a")
        assert addr is not None
        conn = p.instance.remoting.connections[addr]
        assert isinstance(conn, SdkConnection)
        real = conn._transport
        writes: list[int] = []

        class Blackhole:  # requests vanish: no reply ever comes
            def write(self, data: bytes) -> None:
                writes.append(len(data))

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        conn._transport = Blackhole()  # type: ignore[assignment]
        try:
            t0 = time.monotonic()
            with pytest.raises(ClientTimeoutError, match=r"sendDefaultImpl call timeout: .* 1 attempt; the last failed:"
                                                         r" no answer from 127.0.0.1:\d+ in time \(send to TO/\d\)"):
                await p.send(Message("TO", b"lost"), timeout=0.1)
            # the timeout is the whole send's (as RocketMQ's): its first attempt spent it, no retry is made
            assert len(writes) == 1 and 0.09 < time.monotonic() - t0 < 5  # (a bound that catches a hang)
            task = asyncio.ensure_future(p.send(Message("TO", b"cancelled"), timeout=30))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert conn.pending_requests == 0
        finally:
            conn._transport = real
        r = await p.send(Message("TO", b"again"))
        assert r.ok and r.queue.topic == "TO"


async def test_answered_requests_behind_a_waiting_one_are_not_kept() -> None:
    conn, _ = _open()
    stuck = conn.start_request(b"", b"", 1, 310, 30)
    for n in range(2, 1000):
        conn.start_request(b"", b"", n, 310, 30)
        conn.data_received(_reply(n))
    assert len(conn._deadlines) <= 130 and conn.pending_requests == 1 and not stuck.done()
    conn.close()


@st.composite
def _reply_streams(draw: st.DrawFn) -> tuple[list[int], list[bytes]]:
    """Replies to requests 1..n back to back (JSON and binary headers, bodies, remarks; now and then a frame the
    lone-reply decoder leaves to the codec), the stream cut anywhere, as TCP may deliver several sends' answers."""
    frames = []
    opaques = draw(st.permutations(list(range(1, draw(st.integers(2, 8)) + 1))))
    for opaque in opaques:
        kind = draw(st.integers(0, 5))
        if kind == 0:
            frames.append(encode(RemotingCommand(0, opaque=opaque, flag=1, serialize_type=SerializeType.ROCKETMQ,
                                                 ext_fields={"k": "v"})))
        else:
            frames.append(_reply(opaque, remark=draw(st.none() | _str), body=draw(st.binary(max_size=8)),
                                 ext=draw(st.dictionaries(_str, _str, max_size=3))))
    stream = b"".join(frames)
    cuts = sorted(draw(st.lists(st.integers(1, len(stream) - 1), max_size=3, unique=True)))
    return opaques, [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reply_streams())
def test_chunks_of_several_replies_complete_what_the_base_class_completes(
        case: tuple[list[int], list[bytes]]) -> None:
    opaques, chunks = case

    async def run(cls: type[RemotingConnection]) -> list[RemotingCommand]:
        conn, _ = _open(cls)
        if isinstance(conn, SdkConnection):
            futures = [conn.start_request(b"", b"", n, 310, 30) for n in sorted(opaques)]
        else:
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in opaques]
            conn._pending.update(zip(sorted(opaques), futures, strict=True))
        for chunk in chunks:
            conn.data_received(chunk)
        done = [await asyncio.wait_for(f, 5) for f in futures]
        assert conn.pending_requests == 0
        conn.close()
        return done

    fast = asyncio.run(run(SdkConnection))
    base = asyncio.run(run(RemotingConnection))
    assert fast == base and [_types(c) for c in fast] == [_types(c) for c in base]


def test_the_brokers_compact_answers_are_read_without_the_json_decoder() -> None:
    """A pull or send answer as the broker writes it (broker/pull_fast.py, broker/send_fast.py, the codec) is read
    by the C helper's compact reader; the decoder is asked only about other text."""
    if wire._C_HELPER is None:
        pytest.skip("the C helper is not built")
    asked: list[bytes] = []

    def loads(raw: bytes) -> Any:
        asked.append(raw)
        return orjson.loads(raw)

    pull = (b'{"code":0,"language":"PYTHON","version":0,"opaque":-7,"flag":1,"extFields":{"suggestWhichBrokerId":'
            b'"0","nextBeginOffset":"8","minOffset":"0","maxOffset":"8"},"serializeTypeCurrentRPC":"JSON"}')
    spaced = pull.replace(b'"flag":1', b'"flag": 1')
    wire._C_HELPER.bind(RemotingCommand, wire._FIELDS, SerializeType.JSON, loads)
    try:
        for header in (pull, spaced):
            frame = struct.pack(">II", 4 + len(header) + 3, len(header)) + header + b"abc"
            assert wire._C_HELPER.lone_reply(frame, DEFAULT_MAX_FRAME_SIZE) == _lone_reply_py(
                frame, DEFAULT_MAX_FRAME_SIZE) == decode(frame)
    finally:
        wire._C_HELPER.bind(RemotingCommand, wire._FIELDS, SerializeType.JSON, orjson.loads)
    assert asked == [spaced]
