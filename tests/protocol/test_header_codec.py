"""The JSON header codec in C (cometmq.protocol._sendv2c: loads_header, dumps_header) against its reference, the json
module as cometmq.protocol.remoting calls it: byte for byte on the way out, value for value on the way in, and None
(the json module decides) wherever it is not sure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.common.native import load_c_helper
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import _json_encode

C: Any = load_c_helper("cometmq.protocol._sendv2c")
pytestmark = pytest.mark.skipif(C is None, reason="the C helpers are not built")

#: any code point, lone surrogates and DEL included (the json module escapes both)
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=24)
INT64 = st.integers(-(2**63), 2**63 - 1)


def reference(code: object, language: str, version: object, opaque: object, flag: object, remark: str | None,
              ext: dict[str, str]) -> bytes:
    """What remoting._json_header writes through the json module."""
    header: dict[str, object] = {"code": code, "language": language, "version": version, "opaque": opaque,
                                 "flag": flag}
    if remark is not None:
        header["remark"] = remark
    header["extFields"] = ext
    header["serializeTypeCurrentRPC"] = "JSON"
    return _json_encode(header).encode("ascii")


@settings(max_examples=400, deadline=None)
@given(code=INT64, language=TEXT, version=INT64, opaque=INT64, flag=INT64, remark=st.none() | TEXT,
       ext=st.dictionaries(TEXT, TEXT, max_size=6))
def test_dumps_header_writes_what_the_json_module_writes(code: int, language: str, version: int, opaque: int,
                                                         flag: int, remark: str | None, ext: dict[str, str]) -> None:
    assert C.dumps_header(code, language, version, opaque, flag, remark, ext) == reference(
        code, language, version, opaque, flag, remark, ext)


def test_dumps_header_leaves_what_it_does_not_take_to_the_json_module() -> None:
    ok = (310, "JAVA", 317, 1, 0, None, {"a": "b"})
    assert C.dumps_header(*ok) == reference(*ok)
    assert C.dumps_header(RequestCode.SEND_MESSAGE_V2, *ok[1:]) == reference(*ok)  # an IntEnum is its number
    for i, bad in ((4, True), (0, 2**63), (3, -(2**63) - 1), (0, 1.0), (1, None), (5, 7), (6, {"a": 1}),
                   (6, {1: "a"}), (6, [("a", "b")])):
        args = list(ok)
        args[i] = bad
        assert C.dumps_header(*args) is None, (i, bad)


#: a JSON value of the shapes headers hold: scalars, and at the top an object of those or of objects of them
SCALAR = st.none() | st.booleans() | st.integers(-(10**18) + 1, 10**18 - 1) | TEXT
HEADER = st.dictionaries(TEXT, SCALAR | st.dictionaries(TEXT, SCALAR, max_size=4), max_size=8)


@settings(max_examples=400, deadline=None)
@given(header=HEADER, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]),
       pad=st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_loads_header_reads_what_the_json_module_reads(header: dict[str, Any], ascii_only: bool, indent: int | None,
                                                       pad: str) -> None:
    text = pad + json.dumps(header, ensure_ascii=ascii_only, indent=indent) + pad
    raw = text.encode("utf-8", "surrogatepass")
    got = C.loads_header(raw)
    try:
        want = json.loads(raw.decode("utf-8"))
    except ValueError:  # a lone surrogate written raw is no UTF-8: the json module refuses it, and so does C
        assert got is None
        return
    if got is None:  # only where it is not sure: a lone surrogate escape
        assert "\\ud" in text.lower() or any(0xD800 <= ord(ch) <= 0xDFFF for ch in text), text
    else:
        assert got == want and type(got) is dict
        assert all(type(got[k]) is type(want[k]) for k in want)  # True stays a bool, 1 an int


@settings(max_examples=600, deadline=None)
@given(data=st.binary(max_size=64) | st.builds(
    lambda doc, cut, junk: (doc[:cut] + junk + doc[cut:]),
    st.builds(lambda h: json.dumps(h).encode(), HEADER), st.integers(0, 200), st.binary(max_size=3)))
def test_loads_header_on_any_bytes_is_the_json_module_or_none(data: bytes) -> None:
    got = C.loads_header(data)
    try:
        want = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        assert got is None, data
        return
    assert got is None or got == want, data


@pytest.mark.parametrize("text", [
    b'{"a":1.5}', b'{"a":1e3}', b'{"a":[1]}', b'{"a":{"b":{}}}', b'{"a":NaN}', b'{"a":12345678901234567890}',
    b'{"a":"\\ud800"}', b'{} x', b"[]", b'"s"', b"", b'\xef\xbb\xbf{}', b'{"a":"\xff"}', b'{"a":01}',
])
def test_loads_header_gives_way_where_the_json_module_must_decide(text: bytes) -> None:
    assert C.loads_header(text) is None


def test_loads_header_keeps_the_last_of_a_repeated_key_and_reads_escapes() -> None:
    raw = b' {"k":"\\ud83d\\ude00\\u00e9\\n","k":2,"e":{"x":"\\"","x":"y"},"t":true,"n":null} '
    assert C.loads_header(raw) == json.loads(raw) == {"k": 2, "e": {"x": "y"}, "t": True, "n": None}
