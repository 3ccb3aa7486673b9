"""Rows of an Arrow batch -> SEND_BATCH_MESSAGE bodies for the Spark sink, without a Python object per row.

:func:`encode_rows` runs the C helper (``cometmq.spark._encodec``, reading the Arrow buffers) when it is built;
where it is not, or where the input is not the common case, the reference :func:`encode_rows_py` does the work
(and raises the error, naming the row). The reference builds each row's :class:`Message` as the sink always did
and encodes it with :meth:`Message.batch_properties_head` plus the producer's ``UNIQ_KEY``/``WAIT`` and
:func:`cometmq.protocol.batch.encode_batch_raw`, the owner of the item layout: the bytes are those
``Producer.send_batch`` would send for the same messages and ids. A test compares both byte for byte.

An exactly-once write (:mod:`cometmq.spark.exactly_once`) passes a ``suffix``: properties every item gets, as
``dict.update`` after the row's own (its query, batch and write ids, and ``TRAN_MSG``/``PGROUP``, which make the
item a transaction's half): the bytes ``TransactionProducer.send_half_batch`` would send for the rows' messages
with those properties merged in, as the per-row path did (``{**row properties, **suffix}``: a row's property of a
suffix name keeps its place and takes the suffix's value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cometmq.client.errors import InvalidArgumentError
from cometmq.client.message import RESERVED_PROPERTIES, Message
from cometmq.common.native import load_c_helper
from cometmq.protocol.batch import encode_batch_raw
from cometmq.protocol.errors import LocalProtocolError
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, encode_properties

__all__ = ["Columns", "check_suffix", "encode_rows", "encode_rows_py", "given_bytes", "message_id"]

#: cometmq.spark._encodec when built, else None: the same bytes either way
C_HELPER: Any = load_c_helper("cometmq.spark._encodec")

_RESERVED_NAMES = tuple(sorted(name.encode() for name in RESERVED_PROPERTIES))


@dataclass(frozen=True)
class Columns:
    """The columns of a batch that go into the items (``keys``: string or list<string>)."""

    body: pa.Array
    tags: pa.Array | None = None
    keys: pa.Array | None = None
    properties: pa.Array | None = None

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Columns:
        names = batch.schema.names

        def col(name: str) -> pa.Array | None:
            return batch.column(name) if name in names else None

        return cls(batch.column("body"), col("tags"), col("keys"), col("properties"))


def _per_row(item_bytes: np.ndarray, array: pa.Array) -> np.ndarray:
    """Per row of the list or map ``array``, the sum of ``item_bytes`` (one figure per item of ``array.values``, the
    whole child array: a slice's offsets point into it) over the row's items; 0 for a null row."""
    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    sums = np.concatenate(([0], np.cumsum(item_bytes, dtype=np.int64)))
    out: np.ndarray = sums[offsets[1:]] - sums[offsets[:-1]]
    if array.null_count:
        out[~array.is_valid().to_numpy(zero_copy_only=False)] = 0
    return out


def _utf8_bytes(values: pa.Array) -> np.ndarray:
    lengths: np.ndarray = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    return lengths.astype(np.int64)


def given_bytes(cols: Columns) -> np.ndarray:
    """Per row, the bytes of what the row gives besides its body (tags, keys, properties, as UTF-8; a separator a
    key, two a property), as ``Producer.send_batch`` counts a message's (client.producer.batch_item_estimate)."""
    out = np.zeros(len(cols.body), dtype=np.int64)
    for column in (cols.tags, cols.keys):
        if column is None:
            continue
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            out += _per_row(_utf8_bytes(column.values) + 1, column)
        else:
            out += _utf8_bytes(column)
    props = cols.properties
    if props is not None:
        entries = props.values  # (a map's entries: a struct of key and value)
        out += _per_row(_utf8_bytes(entries.field("key")) + _utf8_bytes(entries.field("value")) + 2, props)
    return out


def message_id(prefix: str, value: int) -> str:
    """The UNIQ_KEY of a reserved id (``Producer.reserve_msg_ids``)."""
    return f"{prefix}{value:012X}"


def check_suffix(suffix: Mapping[str, str]) -> tuple[tuple[bytes, bytes], ...]:
    """``suffix`` as the C helper takes it; ValueError for a name or value no item may have (a caller's
    mistake, not a row's)."""
    bad = sorted(set(suffix) & RESERVED_PROPERTIES)
    if bad:
        raise ValueError(f"suffix property {bad[0]!r} is reserved")
    try:
        encode_properties(suffix)
    except LocalProtocolError as exc:
        raise ValueError(f"suffix: {exc}") from None
    return tuple((k.encode(), v.encode()) for k, v in suffix.items())


def encode_rows(cols: Columns, rows: np.ndarray, cuts: Sequence[int], prefix: str, first: int,
                first_row: int = 0, suffix: Mapping[str, str] | None = None) -> list[bytes]:
    """One batch body per cut: the items of ``rows[previous cut:cut]``, row ``rows[k]`` with the message id
    ``message_id(prefix, first + k)``, each with the ``suffix`` properties merged into its own (see the module
    docstring). A row that cannot be sent raises InvalidArgumentError naming it (row ``first_row + index`` of the
    task)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    pairs = check_suffix(suffix) if suffix else ()
    if C_HELPER is not None and len(rows):
        def capsules(arr: pa.Array | None) -> Any:
            return None if arr is None else arr.__arrow_c_array__()

        out: list[bytes] | None = C_HELPER.encode(
            capsules(cols.body), capsules(cols.tags), capsules(cols.keys), capsules(cols.properties), rows,
            np.asarray(cuts, dtype=np.int64), prefix.encode("ascii"), first, _RESERVED_NAMES, MAX_PROPERTIES_LENGTH,
            pairs)
        if out is not None:
            return out
    return encode_rows_py(cols, rows, cuts, prefix, first, first_row, suffix)


def encode_rows_py(cols: Columns, rows: np.ndarray, cuts: Sequence[int], prefix: str, first: int,
                   first_row: int = 0, suffix: Mapping[str, str] | None = None) -> list[bytes]:
    """:func:`encode_rows` in Python, a Message per row: the reference."""
    if suffix:
        check_suffix(suffix)

    def values(arr: pa.Array | None) -> list[Any]:
        return arr.to_pylist() if arr is not None else [None] * len(cols.body)

    bodies, tags, keys, props = (values(a) for a in (cols.body, cols.tags, cols.keys, cols.properties))
    bounds = [int(c) for c in cuts]
    if (bounds != sorted(set(bounds)) or (bounds and (bounds[0] <= 0 or bounds[-1] != len(rows)))
            or (not bounds and len(rows))):
        raise ValueError(f"cuts {bounds[:8]} do not split {len(rows)} rows")
    ends = set(bounds)
    out: list[bytes] = []
    items: list[bytes] = []
    for k, i in enumerate(int(r) for r in rows):
        try:
            body = bodies[i]
            if not body:
                raise InvalidArgumentError("the body is null or empty")
            p = props[i]
            merged = dict(p) if p else {}
            if suffix:
                merged.update(suffix)  # as the per-row path's {**row properties, **extra}: the suffix wins
            msg = Message("T", body, tags=tags[i], keys=keys[i], properties=merged)
            head = msg.batch_properties_head()
            tail = f"UNIQ_KEY\x01{message_id(prefix, first + k)}\x02WAIT\x01true\x02".encode("ascii")
            items.append(encode_batch_raw([(msg.body, head + tail, msg.flag)]))
        except (InvalidArgumentError, LocalProtocolError) as exc:
            raise InvalidArgumentError(f"row {first_row + i} of the task: {exc}") from None
        if k + 1 in ends:
            out.append(b"".join(items))
            items = []
    return out
