"""Stored-message records in RocketMQ's v1 layout (remoting-protocol.md §4): encode and decode.

The byte layout itself (field positions, the hosts' widths by sys flag) is owned by
:mod:`cometmq.protocol.record_layout`; the names re-exported here are its values for records with IPv4 hosts,
the fixed 84-byte header::

    TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG
    BORNTIMESTAMP BORNHOST(ip+port) STORETIMESTAMP STOREHOST(ip+port)
    RECONSUMETIMES PREPAREDTRANSACTIONOFFSET | BODYLEN BODY | TOPICLEN(1) TOPIC | PROPLEN(2) PROPS

A host is IPv4 (4 address bytes + int32 port) or, flagged in SYSFLAG, IPv6 (16 + 4), which moves every later
field. The same bytes are what the commit log stores and what a pull response carries back to back.
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
from cometmq.protocol.record_layout import (
    BLANK_FILL_SIZE,
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    HOST_V6_FLAGS,
    IPV4_HOST_SIZE,
    IPV6_HOST_SIZE,
    LAYOUT_V4,
    LAYOUTS,
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    STOREHOST_V6_FLAG,
    SYS_FLAG_POS,
    RecordLayout,
    host_flags,
    layout_for,
    record_layout,
)

__all__ = [
    "BLANK_FILL_SIZE", "BLANK_MAGIC_CODE", "BORNHOST_V6_FLAG", "DEFAULT_MAX_INFLATED_BODY", "HEADER", "HEADER_SIZE",
    "HOST_V6_FLAGS", "LAYOUTS", "LAYOUT_V4", "MAGIC_CODE", "MAX_PROPERTIES_LENGTH", "MAX_TOPIC_LENGTH",
    "MIN_RECORD_SIZE", "PHYSICAL_OFFSET_POS", "QUEUE_OFFSET_POS", "STOREHOST_V6_FLAG", "STORE_TIMESTAMP_POS",
    "SYS_FLAG_POS", "TRANSACTION_MASK", "MessageRecord", "RecordLayout", "SysFlag", "body_crc", "decode_record",
    "encode_parts", "encode_record", "host_flags", "host_string", "inflate_body", "iter_records", "layout_for",
    "pack_host", "record_layout", "record_properties", "record_size_at", "transaction_value", "unpack_host",
]

#: TOTALSIZE .. PREPAREDTRANSACTIONOFFSET of a record with IPv4 hosts (address and port apart)
HEADER = LAYOUT_V4.header
HEADER_SIZE = LAYOUT_V4.header_size  # 84
#: where STORETIMESTAMP is in a record with an IPv4 born host
STORE_TIMESTAMP_POS = LAYOUT_V4.store_timestamp_pos
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_SIZE_MAGIC = LAYOUT_V4.struct_of("total_size", "magic_code")
_LOCALHOST = b"\x7f\x00\x00\x01\x00\x00\x00\x00"  # 127.0.0.1:0


class SysFlag(enum.IntFlag):
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = BORNHOST_V6_FLAG
    STOREHOST_V6 = STOREHOST_V6_FLAG


TRANSACTION_MASK = 0xC

#: how far a consumer inflates a COMPRESSED body unless told otherwise: four times the producers' default
#: maxMessageSize (4 MiB), which RocketMQ's producers and this SDK's check on a body before they compress it. A
#: stored body of 4 MiB can inflate a thousandfold (zlib's ratio): 4 GiB in each consumer's memory, unbounded.
DEFAULT_MAX_INFLATED_BODY = 16 * 1024 * 1024


def inflate_body(body: bytes | bytearray | memoryview, limit: int) -> bytes | None:
    """A COMPRESSED record's body (a zlib stream, as the 4.x producers write it) inflated, but never past ``limit``
    bytes: the work and the memory stop at ``limit`` + 1. None when it does not inflate (not zlib, truncated, another
    compression type) or inflates to more than ``limit``: the caller leaves the body as stored."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        return None
    return out if inflater.eof and len(out) <= limit else None


def transaction_value(sys_flag: int) -> int:
    """The transaction bits of a sys flag: 0 (not a transaction), 4, 8 or 12."""
    return sys_flag & TRANSACTION_MASK


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's body CRC: CRC32-IEEE masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


_V4_MAPPED = bytes(10) + b"\xff\xff"


def pack_host(host: str, port: int) -> bytes:
    """A host as a record stores it: 8 bytes (IPv4 address + int32 port) or 20 (IPv6 address + port).

    An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``, what a dual-stack socket reports for an IPv4 peer) packs
    as the IPv4 address, as Java's InetAddress turns it into one; an IPv6 zone (``%eth0``) is dropped. A name
    that is not an IP literal is refused."""
    # inet_pton, not inet_aton: inet_aton also takes "127.1", "1" and "1.2.3.4 junk", which would not
    # round-trip, and a NUL in the string raises ValueError rather than OSError.
    try:
        if ":" in host:
            addr = socket.inet_pton(socket.AF_INET6, host.partition("%")[0])
            if addr[:12] == _V4_MAPPED:
                addr = addr[12:]
        else:
            addr = socket.inet_pton(socket.AF_INET, host)
        return addr + _I32.pack(port)
    except (OSError, ValueError, TypeError, struct.error) as exc:
        raise ProtocolError(f"host {host!r}:{port} is not an IP address and port") from exc


def unpack_host(data: bytes | bytearray | memoryview) -> tuple[str, int]:
    """Inverse of :func:`pack_host`: 8 bytes give an IPv4 host, 20 an IPv6 one; other sizes raise ProtocolError."""
    if len(data) == IPV4_HOST_SIZE:
        return socket.inet_ntoa(bytes(data[:4])), _I32.unpack_from(data, 4)[0]
    if len(data) == IPV6_HOST_SIZE:
        return socket.inet_ntop(socket.AF_INET6, bytes(data[:16])), _I32.unpack_from(data, 16)[0]
    raise ProtocolError(f"a host is {IPV4_HOST_SIZE} or {IPV6_HOST_SIZE} bytes, got {len(data)}")


def host_string(host: tuple[str, int]) -> str:
    """``ip:port``, or ``[ip]:port`` for an IPv6 address (the form the network layer parses)."""
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One stored message with every v1 field. Hosts are (IPv4 or IPv6 address, port) pairs; the host bits of
    ``sys_flag`` follow them when the record is encoded."""

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
    born_host: bytes = _LOCALHOST,
    store_timestamp: int = 0,
    store_host: bytes = _LOCALHOST,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """Encode one record from already-encoded parts (hosts packed, 8 or 20 bytes each, as by :func:`pack_host`).

    The host bits of ``sys_flag`` are set from the hosts' widths, so the record always reads back as written."""
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ProtocolError(f"topic is {len(topic)} bytes, at most {MAX_TOPIC_LENGTH}")
    if len(properties) > MAX_PROPERTIES_LENGTH:
        raise ProtocolError(f"properties are {len(properties)} bytes, at most {MAX_PROPERTIES_LENGTH}")
    try:
        sys_flag = (sys_flag & ~HOST_V6_FLAGS) | host_flags(born_host, store_host)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    except TypeError:
        raise ProtocolError(f"sys flag {sys_flag!r} is not an int") from None
    layout = layout_for(sys_flag)
    body_len = len(body)
    total = layout.min_record_size + body_len + len(topic) + len(properties)
    try:
        header = layout.head.pack(
            total,
            MAGIC_CODE,
            body_crc(body) if crc is None else crc,
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body_len,
        )
    except struct.error as exc:
        raise ProtocolError(f"record field out of range: {exc}") from None
    return b"".join(
        (
            header,
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


def _ip_text(ip: bytes) -> str:
    return socket.inet_ntoa(ip) if len(ip) == 4 else socket.inet_ntop(socket.AF_INET6, ip)


def decode_record(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = False
) -> tuple[MessageRecord, int]:
    """Decode the record at ``pos``; returns it and its size. Any malformation raises ProtocolError."""
    end_of_buf = len(buf)
    if pos < 0:  # struct would count a negative offset from the end of the buffer
        raise ProtocolError(f"negative record position {pos}")
    if end_of_buf - pos < MIN_RECORD_SIZE:
        raise ProtocolError(f"truncated record: {end_of_buf - pos} bytes, at least {MIN_RECORD_SIZE} needed")
    layout = LAYOUT_V4
    fields = HEADER.unpack_from(buf, pos)
    if fields[7] & HOST_V6_FLAGS:  # SYSFLAG: an IPv6 host moves the fields after it
        layout = layout_for(fields[7])
        if end_of_buf - pos < layout.min_record_size:
            raise ProtocolError(f"truncated record: {end_of_buf - pos} bytes, at least {layout.min_record_size}"
                                " needed with IPv6 hosts")
        fields = layout.header.unpack_from(buf, pos)
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
    ) = fields
    if magic != MAGIC_CODE:
        raise ProtocolError(f"bad magic code {magic:#010x} at {pos}")
    if total < layout.min_record_size or total > end_of_buf - pos:
        raise ProtocolError(f"record size {total} at {pos} does not fit the {end_of_buf - pos} bytes left")
    end = pos + total
    p = pos + layout.header_size
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
        born_host=(_ip_text(born_ip), born_port),
        store_timestamp=store_ts,
        store_host=(_ip_text(store_ip), store_port),
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
    layout = record_layout(view)
    if len(view) < layout.min_record_size:
        raise ProtocolError("truncated record")
    (body_len,) = _I32.unpack_from(view, layout.body_length_pos)
    p = layout.body_pos + body_len
    if body_len < 0 or p + 3 > len(view):
        raise ProtocolError("body length overruns the record")
    p += 1 + view[p]
    if p + 2 > len(view):
        raise ProtocolError("topic length overruns the record")
    (props_len,) = _I16.unpack_from(view, p)
    if props_len < 0 or p + 2 + props_len > len(view):
        raise ProtocolError("properties length overruns the record")
    return decode_properties(view[p + 2 : p + 2 + props_len])
