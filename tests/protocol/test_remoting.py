from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.codes import LanguageCode, RequestCode, ResponseCode
from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError
from cometmq.protocol.remoting import (
    DEFAULT_VERSION,
    ONEWAY_FLAG,
    RESPONSE_FLAG,
    FrameDecoder,
    RemotingCommand,
    SerializeType,
    decode,
    encode,
    make_request,
    make_response,
    normalize_ext_fields,
)


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def json_frame(header: object, body: bytes = b"") -> bytes:
    return frame(json.dumps(header).encode(), body)


def send_request(serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    return make_request(
        RequestCode.SEND_MESSAGE,
        {"producerGroup": "pg", "topic": "T", "queueId": 3, "sysFlag": 0, "batch": False, "bornTimestamp": "1"},
        b"hello \x00 world",
        serialize_type=serialize_type,
    )


# -- round trips ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("serialize_type", list(SerializeType))
def test_request_round_trip(serialize_type: SerializeType) -> None:
    cmd = send_request(serialize_type)
    assert cmd.ext_fields["queueId"] == "3"
    assert cmd.ext_fields["batch"] == "false"
    assert decode(encode(cmd)) == cmd


@pytest.mark.parametrize("serialize_type", list(SerializeType))
def test_response_round_trip(serialize_type: SerializeType) -> None:
    request = send_request(serialize_type)
    reply = make_response(request, ResponseCode.SUCCESS, "ok", {"msgId": "AB", "queueOffset": 7}, b"\x01")
    assert reply.opaque == request.opaque
    assert reply.is_response and not reply.is_oneway
    assert reply.serialize_type is serialize_type
    assert decode(encode(reply)) == reply


def test_binary_header_treats_empty_remark_as_none() -> None:
    cmd = RemotingCommand(code=1, remark="", serialize_type=SerializeType.ROCKETMQ)
    assert decode(encode(cmd)).remark is None


def test_binary_header_rejects_code_beyond_int16() -> None:
    cmd = make_request(RequestCode.POP_MESSAGE, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(LocalProtocolError, match="int16"):  # our bug, not the peer's
        encode(cmd)
    assert decode(encode(make_request(RequestCode.POP_MESSAGE))).code == RequestCode.POP_MESSAGE


def test_oneway_and_opaques() -> None:
    a, b = make_request(RequestCode.HEART_BEAT), make_request(RequestCode.HEART_BEAT, oneway=True)
    assert a.opaque != b.opaque
    assert b.is_oneway and b.flag == ONEWAY_FLAG and not a.is_oneway


def test_empty_body_and_fields_round_trip() -> None:
    cmd = RemotingCommand(code=0, flag=RESPONSE_FLAG, opaque=-5)  # Java opaques can wrap negative
    assert decode(encode(cmd)) == cmd


# -- the JSON header the C++ client reads ----------------------------------------------------------------------


def test_json_reply_known_answer() -> None:
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=42, language="CPP", version=63)
    reply = make_response(request, ResponseCode.SUCCESS, None, {"msgId": "0A", "queueId": 1, "queueOffset": 9})
    data = encode(reply)
    header = (
        b'{"code":0,"language":"PYTHON","version":401,"opaque":42,"flag":1,'
        b'"extFields":{"msgId":"0A","queueId":"1","queueOffset":"9"},"serializeTypeCurrentRPC":"JSON"}'
    )
    # serialize type byte 0 (C++ reads the header word unmasked), ints for code/opaque/flag, strings in
    # extFields, extFields always present.
    assert data == struct.pack(">II", 4 + len(header), len(header)) + header
    parsed = json.loads(data[8:])
    assert all(type(parsed[key]) is int for key in ("code", "opaque", "flag", "version"))
    assert all(type(value) is str for value in parsed["extFields"].values())


def test_json_header_always_has_ext_fields() -> None:
    reply = make_response(make_request(RequestCode.PULL_MESSAGE), ResponseCode.PULL_NOT_FOUND)
    assert json.loads(encode(reply)[8:])["extFields"] == {}


def test_decodes_cpp_request_with_mixed_value_types() -> None:
    header = (
        b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","batch":false,"bornTimestamp":"17",'
        b'"defaultTopicQueueNums":4,"flag":0,"queueId":2,"unitMode":"0","missing":null},'
        b'"flag":0,"language":"CPP","opaque":7,"remark":"","version":63}\n'
    )
    cmd = decode(frame(header, b"body"))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.language) == (10, 7, 0, 63, "CPP")
    assert cmd.remark == ""
    assert cmd.ext_fields == {
        "AccessKey": "",
        "OnsChannel": "ALIYUN",
        "batch": "false",
        "bornTimestamp": "17",
        "defaultTopicQueueNums": "4",
        "flag": "0",
        "queueId": "2",
        "unitMode": "0",
    }
    assert cmd.body == b"body"


def test_decodes_minimal_header_with_defaults() -> None:
    cmd = decode(json_frame({"code": 0, "opaque": 3, "flag": 1}))
    assert cmd.ext_fields == {} and cmd.remark is None and cmd.version == 0
    assert cmd.language == "JAVA"
    assert decode(json_frame({"code": 0, "language": LanguageCode.GO})).language == "GO"


def test_non_ascii_strings_survive() -> None:
    cmd = make_request(RequestCode.SEND_MESSAGE, {"topic": "T", "properties": "KEYS\x01订单\x02"}, remark="é")
    for serialize_type in SerializeType:
        cmd2 = RemotingCommand(
            code=cmd.code, remark=cmd.remark, ext_fields=cmd.ext_fields, serialize_type=serialize_type
        )
        assert decode(encode(cmd2)) == cmd2


def test_lone_surrogate_from_peer_can_be_echoed() -> None:
    cmd = decode(frame(b'{"code":1,"remark":"\\ud800"}'))
    assert decode(encode(cmd)).remark == "\ud800"


def test_normalize_ext_fields() -> None:
    assert normalize_ext_fields({"a": 1, "b": True, "c": "x", "d": None, "e": 1.5}) == {
        "a": "1",
        "b": "true",
        "c": "x",
        "e": "1.5",
    }
    with pytest.raises(LocalProtocolError):  # fields we build
        normalize_ext_fields({"a": [1]})
    with pytest.raises(RemoteProtocolError):  # fields a peer sent
        normalize_ext_fields({"a": [1]}, RemoteProtocolError)


# -- malformed input ---------------------------------------------------------------------------------------


BAD_FRAMES = {
    "length shorter than header word": struct.pack(">I", 3) + b"abc",
    "length zero": struct.pack(">I", 0),
    "header longer than frame": struct.pack(">II", 8, 100) + b"{}{}",
    "unknown serialize type": struct.pack(">II", 6, (2 << 24) | 2) + b"{}",
    "bad json": frame(b'{"code":'),
    "empty json header": frame(b""),
    "not utf-8": frame(b'{"code":1,"remark":"\xff"}'),
    "json array": json_frame([1, 2]),
    "string code": json_frame({"code": "10"}),
    "bool code": json_frame({"code": True}),
    "missing code": json_frame({"opaque": 1}),
    "float opaque": json_frame({"code": 1, "opaque": 1.5}),
    "code beyond int32": json_frame({"code": 2**31}),
    "huge int": frame(b'{"code":' + b"9" * 5000 + b"}"),
    "list ext value": json_frame({"code": 1, "extFields": {"a": [1]}}),
    "ext not object": json_frame({"code": 1, "extFields": "a=1"}),
    "remark not string": json_frame({"code": 1, "remark": 5}),
    "language object": json_frame({"code": 1, "language": {}}),
    "deep nesting": frame(b'{"code":1,"x":' + b"[" * 100000 + b"]" * 100000 + b"}"),
    "binary truncated": frame(b"\x00\x01\x00", serialize_type=1),
    "binary remark overrun": frame(struct.pack(">hBhiii", 1, 0, 0, 0, 0, 50), serialize_type=1),
    "binary negative remark": frame(struct.pack(">hBhiii", 1, 0, 0, 0, 0, -1), serialize_type=1),
    "binary fields overrun": frame(struct.pack(">hBhiiii", 1, 0, 0, 0, 0, 0, 99), serialize_type=1),
    "binary key overrun": frame(
        struct.pack(">hBhiiii", 1, 0, 0, 0, 0, 0, 4) + struct.pack(">h", 9) + b"ab", serialize_type=1
    ),
    "binary bad utf-8": frame(
        struct.pack(">hBhiiii", 1, 0, 0, 0, 0, 0, 9) + struct.pack(">h", 1) + b"\xff" + struct.pack(">i", 0),
        serialize_type=1,
    ),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_malformed_frames_raise_protocol_error(name: str) -> None:
    with pytest.raises(RemoteProtocolError):
        FrameDecoder().feed(BAD_FRAMES[name])


def test_oversize_frame_rejected_before_it_is_buffered() -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        decoder.feed(struct.pack(">I", 1025))
    assert decoder.buffered == 0


def test_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(BAD_FRAMES["bad json"])
    with pytest.raises(RemoteProtocolError):
        decoder.feed(encode(make_request(RequestCode.HEART_BEAT)))


# -- incremental feeding -------------------------------------------------------------------------------------


def sample_stream() -> tuple[bytes, list[RemotingCommand]]:
    commands = [
        send_request(),
        send_request(SerializeType.ROCKETMQ),
        make_response(send_request(), ResponseCode.PULL_NOT_FOUND, "none", {"nextBeginOffset": 5}),
        make_request(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}' * 40),
        RemotingCommand(code=0),
    ]
    return b"".join(encode(c) for c in commands), commands


def test_feed_one_byte_at_a_time() -> None:
    data, commands = sample_stream()
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
    assert out == commands
    assert decoder.buffered == 0


def test_split_at_every_byte() -> None:
    data, commands = sample_stream()
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        out = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert out == commands, cut
        assert decoder.buffered == 0


def test_accepts_bytearray_and_memoryview() -> None:
    data, commands = sample_stream()
    assert FrameDecoder().feed(bytearray(data)) == commands
    assert FrameDecoder().feed(memoryview(data)) == commands


def test_large_frame_in_small_chunks() -> None:
    cmd = make_request(RequestCode.SEND_MESSAGE, {"topic": "T"}, bytes(range(256)) * 4096)  # 1 MiB body
    data = encode(cmd)
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(0, len(data), 512):
        out += decoder.feed(data[i : i + 512])
    assert out == [cmd]


def test_many_small_frames_in_one_chunk() -> None:
    commands = [make_request(RequestCode.UPDATE_CONSUMER_OFFSET, {"queueId": i}) for i in range(2000)]
    data = b"".join(encode(c) for c in commands)
    decoder = FrameDecoder()
    assert decoder.feed(data[:-3]) + decoder.feed(data[-3:]) == commands


# -- fuzzing ---------------------------------------------------------------------------------------------


def feed_all(chunks: list[bytes]) -> None:
    """Any bytes either decode into commands we can encode again or raise RemoteProtocolError: no other exception
    type escapes the decoder (the h11 fuzz harness's property)."""
    decoder = FrameDecoder(max_frame_size=1 << 16)
    commands: list[RemotingCommand] = []
    try:
        for chunk in chunks:
            commands += decoder.feed(chunk)
    except RemoteProtocolError:
        pass
    for cmd in commands:
        assert isinstance(cmd, RemotingCommand)
        assert all(type(v) is str for v in cmd.ext_fields.values())
        encode(cmd)  # what a peer sent can be encoded again (echoed back) without a LocalProtocolError


@settings(max_examples=400)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_random_bytes(chunks: list[bytes]) -> None:
    feed_all(chunks)


@st.composite
def framed_garbage(draw: st.DrawFn) -> bytes:
    """Frames with a plausible length and header word around random header bytes: gets past the framing."""
    serialize_type = draw(st.sampled_from([0, 1, 0, 1, 7]))
    if serialize_type == 0 and draw(st.booleans()):
        value = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
        header_obj = draw(
            st.dictionaries(
                st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields"]),
                st.one_of(value, st.dictionaries(st.text(max_size=5), value, max_size=3)),
            )
        )
        header = json.dumps(header_obj).encode()
    else:
        header = draw(st.binary(max_size=64))
    body = draw(st.binary(max_size=16))
    header_length = draw(st.sampled_from([len(header), len(header), len(header) + 1, 0xFFFFFF]))
    length = draw(st.sampled_from([4 + len(header) + len(body), 4 + len(header) + len(body) - 1]))
    return struct.pack(">II", max(length, 0), (serialize_type << 24) | header_length) + header + body


@settings(max_examples=600)
@given(st.lists(framed_garbage(), min_size=1, max_size=3), st.integers(min_value=0, max_value=400))
def test_fuzz_framed_garbage(frames: list[bytes], cut: int) -> None:
    data = b"".join(frames)
    feed_all([data[:cut], data[cut:]])


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """Valid frames (JSON and binary headers) with a few bytes overwritten: reaches deep into header decoding."""
    frames = b"".join(
        encode(RemotingCommand(
            draw(st.integers(-(2**15), 2**15 - 1)), "JAVA", 1, draw(st.integers(0, 2**31 - 1)), draw(st.integers(0, 3)),
            draw(st.one_of(st.none(), st.text(max_size=8))),
            draw(st.dictionaries(st.text(max_size=6), st.text(max_size=8), max_size=3)),
            draw(st.binary(max_size=8)), draw(st.sampled_from(list(SerializeType)))))
        for _ in range(draw(st.integers(1, 3))))
    data = bytearray(frames)
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@settings(max_examples=600)
@given(mutated_frames(), st.integers(min_value=0, max_value=200))
def test_fuzz_mutated_frames_decode_or_raise_remote_error(data: bytes, cut: int) -> None:
    feed_all([data[:cut], data[cut:]])


@settings(max_examples=200)
@given(
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
    ext=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=5),
    body=st.binary(max_size=64),
    serialize_type=st.sampled_from(list(SerializeType)),
    language=st.sampled_from([lc.name for lc in LanguageCode]),
)
def test_round_trip_property(
    code: int,
    opaque: int,
    flag: int,
    remark: str | None,
    ext: dict[str, str],
    body: bytes,
    serialize_type: SerializeType,
    language: str,
) -> None:
    cmd = RemotingCommand(code, language, DEFAULT_VERSION, opaque, flag, remark, ext, body, serialize_type)
    assert decode(encode(cmd)) == cmd


# -- the orjson fast path and its fallback to the json module ----------------------------------------------------


@given(
    remark=st.one_of(st.none(), st.text(max_size=20)),
    ext=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=5),
    code=st.integers(-(2**31), 2**31 - 1),
)
def test_json_header_is_ascii_and_means_what_the_json_module_writes(
    remark: str | None, ext: dict[str, str], code: int
) -> None:
    cmd = RemotingCommand(code, "PYTHON", DEFAULT_VERSION, 5, 0, remark, ext)
    data = encode(cmd)
    header = data[8:]
    assert header.isascii()  # lone surrogates and non-ASCII text are escaped, whichever encoder wrote it
    reference = json.dumps({"code": code, "language": "PYTHON", "version": DEFAULT_VERSION, "opaque": 5, "flag": 0,
                            **({"remark": remark} if remark is not None else {}), "extFields": ext,
                            "serializeTypeCurrentRPC": "JSON"}, separators=(",", ":"))
    assert json.loads(header) == json.loads(reference)
    assert decode(data) == cmd


def test_plain_ascii_header_is_byte_identical_to_the_json_module() -> None:
    cmd = make_request(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "i": "UNIQ_KEY\x01K\x02WAIT\x01true\x02", "q": '"\\/'},
                       opaque=9)
    header = encode(cmd)[8:]
    expected = json.dumps({"code": int(RequestCode.SEND_MESSAGE_V2), "language": "PYTHON", "version": DEFAULT_VERSION,
                           "opaque": 9, "flag": 0, "extFields": cmd.ext_fields, "serializeTypeCurrentRPC": "JSON"},
                          separators=(",", ":")).encode()
    assert header == expected


@pytest.mark.parametrize("header, check", [
    # what orjson refuses and the json module accepts: each must decode exactly as before
    (b'{"code":1,"remark":"\\udc00x"}', lambda c: c.remark == "\udc00x"),
    (b'{"code":1,"extFields":{"n":NaN}}', lambda c: c.ext_fields == {"n": "nan"}),
    (b'{"code":1,"extFields":{"big":123456789012345678901234567890}}',
     lambda c: c.ext_fields == {"big": "123456789012345678901234567890"}),
])
def test_headers_orjson_refuses_take_the_json_module(header: bytes, check: object) -> None:
    cmd = decode(frame(header))
    assert callable(check) and check(cmd)


@pytest.mark.parametrize("header", [b'{"code":99999999999999999999999}', b"null", b'{"code":1', b'{"code":1}\xff'])
def test_bad_headers_still_raise_protocol_error(header: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(frame(header))
