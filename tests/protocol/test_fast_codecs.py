"""The allocation-light codecs agree with the straightforward ones, and stay as strict."""

from __future__ import annotations

import pytest

from cometmq.protocol.batch import decode_batch, decode_batch_raw, encode_batch, encode_batch_raw
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.msgid import UniqKeyGenerator
from cometmq.protocol.properties import decode_properties, encode_properties
from tests.kit import FakeClock


@pytest.mark.parametrize("raw, expected", [
    (b"", {}),
    (b"a\x01b", {"a": "b"}),
    (b"a\x01b\x02c\x01\x02", {"a": "b", "c": ""}),
    (b"a\x01b\x02\x02c\x01d\x02", {"a": "b", "c": "d"}),       # an empty pair is skipped
    (b"\x01nameless\x02a\x01b", {"a": "b"}),                   # a nameless pair is skipped
    (b"novalue\x02k\x01v", {"k": "v"}),                        # a pair without separator is skipped
    (b"k\x01v\x01w\x02k\x012", {"k": "2"}),                    # the last value wins; 0x01 in a value stays
    ("é\x01ü\x02".encode(), {"é": "ü"}),
])
def test_decode_properties_fast_and_lenient_paths(raw: bytes, expected: dict[str, str]) -> None:
    assert decode_properties(raw) == expected
    assert decode_properties(memoryview(raw)) == expected


def test_decode_properties_rejects_bad_utf8() -> None:
    with pytest.raises(ProtocolError):
        decode_properties(b"k\x01\xff\x02")


def test_raw_batch_codecs_match_the_mapping_ones() -> None:
    items = [(b"body%d" % i, {"UNIQ_KEY": f"K{i}", "TAGS": "t"}, i) for i in range(5)] + [(b"", {}, 0)]
    wire = encode_batch(items)
    assert encode_batch_raw([(b, encode_properties(p), f) for b, p, f in items]) == wire
    raw = decode_batch_raw(wire)
    assert [(b, decode_properties(p), f) for b, p, f in raw] == [(b, p, f) for b, p, f in items]
    assert [(x.body, x.properties, x.flag, x.properties_raw) for x in decode_batch(wire)] == [
        (b, decode_properties(p), f, p) for b, p, f in raw]
    assert decode_batch_raw(bytearray(wire)) == raw and decode_batch_raw(memoryview(wire)) == raw


@pytest.mark.parametrize("cut", [1, 5, 21, 30])
def test_raw_batch_decode_rejects_truncation(cut: int) -> None:
    wire = encode_batch([(b"abcdef", {"UNIQ_KEY": "K"}, 0)])
    with pytest.raises(ProtocolError):
        decode_batch_raw(wire[:-cut])


def test_raw_batch_encode_rejects_oversized_properties() -> None:
    with pytest.raises(ProtocolError):
        encode_batch_raw([(b"x", b"k\x01" + b"v" * 40000, 0)])


def test_new_keys_are_unique_and_continue_new_key() -> None:
    clock = FakeClock(1_800_000_000_000)
    gen = UniqKeyGenerator("10.0.0.1", clock_ms=clock)
    first = gen.new_key()
    batch = gen.new_keys(1000)
    last = gen.new_key()
    keys = [first, *batch, last]
    assert len(set(keys)) == len(keys) and all(len(k) == 32 for k in keys)
    assert keys == sorted(keys)  # one prefix, values only grow
    assert [int(k[20:], 16) for k in keys] == list(range(int(first[20:], 16), int(first[20:], 16) + 1002))
    clock.advance(5)
    later = gen.new_keys(3)
    assert later[0] > last and gen.new_keys(0) == []
