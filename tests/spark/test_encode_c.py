"""The optional C encoder (cometmq.spark._encodec) against the reference (a Message per row, encoded by
cometmq.protocol.batch): the same bytes for the same rows, or both refuse; the reference where the C helper gives
up."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cometmq.client.errors import InvalidArgumentError
from cometmq.protocol.batch import decode_batch
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH
from cometmq.spark import encode
from cometmq.spark.encode import Columns, encode_rows, encode_rows_py

needs_c = pytest.mark.skipif(encode.C_HELPER is None, reason="C helper not built")


def test_the_c_helper_is_built() -> None:
    """The install compiles it on this kind of machine; a silent fallback would hide a slower writer."""
    if os.environ.get("COMETMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("COMETMQ_PURE_PYTHON is set")
    assert encode.C_HELPER is not None


def c_encode(cols: Columns, rows: np.ndarray, cuts: list[int], prefix: str, first: int,
             max_props: int = MAX_PROPERTIES_LENGTH) -> list[bytes] | None:
    def capsules(arr: pa.Array | None) -> Any:
        return None if arr is None else arr.__arrow_c_array__()

    return encode.C_HELPER.encode(  # type: ignore[no-any-return]
        capsules(cols.body), capsules(cols.tags), capsules(cols.keys), capsules(cols.properties),
        np.ascontiguousarray(rows, dtype=np.int64), np.asarray(cuts, dtype=np.int64), prefix.encode(), first,
        encode._RESERVED_NAMES, max_props)


# Texts with the awkward cases: spaces (keys split on them), non-ASCII, duplicate names, null values; and, in a
# "dirty" batch, what the reference refuses: separators, reserved and empty names, null and empty bodies.
WORDS = ["", " ", "a", "k1", "k1 k2", "  k3  ", "héllo", "日本", "TagA", "x" * 40, "None"]
BAD_WORDS = ["a\x01b", "c\x02"]
NAMES = ["a", "b", "source", "TAGSX", "ünï", "x y"]
BAD_NAMES = ["", "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TIMER_DELAY_SEC", "n\x01", "n\x02"]


def strategies(dirty: bool) -> dict[str, st.SearchStrategy[Any]]:
    words = st.sampled_from(WORDS + BAD_WORDS if dirty else WORDS)
    text = st.one_of(words, st.text(alphabet=st.characters(exclude_categories=["Cs"],
                                                           exclude_characters="" if dirty else "\x01\x02"),
                                    max_size=8))
    body = st.binary(min_size=1, max_size=40)
    entry = st.tuples(st.sampled_from(NAMES + BAD_NAMES if dirty else NAMES), st.one_of(st.none(), text))
    return {"text": text,
            "body": st.one_of(body, body, body, st.none(), st.just(b"")) if dirty else body,
            "map": st.one_of(st.none(), st.lists(entry, max_size=5)),
            "list": st.one_of(st.none(), st.lists(st.one_of(st.none(), text), max_size=4))}


@st.composite
def batches(draw: st.DrawFn) -> tuple[Columns, np.ndarray, list[int], str, int]:
    n = draw(st.integers(1, 12))
    pad = draw(st.integers(0, 3))  # rows sliced off the front: the arrays then have an offset
    total = n + pad

    def column(values: st.SearchStrategy[Any], kind: pa.DataType) -> pa.Array:
        return pa.array(draw(st.lists(values, min_size=total, max_size=total)), kind).slice(pad)

    kinds = strategies(draw(st.booleans()))
    text = kinds["text"]
    large = draw(st.booleans())
    body_kind = draw(st.sampled_from([pa.binary(), pa.string()]))
    if large:
        body_kind = pa.large_binary() if body_kind == pa.binary() else pa.large_string()
    raw = draw(st.lists(kinds["body"], min_size=total, max_size=total))
    if pa.types.is_string(body_kind) or pa.types.is_large_string(body_kind):
        raw = [None if b is None else b.decode("latin-1") for b in raw]
    body = pa.array(raw, body_kind).slice(pad)
    tags = column(st.one_of(st.none(), text), pa.string()) if draw(st.booleans()) else None
    keys = None
    if draw(st.booleans()):
        keys = (column(st.one_of(st.none(), text), pa.large_string() if large else pa.string())
                if draw(st.booleans()) else column(kinds["list"], pa.list_(pa.string())))
    props = column(kinds["map"], pa.map_(pa.string(), pa.string())) if draw(st.booleans()) else None
    rows = np.array(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n)), dtype=np.int64)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=4))) | {len(rows)})
    prefix = draw(st.text("0123456789ABCDEF", min_size=20, max_size=20))
    first = draw(st.one_of(st.integers(0, 2**20), st.just(2**48 - len(rows))))
    return Columns(body, tags, keys, props), rows, cuts, prefix, first


def reference(cols: Columns, rows: np.ndarray, cuts: list[int], prefix: str, first: int) -> list[bytes] | None:
    try:
        return encode_rows_py(cols, rows, cuts, prefix, first)
    except InvalidArgumentError:
        return None


@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_c_matches_the_reference_byte_for_byte(case: tuple[Columns, np.ndarray, list[int], str, int]) -> None:
    """Same bodies, or both refuse (the reference refuses by raising, the C helper by giving up)."""
    cols, rows, cuts, prefix, first = case
    assert c_encode(cols, rows, cuts, prefix, first) == reference(cols, rows, cuts, prefix, first)


@needs_c
def test_the_reference_writes_what_the_layout_owner_reads() -> None:
    """Not only equal: decode_batch reads back each row's body, properties and id."""
    cols = Columns(pa.array([b"one", b"two"]), pa.array(["t", None]), pa.array([["k1", "", None, "k2"], None],
                   pa.list_(pa.string())), pa.array([[("a", "1"), ("b", None), ("a", "2")], None],
                                                    pa.map_(pa.string(), pa.string())))
    (body,) = encode_rows(cols, np.array([1, 0]), [2], "AB" * 10, 0xFF)
    two, one = decode_batch(body)
    assert (two.body, two.properties) == (b"two", {"UNIQ_KEY": "ABABABABABABABABABAB0000000000FF", "WAIT": "true"})
    assert (one.body, one.properties) == (b"one", {"a": "2", "b": "None", "TAGS": "t", "KEYS": "k1 k2",
                                                   "UNIQ_KEY": "ABABABABABABABABABAB000000000100", "WAIT": "true"})
    assert c_encode(cols, np.array([1, 0]), [2], "AB" * 10, 0xFF) == [body]


@needs_c
def test_c_gives_up_where_it_must() -> None:
    """Long properties, ids past 48 bits, a layout it does not read, a row out of range: None, and encode_rows
    then gives the reference's answer (bytes or the error naming the row)."""
    cols = Columns(pa.array([b"x"]), properties=pa.array([[("p", "v" * 40)]], pa.map_(pa.string(), pa.string())))
    assert c_encode(cols, np.array([0]), [1], "0" * 20, 0, max_props=60) is None
    assert c_encode(cols, np.array([0]), [1], "0" * 20, 0, max_props=200) is not None
    assert c_encode(cols, np.array([0]), [1], "0" * 20, 2**48) is None
    assert c_encode(cols, np.array([1]), [1], "0" * 20, 0) is None
    assert c_encode(cols, np.array([0]), [0, 1], "0" * 20, 0) is None
    views = Columns(pa.array(["x", "y"], pa.string_view()))
    assert c_encode(views, np.array([0, 1]), [2], "0" * 20, 0) is None
    assert encode_rows(views, np.array([0, 1]), [2], "0" * 20, 0) == \
        encode_rows(Columns(pa.array(["x", "y"])), np.array([0, 1]), [2], "0" * 20, 0)
    bad = Columns(pa.array([b"x", b"y"]), tags=pa.array(["ok", "t\x01"]))
    with pytest.raises(InvalidArgumentError, match=r"row 8 of the task: .*separator"):
        encode_rows(bad, np.array([0, 1]), [2], "0" * 20, 0, first_row=7)
