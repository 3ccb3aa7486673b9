"""The owner of the stored-record layout: positions by host widths, as RocketMQ's MessageDecoder reads them."""

from __future__ import annotations

import struct

import pytest

from cometmq.protocol import message, record_layout
from cometmq.protocol.record_layout import (
    BORNHOST_V6_FLAG,
    LAYOUT_V4,
    LAYOUTS,
    STOREHOST_V6_FLAG,
    host_flags,
    layout_for,
)
from cometmq.protocol.record_layout import (
    record_layout as layout_of_record,
)


def test_ipv4_positions_are_the_documented_ones() -> None:
    """remoting-protocol.md §4: the fixed 84-byte header, then the body length at 84 and the body at 88."""
    expected = {"total_size": 0, "magic_code": 4, "body_crc": 8, "queue_id": 12, "flag": 16, "queue_offset": 20,
                "physical_offset": 28, "sys_flag": 36, "born_timestamp": 40, "born_host": 48, "store_timestamp": 56,
                "store_host": 64, "reconsume_times": 72, "prepared_transaction_offset": 76, "body_length": 84}
    assert {name: LAYOUT_V4.position(name) for name in expected} == expected
    assert (LAYOUT_V4.header_size, LAYOUT_V4.body_pos, LAYOUT_V4.min_record_size) == (84, 88, 91)
    assert LAYOUT_V4.head.format == ">iIiiiqqiq8sq8siqi"  # what the store has always packed
    assert LAYOUT_V4.header.format == ">iIiiiqqiq4siq4siiq"
    assert message.HEADER is LAYOUT_V4.header and message.HEADER_SIZE == 84 and message.STORE_TIMESTAMP_POS == 56


@pytest.mark.parametrize("born_v6", [False, True])
@pytest.mark.parametrize("store_v6", [False, True])
def test_an_ipv6_host_moves_every_later_field_by_12(born_v6: bool, store_v6: bool) -> None:
    """Java's MessageDecoder: a host is 8 bytes, or 20 with its sys-flag bit (16 address bytes + port)."""
    flags = (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOST_V6_FLAG if store_v6 else 0)
    layout = layout_for(flags | 0x1 | 0xC)  # other bits do not matter
    born, store = 12 * born_v6, 12 * store_v6
    assert layout is LAYOUTS[layout.index] and layout.host_flags == flags
    assert (layout.born_host_pos, layout.born_host_size) == (48, 8 + born)
    assert layout.store_timestamp_pos == 56 + born
    assert (layout.store_host_pos, layout.store_host_size) == (64 + born, 8 + store)
    assert layout.reconsume_times_pos == 72 + born + store
    assert layout.prepared_transaction_offset_pos == 76 + born + store
    assert layout.body_length_pos == layout.header_size == 84 + born + store
    assert layout.body_pos == 88 + born + store and layout.min_record_size == 91 + born + store
    # Java's calMsgLength adds up the same widths.
    assert layout.head.size == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + (8 + born) + 8 + (8 + store) + 4 + 8 + 4
    assert layout.header.size == layout.header_size


def test_struct_of_picks_fields_and_skips_the_rest() -> None:
    layout = LAYOUTS[3]
    s = layout.struct_of("total_size", "sys_flag", "store_host", "body_length")
    assert s.format == ">i32xi36x20s12xi"
    data = bytearray(200)
    struct.pack_into(">i", data, 0, 200)
    struct.pack_into(">i", data, 36, 0x30)
    data[76:96] = bytes(range(20))
    struct.pack_into(">i", data, 108, 7)
    assert s.unpack_from(data) == (200, 0x30, bytes(range(20)), 7)
    # A struct starts at its first field.
    assert layout.struct_of("store_timestamp", "store_host").format == ">q20s"
    with pytest.raises(ValueError):
        layout.struct_of("sys_flag", "queue_id")


def test_layout_of_a_record_reads_its_sys_flag() -> None:
    data = bytearray(120)
    assert layout_of_record(data) is LAYOUT_V4
    data[39] = 0x20 | 0x1
    assert layout_of_record(data) is LAYOUTS[2]
    assert layout_of_record(b"\x00" * 5 + bytes(data), 5) is LAYOUTS[2]


def test_host_flags_follow_the_host_widths() -> None:
    assert host_flags(b"x" * 8, b"x" * 8) == 0
    assert host_flags(b"x" * 20, b"x" * 8) == 0x10
    assert host_flags(b"x" * 8, b"x" * 20) == 0x20
    assert host_flags(b"x" * 20, b"x" * 20) == 0x30
    for bad in (b"", b"x" * 7, b"x" * 16):
        with pytest.raises(ValueError):
            host_flags(bad, b"x" * 8)


def test_protocol_message_re_exports_the_owner() -> None:
    for name in ("MAGIC_CODE", "BLANK_MAGIC_CODE", "MIN_RECORD_SIZE", "BLANK_FILL_SIZE", "QUEUE_OFFSET_POS",
                 "PHYSICAL_OFFSET_POS", "LAYOUTS", "layout_for", "record_layout", "RecordLayout"):
        assert getattr(message, name) is getattr(record_layout, name)
    assert (message.SysFlag.BORNHOST_V6, message.SysFlag.STOREHOST_V6) == (BORNHOST_V6_FLAG, STOREHOST_V6_FLAG)
