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
from cometmq.protocol import record_layout
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
#: a packed host: IPv4 mostly, IPv6 (20 bytes: the record's sys flag says so, and the fields after it move)
host = st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=8, max_size=8),
                 st.binary(min_size=20, max_size=20))
record = st.builds(
    lambda props, body, compressed, qid, off, ts, born, host, rc: encode_parts(
        topic=b"T", body=zlib.compress(body) if compressed == 1 else body, properties=props[: 32000],
        queue_id=qid, queue_offset=off, physical_offset=off * 300, sys_flag=int(SysFlag.COMPRESSED) if compressed
        else 0, born_timestamp=ts, born_host=born, store_timestamp=ts + 7, store_host=host, reconsume_times=rc),
    properties, body, st.sampled_from([0, 0, 0, 1, 2]),  # 2: flagged compressed, not inflatable
    st.integers(0, 2**31 - 1), st.integers(0, 2**52), st.integers(0, 2**50), host, host, st.integers(0, 16))


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


# Property strings that span several 64-byte blocks of the C split, with separators, the names it looks for,
# non-ASCII and invalid UTF-8 anywhere (a value can hold \x01; any piece without \x01 is a dropped pair).
TOKENS = [b"\x01", b"\x02", b"\x02", b"\x00", b"a", b"bench", b"x" * 30, b"\xff", b"\xc3\xa9", b"\xc3", b"\xe6\x97\xa5",
          b"TAGS\x01", b"KEYS\x01", b"UNIQ_KEY\x01", b"WAIT\x01", b"DELAY\x01", b"TIMER_DELAY_MS\x01",
          b"TIMER_DELAY_SEC\x01", b"TIMER_DELIVER_MS\x01", b"TIMER_DELAY_MSX\x01"]


def records(props: list[bytes]) -> list[bytes]:
    return [encode_parts(topic=b"T", body=b"b" * i, properties=p, queue_offset=i, store_timestamp=5)
            for i, p in enumerate(props)]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(TOKENS), max_size=90).map(b"".join), min_size=1, max_size=4),
       st.integers(1, 4))
def test_c_decoder_equals_the_reference_on_long_properties(props: list[bytes], cut: int) -> None:
    recs = records(props)
    for schema in SCHEMAS:
        same(*both([b"".join(recs[:cut]), b"".join(recs[cut:])] if cut < len(recs) else [b"".join(recs)], schema))


def pairs_string(pairs: list[bytes]) -> bytes:
    return b"".join(p + b"\x02" for p in pairs)


no_sep = st.binary(max_size=20).map(lambda b: b.replace(b"\x01", b"").replace(b"\x02", b""))
HIDDEN_ONLY = sorted(set(decode._HIDDEN) - set(decode._WANTED))  # hidden, no column: their values are never read
INVALID = [b"\xff", b"\xc3", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xfe"]
good_pair = st.sampled_from([b"source\x01bench", b"k\x01v\x01w", b"n\xc3\xa9\x01h\xc3\xa9llo", b"TAGS\x01TagA",
                             b"KEYS\x01k1 k2", b"UNIQ_KEY\x01" + b"AB" * 16, b"x\x01" + b"y" * 70])
# Pairs whose bytes end up in no column: a hidden property's value, a pair without \x01, a pair without a name.
ignored_pair = st.one_of(
    st.builds(lambda n, v: n + b"\x01" + v, st.sampled_from(HIDDEN_ONLY), st.binary(max_size=20).map(
        lambda b: b.replace(b"\x02", b""))),
    no_sep.filter(bool),
    no_sep.map(lambda b: b"\x01" + b))


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(good_pair, ignored_pair), max_size=10).map(pairs_string), min_size=1, max_size=5))
def test_c_path_ignores_bytes_that_reach_no_column(props: list[bytes]) -> None:
    """Non-UTF-8 bytes in a hidden property's value or in a dropped pair do not send the records to the
    reference (they are in no column): the C path decodes them, to the reference's batch."""
    answers = [b"".join(records(props))]
    for schema in SCHEMAS:
        assert decode.C_HELPER.decode(answers, "properties" in schema.names, decode._WANTED, decode._HIDDEN) is not None
        same(*both(answers, schema))


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(good_pair, ignored_pair), max_size=6), st.lists(st.one_of(good_pair, ignored_pair),
       max_size=6), st.sampled_from(INVALID), st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"mine", b"\xff"]),
       st.integers(0, 90))
def test_c_path_gives_up_on_bad_utf8_in_a_column(before: list[bytes], after: list[bytes], bad: bytes, name: bytes,
                                                  pad: int) -> None:
    """A name or value that is not UTF-8 in a wanted column (always) or in the map (when read): the C path leaves
    the records to the reference, which raises; in a map that is not read, the C path decodes them."""
    pair = name + b"\x01" + bad if name != b"\xff" else name + b"\x01v"
    pad_pair = [b"pad\x01" + b"p" * pad] if pad else []  # moves the bad bytes across the 64-byte blocks
    props = pairs_string([*pad_pair, *before, pair, *after])
    if name in decode._WANTED:  # a later pair of the same name would give the column instead
        props = pairs_string([*pad_pair, *before, *[p for p in after if not p.startswith(name + b"\x01")], pair])
    answers = [b"".join(records([pairs_string([b"source\x01bench"]), props]))]
    for schema in SCHEMAS:
        with_map = "properties" in schema.names
        out = decode.C_HELPER.decode(answers, with_map, decode._WANTED, decode._HIDDEN)
        assert (out is None) == (with_map or name in decode._WANTED)
        same(*both(answers, schema))


@needs_c
def test_c_layout_constants_are_the_owners() -> None:
    """The C helper keeps its own copies of the record layout: they must be protocol.record_layout's."""
    got = decode.C_HELPER.layout()
    owner = {name: getattr(record_layout, name) for name in (
        "MAGIC_CODE", "MAGIC_CODE_POS", "QUEUE_ID_POS", "QUEUE_OFFSET_POS", "PHYSICAL_OFFSET_POS", "SYS_FLAG_POS",
        "BORN_TIMESTAMP_POS", "BORN_HOST_POS", "IPV4_HOST_SIZE", "IPV6_HOST_SIZE", "BORNHOST_V6_FLAG",
        "STOREHOST_V6_FLAG", "HOST_FLAGS_SHIFT", "MIN_RECORD_SIZE")}
    owner["COMPRESSED"] = int(SysFlag.COMPRESSED)
    owner["LAYOUTS"] = [{name: getattr(layout, name) for name in (
        "store_timestamp_pos", "store_host_pos", "store_host_size", "reconsume_times_pos", "body_length_pos",
        "body_pos", "min_record_size")} for layout in record_layout.LAYOUTS]
    assert got == owner


@needs_c
@pytest.mark.parametrize("hosts", [(20, 8), (8, 20), (20, 20)])
def test_c_path_takes_records_with_ipv6_hosts(hosts: tuple[int, int]) -> None:
    """IPv6 born or store hosts are decoded in C too, mixed with IPv4 ones, to the reference's batch; the offset
    message id of an IPv6 store host is 56 hex digits."""
    born, store = b"\x20\x01" + bytes(range(14)) + b"\x00\x00\x01\x02", bytes(16) + b"\x00\x00\x2a\x9f"
    recs = [encode_parts(topic=b"T", body=b"x" * i, queue_id=1, queue_offset=i, physical_offset=1000 + i,
                         born_timestamp=5, store_timestamp=9, reconsume_times=i,
                         born_host=born[: hosts[0]] if i % 2 else born[:8],
                         store_host=store[: hosts[1]] if i % 2 else store[:8],
                         properties=b"TAGS\x01a\x02" if i % 3 else b"UNIQ_KEY\x01U\x02")
            for i in range(12)]
    answers = [b"".join(recs[:5]), b"".join(recs[5:])]
    for schema in SCHEMAS:
        assert decode.C_HELPER.decode(answers, "properties" in schema.names, decode._WANTED, decode._HIDDEN)
        same(*both(answers, schema))
    rows = decode.decode_answers(answers, "T", "b", SCHEMAS[0]).to_pylist()
    for i, row in enumerate(rows):
        assert (row["queueOffset"], row["body"], row["reconsumeTimes"]) == (i, b"x" * i, i)
        assert row["storeTimestamp"].timestamp() * 1000 == 9 and row["tags"] == ("a" if i % 3 else None)
        if i % 3 == 0:
            assert row["msgId"] == "U"
        else:
            host = store[: hosts[1]] if i % 2 else store[:8]
            assert row["msgId"] == host.hex().upper() + f"{1000 + i:016X}"


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMETMQ_PURE_PYTHON", "1")
    assert load_c_helper("cometmq.spark._decodec") is None
