"""Pulled message records -> one Arrow record batch, column at a time.

A PULL_MESSAGE answer is stored records back to back (RocketMQ's v1 layout, IPv4 hosts). The only per-record
Python work is walking the record sizes to find where each starts; every field is then gathered for all
records at once with numpy (fixed-offset integers) or cut out as Arrow binary arrays (bodies, properties),
and the properties are split into a map with Arrow's string kernels. Compressed bodies, rare, are inflated
one by one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MAGIC_CODE, MIN_RECORD_SIZE, SysFlag
from cometmq.protocol.properties import KEYS, TAGS, UNIQ_KEY
from cometmq.spark.schema import HIDDEN_PROPERTIES

__all__ = ["decode_records", "empty_batch"]

_SIZE = struct.Struct(">i")
_V6 = int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
_COMPRESSED = int(SysFlag.COMPRESSED)
_HIDDEN = pa.array(sorted(HIDDEN_PROPERTIES), pa.string())
_BODY_AT = 88


def _walk(buf: bytes) -> np.ndarray:
    """Start of each record in ``buf``; ProtocolError when a size runs past the end."""
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


def _ints(raw: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed integers of ``width`` bytes at each of ``pos``, as native int64."""
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    kind = {1: ">u1", 2: ">i2", 4: ">i4", 8: ">i8"}[width]
    return raw[idx].view(kind).ravel().astype(np.int64)


def _segments(buf: bytes, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """An Arrow binary/string array whose i-th value is ``buf[starts[i] : starts[i] + lengths[i]]``."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    # One slice per value and one join: cheaper than any numpy gather for values of ~100 bytes.
    data = b"".join([buf[s:e] for s, e in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)])
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _constant(value: str, n: int) -> pa.Array:
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _timestamps(millis: np.ndarray) -> pa.Array:
    return pa.array(millis * 1000, pa.timestamp("us", tz="UTC"))


def _pick(values: pa.Array, rows: np.ndarray, where: np.ndarray, n: int) -> pa.Array:
    """A length-``n`` column: ``values[where[j]]`` at row ``rows[j]``, null elsewhere."""
    take = np.full(n, -1, dtype=np.int64)
    take[rows] = where
    return values.take(pa.array(take, mask=take < 0))


def _properties(props: pa.Array, n: int, include_map: bool) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array | None]:
    """(tags, keys, uniq keys, map of the other properties) from the raw property strings."""
    pairs = pc.split_pattern(props, "\x02")
    flat = pc.list_flatten(pairs)
    parents = np.asarray(pc.list_parent_indices(pairs))
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    whole = np.asarray(pc.equal(pc.list_value_length(kv), 2).fill_null(False), dtype=bool)
    where = np.flatnonzero(whole)
    kv = kv.take(pa.array(where))
    parents = parents[where]
    try:
        names = pc.cast(pc.list_element(kv, 0), pa.string())
        values = pc.cast(pc.list_element(kv, 1), pa.string())
    except pa.ArrowInvalid as exc:
        raise ProtocolError(f"message properties are not UTF-8: {exc}") from None
    # RocketMQ does not forbid an empty name; the decoders drop such pairs, and so does this.
    named = np.asarray(pc.greater(pc.binary_length(names), 0), dtype=bool)

    def column(name: str) -> pa.Array:
        hit = np.flatnonzero(np.asarray(pc.equal(names, name), dtype=bool) & named)
        return _pick(values, parents[hit], hit, n)

    tags, keys, uniq = column(TAGS), column(KEYS), column(UNIQ_KEY)
    if not include_map:
        return tags, keys, uniq, None
    keep = named & ~np.asarray(pc.is_in(names, value_set=_HIDDEN), dtype=bool)
    kept = np.flatnonzero(keep)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents[kept], minlength=n), out=offsets[1:])
    index = pa.array(kept)
    return tags, keys, uniq, pa.MapArray.from_arrays(pa.array(offsets), names.take(index), values.take(index))


def _offset_ids(raw: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> list[str]:
    """RocketMQ offset message ids (store host + commit-log offset, hex) of ``rows``."""
    out = []
    for i in rows.tolist():
        s = int(starts[i])
        out.append(raw[s + 64 : s + 72].tobytes().hex().upper() + raw[s + 28 : s + 36].tobytes().hex().upper())
    return out


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def decode_records(buf: bytes, topic: str, broker_name: str, schema: pa.Schema) -> pa.RecordBatch:
    """The records in ``buf`` (one or more pull answers of one queue, joined) as a batch of ``schema``
    (the read schema with or without ``properties``). Malformed records raise ProtocolError."""
    starts = _walk(buf)
    n = len(starts)
    if n == 0:
        return empty_batch(schema)
    raw = np.frombuffer(buf, dtype=np.uint8)
    magic = _ints(raw, starts + 4, 4) & 0xFFFFFFFF
    if (magic != MAGIC_CODE).any():
        bad = int(starts[np.flatnonzero(magic != MAGIC_CODE)[0]])
        raise ProtocolError(f"record at byte {bad} has a bad magic code")
    sizes = np.diff(np.append(starts, len(buf)))
    sys_flag = _ints(raw, starts + 36, 4)
    if (sys_flag & _V6).any():
        raise ProtocolError("records with IPv6 hosts are not supported")
    body_len = _ints(raw, starts + 84, 4)
    if ((body_len < 0) | (body_len > sizes - MIN_RECORD_SIZE)).any():
        raise ProtocolError("a record's body length overruns the record")
    body_at = starts + _BODY_AT
    topic_len = _ints(raw, body_at + body_len, 1)
    props_len_at = body_at + body_len + 1 + topic_len
    if (props_len_at + 2 > starts + sizes).any():
        raise ProtocolError("a record's topic overruns the record")
    props_len = _ints(raw, props_len_at, 2)
    if ((props_len < 0) | (props_len_at + 2 + props_len > starts + sizes)).any():
        raise ProtocolError("a record's properties overrun the record")

    compressed = np.flatnonzero(sys_flag & _COMPRESSED)
    if len(compressed):
        bodies: list[bytes] = [buf[s : s + ln] for s, ln in zip(body_at.tolist(), body_len.tolist(), strict=True)]
        for i in compressed.tolist():
            try:
                bodies[i] = zlib.decompress(bodies[i])
            except zlib.error:
                pass  # left as stored, as the SDK does
        body = pa.array(bodies, pa.binary())
    else:
        body = _segments(buf, body_at, body_len, pa.binary())

    include_map = "properties" in schema.names
    props = _segments(buf, props_len_at + 2, props_len, pa.binary())
    tags, keys, uniq, prop_map = _properties(props, n, include_map)
    if uniq.null_count:
        missing = np.flatnonzero(np.asarray(uniq.is_null(), dtype=bool))
        ids = np.array(uniq.to_pylist(), dtype=object)
        ids[missing] = _offset_ids(raw, starts, missing)
        uniq = pa.array(ids.tolist(), pa.string())

    columns: dict[str, pa.Array] = {
        "topic": _constant(topic, n),
        "brokerName": _constant(broker_name, n),
        "queueId": pa.array(_ints(raw, starts + 12, 4).astype(np.int32)),
        "queueOffset": pa.array(_ints(raw, starts + 20, 8)),
        "msgId": uniq,
        "tags": tags,
        "keys": keys,
        "body": body,
        "bornTimestamp": _timestamps(_ints(raw, starts + 40, 8)),
        "storeTimestamp": _timestamps(_ints(raw, starts + 56, 8)),
        "reconsumeTimes": pa.array(_ints(raw, starts + 72, 4).astype(np.int32)),
    }
    if prop_map is not None:
        columns["properties"] = prop_map
    arrays: Sequence[pa.Array] = [columns[f.name] for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
