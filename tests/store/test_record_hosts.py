"""IPv4 and IPv6 born and store hosts in the commit log: the sys flag's host bits follow the hosts' widths (as
RocketMQ's CommitLog sets them from the addresses), on the append, prepare, read and recovery paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from cometmq.protocol.message import decode_record, encode_parts, pack_host
from cometmq.store.commitlog import dispatch_request_from_record, record_is_valid
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus, PutStatus
from tests.kit import FakeClock

from .conftest import msg, small_config

BORN_V6 = pack_host("2001:db8::5", 40001)
BORN_V4 = pack_host("10.0.0.5", 40002)


def _store(path: Path, clock: FakeClock, store_host: tuple[str, int]) -> MessageStore:
    store = MessageStore(small_config(path), store_host=store_host, clock=clock)
    store.start()
    return store


def _with_born(m: MessageInner, born: bytes, sys_flag: int = 0) -> MessageInner:
    m.born_host, m.sys_flag = born, sys_flag
    return m


def _records(store: MessageStore, topic: str = "T", queue_id: int = 0) -> list[memoryview]:
    got = store.get_messages(topic, queue_id, 0, 64)
    assert got.status is GetStatus.FOUND
    return got.buffers


@pytest.mark.parametrize("store_host", [("10.0.0.1", 10911), ("::1", 10911)])
def test_born_and_store_hosts_of_either_family(tmp_path: Path, clock: FakeClock,
                                               store_host: tuple[str, int]) -> None:
    store = _store(tmp_path / "s", clock, store_host)
    try:
        store_bit = 0x20 if ":" in store_host[0] else 0
        # One batch mixing the families, and a client's stray host bits on an IPv4 born host.
        batch = [_with_born(msg(uniq=f"U{i}"), born, flag) for i, (born, flag) in enumerate(
            [(BORN_V4, 0), (BORN_V6, 0x2), (BORN_V4, 0x30 | 0x1), (BORN_V6, 0x20)])]
        result = store.put_messages(batch)
        assert result.ok
        expect_flags = [store_bit, 0x2 | 0x10 | store_bit, 0x1 | store_bit, 0x10 | store_bit]
        assert [r.sys_flag for r in result.records] == expect_flags
        assert [m.sys_flag for m in batch] == expect_flags  # the messages were put right too
        assert [r.queue_offset for r in result.records] == [0, 1, 2, 3]
        views = _records(store)
        assert [len(v) for v in views] == [r.size for r in result.records]
        for view, m, req in zip(views, batch, result.records, strict=True):
            rec, size = decode_record(view, check_crc=True)
            assert size == len(view) and rec.sys_flag == req.sys_flag
            assert pack_host(*rec.born_host) == m.born_host and rec.store_host == store_host
            assert (rec.queue_offset, rec.physical_offset, rec.body, rec.uniq_key) == (
                req.queue_offset, req.phy_offset, m.body, m.properties["UNIQ_KEY"])
            # byte for byte what the codec makes of the same fields
            assert bytes(view) == encode_parts(
                topic=b"T", body=m.body, properties=_props(view), queue_offset=rec.queue_offset,
                physical_offset=rec.physical_offset,
                sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp, born_host=m.born_host,
                store_timestamp=rec.store_timestamp, store_host=pack_host(*store_host))
            assert record_is_valid(view, True)
            again = dispatch_request_from_record(req.phy_offset, view)
            assert again is not None
            assert (again.queue_offset, again.sys_flag, again.store_timestamp, again.size, again.uniq_key) == (
                req.queue_offset, req.sys_flag, req.store_timestamp, req.size, req.uniq_key)
            assert store.commitlog.store_time_at(req.phy_offset, req.size) == req.store_timestamp
    finally:
        store.shutdown()


def _props(view: memoryview) -> bytes:
    rec, _ = decode_record(view)
    return "".join(f"{k}\x01{v}\x02" for k, v in rec.properties.items()).encode()


def test_a_born_host_of_another_width_is_refused(tmp_path: Path, clock: FakeClock) -> None:
    store = _store(tmp_path / "s", clock, ("127.0.0.1", 10911))
    try:
        result = store.put_messages([msg(), _with_born(msg(), b"\x01" * 16)])
        assert result.status is PutStatus.MESSAGE_ILLEGAL and "born host" in result.remark
    finally:
        store.shutdown()


@pytest.mark.parametrize("store_host", [("10.0.0.1", 10911), ("::1", 10911)])
def test_prepared_records_get_the_store_host_where_their_layout_has_it(
        tmp_path: Path, clock: FakeClock, store_host: tuple[str, int]) -> None:
    """The timer's read-ahead encodes records early; an IPv6 born host is left to the append instead."""
    store = _store(tmp_path / "s", clock, store_host)
    try:
        log = store.commitlog
        v4, v6 = _with_born(msg(uniq="A"), BORN_V4, 0x30), _with_born(msg(uniq="B"), BORN_V6)
        assert log.prepare(v4) and v4.encoded is not None
        assert not log.prepare(v6) and v6.encoded is None
        result = store.put_messages([v4, v6])
        assert result.ok
        for view, born in zip(_records(store), (BORN_V4, BORN_V6), strict=True):
            rec, _ = decode_record(view, check_crc=True)
            assert rec.store_host == store_host and pack_host(*rec.born_host) == born
            assert rec.store_timestamp == clock() and rec.sys_flag & 0x30 == (
                (0x10 if born is BORN_V6 else 0) | (0x20 if ":" in store_host[0] else 0))
    finally:
        store.shutdown()


def test_recovery_reads_records_with_ipv6_hosts(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    store = _store(path, clock, ("::1", 10911))
    assert store.put_messages([_with_born(msg(uniq=f"U{i}"), BORN_V6 if i % 2 else BORN_V4)
                               for i in range(20)]).ok
    end = store.commitlog.max_offset
    store.shutdown()
    again = _store(path, clock, ("::1", 10911))
    try:
        scan = again.commitlog.recover_end(0)
        assert (scan.end_offset, scan.records, scan.corrupt_at) == (end, 20, None)
        assert [decode_record(v)[0].uniq_key for v in _records(again)] == [f"U{i}" for i in range(20)]
    finally:
        again.shutdown()


def test_store_host_must_be_an_ipv4_or_ipv6_host(tmp_path: Path, clock: FakeClock) -> None:
    store = _store(tmp_path / "s", clock, ("127.0.0.1", 10911))
    try:
        with pytest.raises(ValueError):
            store.commitlog.store_host = b"\x00" * 16
        store.commitlog.store_host = pack_host("::1", 9)  # as the broker sets it once it knows its port
        assert store.put_messages([msg()]).ok
        rec, _ = decode_record(_records(store)[0])
        assert rec.store_host == ("::1", 9) and rec.sys_flag == 0x20
    finally:
        store.shutdown()
