"""The optional C decoder (cometmq.spark._decodec) against the numpy/Arrow decoder, the reference: the same
batch for the same records, or the same error; the reference's handling where the C helper gives up."""

from __future__ import annotations

import os
import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.common.native import load_c_helper
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MAGIC_CODE, SysFlag, encode_parts
from cometmq.spark import decode
from cometmq.spark.schema import arrow_schema, read_schema

needs_c = pytest.mark.skipif(decode.C_HELPER is None, reason="C helper not built")
SCHEMAS = [arrow_schema(read_schema()), arrow_schema(read_schema(include_properties=False))]


def test_the_c_helper_is_built() -> None:
    """The install compiles it on this kind of machine; a silent fallback would hide a slower reader."""
    if os.environ.get("COMETMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("COMETMQ_PURE_PYTHON is set")
    assert decode.C_HELPER is not None


NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TAG", "TAGSX",
         "UNIQ_KEYS", "KEYZ", "", "a", "source", "ÿname", "x" * 70]
VALUES = ["", "v", "TagA", "k1 k2", "héllo", "7F0000010000ABCDEF", "a\x01b", "日本"]

pair = st.one_of(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)).map(lambda kv: f"{kv[0]}\x01{kv[1]}".encode()),
    st.sampled_from([b"noseparator", b"", b"\x01nameless", b"\x00\x01zero", b"name\x01\xff\xfe"]),  # odd ones
    st.binary(max_size=12),
)
properties = st.tuples(st.lists(pair, max_size=7), st.booleans()).map(
    lambda p: b"".join(x + b"\x02" for x in p[0])[: None if p[1] else -1] if p[0] else b"")
body = st.one_of(st.binary(max_size=60), st.just(MAGIC_CODE.to_bytes(4, "big") + (300).to_bytes(4, "big")))
record = st.builds(
    lambda props, body, compressed, qid, off, ts, host, rc: encode_parts(
        topic=b"T", body=zlib.compress(body) if compressed == 1 else body, properties=props[: 32000],
        queue_id=qid, queue_offset=off, physical_offset=off * 300, sys_flag=int(SysFlag.COMPRESSED) if compressed
        else 0, born_timestamp=ts, store_timestamp=ts + 7, store_host=host, reconsume_times=rc),
    properties, body, st.sampled_from([0, 0, 0, 1, 2]),  # 2: flagged compressed, not inflatable
    st.integers(0, 2**31 - 1), st.integers(0, 2**52), st.integers(0, 2**50), st.binary(min_size=8, max_size=8),
    st.integers(0, 16))


def both(chunks: list[bytes], schema: pa.Schema) -> tuple[object, object]:
    """(reference result or error, C path result or error)."""
    def run(fn: object) -> object:
        try:
            return fn()  # type: ignore[operator]
        except ProtocolError as exc:
            return ("error", str(exc))

    ref = run(lambda: decode._decode_py(b"".join(chunks), "T", "broker-a", schema))
    got = run(lambda: decode.decode_answers(chunks, "T", "broker-a", schema))
    return ref, got


def same(ref: object, got: object) -> None:
    if isinstance(ref, pa.RecordBatch):
        assert isinstance(got, pa.RecordBatch)
        got.validate(full=True)
        assert got.schema.equals(ref.schema)
        assert got.equals(ref), (got.to_pylist()[:3], ref.to_pylist()[:3])
    else:
        assert got == ref


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=4), st.sampled_from(SCHEMAS))
def test_c_decoder_equals_the_reference(answers: list[list[bytes]], schema: pa.Schema) -> None:
    same(*both([b"".join(a) for a in answers], schema))


@needs_c
@settings(max_examples=150, deadline=None)
@given(st.lists(record, min_size=1, max_size=5), st.integers(0, 10_000), st.integers(0, 255))
def test_corrupt_answers_fail_or_decode_the_same(recs: list[bytes], where: int, byte: int) -> None:
    """A byte changed or the answer cut anywhere: the C path gives what the reference gives (an error
    mostly, the same batch when the change is harmless)."""
    buf = bytearray(b"".join(recs))
    pos = where % len(buf)
    for schema in SCHEMAS:
        same(*both([bytes(buf[:pos])], schema))
        changed = bytearray(buf)
        changed[pos] = byte
        same(*both([bytes(changed)], schema))


@needs_c
def test_c_path_takes_the_common_case() -> None:
    """Records as producers write them are decoded in C (not handed back to the reference)."""
    recs = [encode_parts(topic=b"T", body=b"x" * 100, queue_id=1, queue_offset=i, properties=(
        f"TAGS\x01TagA\x02KEYS\x01k{i}\x02UNIQ_KEY\x01U{i}\x02WAIT\x01true\x02source\x01bench\x02".encode()))
        for i in range(50)]
    recs.append(encode_parts(topic=b"T", body=b"y", queue_offset=50, properties=b""))  # no UNIQ_KEY: offset id
    answers = [b"".join(recs[:20]), b"".join(recs[20:])]
    for schema in SCHEMAS:
        out = decode.C_HELPER.decode(answers, "properties" in schema.names, decode._WANTED, decode._HIDDEN)
        assert out is not None and out[0] == 51
        ref, got = both(answers, schema)
        same(ref, got)
    rows = decode.decode_answers(answers, "T", "b", SCHEMAS[0]).to_pylist()
    assert rows[7]["properties"] == [("source", "bench")] and rows[7]["keys"] == "k7" and rows[7]["msgId"] == "U7"
    assert rows[50]["tags"] is None and rows[50]["msgId"] == "7F000001000000000000000000000000"


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMETMQ_PURE_PYTHON", "1")
    assert load_c_helper("cometmq.spark._decodec") is None
