"""The optional C encoder (cometmq.spark._encodec) against the reference (a Message per row, encoded by
cometmq.protocol.batch): the same bytes for the same rows, or both refuse; the reference where the C helper gives
up."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cometmq.client.errors import InvalidArgumentError, MQClientError
from cometmq.client.message import Message, MessageQueue, SendResult
from cometmq.client.producer import _V2_BORN_TIMESTAMP
from cometmq.client.transaction_producer import HalfBatchRange, TransactionClientInstance, TransactionProducer
from cometmq.protocol.batch import decode_batch
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH
from cometmq.protocol.remoting import RemotingCommand
from cometmq.spark import encode
from cometmq.spark.encode import Columns, encode_rows, encode_rows_py
from cometmq.spark.exactly_once import HalfRef, half_range
from cometmq.spark.writer import to_messages

needs_c = pytest.mark.skipif(encode.C_HELPER is None, reason="C helper not built")


def test_the_c_helper_is_built() -> None:
    """The install compiles it on this kind of machine; a silent fallback would hide a slower writer."""
    if os.environ.get("COMETMQ_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("COMETMQ_PURE_PYTHON is set")
    assert encode.C_HELPER is not None


def c_encode(cols: Columns, rows: np.ndarray, cuts: list[int], prefix: str, first: int,
             max_props: int = MAX_PROPERTIES_LENGTH, suffix: dict[str, str] | None = None) -> list[bytes] | None:
    def capsules(arr: pa.Array | None) -> Any:
        return None if arr is None else arr.__arrow_c_array__()

    return encode.C_HELPER.encode(  # type: ignore[no-any-return]
        capsules(cols.body), capsules(cols.tags), capsules(cols.keys), capsules(cols.properties),
        np.ascontiguousarray(rows, dtype=np.int64), np.asarray(cuts, dtype=np.int64), prefix.encode(), first,
        encode._RESERVED_NAMES, max_props, tuple((k.encode(), v.encode()) for k, v in (suffix or {}).items()))


# Texts with the awkward cases: spaces (keys split on them), non-ASCII, duplicate names, null values; and, in a
# "dirty" batch, what the reference refuses: separators, reserved and empty names, null and empty bodies.
WORDS = ["", " ", "a", "k1", "k1 k2", "  k3  ", "héllo", "日本", "TagA", "x" * 40, "None"]
BAD_WORDS = ["a\x01b", "c\x02"]
NAMES = ["a", "b", "source", "TAGSX", "ünï", "x y", "__SPARK_WRITE_ID", "TRAN_MSG"]
#: an exactly-once write's suffix names, some a row may use too (the suffix then wins, in the row's place)
SUFFIX_NAMES = ["__SPARK_QUERY_ID", "__SPARK_WRITE_ID", "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRAN_MSG", "PGROUP", "a",
                "日本"]
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


Case = tuple[Columns, np.ndarray, list[int], str, int, dict[str, str] | None]


@st.composite
def batches(draw: st.DrawFn) -> Case:
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
    suffix = None
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(SUFFIX_NAMES), min_size=1, max_size=5, unique=True))
        suffix = {n: draw(st.sampled_from(["true", "g-1", "", "héllo", "60"])) for n in names}
    return Columns(body, tags, keys, props), rows, cuts, prefix, first, suffix


def reference(cols: Columns, rows: np.ndarray, cuts: list[int], prefix: str, first: int,
              suffix: dict[str, str] | None = None) -> list[bytes] | None:
    try:
        return encode_rows_py(cols, rows, cuts, prefix, first, suffix=suffix)
    except InvalidArgumentError:
        return None


@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_c_matches_the_reference_byte_for_byte(case: Case) -> None:
    """Same bodies, or both refuse (the reference refuses by raising, the C helper by giving up); with or
    without an exactly-once write's suffix."""
    cols, rows, cuts, prefix, first, suffix = case
    assert c_encode(cols, rows, cuts, prefix, first, suffix=suffix) == \
        reference(cols, rows, cuts, prefix, first, suffix)


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


# -- an exactly-once write's half batches ---------------------------------------------------------------------------
RANGES: list[HalfRef] = []  # half_batch_requests's send_half_batch_range, as the sink's task keeps it
EXTRA = {"__SPARK_QUERY_ID": "q-1", "__SPARK_BATCH_ID": "3", "__SPARK_WRITE_ID": "w-1",
         "CHECK_IMMUNITY_TIME_IN_SECONDS": "60"}


def half_batch_requests(batch: pa.RecordBatch) -> tuple[RemotingCommand, list[SendResult], RemotingCommand,
                                                         list[SendResult], dict[str, str]]:
    """The request (and results) ``send_half_batch`` makes of the rows' messages as the per-row sink built them
    (``{**row properties, **extra}``), and the one ``send_half_batch_body`` makes of ``encode_rows`` with the
    suffix, for the same ids; against a stub connection that answers as a broker would."""
    async def go() -> tuple[RemotingCommand, list[SendResult], RemotingCommand, list[SendResult], dict[str, str]]:
        instance = TransactionClientInstance("127.0.0.1:9")
        producer = TransactionProducer("cometmq-spark-eos-q-1", instance=instance)
        producer.started = True
        sent: list[RemotingCommand] = []

        async def invoke(addr: str, cmd: RemotingCommand, timeout: float, context: str = "") -> RemotingCommand:
            sent.append(cmd)
            n = len(decode_batch(cmd.body))
            ids = ",".join(f"7F00000100002A9F{1000 + 10 * i:016X}" for i in range(n))
            return RemotingCommand(code=0, ext_fields={"msgId": ids, "queueOffset": "40", "queueId": "2"})

        async def announce(q: MessageQueue) -> None:
            return None

        instance.invoke = invoke  # type: ignore[method-assign]
        instance.master_addr = lambda name: "127.0.0.1:9"  # type: ignore[method-assign]
        producer._announce = announce  # type: ignore[method-assign]
        producer._uniq.reserve = lambda n: ("AB" * 10, 7)  # type: ignore[method-assign]
        queue = MessageQueue("T", "broker-a", 2)
        msgs = [Message(o.msg.topic, o.msg.body, tags=o.msg.tags, keys=o.msg.keys,
                        properties={**o.msg.properties, **EXTRA}) for o in to_messages(batch, "T")]
        old = await producer.send_half_batch(msgs, queue=queue)
        suffix = {**EXTRA, **producer.half_properties()}
        (body,) = encode_rows(Columns.of(batch), np.arange(batch.num_rows), [batch.num_rows], "AB" * 10, 7,
                              suffix=suffix)
        assert [body] == encode_rows_py(Columns.of(batch), np.arange(batch.num_rows), [batch.num_rows], "AB" * 10,
                                        7, suffix=suffix)
        ids = [encode.message_id("AB" * 10, 7 + i) for i in range(batch.num_rows)]
        new = await producer.send_half_batch_body(queue, body, ids)
        ranged = await producer.send_half_batch_range(queue, body, ids[0], len(ids))
        assert sent[2].body == sent[1].body and sent[2].ext_fields.keys() == sent[1].ext_fields.keys()
        assert ranged == HalfBatchRange(new[0].status, new[0].queue, 40, new[0].offset_msg_id, ids[0], len(ids))
        with pytest.raises(MQClientError, match=rf"lists {len(ids)} halves for {len(ids) + 1} items"):
            await producer.send_half_batch_range(queue, body, ids[0], len(ids) + 1)
        RANGES.append(half_range(ranged, True))
        return sent[0], old, sent[1], new, suffix

    return asyncio.run(go())


def test_half_batch_bodies_are_what_send_half_batch_sends() -> None:
    """The same request (body byte for byte, the fields but the born time) and the same SendResults, with rows that
    use the suffix's names themselves (the write's value wins, in the row's place, as the dict merge did)."""
    props = pa.map_(pa.string(), pa.string())
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"one", b"two", b"three"]),
        "tags": pa.array(["t", None, ""]),
        "keys": pa.array(["k1 k2", None, "k3"]),
        "properties": pa.array([[("a", "1"), ("__SPARK_WRITE_ID", "mine"), ("TRAN_MSG", None)], None,
                                [("PGROUP", "other"), ("b", "2"), ("CHECK_IMMUNITY_TIME_IN_SECONDS", "5")]], props)})
    old_cmd, old, new_cmd, new, _ = half_batch_requests(batch)
    assert new_cmd.body == old_cmd.body
    assert new_cmd.code == old_cmd.code and new_cmd.ext_fields.keys() == old_cmd.ext_fields.keys()
    assert {k: v for k, v in new_cmd.ext_fields.items() if v != old_cmd.ext_fields[k]}.keys() <= {_V2_BORN_TIMESTAMP}
    assert new_cmd.ext_fields["cometmqHalfBatch"] == "true"
    assert new == old and [r.queue_offset for r in new] == [40, 41, 42] and new[0].queue.queue_id == 2
    assert RANGES[-1] == ("broker-a", 1000, 40, new[0].msg_id, 2, True, 3)  # one range, its first half's offsets


def test_a_row_property_named_as_the_suffix_takes_the_writes_value() -> None:
    """Today's rule (the per-row path's ``{**row properties, **extra}``), kept: the row's own value of a name the
    write sets is replaced, where the row put it; the rows keep their other properties. Refusing would break
    copying a transactional topic's rows (whose properties carry these names) into another one."""
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"x"]),
        "properties": pa.array([[("__SPARK_WRITE_ID", "mine"), ("a", "1"), ("TRAN_MSG", "false")]],
                               pa.map_(pa.string(), pa.string()))})
    old_cmd, _, new_cmd, _, suffix = half_batch_requests(batch)
    assert new_cmd.body == old_cmd.body
    (item,) = decode_batch(new_cmd.body)
    assert list(item.properties.items()) == [
        ("__SPARK_WRITE_ID", "w-1"), ("a", "1"), ("TRAN_MSG", "true"), ("__SPARK_QUERY_ID", "q-1"),
        ("__SPARK_BATCH_ID", "3"), ("CHECK_IMMUNITY_TIME_IN_SECONDS", "60"), ("PGROUP", suffix["PGROUP"]),
        ("UNIQ_KEY", "ABABABABABABABABABAB000000000007"), ("WAIT", "true")]


def test_a_suffix_no_item_may_have_is_refused() -> None:
    cols = Columns(pa.array([b"x"]))
    for bad in ({"TAGS": "x"}, {"": "x"}, {"a": "x\x01"}):
        with pytest.raises(ValueError, match="suffix"):
            encode_rows(cols, np.array([0]), [1], "0" * 20, 0, suffix=bad)
