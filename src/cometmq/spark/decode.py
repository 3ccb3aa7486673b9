"""Pulled message records -> one Arrow record batch, column at a time, with no Python work per record.

A PULL_MESSAGE answer is stored records back to back (RocketMQ's v1 layout, protocol.record_layout). The record
starts are where the magic code is, checked to chain by the record sizes (else the sizes are walked one by one).
A binary array laid over the answer itself, with the record boundaries as offsets, lets Arrow's ``take`` copy
out the 88-byte headers of records with IPv4 hosts (read as a numpy structured array; the few fields that an
IPv6 host moves are read again for the records that have one), the bodies and the property strings in one call
each. The properties are split with numpy on the separator positions into zero-copy name and value arrays;
the well-known names are found by comparing each name's first 8 bytes as one integer. Property strings of an
unusual shape (a separator inside a value, no final separator) take Arrow's string kernels instead.
Compressed bodies, rare, are inflated one by one, each to 16 MiB at most (one that inflates to more stays as
stored).

An optional C helper (``cometmq.spark._decodec``, built by setup.py when a compiler is there; ``COMETMQ_PURE_PYTHON=1``
turns it off) does the same in one pass over the records, copying each value once straight into the Arrow
buffers. The numpy/Arrow code stays the reference: the helper gives up (returns None) on anything but the common
case — a malformed record, a property that is not UTF-8 — and that code then decodes or raises, so both paths
give the same batch or the same error (tests compare them).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cometmq.common.native import load_c_helper
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import DEFAULT_MAX_INFLATED_BODY, SysFlag, inflate_body
from cometmq.protocol.properties import KEYS, TAGS, UNIQ_KEY
from cometmq.protocol.record_layout import (
    HOST_FLAGS_SHIFT,
    HOST_V6_FLAGS,
    LAYOUT_V4,
    LAYOUTS,
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    layout_for,
)
from cometmq.spark.schema import HIDDEN_PROPERTIES

__all__ = ["decode_answers", "decode_records", "empty_batch"]

Buffer: TypeAlias = bytes | bytearray | memoryview


#: cometmq.spark._decodec when built, else None: the same batches either way
C_HELPER: Any = load_c_helper("cometmq.spark._decodec")

_SIZE = struct.Struct(">i")
_V6 = HOST_V6_FLAGS
_COMPRESSED = int(SysFlag.COMPRESSED)
_BODY_AT = LAYOUT_V4.body_pos
_MAGIC = MAGIC_CODE.to_bytes(4, "big")
_MAGIC0 = _MAGIC[0]
#: column name -> (record field, numpy type) of the fixed part of a record, up to and with the body length
_HEAD_FIELDS = {"magic": ("magic_code", ">u4"), "queueId": ("queue_id", ">i4"), "queueOffset": ("queue_offset", ">i8"),
                "sysFlag": ("sys_flag", ">i4"), "born": ("born_timestamp", ">i8"), "store": ("store_timestamp", ">i8"),
                "reconsume": ("reconsume_times", ">i4"), "bodyLen": ("body_length", ">i4")}
#: that fixed part of a record with IPv4 hosts
_HEADER = np.dtype({
    "names": list(_HEAD_FIELDS),
    "formats": [kind for _, kind in _HEAD_FIELDS.values()],
    "offsets": [LAYOUT_V4.position(name) for name, _ in _HEAD_FIELDS.values()],
    "itemsize": _BODY_AT,
})
#: the fields an IPv6 host moves: column -> (position in each layout, by layout index, and width)
_MOVED = {column: (np.array([layout.position(name) for layout in LAYOUTS], dtype=np.int64), int(kind[2:]))
          for column, (name, kind) in _HEAD_FIELDS.items()
          if len({layout.position(name) for layout in LAYOUTS}) > 1}
_BODY_POS = np.array([layout.body_pos for layout in LAYOUTS], dtype=np.int64)


def _inflated(body: bytes) -> bytes:
    """A COMPRESSED body inflated, but to DEFAULT_MAX_INFLATED_BODY (16 MiB) at most: a few KiB stored can inflate
    to gigabytes, in the executor's memory. Past it, or when it does not inflate, as stored (as the SDK does)."""
    inflated = inflate_body(body, DEFAULT_MAX_INFLATED_BODY)
    return body if inflated is None else inflated


def _walk_slow(buf: bytes) -> np.ndarray:
    """Start of each record in ``buf``, one size at a time; ProtocolError when a size runs past the end."""
    starts: list[int] = []
    append = starts.append
    unpack = _SIZE.unpack_from
    pos, end = 0, len(buf)
    limit = end - MIN_RECORD_SIZE
    while pos < end:
        if pos > limit:
            raise ProtocolError(f"truncated record at byte {pos} of {end}")
        size = unpack(buf, pos)[0]
        if size < MIN_RECORD_SIZE:
            raise ProtocolError(f"record at byte {pos} claims {size} bytes")
        append(pos)
        pos += size
    if pos != end:
        raise ProtocolError(f"the last record runs {pos - end} bytes past the end of the answer")
    return np.array(starts, dtype=np.int64)


def _walk(buf: bytes, raw: np.ndarray) -> np.ndarray:
    """Start of each record in ``buf``.

    Every record has the magic code 4 bytes in, so the places where it occurs are the candidates; if they
    chain exactly (the first at 0, each one's size leading to the next, the last to the end) they are the
    records, as walking the sizes from 0 would find them. Otherwise (the code inside a body, a malformed
    answer) the sizes are walked one by one."""
    end = len(buf)
    if end < MIN_RECORD_SIZE:
        return _walk_slow(buf)
    hits: np.ndarray = np.flatnonzero(raw[4 : end - MIN_RECORD_SIZE + 5] == _MAGIC0)
    hits = hits[(raw[hits + 5] == _MAGIC[1]) & (raw[hits + 6] == _MAGIC[2]) & (raw[hits + 7] == _MAGIC[3])]
    if len(hits) == 0 or hits[0] != 0:
        return _walk_slow(buf)
    sizes = _ints(raw, hits, 4)
    if (sizes < MIN_RECORD_SIZE).any() or not np.array_equal(hits[1:], (hits + sizes)[:-1]) \
            or int(hits[-1] + sizes[-1]) != end:
        return _walk_slow(buf)
    return hits


def _ints(raw: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed integers of ``width`` bytes at each of ``pos``, as native int64."""
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    kind = {1: ">u1", 2: ">i2", 4: ">i4", 8: ">i8"}[width]
    return raw[idx].view(kind).ravel().astype(np.int64)


def _binary(data: pa.Buffer | bytes, bounds: np.ndarray) -> pa.Array:
    """A binary array over ``data`` whose values are the pieces between consecutive ``bounds`` (which start
    at 0, never go down and end at most at the end of ``data``): no copy."""
    if len(data) >= 1 << 31:
        return pa.Array.from_buffers(pa.large_binary(), len(bounds) - 1,
                                     [None, pa.py_buffer(bounds.astype(np.int64)), pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.binary(), len(bounds) - 1,
                                 [None, pa.py_buffer(bounds.astype(np.int32)), pa.py_buffer(data)])


def _every(pieces: pa.Array, first: int, step: int) -> pa.Array:
    """Pieces ``first, first + step, ...``, copied into a new binary array."""
    out = pieces.take(pa.array(np.arange(first, len(pieces), step, dtype=np.int64)))
    return out if out.type == pa.binary() else out.cast(pa.binary())


def _headers(buf: bytes, starts: np.ndarray) -> np.ndarray:
    """The fixed 88-byte headers of all records as one structured array (copied out by Arrow)."""
    bounds = np.empty(2 * len(starts) + 1, dtype=np.int64)
    bounds[0:-1:2] = starts
    bounds[1:-1:2] = starts + _BODY_AT
    bounds[-1] = len(buf)
    heads = _every(_binary(buf, bounds), 0, 2)
    return np.frombuffer(heads.buffers()[2], dtype=_HEADER, count=len(starts))


def _cut(buf: bytes, starts: np.ndarray, body_at: np.ndarray, body_len: np.ndarray, props_at: np.ndarray,
         props_len: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """(bodies, raw property strings) as Arrow binary arrays, copied out of ``buf`` by Arrow in one go.

    Records are back to back, so ``buf`` is exactly covered by five pieces per record (header, body, topic,
    properties, any tail): one binary array over ``buf`` itself with those boundaries as offsets, from which
    ``take`` gathers every fifth piece, no Python slice per value."""
    n = len(starts)
    bounds = np.empty(5 * n + 1, dtype=np.int64)
    bounds[0:-1:5] = starts
    bounds[1:-1:5] = body_at
    bounds[2:-1:5] = body_at + body_len
    bounds[3:-1:5] = props_at
    bounds[4:-1:5] = props_at + props_len
    bounds[-1] = len(buf)
    pieces = _binary(buf, bounds)
    return _every(pieces, 1, 5), _every(pieces, 3, 5)


def _constant(value: str, n: int) -> pa.Array:
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _timestamps(millis: np.ndarray) -> pa.Array:
    return pa.array(millis * 1000, pa.timestamp("us", tz="UTC"))


def _pick(values: pa.Array, rows: np.ndarray, where: np.ndarray, n: int) -> pa.Array:
    """A length-``n`` string column: ``values[where[j]]`` at row ``rows[j]``, null elsewhere."""
    take = np.full(n, -1, dtype=np.int64)
    take[rows] = where
    return _text(values.take(pa.array(take, mask=take < 0)))


def _text(values: pa.Array) -> pa.Array:
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise ProtocolError(f"message properties are not UTF-8: {exc}") from None


class _Pairs:
    """The ``name\x01value`` pairs of a batch's property strings. ``names``/``values`` are binary arrays in
    which pair ``j`` is at index ``stride * j``; ``data``/``begins``/``lengths`` locate the name bytes;
    ``parents`` is each pair's row; only pairs with a separator are listed (others are dropped)."""

    __slots__ = ("begins", "data", "key", "lengths", "names", "parents", "stride", "values")

    def __init__(self, names: pa.Array, values: pa.Array, stride: int, parents: np.ndarray, data: np.ndarray,
                 begins: np.ndarray, lengths: np.ndarray) -> None:
        self.names, self.values, self.stride, self.parents = names, values, stride, parents
        self.data, self.begins, self.lengths = data, begins, lengths
        # The first 8 bytes of each name as one integer (bytes past the name zeroed): one compare per name.
        padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
        window = np.ndarray((len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
        short = np.minimum(lengths, 7).astype(np.uint64) * np.uint64(8)
        mask = np.where(lengths >= 8, np.uint64(_ALL64), (np.uint64(1) << short) - np.uint64(1))
        self.key = window[begins] & mask

    def named(self, name: bytes) -> np.ndarray:
        """Which pairs are called ``name``, compared in numpy."""
        first = int.from_bytes(name[:8].ljust(8, b"\0"), "little")
        out: np.ndarray = (self.lengths == len(name)) & (self.key == np.uint64(first))
        if len(name) > 8:
            cand = np.flatnonzero(out)
            if len(cand):
                idx = self.begins[cand][:, None] + np.arange(8, len(name), dtype=np.int64)
                out[cand] = (self.data[idx] == np.frombuffer(name[8:], dtype=np.uint8)).all(axis=1)
        return out


_ALL64 = (1 << 64) - 1
_NO_PAIRS = np.zeros(0, dtype=np.int64)


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes, value starts, value lengths) of a binary array."""
    _, off_buf, data_buf = arr.buffers()
    offs = np.frombuffer(off_buf, dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset).astype(np.int64)
    data = np.zeros(0, np.uint8) if data_buf is None else np.frombuffer(data_buf, dtype=np.uint8)
    return data, offs[:-1], np.diff(offs)


def _pairs_arrow(props: pa.Array) -> _Pairs:
    """The pairs of ``props`` split with Arrow's string kernels: the general way, for property strings that
    do not each end with the pair separator or hold a name-value separator in a value."""
    pairs = pc.split_pattern(props, "\x02")
    flat = pc.list_flatten(pairs)
    parents = np.asarray(pc.list_parent_indices(pairs))
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    whole = np.asarray(pc.equal(pc.list_value_length(kv), 2).fill_null(False), dtype=bool)
    where = np.flatnonzero(whole)
    kv = kv.take(pa.array(where))
    names = pc.list_element(kv, 0).take(pa.array(np.arange(len(where))))  # compacted: offsets from 0
    data, begins, lengths = _binary_parts(names)
    return _Pairs(names, pc.list_element(kv, 1), 1, parents[where], data, begins, lengths)


def _pairs(props: pa.Array) -> _Pairs:
    """The pairs of ``props``; with numpy on the bytes when every non-empty property string ends with the pair
    separator and each pair has one name-value separator (as RocketMQ and cometmq write them): the
    separators' positions give the pairs, and the names and values are zero-copy Arrow arrays over the bytes
    (pieces name/rest alternating, value/rest alternating)."""
    data, po, lens = _binary_parts(props)
    n = len(props)
    if not len(data) or not lens.any():
        none = pa.array([], pa.binary())
        return _Pairs(none, none, 1, _NO_PAIRS, data, _NO_PAIRS, _NO_PAIRS)
    data = data[: po[-1] + lens[-1]]
    if po[0] != 0 or not (data[(po + lens)[lens > 0] - 1] == 2).all():
        return _pairs_arrow(props)
    ends = np.flatnonzero(data == 2)  # pair j is data[begins[j] : ends[j]]
    ones = np.flatnonzero(data == 1)
    begins = np.empty_like(ends)
    begins[0] = 0
    begins[1:] = ends[:-1] + 1
    if len(ones) != len(ends) or not ((ones >= begins).all() and (ones < ends).all()):
        return _pairs_arrow(props)
    bounds = np.empty(2 * len(ends) + 1, dtype=np.int64)
    bounds[0:-1:2] = begins
    bounds[1:-1:2] = ones
    bounds[-1] = len(data)
    names = _binary(data, bounds)
    bounds[0:-1:2] = ones + 1
    bounds[1:-1:2] = ends
    values = _binary(data, bounds)
    parents = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.searchsorted(ends, np.append(po, len(data)))))
    return _Pairs(names, values, 2, parents, data, begins, ones - begins)


def _properties(props: pa.Array, n: int, include_map: bool) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array | None]:
    """(tags, keys, uniq keys, map of the other properties) from the raw property strings."""
    pairs = _pairs(props)
    # RocketMQ does not forbid an empty name; the decoders drop such pairs, and so does this.
    named = pairs.lengths > 0

    def column(name: str) -> pa.Array:
        hit = np.flatnonzero(pairs.named(name.encode()))
        return _pick(pairs.values, pairs.parents[hit], pairs.stride * hit, n)

    tags, keys, uniq = column(TAGS), column(KEYS), column(UNIQ_KEY)
    if not include_map:
        return tags, keys, uniq, None
    keep = named
    for hidden in HIDDEN_PROPERTIES:
        keep &= ~pairs.named(hidden.encode())
    kept = np.flatnonzero(keep)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(pairs.parents[kept], minlength=n), out=offsets[1:])
    index = pa.array(pairs.stride * kept)
    return tags, keys, uniq, pa.MapArray.from_arrays(pa.array(offsets), _text(pairs.names.take(index)),
                                                     _text(pairs.values.take(index)))


def _offset_ids(raw: np.ndarray, starts: np.ndarray, sys_flag: np.ndarray, rows: np.ndarray) -> list[str]:
    """RocketMQ offset message ids (store host + commit-log offset, hex) of ``rows``."""
    out = []
    phy = PHYSICAL_OFFSET_POS
    for i in rows.tolist():
        s = int(starts[i])
        layout = layout_for(int(sys_flag[i]))
        host = raw[s + layout.store_host_pos : s + layout.store_host_pos + layout.store_host_size]
        out.append(host.tobytes().hex().upper() + raw[s + phy : s + phy + 8].tobytes().hex().upper())
    return out


def _moved_fields(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray, sys_flag: np.ndarray,
                  columns: dict[str, np.ndarray]) -> np.ndarray:
    """The fields of the records with an IPv6 host read again where their layout has them (``columns``, the
    header's columns as int64, changed in place); returns where each record's body starts."""
    index = (sys_flag >> HOST_FLAGS_SHIFT) & 3
    body_at: np.ndarray = starts + _BODY_POS[index]
    rows = np.flatnonzero(index)
    if ((body_at[rows] + 3) > ends[rows]).any():
        raise ProtocolError("a record is too short for its IPv6 hosts")
    for column, (positions, width) in _MOVED.items():
        columns[column][rows] = _ints(raw, starts[rows] + positions[index[rows]], width)
    return body_at


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def decode_records(buf: bytes, topic: str, broker_name: str, schema: pa.Schema) -> pa.RecordBatch:
    """The records in ``buf`` (one or more pull answers of one queue, joined) as a batch of ``schema``
    (the read schema with or without ``properties``). Malformed records raise ProtocolError."""
    return decode_answers([buf], topic, broker_name, schema)


def decode_answers(answers: Sequence[Buffer], topic: str, broker_name: str, schema: pa.Schema) -> pa.RecordBatch:
    """decode_records of pull answers not joined (each holds whole records): the C helper reads them where they
    are; the Python code joins them first."""
    if C_HELPER is not None:
        batch = _decode_c(C_HELPER, answers, topic, broker_name, schema)
        if batch is not None:
            return batch
    only = answers[0] if len(answers) == 1 else None
    return _decode_py(only if isinstance(only, bytes) else b"".join(answers), topic, broker_name, schema)


_WANTED = (TAGS.encode(), KEYS.encode(), UNIQ_KEY.encode())
_HIDDEN = tuple(sorted(name.encode() for name in HIDDEN_PROPERTIES))
_STRING = pa.string()


def _strings(n: int, offsets: bytes, data: bytes, valid: bytes | None = None, nulls: int = 0) -> pa.Array:
    return pa.Array.from_buffers(_STRING, n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets),
                                              pa.py_buffer(data)], null_count=nulls)


def _fixed(kind: pa.DataType, n: int, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(data)])


_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _decode_c(helper: Any, answers: Sequence[Buffer], topic: str, broker_name: str,
              schema: pa.Schema) -> pa.RecordBatch | None:
    """decode_answers through the C helper; None when it leaves the records to the Python code."""
    include_map = "properties" in schema.names
    out = helper.decode(answers, include_map, _WANTED, _HIDDEN)
    if out is None:
        return None
    n, qid, qoff, born, store, reconsume, (body_offs, body_data), (id_offs, id_data), tags, keys, pmap, packed = out
    body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(body_offs), pa.py_buffer(body_data)])
    if packed:
        bodies: list[bytes | None] = body.to_pylist()
        for i in np.frombuffer(packed, dtype=np.int64).tolist():
            bodies[i] = _inflated(bodies[i] or b"")
        body = pa.array(bodies, pa.binary())
    columns: dict[str, pa.Array] = {
        "topic": _constant(topic, n),
        "brokerName": _constant(broker_name, n),
        "queueId": _fixed(pa.int32(), n, qid),
        "queueOffset": _fixed(pa.int64(), n, qoff),
        "msgId": _strings(n, id_offs, id_data),
        "tags": _strings(n, tags[2], tags[3], tags[0], tags[1]),
        "keys": _strings(n, keys[2], keys[3], keys[0], keys[1]),
        "body": body,
        "bornTimestamp": _fixed(_TIMESTAMP, n, born),
        "storeTimestamp": _fixed(_TIMESTAMP, n, store),
        "reconsumeTimes": _fixed(pa.int32(), n, reconsume),
    }
    if include_map:
        map_offs, name_offs, name_data, value_offs, value_data = pmap
        pairs = len(name_offs) // 4 - 1
        columns["properties"] = pa.MapArray.from_arrays(_fixed(pa.int32(), n + 1, map_offs),
                                                        _strings(pairs, name_offs, name_data),
                                                        _strings(pairs, value_offs, value_data))
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


def _decode_py(buf: bytes, topic: str, broker_name: str, schema: pa.Schema) -> pa.RecordBatch:
    """decode_records in numpy and Arrow: the reference, and the way when the C helper is not there."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    starts = _walk(buf, raw)
    n = len(starts)
    if n == 0:
        return empty_batch(schema)
    head = _headers(buf, starts)
    magic = head["magic"]
    if (magic != MAGIC_CODE).any():
        bad = int(starts[np.flatnonzero(magic != MAGIC_CODE)[0]])
        raise ProtocolError(f"record at byte {bad} has a bad magic code")
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = len(buf)
    sys_flag = head["sysFlag"].astype(np.int64)
    moved = {"store": head["store"].astype(np.int64), "reconsume": head["reconsume"].astype(np.int64),
             "bodyLen": head["bodyLen"].astype(np.int64)}
    if (sys_flag & _V6).any():
        body_at = _moved_fields(raw, starts, ends, sys_flag, moved)
    else:
        body_at = starts + _BODY_AT
    body_len = moved["bodyLen"]
    if ((body_len < 0) | (body_at + body_len + 3 > ends)).any():
        raise ProtocolError("a record's body length overruns the record")
    topic_len = raw[body_at + body_len].astype(np.int64)
    props_len_at = body_at + body_len + 1 + topic_len
    if (props_len_at + 2 > ends).any():
        raise ProtocolError("a record's topic overruns the record")
    props_len = raw[props_len_at].astype(np.int64) * 256 + raw[props_len_at + 1]
    if (props_len_at + 2 + props_len > ends).any() or (props_len >= 1 << 15).any():
        raise ProtocolError("a record's properties overrun the record")

    props_at = props_len_at + 2
    body, props = _cut(buf, starts, body_at, body_len, props_at, props_len)
    compressed = np.flatnonzero(sys_flag & _COMPRESSED)
    if len(compressed):
        bodies: list[bytes | None] = body.to_pylist()
        for i in compressed.tolist():
            bodies[i] = _inflated(bodies[i] or b"")
        body = pa.array(bodies, pa.binary())

    include_map = "properties" in schema.names
    tags, keys, uniq, prop_map = _properties(props, n, include_map)
    if uniq.null_count:
        missing = np.flatnonzero(np.asarray(uniq.is_null(), dtype=bool))
        ids = np.array(uniq.to_pylist(), dtype=object)
        ids[missing] = _offset_ids(raw, starts, sys_flag, missing)
        uniq = pa.array(ids.tolist(), pa.string())

    columns: dict[str, pa.Array] = {
        "topic": _constant(topic, n),
        "brokerName": _constant(broker_name, n),
        "queueId": pa.array(head["queueId"].astype(np.int32)),
        "queueOffset": pa.array(head["queueOffset"].astype(np.int64)),
        "msgId": uniq,
        "tags": tags,
        "keys": keys,
        "body": body,
        "bornTimestamp": _timestamps(head["born"].astype(np.int64)),
        "storeTimestamp": _timestamps(moved["store"]),
        "reconsumeTimes": pa.array(moved["reconsume"].astype(np.int32)),
    }
    if prop_map is not None:
        columns["properties"] = prop_map
    arrays: Sequence[pa.Array] = [columns[f.name] for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
