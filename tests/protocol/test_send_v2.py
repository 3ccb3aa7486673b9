"""protocol/send_v2.py: the one-step reading of a lone SEND_MESSAGE_V2 or SEND_MESSAGE frame. The reference
(``decode_send_v2_py``) takes only frames the generic decoder and header parsers read to the same values; the C
helper answers exactly what the reference answers, on well-formed frames and on any mutation of them."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cometmq.protocol import send_v2
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.headers import V2_KEYS, SendMessageRequestHeader, send_header_from_v2
from cometmq.protocol.remoting import RemotingCommand, SerializeType, decode, encode

C = send_v2._C_HELPER
MAX = 1 << 20
TEXT = st.text(max_size=10)
VALUES = st.one_of(st.sampled_from(["0", "1", "-1", "3", "true", "false", "", "TBW102", "T", "007", "-0", " 1",
                                    "+1", "1_0", "9" * 19, "2147483647", "2147483648", "-2147483648",
                                    "-2147483649", "TAGS\x01a\x02", "ü", "\U0001F600", "\udc80"]), TEXT)
KEYS = st.one_of(st.sampled_from([*"abcdefghijklmn", "topic", "queueId", "zz", "A"]), TEXT)
V1_KEYS = st.one_of(st.sampled_from([*V2_KEYS.values(), "b", "zz"]), TEXT)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    code = draw(st.sampled_from([310, 310, 310, 10, 10, 10, 320]))
    v1 = code == 10 and draw(st.integers(0, 4)) > 0  # (else a V1 frame with V2 keys, which the V2 parser reads)
    first, second = ("producerGroup", "topic") if v1 else ("a", "b")
    ext = {first: "pg", second: "T"}
    ext.update(draw(st.dictionaries(V1_KEYS if v1 else KEYS, VALUES, max_size=8)))
    for key in draw(st.lists(st.sampled_from([first, second]), max_size=2)):
        ext.pop(key, None)
    cmd = RemotingCommand(code, opaque=draw(st.integers(0, 2**31 - 1)),
                          flag=draw(st.sampled_from([0, 0, 1, 2, 4, 3])), ext_fields=ext,
                          body=draw(st.binary(max_size=20)), remark=draw(st.sampled_from([None, None, "r", "ü"])),
                          serialize_type=draw(st.sampled_from([SerializeType.JSON] * 5 + [SerializeType.ROCKETMQ])))
    frame = encode(cmd)
    if draw(st.booleans()) and frame[4] == 0:  # rewrite the JSON: other spacing, numbers, escapes, duplicates
        hlen = int.from_bytes(frame[5:8], "big")
        header = json.loads(frame[8:8 + hlen])
        if draw(st.booleans()):  # numbers and booleans as JSON values, as the C++ client sends some
            header["extFields"] = {k: int(v) if v.isascii() and v.isdigit() and len(v) < 12 else
                                   {"true": True, "false": False, "null": None}.get(v, v) if draw(st.booleans())
                                   else v for k, v in header["extFields"].items()}
        text = json.dumps(header, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
        if draw(st.booleans()):
            text = text.replace('"extFields": {', '"extFields": {"b": "T", ', 1)
        raw = text.encode("utf-8", "surrogatepass")
        frame = (4 + len(raw) + len(cmd.body)).to_bytes(4, "big") + len(raw).to_bytes(4, "big") + raw + cmd.body
    return frame


def generic(frame: bytes) -> send_v2.SendV2 | None:
    """What the generic path reads of the frame, when it is a single plain send it would serve (its header read
    as ``SendProcessor.send`` chooses: by letter for 310, or for a header with ``b`` and no ``topic``)."""
    try:
        cmd = decode(frame, MAX)
        if cmd.code not in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE):
            return None
        ext = cmd.ext_fields
        header = send_header_from_v2(ext) if cmd.code == RequestCode.SEND_MESSAGE_V2 or (
            "b" in ext and "topic" not in ext) else SendMessageRequestHeader.from_ext(ext)
    except RemoteProtocolError:
        return None
    if cmd.flag & 3 or header.batch:
        return None
    return (cmd.code, cmd.opaque, header.topic, header.queue_id, header.sys_flag, header.born_timestamp,
            header.flag, header.properties, header.reconsume_times, cmd.body)


def check(frame: bytes) -> None:
    ref = send_v2.decode_send_v2_py(frame, MAX)
    if ref is not None:
        assert ref == generic(frame)
    if C is not None:
        assert C.decode(frame, MAX) == ref
    event(f"code {ref[0]} taken" if ref is not None else "left to the generic path")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames())
def test_reader_agrees_with_the_generic_path(frame: bytes) -> None:
    check(frame)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), st.data())
def test_mutated_frames(frame: bytes, data: st.DataObject) -> None:
    raw = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[at] = data.draw(st.sampled_from([0x22, 0x5C, 0x7B, 0x7D, 0x2C, 0x3A, 0x20, 0x30, 0x2D, 0x80, 0xFF,
                                                 0x00, 0x75, 0x65, 0x2E]))
        elif op == "cut":
            del raw[at:at + data.draw(st.integers(1, 4))]
        else:
            raw[at:at] = data.draw(st.sampled_from([b" ", b"\\u0061", b"\\ud800", b"1", b",", b'"', b"null",
                                                    b"\xc3\xbc"]))
    if len(raw) >= 4 and data.draw(st.booleans()):  # keep the length field right, so the header is parsed
        raw[0:4] = (len(raw) - 4).to_bytes(4, "big")
    check(bytes(raw))


@pytest.mark.parametrize("frame", [
    b"",
    b"\x00\x00\x00\x04\x00\x00\x00\x00",
    b'\x00\x00\x00\x0c\x00\x00\x00\x08{"code"}',
])
def test_short_and_broken_frames_are_left_alone(frame: bytes) -> None:
    assert send_v2.decode_send_v2_py(frame, MAX) is None
    if C is not None:
        assert C.decode(frame, MAX) is None


def test_frame_over_the_limit_is_left_alone() -> None:
    frame = encode(RemotingCommand(310, ext_fields={"a": "pg", "b": "T"}, body=b"x" * 100))
    assert send_v2.decode_send_v2_py(frame, len(frame) - 4) is not None
    assert send_v2.decode_send_v2_py(frame, len(frame) - 5) is None
    if C is not None:
        assert C.decode(frame, len(frame) - 4) is not None and C.decode(frame, len(frame) - 5) is None


def test_the_cpp_clients_send_is_taken() -> None:
    """A SEND_MESSAGE header as the C++ client (PyPI rocketmq 0.4.4) writes it (docs/interop-notes.md): some
    values JSON numbers, the booleans "0"."""
    ext = {"batch": "0", "bornTimestamp": "1764000000000", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "flag": 0, "producerGroup": "pg", "properties": "UNIQ_KEY\x01AB\x02WAIT\x01true\x02", "queueId": 2,
           "reconsumeTimes": "0", "sysFlag": 0, "topic": "T", "unitMode": "0"}
    header = json.dumps({"code": 10, "language": "CPP", "version": 0, "opaque": 7, "flag": 0, "remark": "",
                         "extFields": ext}).encode()
    body = b"hello"
    frame = (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body
    want = (10, 7, "T", 2, 0, 1764000000000, 0, "UNIQ_KEY\x01AB\x02WAIT\x01true\x02", 0, body)
    assert send_v2.decode_send_v2_py(frame, MAX) == want == generic(frame)
    if C is not None:
        assert C.decode(frame, MAX) == want


@pytest.mark.parametrize("letter", ["d", "e", "f", "g", "h", "j", "l"])
def test_a_number_past_its_java_type_is_left_to_the_header_parser(letter: str) -> None:
    """Every numeric field but bornTimestamp (g, a Java long: its 18 digits always fit) is a Java int: one past
    its range is left to the generic path, whose header parser refuses it."""
    def frame(value: int) -> bytes:
        return encode(RemotingCommand(310, opaque=5, ext_fields={"a": "pg", "b": "T", letter: str(value)}, body=b"x"))

    wide = letter == "g"
    for ok in ((10**18 - 1, -(10**18) + 1) if wide else (2**31 - 1, -(2**31))):
        assert send_v2.decode_send_v2_py(frame(ok), MAX) is not None and generic(frame(ok)) is not None
        if C is not None:
            assert C.decode(frame(ok), MAX) == send_v2.decode_send_v2_py(frame(ok), MAX)
    if wide:
        return
    for bad in (2**31, -(2**31) - 1, 2**40):
        assert send_v2.decode_send_v2_py(frame(bad), MAX) is None
        if C is not None:
            assert C.decode(frame(bad), MAX) is None
        with pytest.raises(RemoteProtocolError, match="is out of range for a Java int"):
            send_header_from_v2(decode(frame(bad), MAX).ext_fields)
