from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.batch import BatchItem, decode_batch, encode_batch
from cometmq.protocol.errors import ProtocolError

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
_chars = st.characters(codec="utf-8", exclude_characters="\x01\x02")
property_maps = st.dictionaries(
    st.text(_chars, min_size=1, max_size=12), st.text(_chars, max_size=30), max_size=5
)
messages = st.lists(st.tuples(st.binary(max_size=200), property_maps, INT32), max_size=6)


def test_known_encoding() -> None:
    data = encode_batch([(b"hi", {"K": "v"}, 3)])
    expected = (
        struct.pack(">iiiii", 20 + 2 + 2 + 4, 0, 0, 3, 2)  # TOTALSIZE MAGIC(0) BODYCRC(0) FLAG BODYLEN
        + b"hi"
        + struct.pack(">h", 4)
        + b"K\x01v\x02"
    )
    assert data == expected
    [item] = decode_batch(data)
    assert item == BatchItem(b"hi", {"K": "v"}, 3, b"K\x01v\x02")
    assert item.body_crc == zlib.crc32(b"hi") & 0x7FFFFFFF


def test_two_items_and_empty_batch() -> None:
    data = encode_batch([(b"a", {"TAGS": "x"}, 0), (b"", {}, -1)])
    items = decode_batch(data)
    assert [(i.body, i.properties, i.flag) for i in items] == [(b"a", {"TAGS": "x"}, 0), (b"", {}, -1)]
    assert items[1].body_crc == 0
    assert encode_batch([]) == b""
    assert decode_batch(b"") == []


def test_magic_and_crc_fields_are_ignored_on_decode() -> None:
    data = bytearray(encode_batch([(b"body", {"A": "1"}, 5)]))
    struct.pack_into(">II", data, 4, 0xDAA320A7, 12345)
    (item,) = decode_batch(bytes(data))
    assert item.body_crc == zlib.crc32(b"body") & 0x7FFFFFFF
    assert item.flag == 5


def test_body_crc_is_masked() -> None:
    (item,) = decode_batch(encode_batch([(b"a", {}, 0)]))  # crc32(b"a") has its high bit set
    assert item.body_crc == 0x68B7BE43


def test_accepts_memoryview() -> None:
    data = encode_batch([(memoryview(b"xyz"), {"A": "1"}, 1)])
    assert decode_batch(memoryview(data))[0].body == b"xyz"


@settings(max_examples=150, deadline=None)
@given(messages)
def test_round_trip(msgs: list[tuple[bytes, dict[str, str], int]]) -> None:
    data = encode_batch(msgs)
    items = decode_batch(data)
    assert [(i.body, i.properties, i.flag) for i in items] == msgs
    assert [i.body_crc for i in items] == [zlib.crc32(b) & 0x7FFFFFFF for b, _, _ in msgs]
    pos = 0
    for body, props, _ in msgs:  # each TOTALSIZE = 20 + n + 2 + p, magic and CRC zero
        total, magic, crc = struct.unpack_from(">iii", data, pos)
        p = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in props.items())
        assert (total, magic, crc) == (20 + len(body) + 2 + p, 0, 0)
        pos += total
    assert pos == len(data)


@pytest.mark.parametrize(
    "msgs",
    [
        [(b"", {"A": "x\x01"}, 0)],
        [(b"", {"A\x02": "x"}, 0)],
        [(b"", {"": "x"}, 0)],
        [(b"", {}, 1 << 31)],
        [(b"", {"K": "v" * 32767}, 0)],
    ],
)
def test_encode_refuses(msgs: list[tuple[bytes, dict[str, str], int]]) -> None:
    with pytest.raises(ProtocolError):
        encode_batch(msgs)


def _patched(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, pos, value)
    return bytes(buf)


def test_malformed_batches_raise_protocol_error() -> None:
    one = encode_batch([(b"body", {"A": "1"}, 7)])  # body at 20..24, props length at 24, props 26..30
    two = one + encode_batch([(b"x", {}, 0)])
    bad = [
        _patched(one, 0, ">i", -1),  # negative total
        _patched(one, 0, ">i", 21),  # total below the fixed part
        _patched(one, 0, ">i", len(one) + 1),  # total beyond the data
        _patched(one, 0, ">i", len(one) - 1),  # total disagrees with the parts
        _patched(one, 16, ">i", -1),  # negative body length
        _patched(one, 16, ">i", 5),  # body runs into the properties length
        _patched(one, 16, ">i", 1 << 30),  # body overruns everything
        _patched(one, 24, ">h", -1),  # negative properties length
        _patched(one, 24, ">h", 3),  # properties end early
        _patched(one, 24, ">h", 5),  # properties overrun
        one[:-2] + b"\xff" + one[-1:],  # properties not UTF-8
        one + b"\x00",  # trailing byte
        two[: len(one) + 21],  # second item truncated inside its fixed part
    ]
    for data in bad:
        with pytest.raises(ProtocolError):
            decode_batch(data)


def test_every_proper_prefix_is_refused() -> None:
    data = encode_batch([(b"body", {"A": "1"}, 7), (b"", {"TAGS": "t"}, 0)])
    first = struct.unpack_from(">i", data, 0)[0]
    for cut in range(1, len(data)):
        if cut == first:
            assert len(decode_batch(data[:cut])) == 1  # a whole first item alone is a valid batch
            continue
        with pytest.raises(ProtocolError):
            decode_batch(data[:cut])


def _decode_or_protocol_error(data: bytes | bytearray) -> None:
    try:
        items = decode_batch(data)
    except ProtocolError:
        return
    assert sum(22 + len(i.body) for i in items) <= len(data)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _decode_or_protocol_error(data)


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    messages,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_fuzz_mutated_batches(
    data: st.DataObject, msgs: list[tuple[bytes, dict[str, str], int]], edits: list[tuple[int, int]]
) -> None:
    buf = bytearray(encode_batch(msgs) + encode_batch([(b"tail", {"A": "1"}, 0)]))
    for pos, value in edits:
        buf[pos % len(buf)] = value
    cut = data.draw(st.integers(0, len(buf)))
    _decode_or_protocol_error(buf[:cut])
    _decode_or_protocol_error(buf)
