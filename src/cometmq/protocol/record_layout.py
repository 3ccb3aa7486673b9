"""Where each field of a stored message record is: the one owner of RocketMQ's v1 record layout.

A record (what the commit log stores and a pull answer carries back to back), big-endian::

    TOTALSIZE(4) MAGICCODE(4) BODYCRC(4) QUEUEID(4) FLAG(4) QUEUEOFFSET(8) PHYSICALOFFSET(8) SYSFLAG(4)
    BORNTIMESTAMP(8) BORNHOST STORETIMESTAMP(8) STOREHOSTADDRESS RECONSUMETIMES(4) PREPAREDTRANSACTIONOFFSET(8)
    | BODYLEN(4) BODY | TOPICLEN(1) TOPIC | PROPLEN(2) PROPS

A host is 4 IPv4 address bytes and an int32 port (8 bytes) or, when its SYSFLAG bit is set (BORNHOST_V6 0x10,
STOREHOST_V6 0x20), 16 IPv6 address bytes and the port (20 bytes), as RocketMQ's MessageDecoder and
CommitLog.calMsgLength read it. Fields up to BORNHOST sit at fixed positions; the later ones move by 12 bytes
per IPv6 host, so their positions are those of the :class:`RecordLayout` of the record's sys flag
(:func:`layout_for`, :func:`record_layout`). Every module that reads or writes record bytes takes its positions
and structs from here. The C helpers ``spark/_decodec.c``, ``store/_indexc.c``, ``store/_batchc.c`` (which
writes records) and ``broker/transaction/_txc.c`` keep copies as macros; tests check them against this module.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

MAGIC_CODE = 0xDAA320A7  # -626843481 as a Java int
BLANK_MAGIC_CODE = 0xCBD43194  # marks the unused tail of a commit-log segment

BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
HOST_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
#: the host bits shifted down by this are 0..3, the index of the record's layout in :data:`LAYOUTS`
HOST_FLAGS_SHIFT = 4
IPV4_HOST_SIZE = 8  # 4 address bytes + int32 port
IPV6_HOST_SIZE = 20  # 16 address bytes + int32 port

#: The fields in record order, as (name, struct code); "" for a host address, whose width is the sys flag's.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", "i"),
    ("magic_code", "I"),
    ("body_crc", "i"),
    ("queue_id", "i"),
    ("flag", "i"),
    ("queue_offset", "q"),
    ("physical_offset", "q"),
    ("sys_flag", "i"),
    ("born_timestamp", "q"),
    ("born_ip", ""),
    ("born_port", "i"),
    ("store_timestamp", "q"),
    ("store_ip", ""),
    ("store_port", "i"),
    ("reconsume_times", "i"),
    ("prepared_transaction_offset", "q"),
    ("body_length", "i"),
)
#: Whole hosts (address + port as one bytes value): names usable in :meth:`RecordLayout.struct_of` too.
_HOSTS = {"born_host": ("born_ip", "born_port"), "store_host": ("store_ip", "store_port")}
#: Every field through the body length, hosts whole: what an append packs.
HEAD_FIELDS = ("total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
               "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
               "prepared_transaction_offset", "body_length")
#: Every field before the body length, hosts as address and port: what a full decode unpacks.
HEADER_FIELDS = tuple(name for name, _ in _FIELDS if name != "body_length")


class RecordLayout:
    """Positions and structs of the records whose hosts have one pair of widths (one of :data:`LAYOUTS`)."""

    __slots__ = ("_fields", "body_length_pos", "body_pos", "born_host_pos", "born_host_size", "head", "header",
                 "header_size", "host_flags", "index", "min_record_size", "prepared_transaction_offset_pos",
                 "reconsume_times_pos", "store_host_pos", "store_host_size", "store_timestamp_pos")

    def __init__(self, born_v6: bool, store_v6: bool) -> None:
        self.host_flags = (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOST_V6_FLAG if store_v6 else 0)
        #: this layout's place in :data:`LAYOUTS` (0 for IPv4 hosts), for tables of per-layout structs
        self.index = self.host_flags >> HOST_FLAGS_SHIFT
        self.born_host_size = IPV6_HOST_SIZE if born_v6 else IPV4_HOST_SIZE
        self.store_host_size = IPV6_HOST_SIZE if store_v6 else IPV4_HOST_SIZE
        ips = {"born_ip": f"{self.born_host_size - 4}s", "store_ip": f"{self.store_host_size - 4}s"}
        self._fields: dict[str, tuple[int, str]] = {}
        pos = 0
        for name, code in _FIELDS:
            code = code or ips[name]
            self._fields[name] = (pos, code)
            pos += struct.calcsize(">" + code)
        for host, (ip, _) in _HOSTS.items():
            size = self.born_host_size if host == "born_host" else self.store_host_size
            self._fields[host] = (self._fields[ip][0], f"{size}s")
        self.born_host_pos = self.position("born_host")
        self.store_timestamp_pos = self.position("store_timestamp")
        self.store_host_pos = self.position("store_host")
        self.reconsume_times_pos = self.position("reconsume_times")
        self.prepared_transaction_offset_pos = self.position("prepared_transaction_offset")
        self.body_length_pos = self.position("body_length")
        #: the fixed fields before the body length: 84 bytes with two IPv4 hosts
        self.header_size = self.body_length_pos
        self.body_pos = self.body_length_pos + 4
        #: a record with an empty body, topic and properties: 91 bytes with two IPv4 hosts
        self.min_record_size = self.body_pos + 1 + 2
        self.head = self.struct_of(*HEAD_FIELDS)
        self.header = self.struct_of(*HEADER_FIELDS)

    def position(self, name: str) -> int:
        """Where field ``name`` (one of the record's, or ``born_host``/``store_host``) starts."""
        return self._fields[name][0]

    def struct_of(self, *names: str) -> struct.Struct:
        """A struct for just the fields ``names`` (in record order), skipping the bytes between them. It starts at
        the first one: use it at ``position(names[0])`` past the record's start."""
        parts = [">"]
        at = self._fields[names[0]][0]
        for name in names:
            pos, code = self._fields[name]
            if pos < at:
                raise ValueError(f"field {name} is not after the fields before it in {names}")
            if pos > at:
                parts.append(f"{pos - at}x")
            parts.append(code)
            at = pos + struct.calcsize(">" + code)
        return struct.Struct("".join(parts))

    def __repr__(self) -> str:
        return f"RecordLayout(born_host_size={self.born_host_size}, store_host_size={self.store_host_size})"


#: The layouts by ``(sys_flag >> 4) & 3``: IPv4 hosts, IPv6 born host, IPv6 store host, both IPv6.
LAYOUTS: tuple[RecordLayout, RecordLayout, RecordLayout, RecordLayout] = (
    RecordLayout(False, False), RecordLayout(True, False), RecordLayout(False, True), RecordLayout(True, True))
LAYOUT_V4 = LAYOUTS[0]
assert all(layout.index == i for i, layout in enumerate(LAYOUTS))

TOTAL_SIZE_POS = LAYOUT_V4.position("total_size")
MAGIC_CODE_POS = LAYOUT_V4.position("magic_code")
BODY_CRC_POS = LAYOUT_V4.position("body_crc")
QUEUE_ID_POS = LAYOUT_V4.position("queue_id")
FLAG_POS = LAYOUT_V4.position("flag")
QUEUE_OFFSET_POS = LAYOUT_V4.position("queue_offset")
PHYSICAL_OFFSET_POS = LAYOUT_V4.position("physical_offset")
SYS_FLAG_POS = LAYOUT_V4.position("sys_flag")
BORN_TIMESTAMP_POS = LAYOUT_V4.position("born_timestamp")
BORN_HOST_POS = LAYOUT_V4.position("born_host")
#: the byte of SYSFLAG that holds both host bits (its lowest, the field being big-endian)
HOST_FLAGS_BYTE = SYS_FLAG_POS + 3
#: the smallest record of any layout (both hosts IPv4, everything empty)
MIN_RECORD_SIZE = LAYOUT_V4.min_record_size
#: a blank filler needs TOTALSIZE + MAGIC
BLANK_FILL_SIZE = MAGIC_CODE_POS + 4
#: the largest fixed part of any layout: both hosts IPv6
MAX_HEADER_SIZE = LAYOUTS[3].header_size


def layout_for(sys_flag: int) -> RecordLayout:
    """The layout of records with this sys flag."""
    return LAYOUTS[(sys_flag >> HOST_FLAGS_SHIFT) & 3]


def record_layout(buf: bytes | bytearray | memoryview, pos: int = 0) -> RecordLayout:
    """The layout of the record at ``pos`` of ``buf``, from its SYSFLAG (IndexError when the buffer ends first)."""
    return LAYOUTS[(buf[pos + HOST_FLAGS_BYTE] >> HOST_FLAGS_SHIFT) & 3]


def host_flags(born_host: Sequence[int], store_host: Sequence[int]) -> int:
    """The sys-flag host bits of a record with these packed hosts (8 or 20 bytes each); ValueError otherwise."""
    flags = 0
    for host, v6_flag in ((born_host, BORNHOST_V6_FLAG), (store_host, STOREHOST_V6_FLAG)):
        if len(host) == IPV6_HOST_SIZE:
            flags |= v6_flag
        elif len(host) != IPV4_HOST_SIZE:
            raise ValueError(f"a packed host is {IPV4_HOST_SIZE} or {IPV6_HOST_SIZE} bytes, got {len(host)}")
    return flags
