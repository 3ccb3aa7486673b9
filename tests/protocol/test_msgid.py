from __future__ import annotations

import ipaddress
import itertools
import os
import re
import sys
import threading
import time
import timeit
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MessageRecord, encode_record, iter_records, pack_host
from cometmq.protocol.msgid import (
    OffsetMsgId,
    UniqKeyGenerator,
    decode_offset_msg_id,
    offset_msg_id,
    uniq_key_ip,
    uniq_key_timestamp,
)

HEX32 = re.compile(r"[0-9A-F]{32}")
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _local_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))) * 1000


# -- offset msgId ----------------------------------------------------------------------------------------


def test_offset_msg_id_known_answer() -> None:
    # 10.0.0.1 -> 0A000001, port 10911 -> 00002A9F, offset 0x1234 -> 16 hex digits
    expected = "0A00000100002A9F0000000000001234"
    assert offset_msg_id(("10.0.0.1", 10911), 0x1234) == expected
    assert offset_msg_id(pack_host("10.0.0.1", 10911), 0x1234) == expected
    assert offset_msg_id(bytearray(pack_host("10.0.0.1", 10911)), 0x1234) == expected
    assert decode_offset_msg_id(expected) == OffsetMsgId("10.0.0.1", 10911, 0x1234)
    assert decode_offset_msg_id(expected.lower()) == ("10.0.0.1", 10911, 0x1234)
    assert decode_offset_msg_id(expected.encode()) == ("10.0.0.1", 10911, 0x1234)


def test_offset_msg_id_of_a_stored_record() -> None:
    rec = MessageRecord(topic="T", body=b"x", physical_offset=4096, store_host=("1.2.3.4", 80))
    data = encode_record(rec)
    (rec,) = iter_records(data)
    assert offset_msg_id(rec.store_host, rec.physical_offset) == "01020304000000500000000000001000"
    assert offset_msg_id(data[64:72], 4096) == "01020304000000500000000000001000"


def test_negative_values_are_twos_complement() -> None:
    assert offset_msg_id(("255.255.255.255", -1), -1) == "F" * 32
    assert decode_offset_msg_id("F" * 32) == ("255.255.255.255", -1, -1)


@pytest.mark.parametrize(
    ("host", "offset"),
    [
        (("10.0.0.1", 1), 1 << 63),
        (("10.0.0.1", 1), -(1 << 63) - 1),
        (("10.0.0.1", 1 << 31), 0),
        (("localhost", 1), 0),
        (b"\x01\x02\x03\x04\x00\x00\x00", 0),
        (b"\x01\x02\x03\x04\x00\x00\x00\x00\x00", 0),
    ],
)
def test_offset_msg_id_refuses(host: tuple[str, int] | bytes, offset: int) -> None:
    with pytest.raises(ProtocolError):
        offset_msg_id(host, offset)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "0A00000100002A9F000000000000123",  # 31
        "0A00000100002A9F00000000000012345",  # 33
        "0A00000100002A9F000000000000123G",
        "0x0000100002A9F0000000000001234",
        "+A00000100002A9F0000000000001234",
        "0A 00000100002A9F000000000001234",
        "0A00000100002A9F000000000000123\n",
        "0A_00000100002A9F000000000001234",
        "0A00000100002A9F00000000000012\u0663\u0664",  # Arabic-Indic digits are not hex
        "0A00000100002A9F0000000000001234,0A00000100002A9F0000000000001234",
    ],
)
def test_decode_offset_msg_id_refuses(bad: str) -> None:
    with pytest.raises(ProtocolError):
        decode_offset_msg_id(bad)


def test_decode_offset_msg_id_refuses_non_ascii_bytes() -> None:
    with pytest.raises(ProtocolError):
        decode_offset_msg_id(b"\xff" * 32)


@settings(max_examples=200)
@given(st.ip_addresses(v=4).map(str), INT32, INT64)
def test_offset_msg_id_round_trip(ip: str, port: int, offset: int) -> None:
    msg_id = offset_msg_id((ip, port), offset)
    assert HEX32.fullmatch(msg_id)
    assert decode_offset_msg_id(msg_id) == (ip, port, offset)


@settings(max_examples=300)
@given(st.binary(max_size=40) | st.text(max_size=40) | st.text("0123456789abcdefABCDEF x+_-", max_size=34))
def test_fuzz_decode_offset_msg_id(data: bytes | str) -> None:
    try:
        ip, port, offset = decode_offset_msg_id(data)
    except ProtocolError:
        return
    assert offset_msg_id((ip, port), offset) == (data if isinstance(data, str) else data.decode()).upper()


def test_offset_msg_id_of_an_ipv6_store_host() -> None:
    """Java's MessageDecoder.createMessageId: 16 address bytes + port + offset, 56 hex digits."""
    expected = "2001" + "0DB8" + "0" * 20 + "0001" + "00002A9F" + "0000000000001234"
    assert len(expected) == 56
    assert offset_msg_id(("2001:db8::1", 10911), 0x1234) == expected
    assert offset_msg_id(pack_host("2001:db8::1", 10911), 0x1234) == expected
    assert decode_offset_msg_id(expected) == OffsetMsgId("2001:db8::1", 10911, 0x1234)
    assert decode_offset_msg_id(expected.lower().encode()) == ("2001:db8::1", 10911, 0x1234)
    for bad in (expected[:-1], expected + "0", expected[:-1] + "G", b"\xff" * 56):
        with pytest.raises(ProtocolError):
            decode_offset_msg_id(bad)
    with pytest.raises(ProtocolError):
        offset_msg_id(b"\x00" * 16, 0)  # neither 8 nor 20 bytes


def test_offset_msg_id_of_a_stored_ipv6_record() -> None:
    rec = MessageRecord("T", b"x", physical_offset=4096, store_host=("::1", 80), born_host=("fe80::2", 1))
    data = encode_record(rec)
    [back] = list(iter_records(data))
    assert offset_msg_id(back.store_host, back.physical_offset) == "0" * 30 + "01" + "00000050" + "0000000000001000"
    assert offset_msg_id(data[76:96], 4096) == offset_msg_id(("::1", 80), 4096)


@settings(max_examples=200)
@given(st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None), INT32, INT64)
def test_offset_msg_id_round_trip_ipv6(ip: ipaddress.IPv6Address, port: int, offset: int) -> None:
    msg_id = offset_msg_id((str(ip), port), offset)
    assert re.fullmatch(r"[0-9A-F]{56}", msg_id)
    host, got_port, got_offset = decode_offset_msg_id(msg_id)
    assert (ipaddress.ip_address(host), got_port, got_offset) == (ip, port, offset)


# -- UNIQ_KEY --------------------------------------------------------------------------------------------


def _clock(values: list[int]) -> Iterator[int]:
    yield from values


def _generator_with(values: list[int], ip: str = "10.1.2.3") -> UniqKeyGenerator:
    it = _clock(values)
    return UniqKeyGenerator(ip, clock_ms=lambda: next(it))


def test_key_shape() -> None:
    gen = UniqKeyGenerator("10.1.2.3")
    key = gen.new_key()
    assert HEX32.fullmatch(key)
    assert key.startswith("0A010203")
    assert key[8:12] == f"{os.getpid() & 0xFFFF:04X}"
    assert uniq_key_ip(key) == "10.1.2.3"
    assert gen() != key


def test_keys_of_one_millisecond_count_up() -> None:
    t = _local_ms(2024, 3, 5, 12)
    gen = _generator_with([t, t, t + 1])
    a, b, c = gen(), gen(), gen()
    assert a[:20] == b[:20] == c[:20]
    offset = t - _local_ms(2024, 3, 1)
    assert a[20:] == f"{offset:08X}0000"
    assert b[20:] == f"{offset:08X}0001"
    assert c[20:] == f"{offset + 1:08X}0000"


def test_more_than_65536_keys_in_one_millisecond_stay_unique() -> None:
    t = _local_ms(2024, 3, 5, 12)
    gen = UniqKeyGenerator(clock_ms=lambda: t)
    keys = [gen() for _ in range(70_000)]
    assert len(set(keys)) == len(keys)
    assert keys == sorted(keys)  # the counter carries into the time field instead of wrapping


def test_clock_stepping_back_does_not_repeat_keys() -> None:
    t = _local_ms(2024, 3, 5, 12)
    gen = _generator_with([t, t + 5, t, t - 1000, t + 5])
    keys = [gen() for _ in range(5)]
    assert len(set(keys)) == 5
    assert keys == sorted(keys)


def test_month_rollover_changes_prefix_and_restarts_time() -> None:
    end = _local_ms(2024, 4, 1)
    gen = _generator_with([end - 1, end, end + 1, end - 1, end])
    keys = [gen() for _ in range(5)]
    assert len(set(keys)) == 5
    assert keys[1][20:] == "0" * 12  # time since the new month's start is 0
    assert keys[0][:20] != keys[1][:20] == keys[2][:20]
    # the clock going back across the boundary and forward again each move to an unused prefix
    assert len({k[:20] for k in keys}) == 4


def _keys_from_threads(gen: UniqKeyGenerator, threads: int, per_thread: int) -> list[str]:
    results: list[list[str]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def work(out: list[str]) -> None:
        start.wait()
        out.extend(gen() for _ in range(per_thread))

    workers = [threading.Thread(target=work, args=(out,)) for out in results]
    # Switch threads as often as the interpreter allows, so that unserialised updates of the generator's
    # state would interleave (with the default 5 ms interval such races are too rare to see).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for th in workers:
            th.start()
        for th in workers:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    return [k for out in results for k in out]


def test_keys_are_unique_across_threads() -> None:
    keys = _keys_from_threads(UniqKeyGenerator("10.1.2.3"), 8, 10_000)
    assert len(keys) == 80_000
    assert len(set(keys)) == 80_000


def test_keys_are_unique_across_threads_while_the_month_flaps() -> None:
    # Every call crosses a month boundary, so every call replaces the prefix: the slow path must be
    # serialised too (an unlocked generator gives dozens of duplicates here).
    a = _local_ms(2024, 3, 31, 23, 59)
    ticks = itertools.count()
    gen = UniqKeyGenerator(clock_ms=lambda: a + 120_000 * (next(ticks) % 2))
    keys = _keys_from_threads(gen, 4, 3_000)
    assert len(set(keys)) == 12_000


def test_two_generators_in_one_process_differ() -> None:
    t = _local_ms(2024, 3, 5, 12)
    a = UniqKeyGenerator(clock_ms=lambda: t)
    b = UniqKeyGenerator(clock_ms=lambda: t)
    assert a() != b()  # random salts


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_new_prefix() -> None:
    gen = UniqKeyGenerator("10.1.2.3")
    parent_key = gen()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(write_fd, gen().encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    child_key = os.read(read_fd, 64).decode()
    os.close(read_fd)
    os.waitpid(pid, 0)
    assert HEX32.fullmatch(child_key)
    assert child_key[8:12] == f"{pid & 0xFFFF:04X}"
    assert child_key[:20] != parent_key[:20]


def test_key_generation_has_no_gross_regression() -> None:
    # ~1 us per key on this machine kind; the bound only catches a hang or a ~50x regression, since pass/fail
    # tests do not time (the per-send cost is measured by bench/bench_client_send.py)
    gen = UniqKeyGenerator("10.1.2.3")
    best = min(timeit.repeat(gen.new_key, number=2_000, repeat=3)) / 2_000
    assert best < 50e-6, f"{best * 1e6:.2f} µs per key"


def test_uniq_key_timestamp() -> None:
    t = _local_ms(2024, 3, 5, 12, 30)
    key = _generator_with([t])()
    assert uniq_key_timestamp(key, now_ms=t) == t
    assert uniq_key_timestamp(key, now_ms=_local_ms(2024, 3, 28)) == t
    # read early next month, the offset would lie in the future, so the previous month is meant
    assert uniq_key_timestamp(key, now_ms=_local_ms(2024, 4, 2)) == t
    # across a year boundary
    t2 = _local_ms(2023, 12, 31, 23, 59)
    key2 = _generator_with([t2])()
    assert uniq_key_timestamp(key2, now_ms=_local_ms(2024, 1, 1, 0, 1)) == t2


def test_uniq_key_timestamp_of_a_fresh_key_is_now() -> None:
    before = time.time_ns() // 1_000_000
    key = UniqKeyGenerator()()
    after = time.time_ns() // 1_000_000
    assert before <= uniq_key_timestamp(key) <= after


@pytest.mark.parametrize("bad", ["", "XYZ", "0A010203" * 3, "0A010203" * 4 + "0", "0x" + "0" * 30])
def test_uniq_key_helpers_refuse_malformed_keys(bad: str) -> None:
    with pytest.raises(ProtocolError):
        uniq_key_timestamp(bad, now_ms=0)
    with pytest.raises(ProtocolError):
        uniq_key_ip(bad)


@pytest.mark.parametrize("ip", ["localhost", "1.2.3", b"\x01\x02\x03", "::1"])
def test_generator_refuses_bad_ip(ip: str | bytes) -> None:
    with pytest.raises(ProtocolError):
        UniqKeyGenerator(ip)


def test_generator_accepts_packed_ip() -> None:
    assert UniqKeyGenerator(b"\x0a\x00\x00\x07")().startswith("0A000007")
