"""The SDK's batch encoder in C (protocol/_batchenc.c) against its Python reference (batch.encode_keyed_batch_py):
the same body and keys byte for byte, or a hand-back to the reference for what it leaves to Python."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol import batch
from cometmq.protocol.batch import ITEM_OVERHEAD, KeyedItem, decode_batch, encode_keyed_batch_py
from cometmq.protocol.errors import LocalProtocolError
from cometmq.protocol.msgid import UniqKeyGenerator
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, encode_properties

C = batch._C_ENCODE
pytestmark = pytest.mark.skipif(C is None, reason="C helper not built")

_heads = st.one_of(st.just(b""), st.dictionaries(st.sampled_from(["TAGS", "KEYS", "a", "ünï"]),
                                                 st.sampled_from(["v", "TagA", "日本", "k1 k2"]),
                                                 min_size=1, max_size=3).map(encode_properties))
_bodies = st.one_of(st.binary(max_size=300), st.binary(max_size=50).map(bytearray),
                    st.binary(max_size=50).map(lambda b: memoryview(b)))
items = st.lists(st.tuples(_bodies, _heads, st.integers(-(2**31), 2**31 - 1)), max_size=20)
prefixes = st.one_of(st.text("0123456789ABCDEF", min_size=20, max_size=20), st.sampled_from(["", "é" * 20, "K"]))
firsts = st.one_of(st.integers(0, 2**48 - 1), st.integers(2**48 - 30, 2**48 + 5), st.integers(-5, -1))


def _python(its: list[KeyedItem], prefix: str, first: int) -> tuple[bytes, list[str]] | str:
    try:
        return encode_keyed_batch_py(its, prefix, first)
    except (LocalProtocolError, UnicodeEncodeError) as exc:
        return type(exc).__name__


@settings(max_examples=400, deadline=None)
@given(items, prefixes, firsts)
def test_encode_matches_reference(its: list[KeyedItem], prefix: str, first: int) -> None:
    want = _python(its, prefix, first)
    got = C.encode_keyed(its, prefix, first)
    if got is None:
        # handed back: only for what the helper does not take on
        assert not prefix.isascii() or first < 0 or first + len(its) > 2**48 or first >= 2**48
    else:
        assert got == want
        assert all(type(k) is str for k in got[1])
    # the entry the producer calls: the reference's answer either way
    if isinstance(want, str):
        with pytest.raises((LocalProtocolError, UnicodeEncodeError)):
            batch.encode_keyed_batch(its, prefix, first)
    else:
        assert batch.encode_keyed_batch(its, prefix, first) == want


def test_encoded_items_decode_back() -> None:
    gen = UniqKeyGenerator()
    its: list[KeyedItem] = [(b"body%d" % i, b"TAGS\x01t\x02" if i % 2 else b"", i - 3) for i in range(10)]
    prefix, first = gen.reserve(len(its))
    body, keys = batch.encode_keyed_batch(its, prefix, first)
    assert [k[:len(prefix)] for k in keys] == [prefix] * 10 and len(set(keys)) == 10
    decoded = decode_batch(body)
    assert [(d.body, d.flag) for d in decoded] == [(b, f) for b, _, f in its]
    assert [d.properties["UNIQ_KEY"] for d in decoded] == keys
    assert all(d.properties["WAIT"] == "true" for d in decoded)


def test_hand_backs_and_limits() -> None:
    prefix = "0A0B0C0D0E0F00112233"
    tail = len(b"UNIQ_KEY\x01\x02WAIT\x01true\x02") + len(prefix) + 12
    fits = [(b"x", b"p" * (MAX_PROPERTIES_LENGTH - tail), 0)]
    assert C.encode_keyed(fits, prefix, 0) == encode_keyed_batch_py(fits, prefix, 0)
    too_long = [(b"x", b"p" * (MAX_PROPERTIES_LENGTH - tail + 1), 0)]
    assert C.encode_keyed(too_long, prefix, 0) is None
    with pytest.raises(LocalProtocolError):
        batch.encode_keyed_batch(too_long, prefix, 0)
    assert C.encode_keyed([(b"x", b"", 2**31)], prefix, 0) is None
    assert C.encode_keyed([(b"x", "text", 0)], prefix, 0) is None
    assert C.encode_keyed([], prefix, 0) == (b"", [])
    assert C.layout() == {"ITEM_HEAD": batch._HEAD.size, "ITEM_OVERHEAD": ITEM_OVERHEAD,
                          "MAX_PROPERTIES_LENGTH": MAX_PROPERTIES_LENGTH, "KEY_DIGITS": 12}
