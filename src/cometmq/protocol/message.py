"""Stored-message records in RocketMQ's v1 layout (remoting-protocol.md §4).

A record is a fixed 84-byte header, then the body, topic and properties, all big-endian::

    TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG
    BORNTIMESTAMP BORNHOST(ip4+port) STORETIMESTAMP STOREHOST(ip4+port)
    RECONSUMETIMES PREPAREDTRANSACTIONOFFSET | BODYLEN BODY | TOPICLEN(1) TOPIC | PROPLEN(2) PROPS

The same bytes are what the commit log stores and what a pull response carries back to back.
"""

from __future__ import annotations

import enum
import socket
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.properties import decode_properties, encode_properties

MAGIC_CODE = 0xDAA320A7  # -626843481 as a Java int
BLANK_MAGIC_CODE = 0xCBD43194  # marks the unused tail of a commit-log segment

#: TOTALSIZE .. PREPAREDTRANSACTIONOFFSET; hosts are 4 address bytes + an int32 port.
HEADER = struct.Struct(">iIiiiqqiq4siq4siiq")
HEADER_SIZE = HEADER.size  # 84
#: Offsets of fields that the store patches or reads on their own.
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
STORE_TIMESTAMP_POS = 56
#: Smallest possible record: empty body, topic and properties.
MIN_RECORD_SIZE = HEADER_SIZE + 4 + 1 + 2  # 91
#: Blank filler needs TOTALSIZE + MAGIC.
BLANK_FILL_SIZE = 8
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_SIZE_MAGIC = struct.Struct(">iI")


class SysFlag(enum.IntFlag):
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20


TRANSACTION_MASK = 0xC


def transaction_value(sys_flag: int) -> int:
    """The transaction bits of a sys flag: 0 (not a transaction), 4, 8 or 12."""
    return sys_flag & TRANSACTION_MASK


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's body CRC: CRC32-IEEE masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def pack_host(host: str, port: int) -> bytes:
    """8 bytes: IPv4 address + int32 port. A name that is not a dotted-quad IPv4 literal is refused."""
    # inet_pton, not inet_aton: inet_aton also takes "127.1", "1" and "1.2.3.4 junk", which would not
    # round-trip, and a NUL in the string raises ValueError rather than OSError.
    try:
        return socket.inet_pton(socket.AF_INET, host) + _I32.pack(port)
    except (OSError, ValueError, TypeError, struct.error) as exc:
        raise ProtocolError(f"host {host!r}:{port} is not an IPv4 address and port") from exc


def unpack_host(data: bytes | bytearray | memoryview) -> tuple[str, int]:
    """Inverse of :func:`pack_host`; fewer than 8 bytes raise ProtocolError."""
    if len(data) < 8:
        raise ProtocolError(f"a host needs 8 bytes, got {len(data)}")
    return socket.inet_ntoa(bytes(data[:4])), _I32.unpack_from(data, 4)[0]


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One stored message with every v1 field. Hosts are (IPv4, port) pairs."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    body_crc: int | None = None  # None: computed from the body when encoding

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")


def encode_parts(
    *,
    topic: bytes,
    body: bytes | bytearray | memoryview,
    properties: bytes,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
    store_timestamp: int = 0,
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """Encode one record from already-encoded parts; the hot path of the store and the broker."""
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ProtocolError(f"topic is {len(topic)} bytes, at most {MAX_TOPIC_LENGTH}")
    if len(properties) > MAX_PROPERTIES_LENGTH:
        raise ProtocolError(f"properties are {len(properties)} bytes, at most {MAX_PROPERTIES_LENGTH}")
    body_len = len(body)
    total = MIN_RECORD_SIZE + body_len + len(topic) + len(properties)
    try:
        header = HEADER.pack(
            total,
            MAGIC_CODE,
            body_crc(body) if crc is None else crc,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            born_host[:4],
            _I32.unpack_from(born_host, 4)[0],
            store_timestamp,
            store_host[:4],
            _I32.unpack_from(store_host, 4)[0],
            reconsume_times,
            prepared_transaction_offset,
        )
    except struct.error as exc:
        raise ProtocolError(f"record field out of range: {exc}") from None
    return b"".join(
        (
            header,
            _I32.pack(body_len),
            body,
            bytes((len(topic),)),
            topic,
            _I16.pack(len(properties)),
            properties,
        )
    )


def encode_record(rec: MessageRecord) -> bytes:
    """Encode a :class:`MessageRecord` to its v1 bytes."""
    born = pack_host(*rec.born_host)
    store = pack_host(*rec.store_host)
    try:
        topic = rec.topic.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a JSON "\ud800" escape
        raise ProtocolError(f"topic {rec.topic!r} cannot be encoded as UTF-8") from None
    return encode_parts(
        topic=topic,
        body=rec.body,
        properties=encode_properties(rec.properties),
        queue_id=rec.queue_id,
        flag=rec.flag,
        queue_offset=rec.queue_offset,
        physical_offset=rec.physical_offset,
        sys_flag=rec.sys_flag,
        born_timestamp=rec.born_timestamp,
        born_host=born,
        store_timestamp=rec.store_timestamp,
        store_host=store,
        reconsume_times=rec.reconsume_times,
        prepared_transaction_offset=rec.prepared_transaction_offset,
        crc=rec.body_crc,
    )


def record_size_at(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(TOTALSIZE, MAGIC) at ``pos``; raises ProtocolError when fewer than 8 bytes remain."""
    if len(buf) - pos < BLANK_FILL_SIZE:
        raise ProtocolError("fewer than 8 bytes where a record should start")
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return size, magic


def decode_record(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = False
) -> tuple[MessageRecord, int]:
    """Decode the record at ``pos``; returns it and its size. Any malformation raises ProtocolError."""
    end_of_buf = len(buf)
    if pos < 0:  # struct would count a negative offset from the end of the buffer
        raise ProtocolError(f"negative record position {pos}")
    if end_of_buf - pos < MIN_RECORD_SIZE:
        raise ProtocolError(f"truncated record: {end_of_buf - pos} bytes, at least {MIN_RECORD_SIZE} needed")
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
    ) = HEADER.unpack_from(buf, pos)
    if magic != MAGIC_CODE:
        raise ProtocolError(f"bad magic code {magic:#010x} at {pos}")
    if total < MIN_RECORD_SIZE or total > end_of_buf - pos:
        raise ProtocolError(f"record size {total} at {pos} does not fit the {end_of_buf - pos} bytes left")
    end = pos + total
    p = pos + HEADER_SIZE
    (body_len,) = _I32.unpack_from(buf, p)
    p += 4
    if body_len < 0 or p + body_len + 3 > end:
        raise ProtocolError(f"body length {body_len} overruns the record at {pos}")
    body = bytes(buf[p : p + body_len])
    p += body_len
    topic_len = buf[p]
    p += 1
    if topic_len > MAX_TOPIC_LENGTH or p + topic_len + 2 > end:
        raise ProtocolError(f"topic length {topic_len} overruns the record at {pos}")
    try:
        topic = bytes(buf[p : p + topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"topic at {pos} is not UTF-8") from None
    p += topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    p += 2
    if props_len < 0 or p + props_len != end:
        raise ProtocolError(f"properties length {props_len} does not end the record at {pos}")
    properties = decode_properties(buf[p : p + props_len])
    if check_crc and body_crc(body) != crc:
        raise ProtocolError(f"body CRC mismatch at {pos}")
    rec = MessageRecord(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=(socket.inet_ntoa(born_ip), born_port),
        store_timestamp=store_ts,
        store_host=(socket.inet_ntoa(store_ip), store_port),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        properties=properties,
        body_crc=crc,
    )
    return rec, total


def iter_records(buf: bytes | bytearray | memoryview, *, check_crc: bool = False) -> Iterator[MessageRecord]:
    """Records back to back (a pull response body), decoded to the end of ``buf``."""
    pos = 0
    while pos < len(buf):
        rec, size = decode_record(buf, pos, check_crc=check_crc)
        yield rec
        pos += size


def record_properties(view: bytes | bytearray | memoryview) -> dict[str, str]:
    """Only the properties of a stored record (what a property filter needs), without decoding the rest."""
    if len(view) < MIN_RECORD_SIZE:
        raise ProtocolError("truncated record")
    (body_len,) = _I32.unpack_from(view, HEADER_SIZE)
    p = HEADER_SIZE + 4 + body_len
    if body_len < 0 or p + 3 > len(view):
        raise ProtocolError("body length overruns the record")
    p += 1 + view[p]
    if p + 2 > len(view):
        raise ProtocolError("topic length overruns the record")
    (props_len,) = _I16.unpack_from(view, p)
    if props_len < 0 or p + 2 + props_len > len(view):
        raise ProtocolError("properties length overruns the record")
    return decode_properties(view[p + 2 : p + 2 + props_len])
