from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.properties import decode_properties, encode_properties

_chars = st.characters(codec="utf-8", exclude_characters="\x01\x02")
names = st.text(_chars, min_size=1, max_size=12)
values = st.text(_chars, max_size=30)
property_maps = st.dictionaries(names, values, max_size=6)


def test_known_encoding() -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "0A"}
    assert encode_properties(props) == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x010A\x02"


def test_values_are_utf8() -> None:
    assert encode_properties({"TAGS": "\u00e9"}) == b"TAGS\x01\xc3\xa9\x02"
    assert decode_properties(b"TAGS\x01\xc3\xa9\x02") == {"TAGS": "\u00e9"}


def test_empty() -> None:
    assert encode_properties({}) == b""
    assert decode_properties(b"") == {}


def test_decode_tolerates_missing_final_separator() -> None:
    assert decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}


def test_decode_skips_pairs_without_name_or_separator() -> None:
    assert decode_properties(b"junk\x02\x01nameless\x02A\x011\x02\x02") == {"A": "1"}


def test_decode_keeps_empty_value_and_last_duplicate() -> None:
    assert decode_properties(b"A\x01\x02B\x01x\x02B\x01y\x02") == {"A": "", "B": "y"}


def test_decode_accepts_memoryview_and_bytearray() -> None:
    data = b"A\x011\x02"
    assert decode_properties(memoryview(data)) == {"A": "1"}
    assert decode_properties(bytearray(data)) == {"A": "1"}


@pytest.mark.parametrize(
    "props",
    [
        {"TA\x01GS": "x"},
        {"TA\x02GS": "x"},
        {"TAGS": "a\x01b"},
        {"TAGS": "a\x02b"},
        {"": "value"},  # would vanish on decode
        {"TAGS": "\ud800"},  # lone surrogate cannot be UTF-8
    ],
)
def test_encode_refuses(props: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        encode_properties(props)


def test_decode_refuses_invalid_utf8() -> None:
    with pytest.raises(ProtocolError):
        decode_properties(b"TAGS\x01\xff\x02")


@settings(max_examples=200)
@given(property_maps)
def test_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_decode_any_bytes_decodes_or_raises_protocol_error(data: bytes) -> None:
    try:
        result = decode_properties(data)
    except ProtocolError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())


@settings(max_examples=200)
@given(st.lists(st.sampled_from([b"\x01", b"\x02", b"A", b"\xc3\xa9", b"\xff", b""]), max_size=30))
def test_decode_separator_soup_decodes_or_raises_protocol_error(chunks: list[bytes]) -> None:
    try:
        result = decode_properties(b"".join(chunks))
    except ProtocolError:
        return
    assert all(k and "\x02" not in k and "\x01" not in k for k in result)
