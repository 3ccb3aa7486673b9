"""The body of a batch send (code 10 with ``batch`` "1"; remoting-protocol.md §4 "Batch body").

Messages back to back, each big-endian::

    TOTALSIZE(4) = 20 + n + 2 + p | MAGICCODE(4) = 0 | BODYCRC(4) = 0 | FLAG(4) | BODYLEN(4) BODY(n)
    | PROPLEN(2) PROPS(p)

Clients write 0 for MAGICCODE and BODYCRC; we ignore both on decode and give each item the CRC the
store will record. The topic, queue and sys flag come from the request header. When the header's sys flag
says compressed, the caller inflates the whole body before :func:`decode_batch`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cometmq.common.native import load_c_helper
from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError
from cometmq.protocol.message import body_crc
from cometmq.protocol.properties import MAX_PROPERTIES_LENGTH, decode_properties, encode_properties

#: TOTALSIZE MAGICCODE BODYCRC FLAG BODYLEN
_HEAD = struct.Struct(">iiiii")
_I16 = struct.Struct(">h")
#: Bytes of an item besides its body and properties.
ITEM_OVERHEAD = _HEAD.size + _I16.size  # 22


@dataclass(frozen=True, slots=True)
class BatchItem:
    body: bytes
    properties: dict[str, str]
    flag: int
    #: the properties as they came (the store keeps these bytes, so nothing is encoded twice)
    properties_raw: bytes = b""

    @property
    def body_crc(self) -> int:
        """Computed from the body on demand; the wire field is 0."""
        return body_crc(self.body)


def encode_batch(messages: Iterable[tuple[bytes | bytearray | memoryview, Mapping[str, str], int]]) -> bytes:
    """Encode ``(body, properties, flag)`` triples as a client would."""
    return encode_batch_raw([(body, encode_properties(properties), flag) for body, properties, flag in messages])


def encode_batch_raw(messages: Iterable[tuple[bytes | bytearray | memoryview, bytes, int]]) -> bytes:
    """Encode ``(body, encoded properties, flag)`` triples (properties as :func:`encode_properties` gives)."""
    parts: list[bytes | bytearray | memoryview] = []
    add = parts.append
    head = _HEAD.pack
    i16 = _I16.pack
    try:
        for body, props, flag in messages:
            n = len(props)
            if n > MAX_PROPERTIES_LENGTH:
                raise LocalProtocolError(f"properties are {n} bytes, at most {MAX_PROPERTIES_LENGTH}")
            add(head(ITEM_OVERHEAD + len(body) + n, 0, 0, flag, len(body)))
            add(body)
            add(i16(n))
            add(props)
    except struct.error as exc:
        raise LocalProtocolError(f"batch item field out of range: {exc}") from None
    return b"".join(parts)


#: a producer's batch item: (body, the encoded properties before UNIQ_KEY, flag)
KeyedItem = tuple[bytes | bytearray | memoryview, bytes, int]


def encode_keyed_batch_py(items: Sequence[KeyedItem], prefix: str, first: int) -> tuple[bytes, list[str]]:
    """A producer's batch body and its messages' UNIQ_KEYs: item ``i``'s key is ``prefix`` + ``first + i`` in 12
    upper-case hex digits (UniqKeyGenerator's layout), its properties the head + UNIQ_KEY=key + WAIT=true, encoded
    as ``encode_properties`` encodes a plain message's wire properties. The reference of the C helper."""
    keys = [f"{prefix}{v:012X}" for v in range(first, first + len(items))]
    return encode_batch_raw([(body, head + f"UNIQ_KEY\x01{key}\x02WAIT\x01true\x02".encode("ascii"), flag)
                             for (body, head, flag), key in zip(items, keys, strict=True)]), keys


def _encode_keyed_batch_c(items: Sequence[KeyedItem], prefix: str, first: int) -> tuple[bytes, list[str]]:
    if type(items) is not list:
        items = list(items)
    done: tuple[bytes, list[str]] | None = _C_ENCODE.encode_keyed(items, prefix, first)
    # None: something the helper leaves to the reference (which encodes it, or raises its error)
    return done if done is not None else encode_keyed_batch_py(items, prefix, first)


#: cometmq.protocol._batchenc when built (and COMETMQ_PURE_PYTHON is not set), else None
_C_ENCODE: Any = load_c_helper("cometmq.protocol._batchenc")
#: what the SDK uses: one C call per batch when built, else the reference
encode_keyed_batch: Callable[[Sequence[KeyedItem], str, int], tuple[bytes, list[str]]] = (
    _encode_keyed_batch_c if _C_ENCODE is not None else encode_keyed_batch_py)


def decode_batch(data: bytes | bytearray | memoryview) -> list[BatchItem]:
    """Decode a whole batch body; any malformation raises RemoteProtocolError. An empty body gives []."""
    return [BatchItem(body, decode_properties(raw), flag, raw) for body, raw, flag in decode_batch_raw(data)]


def decode_batch_raw(data: bytes | bytearray | memoryview) -> list[tuple[bytes, bytes, int]]:
    """:func:`decode_batch` without decoding the properties: ``(body, properties bytes, flag)`` per item,
    checked as strictly (any malformation raises RemoteProtocolError)."""
    if type(data) is not bytes:
        data = bytes(data)
    items: list[tuple[bytes, bytes, int]] = []
    add = items.append
    unpack_head = _HEAD.unpack_from
    unpack_i16 = _I16.unpack_from
    end = len(data)
    pos = 0
    while pos < end:
        if end - pos < ITEM_OVERHEAD:
            raise RemoteProtocolError(f"truncated batch item at {pos}: {end - pos} bytes left")
        total, _magic, _crc, flag, body_len = unpack_head(data, pos)
        # TOTALSIZE is checked against the buffer first so that a lying body length cannot make us
        # slice past it; then the parts must add up to it exactly.
        if total < ITEM_OVERHEAD or total > end - pos:
            raise RemoteProtocolError(f"batch item size {total} at {pos} does not fit the {end - pos} bytes left")
        item_end = pos + total
        p = pos + 20  # _HEAD.size
        body_end = p + body_len
        if body_len < 0 or body_end + 2 > item_end:
            raise RemoteProtocolError(f"batch body length {body_len} overruns the item at {pos}")
        (props_len,) = unpack_i16(data, body_end)
        if props_len < 0 or body_end + 2 + props_len != item_end:
            raise RemoteProtocolError(f"batch properties length {props_len} does not end the item at {pos}")
        add((data[p:body_end], data[body_end + 2:item_end], flag))
        pos = item_end
    return items
