from __future__ import annotations

import dataclasses
import ipaddress
import socket
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import (
    BLANK_MAGIC_CODE,
    MIN_RECORD_SIZE,
    MessageRecord,
    SysFlag,
    body_crc,
    decode_record,
    encode_parts,
    encode_record,
    host_string,
    iter_records,
    pack_host,
    record_properties,
    record_size_at,
    transaction_value,
    unpack_host,
)

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
_chars = st.characters(codec="utf-8", exclude_characters="\x01\x02")


def _cut_utf8(text: str, limit: int) -> str:
    """Longest prefix of ``text`` whose UTF-8 form has at most ``limit`` bytes."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


topics = st.text(st.characters(codec="utf-8"), max_size=127).map(lambda t: _cut_utf8(t, 127))

def _v6_text(ip: ipaddress.IPv6Address) -> str:
    """The address as decode_record gives it back (inet_ntop's spelling)."""
    return socket.inet_ntop(socket.AF_INET6, ip.packed)


hosts_v4 = st.tuples(st.ip_addresses(v=4).map(str), INT32)
#: IPv6 addresses other than IPv4-mapped ones (those pack as IPv4, as Java's InetAddress makes them)
hosts_v6 = st.tuples(st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None).map(_v6_text), INT32)
hosts = st.one_of(hosts_v4, hosts_v6)
property_maps = st.dictionaries(
    st.text(_chars, min_size=1, max_size=12), st.text(_chars, max_size=30), max_size=6
)
records = st.builds(
    MessageRecord,
    topic=topics,
    body=st.binary(max_size=300),
    queue_id=INT32,
    flag=INT32,
    queue_offset=INT64,
    physical_offset=INT64,
    sys_flag=INT32,
    born_timestamp=INT64,
    born_host=hosts,
    store_timestamp=INT64,
    store_host=hosts,
    reconsume_times=INT32,
    prepared_transaction_offset=INT64,
    properties=property_maps,
    body_crc=st.none() | INT32,
)


def _sample(**overrides: object) -> MessageRecord:
    fields: dict[str, object] = dict(
        topic="TopicTest",
        body=b"hello",
        queue_id=3,
        flag=7,
        queue_offset=42,
        physical_offset=123456789,
        sys_flag=int(SysFlag.MULTI_TAGS),
        born_timestamp=1_700_000_000_000,
        born_host=("192.168.0.1", 51234),
        store_timestamp=1_700_000_000_005,
        store_host=("10.0.0.2", 10911),
        reconsume_times=2,
        prepared_transaction_offset=99,
        properties={"TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true"},
    )
    fields.update(overrides)
    return MessageRecord(**fields)  # type: ignore[arg-type]


# -- layout known answers --------------------------------------------------------------------------------


def test_layout_of_a_known_record() -> None:
    rec = _sample()
    data = encode_record(rec)
    n, t, p = 5, len("TopicTest"), len(b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02WAIT\x01true\x02")
    assert len(data) == 91 + n + t + p
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert data[4:8] == bytes.fromhex("DAA320A7")
    assert struct.unpack_from(">i", data, 4)[0] == -626843481
    assert struct.unpack_from(">i", data, 8)[0] == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert struct.unpack_from(">iiqqiq", data, 12) == (3, 7, 42, 123456789, 2, 1_700_000_000_000)
    assert data[48:56] == bytes([192, 168, 0, 1]) + struct.pack(">i", 51234)
    assert struct.unpack_from(">q", data, 56)[0] == 1_700_000_000_005
    assert data[64:72] == bytes([10, 0, 0, 2]) + struct.pack(">i", 10911)
    assert struct.unpack_from(">iqi", data, 72) == (2, 99, 5)
    assert data[88:93] == b"hello"
    assert data[93] == t
    assert data[94 : 94 + t] == b"TopicTest"
    assert struct.unpack_from(">h", data, 94 + t)[0] == p
    assert data[96 + t :] == b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02WAIT\x01true\x02"


def test_empty_record_is_91_bytes() -> None:
    data = encode_record(MessageRecord(topic="", body=b""))
    assert len(data) == MIN_RECORD_SIZE == 91
    rec, size = decode_record(data)
    assert size == 91
    assert (rec.topic, rec.body, dict(rec.properties)) == ("", b"", {})


def test_crc_is_masked_to_31_bits() -> None:
    assert zlib.crc32(b"a") == 0xE8B7BE43  # high bit set, so the mask matters
    assert body_crc(b"a") == 0x68B7BE43
    data = encode_record(MessageRecord(topic="T", body=b"a"))
    assert data[8:12] == bytes.fromhex("68B7BE43")


def test_explicit_crc_is_written_verbatim() -> None:
    data = encode_record(MessageRecord(topic="T", body=b"a", body_crc=-5))
    assert struct.unpack_from(">i", data, 8)[0] == -5


def test_multibyte_topic_length_is_in_bytes() -> None:
    data = encode_record(MessageRecord(topic="\u00e9" * 63, body=b""))  # 126 bytes
    assert data[88] == 126
    assert decode_record(data)[0].topic == "\u00e9" * 63


def test_encode_parts_matches_encode_record() -> None:
    rec = _sample()
    parts = encode_parts(
        topic=b"TopicTest",
        body=memoryview(b"hello"),
        properties=b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02WAIT\x01true\x02",
        queue_id=3,
        flag=7,
        queue_offset=42,
        physical_offset=123456789,
        sys_flag=2,
        born_timestamp=1_700_000_000_000,
        born_host=pack_host("192.168.0.1", 51234),
        store_timestamp=1_700_000_000_005,
        store_host=pack_host("10.0.0.2", 10911),
        reconsume_times=2,
        prepared_transaction_offset=99,
    )
    assert parts == encode_record(rec)


# -- encode refusals -------------------------------------------------------------------------------------


def test_topic_of_127_bytes_is_accepted_128_refused() -> None:
    assert decode_record(encode_record(MessageRecord(topic="t" * 127, body=b"")))[0].topic == "t" * 127
    with pytest.raises(ProtocolError):
        encode_record(MessageRecord(topic="t" * 128, body=b""))
    with pytest.raises(ProtocolError):
        encode_record(MessageRecord(topic="\u00e9" * 64, body=b""))  # 64 chars but 128 bytes


@pytest.mark.parametrize(
    "props",
    [{"TAGS": "a\x01b"}, {"TA\x01GS": "a"}, {"TAGS": "a\x02b"}, {"K": "v" * 32767}],
)
def test_bad_properties_are_refused(props: dict[str, str]) -> None:
    with pytest.raises(ProtocolError):
        encode_record(MessageRecord(topic="T", body=b"", properties=props))


def test_largest_properties_are_accepted() -> None:
    props = {"K": "v" * (32767 - 4)}  # K \x01 value \x02 = 32767 bytes
    rec, _ = decode_record(encode_record(MessageRecord(topic="T", body=b"", properties=props)))
    assert rec.properties == props


def test_lone_surrogate_topic_is_refused() -> None:
    with pytest.raises(ProtocolError):
        encode_record(MessageRecord(topic="\ud800", body=b""))


@pytest.mark.parametrize(
    "change",
    [
        {"queue_id": 1 << 31},
        {"flag": -(1 << 31) - 1},
        {"queue_offset": 1 << 63},
        {"physical_offset": -(1 << 63) - 1},
        {"sys_flag": 1 << 31},
        {"born_timestamp": 1 << 63},
        {"reconsume_times": 1 << 31},
        {"prepared_transaction_offset": 1 << 63},
        {"body_crc": 1 << 31},
        {"born_host": ("127.0.0.1", 1 << 31)},
    ],
)
def test_out_of_range_fields_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        encode_record(_sample(**change))


@pytest.mark.parametrize(
    "host", ["127.1", "1", "1.2.3.4 x", "localhost", "::1::2", ":::", "1.2.3.4%eth0", "256.0.0.1", "1.2.3.4\x00", ""]
)
def test_non_ip_hosts_are_refused(host: str) -> None:
    with pytest.raises(ProtocolError):
        pack_host(host, 1)
    with pytest.raises(ProtocolError):
        encode_record(_sample(store_host=(host, 1)))


def test_host_round_trip_and_short_host() -> None:
    assert pack_host("10.1.2.3", 10911) == bytes([10, 1, 2, 3, 0, 0, 0x2A, 0x9F])
    assert unpack_host(pack_host("10.1.2.3", -1)) == ("10.1.2.3", -1)
    with pytest.raises(ProtocolError):
        unpack_host(b"\x01\x02\x03\x04\x00\x00\x00")


# -- decode ----------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(records)
def test_round_trip_all_fields(rec: MessageRecord) -> None:
    data = encode_record(rec)
    topic_bytes = rec.topic.encode("utf-8")
    prop_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in rec.properties.items())
    v6_hosts = (":" in rec.born_host[0]) + (":" in rec.store_host[0])
    assert len(data) == 91 + 12 * v6_hosts + len(rec.body) + len(topic_bytes) + prop_bytes
    decoded, size = decode_record(data)
    assert size == len(data)
    expected_crc = body_crc(rec.body) if rec.body_crc is None else rec.body_crc
    # The host bits of the sys flag follow the hosts given.
    flags = (0x10 if ":" in rec.born_host[0] else 0) | (0x20 if ":" in rec.store_host[0] else 0)
    assert decoded == dataclasses.replace(rec, body_crc=expected_crc, sys_flag=rec.sys_flag & ~0x30 | flags)
    assert encode_record(decoded) == data


@settings(max_examples=50, deadline=None)
@given(st.lists(records, max_size=5), st.binary(max_size=20))
def test_iter_records_and_decode_at_offset(recs: list[MessageRecord], lead: bytes) -> None:
    blob = b"".join(encode_record(r) for r in recs)
    assert [r.body for r in iter_records(blob)] == [r.body for r in recs]
    assert [r.topic for r in iter_records(memoryview(blob))] == [r.topic for r in recs]
    if recs:
        shifted = lead + blob
        rec, size = decode_record(bytearray(shifted), len(lead))
        assert rec.body == recs[0].body
        assert size == len(encode_record(recs[0]))


def test_check_crc() -> None:
    data = bytearray(encode_record(_sample()))
    decode_record(data, check_crc=True)
    data[88] ^= 0xFF  # first body byte
    decode_record(data)  # not checked by default, as the client never checks
    with pytest.raises(ProtocolError):
        decode_record(data, check_crc=True)
    with pytest.raises(ProtocolError):
        list(iter_records(bytes(data), check_crc=True))


def _patched(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, pos, value)
    return bytes(buf)


def test_malformed_records_raise_protocol_error() -> None:
    good = encode_record(_sample())
    t = len("TopicTest")
    bad = [
        good[:-1],  # truncated
        good[:90],  # shorter than any record
        _patched(good, 4, ">I", BLANK_MAGIC_CODE),  # blank filler is not a record
        _patched(good, 4, ">I", 0xDAA320AB),  # 5.x v2 magic
        _patched(good, 0, ">i", 90),  # size below minimum
        _patched(good, 0, ">i", len(good) + 1),  # size beyond buffer
        _patched(good, 0, ">i", -1),
        _patched(good, 84, ">i", -1),  # negative body length
        _patched(good, 84, ">i", 6),  # body overruns into the topic
        _patched(good, 84, ">i", 1 << 30),  # body overruns the record
        _patched(good, 84, ">i", -(1 << 30)),  # would index before the buffer's start
        _patched(good, 93, ">B", 128),  # topic longer than a signed byte allows
        _patched(good, 93, ">B", t + 1),  # topic length disagrees with the rest
        _patched(good, 94 + t, ">h", -1),  # negative properties length
        _patched(good, 94 + t, ">h", 1),  # properties end before the record does
        good[:94] + b"\xff" + good[95:],  # topic not UTF-8
        good[:-3] + b"\xff" + good[-2:],  # properties not UTF-8
    ]
    for data in bad:
        with pytest.raises(ProtocolError):
            decode_record(data)
    with pytest.raises(ProtocolError):
        list(iter_records(good + b"\x00"))  # trailing garbage
    with pytest.raises(ProtocolError):
        decode_record(good, -len(good))  # a negative position is not "from the end"
    with pytest.raises(ProtocolError):
        record_size_at(good, len(good) - 7)


def test_topic_length_above_127_is_refused_even_when_it_fits() -> None:
    # C++ reads the topic length as a signed byte, so 128 would be -128 there: not a valid record.
    data = bytearray(encode_parts(topic=b"t" * 127, body=b"", properties=b""))
    data[88] = 128
    data[89:89] = b"t"
    struct.pack_into(">i", data, 0, len(data))
    with pytest.raises(ProtocolError):
        decode_record(bytes(data))


def test_record_size_at() -> None:
    good = encode_record(_sample())
    assert record_size_at(good) == (len(good), 0xDAA320A7)


# -- fuzz: decoders either decode or raise ProtocolError, never anything else ---------------------------


def _decode_or_protocol_error(data: bytes | bytearray) -> None:
    try:
        rec, size = decode_record(data)
        assert MIN_RECORD_SIZE <= size <= len(data)
    except ProtocolError:
        pass
    try:
        for rec in iter_records(data):
            assert isinstance(rec, MessageRecord)
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _decode_or_protocol_error(data)


@settings(max_examples=300)
@given(st.binary(min_size=4, max_size=300), st.integers(0, 1 << 16))
def test_fuzz_bytes_behind_a_valid_size_and_magic(tail: bytes, size: int) -> None:
    # Random bytes almost never carry the magic code; give them one so the length checks get exercised.
    data = struct.pack(">iI", size % (len(tail) + 16), 0xDAA320A7) + tail
    _decode_or_protocol_error(data)


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    records,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_fuzz_mutated_records(data: st.DataObject, rec: MessageRecord, edits: list[tuple[int, int]]) -> None:
    buf = bytearray(encode_record(rec) * 2)
    for pos, value in edits:
        buf[pos % len(buf)] = value
    cut = data.draw(st.integers(0, len(buf)))
    _decode_or_protocol_error(buf[:cut])
    _decode_or_protocol_error(buf)


# -- flags and accessors ---------------------------------------------------------------------------------


def test_sys_flag_values() -> None:
    assert (SysFlag.COMPRESSED, SysFlag.MULTI_TAGS) == (1, 2)
    assert (SysFlag.BORNHOST_V6, SysFlag.STOREHOST_V6) == (0x10, 0x20)
    assert transaction_value(0x1 | 0x4) == 0x4
    assert transaction_value(0x8 | 0x2) == 0x8
    assert transaction_value(0xC | 0x1) == 0xC
    assert transaction_value(0x3) == 0


def test_record_accessors() -> None:
    rec = _sample(properties={"TAGS": "TagA", "KEYS": " k1  k2 ", "UNIQ_KEY": "AB"})
    assert rec.tags == "TagA"
    assert rec.keys == ["k1", "k2"]
    assert rec.uniq_key == "AB"
    bare = MessageRecord(topic="T", body=b"")
    assert (bare.tags, bare.keys, bare.uniq_key) == (None, [], None)


# -- IPv6 hosts ------------------------------------------------------------------------------------------


def test_layout_of_a_known_record_with_ipv6_hosts() -> None:
    """Java's MessageDecoder: with BORNHOST_V6 / STOREHOST_V6 a host is 16 address bytes + port, and every
    field after it moves."""
    rec = _sample(born_host=("2001:db8::7", 51234), store_host=("::1", 10911), sys_flag=int(SysFlag.MULTI_TAGS))
    data = encode_record(rec)
    n, t, p = 5, len("TopicTest"), len(b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02WAIT\x01true\x02")
    assert len(data) == 91 + 24 + n + t + p
    assert struct.unpack_from(">i", data, 0)[0] == len(data)
    assert struct.unpack_from(">i", data, 36)[0] == 0x2 | 0x10 | 0x20
    assert struct.unpack_from(">q", data, 40)[0] == 1_700_000_000_000
    assert data[48:68] == socket.inet_pton(socket.AF_INET6, "2001:db8::7") + struct.pack(">i", 51234)
    assert struct.unpack_from(">q", data, 68)[0] == 1_700_000_000_005
    assert data[76:96] == bytes(15) + b"\x01" + struct.pack(">i", 10911)
    assert struct.unpack_from(">iqi", data, 96) == (2, 99, 5)
    assert data[112:117] == b"hello"
    back, size = decode_record(data)
    assert size == len(data)
    assert back == dataclasses.replace(rec, sys_flag=0x32, body_crc=body_crc(b"hello"))
    assert record_properties(data) == rec.properties


@pytest.mark.parametrize(("born", "store", "flags", "extra"), [
    (("::1", 1), ("10.0.0.1", 2), 0x10, 12),
    (("10.0.0.1", 1), ("::1", 2), 0x20, 12),
    (("::ffff:10.0.0.9", 1), ("10.0.0.1", 2), 0, 0),  # IPv4-mapped: stored as IPv4, as Java does
])
def test_one_ipv6_host(born: tuple[str, int], store: tuple[str, int], flags: int, extra: int) -> None:
    data = encode_record(MessageRecord("T", b"body", born_host=born, store_host=store, sys_flag=0x30 ^ flags))
    assert len(data) == 91 + extra + 4 + 1
    rec, _ = decode_record(data)
    assert rec.sys_flag == flags  # the host bits follow the hosts, whatever the record said
    assert rec.born_host == (born[0].removeprefix("::ffff:"), 1) and rec.store_host == store and rec.body == b"body"


def test_pack_host_ipv6() -> None:
    assert pack_host("::1", 10911) == bytes(15) + b"\x01" + bytes([0, 0, 0x2A, 0x9F])
    assert pack_host("fe80::1%eth0", 1) == pack_host("fe80::1", 1)  # the zone is not stored
    assert pack_host("::ffff:10.1.2.3", 5) == pack_host("10.1.2.3", 5)
    assert unpack_host(pack_host("2001:db8::1:0", -1)) == ("2001:db8::1:0", -1)
    for bad in (b"\x00" * 9, b"\x00" * 19, b"\x00" * 21):
        with pytest.raises(ProtocolError):
            unpack_host(bad)
    assert host_string(("::1", 5)) == "[::1]:5" and host_string(("10.0.0.1", 5)) == "10.0.0.1:5"


def test_encode_parts_refuses_a_host_of_another_width() -> None:
    for host in (b"", b"\x01" * 7, b"\x01" * 9, b"\x01" * 16):
        with pytest.raises(ProtocolError):
            encode_parts(topic=b"T", body=b"", properties=b"", born_host=host)
        with pytest.raises(ProtocolError):
            encode_parts(topic=b"T", body=b"", properties=b"", store_host=host)


def test_an_ipv4_record_is_byte_identical_to_the_old_layout() -> None:
    """What the fixed 84-byte header always was (struct ">iIiiiqqiq4siq4siiq"), for records with IPv4 hosts."""
    rec = _sample()
    head = struct.pack(">iIiiiqqiq4siq4siiq", len(encode_record(rec)), 0xDAA320A7, body_crc(b"hello"), 3, 7, 42,
                       123456789, 2, 1_700_000_000_000, bytes([192, 168, 0, 1]), 51234, 1_700_000_000_005,
                       bytes([10, 0, 0, 2]), 10911, 2, 99)
    assert encode_record(rec)[:84] == head


def test_records_too_short_for_their_ipv6_hosts_are_refused() -> None:
    data = bytearray(encode_record(MessageRecord("T", b"")))  # 92 bytes, IPv4 hosts
    data[39] |= 0x30  # now claims two IPv6 hosts: 24 more header bytes than there are
    with pytest.raises(ProtocolError):
        decode_record(data)
    with pytest.raises(ProtocolError):
        record_properties(data)
    with pytest.raises(ProtocolError):
        decode_record(bytes(data) + bytes(30))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.builds(MessageRecord, topic=topics, body=st.binary(max_size=40), born_host=hosts,
                          store_host=hosts, properties=property_maps), min_size=1, max_size=4))
def test_mixed_ipv4_and_ipv6_records_back_to_back(recs: list[MessageRecord]) -> None:
    blob = b"".join(encode_record(r) for r in recs)
    back = list(iter_records(blob))
    assert [(r.born_host, r.store_host, r.body, r.topic, dict(r.properties)) for r in back] == [
        (r.born_host, r.store_host, r.body, r.topic, dict(r.properties)) for r in recs]
    pos = 0
    for r in recs:
        size = len(encode_record(r))
        assert record_properties(blob[pos : pos + size]) == r.properties
        pos += size
