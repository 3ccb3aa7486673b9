"""Damaged store files found by the file fuzzer ([15], docs/reliability.md "## Fuzzing"): a damaged store is never
served silently: it starts consistent (every record served intact, offsets contiguous) or refuses, naming the file."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from cometmq.store.config import CQ_UNIT_SIZE
from cometmq.store.epoch_file import EpochFileCorrupt
from cometmq.store.mapped_file import StoreFileCorrupt
from cometmq.store.message_store import MessageStore
from cometmq.store.status import GetStatus
from tests.kit import FakeClock

from .conftest import msg, small_config
from .test_recovery import read_all, reopen


def _fill(path: Path, clock: FakeClock, n: int = 60, queues: int = 2,
          **changes: object) -> tuple[list[bytes], list[int]]:
    store = reopen(path, clock, **changes)
    bodies = [f"body-{i}-".encode() * 10 for i in range(n)]
    phys = [store.put_message(msg(body=b, queue_id=i % queues)).records[0].phy_offset for i, b in enumerate(bodies)]
    store.shutdown()  # a clean stop: the checkpoint holds the exact end
    return bodies, phys


def _segment(path: Path) -> Path:
    return sorted((path / "commitlog").iterdir())[0]


# -- bug 3: bytes appended to a segment ------------------------------------------------------------------------------
def test_bytes_appended_to_a_segment_are_cut_not_the_whole_log(tmp_path: Path, clock: FakeClock,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    bodies, _ = _fill(path, clock)
    seg = _segment(path)
    with open(seg, "ab") as f:
        f.write(b"\x5a" * 241)
    with caplog.at_level(logging.WARNING):
        store = reopen(path, clock)
    try:
        assert seg.name in caplog.text and "cutting them off" in caplog.text
        assert read_all(store, "T", 0) == bodies[0::2]
        assert read_all(store, "T", 1) == bodies[1::2]
        assert store.put_message(msg(body=b"next", queue_id=0)).records[0].queue_offset == 30
    finally:
        store.shutdown()


def test_an_unfit_first_segment_refuses_the_start(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    _fill(path, clock)
    seg = _segment(path)
    seg.rename(seg.with_name(f"{1:020d}"))  # not on a segment boundary
    store = MessageStore(small_config(path), clock=clock)
    with pytest.raises(StoreFileCorrupt, match=f"{1:020d}") as info:
        store.start()
    assert isinstance(info.value, EpochFileCorrupt)  # what `cometmq serve` answers "cannot start: ..." to
    assert (path / "commitlog" / f"{1:020d}").exists()  # nothing set aside


# -- bug 1: a damaged log after a clean stop -----------------------------------------------------------------------
def test_flipped_body_bits_after_a_clean_stop_cut_the_log(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    bodies, phys = _fill(path, clock)
    with open(_segment(path), "r+b") as f:
        f.seek(phys[31] + 100)
        f.write(b"\xff\xfe")
    store = reopen(path, clock)
    try:
        assert store.commitlog.max_offset == phys[31]
        assert read_all(store, "T", 0) == bodies[0:31:2]
        assert read_all(store, "T", 1) == bodies[1:31:2]
        assert store.put_message(msg(body=b"next", queue_id=1)).records[0].queue_offset == 15
    finally:
        store.shutdown()


def test_zeroed_range_after_a_clean_stop_cuts_the_log(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    bodies, phys = _fill(path, clock)
    with open(_segment(path), "r+b") as f:
        f.seek(phys[20] + 3)
        f.write(bytes(500))
    store = reopen(path, clock)
    try:
        assert store.commitlog.max_offset == phys[20]
        assert read_all(store, "T", 0) == bodies[0:20:2]
    finally:
        store.shutdown()


def test_segment_cut_short_after_a_clean_stop(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "s"
    bodies, phys = _fill(path, clock)
    with open(_segment(path), "r+b") as f:
        f.truncate(phys[40] + 17)
    store = reopen(path, clock)
    try:
        assert store.commitlog.max_offset == phys[40]
        assert read_all(store, "T", 0) == bodies[0:40:2]
        assert read_all(store, "T", 1) == bodies[1:40:2]
    finally:
        store.shutdown()


# -- bug 2: damaged consume-queue units ------------------------------------------------------------------------------
def _cq_file(path: Path, queue_id: int = 0) -> Path:
    return sorted((path / "consumequeue" / "T" / str(queue_id)).iterdir())[0]


@pytest.mark.parametrize("field", ["phy", "size", "zero"])
def test_damaged_consume_queue_unit_is_rebuilt_from_the_log(tmp_path: Path, clock: FakeClock, field: str) -> None:
    path = tmp_path / "s"
    bodies, _ = _fill(path, clock)
    with open(_cq_file(path), "r+b") as f:
        pos = 11 * CQ_UNIT_SIZE
        f.seek(pos)
        unit = bytearray(f.read(CQ_UNIT_SIZE))
        if field == "phy":
            unit[5] ^= 0x10
        elif field == "size":
            unit[10] ^= 0x01
        else:
            unit[:] = bytes(CQ_UNIT_SIZE)
        f.seek(pos)
        f.write(unit)
    store = reopen(path, clock)
    try:
        assert read_all(store, "T", 0) == bodies[0::2]
        assert read_all(store, "T", 1) == bodies[1::2]
        assert store.put_message(msg(body=b"next", queue_id=0)).records[0].queue_offset == 30
    finally:
        store.shutdown()


@pytest.mark.parametrize("coalesce", [False, True])
def test_a_unit_that_does_not_match_its_record_is_stepped_over(tmp_path: Path, clock: FakeClock, coalesce: bool,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    _, phys = _fill(path, clock, queues=1)
    store = reopen(path, clock)
    try:
        records = [bytes(store.commitlog.record_at(p) or b"") for p in phys]
        cq = store.queues[("T", 0)]
        mf = cq.files.files[0]
        # damage while running (recovery had no chance): unit 7 points 4 bytes into its record
        phy, size, tags = struct.unpack_from(">qiq", mf.mm, 7 * CQ_UNIT_SIZE)
        struct.pack_into(">qiq", mf.mm, 7 * CQ_UNIT_SIZE, phy + 4, size, tags)
        with caplog.at_level(logging.ERROR, logger="cometmq.store.bad_units"):
            r = store.get_messages("T", 0, 0, 32, coalesce=coalesce)
            assert r.status is GetStatus.FOUND
            # never the bytes unit 7 names; the true record 7 only where a coalesced run reads the records around it
            # back to back (pure-Python run finder), each record's head checked against its unit
            assert list(r.queue_offsets) in ([*range(7), *range(8, 33)], list(range(32)))
            assert b"".join(r.buffers) == b"".join(records[o] for o in r.queue_offsets)
            # a read from the bad unit goes on after it (it answered "nothing" at the same offset: a spin)
            r = store.get_messages("T", 0, 7, 32, coalesce=coalesce)
            assert r.status is GetStatus.FOUND and list(r.queue_offsets) == list(range(8, 40))
            assert b"".join(r.buffers) == b"".join(records[8:40])
        assert store.bad_units.unreadable == 1
        assert caplog.text.count("offset 7: the record at") == 1  # logged once
    finally:
        store.shutdown()


@pytest.mark.parametrize("damage", ["into_a_record", "past_the_log", "past_the_end", "record_size", "unit_size"])
def test_damage_recovery_does_not_check_is_stepped_over_after_a_restart(tmp_path: Path, clock: FakeClock,
                                                                        damage: str) -> None:
    """Recovery checks the last consume-queue file against the last segments only: damage before that stays after
    a restart, and every read of the queue met it (a consumer pulled the same offset for ever)."""
    path = tmp_path / "s"
    changes: dict[str, object] = {"consume_queue_units_per_file": 16, "commitlog_segment_size": 4096,
                                  "recover_check_segments": 1}
    bodies, phys = _fill(path, clock, queues=1, **changes)
    log_end = 2 * phys[-1] - phys[-2] + 8  # (just past the last record)
    with open(_cq_file(path), "r+b") as f:  # the first of four files
        f.seek(5 * CQ_UNIT_SIZE)
        phy, size, tags = struct.unpack(">qiq", f.read(CQ_UNIT_SIZE))
        unit = {"into_a_record": (phy + 4, size), "past_the_log": (10**12, size),
                "past_the_end": (log_end, size), "unit_size": (phy, size + 9)}.get(damage, (phy, size))
        f.seek(5 * CQ_UNIT_SIZE)
        f.write(struct.pack(">qiq", *unit, tags))
    if damage == "record_size":
        segment = sorted((path / "commitlog").iterdir())[0]
        with open(segment, "r+b") as f:
            f.seek(phys[5] - int(segment.name))
            f.write(struct.pack(">i", size - 9))
    store = reopen(path, clock, **changes)
    try:
        assert len(store.commitlog.files.files) > 2 and len(store.queues[("T", 0)].files.files) == 4
        if damage == "unit_size":  # the record is whole, of that queue and offset: served by its own size
            assert read_all(store) == bodies
            assert (store.bad_units.unreadable, store.bad_units.salvaged) == (0, 1)
        else:
            assert read_all(store) == bodies[:5] + bodies[6:]
            assert (store.bad_units.unreadable, store.bad_units.salvaged) == (1, 0)
        assert store.put_message(msg(body=b"next", queue_id=0)).records[0].queue_offset == 60
    finally:
        store.shutdown()


@pytest.mark.parametrize("helper", ["c", "python"])
def test_a_record_damaged_inside_a_run_is_never_served(tmp_path: Path, clock: FakeClock, helper: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A coalesced read checked the first and last record of each run only: a record damaged inside one (its total
    size, where recovery does not look) went out in the answer, which the consumer could not decode; it pulled the
    same offset again for ever."""
    import cometmq.store.message_store as ms

    if helper == "python":
        monkeypatch.setattr(ms, "_C_HEADS", None, raising=False)
    elif ms._C_HELPER is None:
        pytest.skip("the C helpers are not built")
    path = tmp_path / "s"
    _, phys = _fill(path, clock, queues=1)
    store = reopen(path, clock)
    try:
        records = [bytes(store.commitlog.record_at(p) or b"") for p in phys]
        mf = store.commitlog.files.files[0]
        struct.pack_into(">i", mf.mm, phys[10], len(records[10]) - 9)  # record 10's TOTALSIZE
        r = store.get_messages("T", 0, 0, 32, coalesce=True)
        assert r.status is GetStatus.FOUND
        assert list(r.queue_offsets) == [*range(10), *range(11, 33)]
        assert b"".join(r.buffers) == b"".join(records[:10] + records[11:33])
        assert store.bad_units.unreadable == 1
        r = store.get_messages("T", 0, 11, 32, coalesce=True)  # runs without it: one view, as before
        assert list(r.queue_offsets) == list(range(11, 43)) and len(r.buffers) == 1
    finally:
        store.shutdown()


# -- bug 4: the delay-level loop and a bad record ---------------------------------------------------------------------
def test_delay_level_skips_unreadable_records_and_keeps_delivering(tmp_path: Path, clock: FakeClock) -> None:
    import asyncio

    from cometmq.broker.schedule import ScheduleMessageService
    from cometmq.broker.topics import SCHEDULE_TOPIC
    from cometmq.protocol.properties import DELAY, REAL_QID, REAL_TOPIC
    from cometmq.protocol.record_layout import LAYOUT_V4
    from cometmq.store.status import PutResult, PutStatus

    store = reopen(tmp_path / "s", clock)
    delivered: list[bytes] = []

    class Appender:
        async def put(self, msgs: list[object]) -> PutResult:
            delivered.extend(m.body for m in msgs)  # type: ignore[attr-defined]
            return PutResult(PutStatus.PUT_OK)

    phys = [store.put_message(msg(SCHEDULE_TOPIC, body=f"d{i}".encode(), queue_id=0,
                                  **{DELAY: "1", REAL_TOPIC: "T", REAL_QID: "0"})).records[0].phy_offset
            for i in range(5)]
    mf = store.commitlog.files.files[0]
    mf.mm[phys[1] + 4 : phys[1] + 8] = b"\x00\x00\x00\x00"  # bad magic: the store will not serve it
    struct.pack_into(">i", mf.mm, phys[3] + LAYOUT_V4.body_pos - 4, 1 << 20)  # body length past the record
    service = ScheduleMessageService(store, Appender(), (0,), tmp_path / "delay.json", clock)  # type: ignore[arg-type]

    async def run() -> None:
        await service.start()
        for _ in range(100):
            if len(delivered) >= 3:
                break
            await asyncio.sleep(0.01)
        await service.stop()

    try:
        asyncio.run(run())
        assert delivered == [b"d0", b"d2", b"d4"]
        assert service.offsets[1] == 5
    finally:
        store.shutdown()


def test_a_record_header_naming_another_queue_offset_ends_the_log_there(tmp_path: Path, clock: FakeClock) -> None:
    from cometmq.protocol.record_layout import QUEUE_OFFSET_POS

    path = tmp_path / "s"
    bodies, phys = _fill(path, clock)
    with open(_segment(path), "r+b") as f:  # not covered by the body CRC
        f.seek(phys[25] + QUEUE_OFFSET_POS + 7)
        f.write(b"\x41")
    store = reopen(path, clock)
    try:
        assert store.commitlog.max_offset == phys[25]
        assert read_all(store, "T", 0) == bodies[0:25:2]
        assert read_all(store, "T", 1) == bodies[1:25:2]
        assert store.put_message(msg(body=b"next", queue_id=1)).records[0].queue_offset == 12
    finally:
        store.shutdown()


def test_a_record_header_naming_another_queue_ends_the_log_there(tmp_path: Path, clock: FakeClock) -> None:
    from cometmq.protocol.record_layout import QUEUE_ID_POS

    path = tmp_path / "s"
    bodies, phys = _fill(path, clock)
    with open(_segment(path), "r+b") as f:  # seed 1001: a flip in QUEUEID, which the body CRC does not cover
        f.seek(phys[25] + QUEUE_ID_POS)
        f.write(b"\x08")
    store = reopen(path, clock)
    try:
        assert store.commitlog.max_offset == phys[25]
        assert read_all(store, "T", 1) == bodies[1:25:2]
        assert ("T", 1 | 0x08000000) not in store.queues
    finally:
        store.shutdown()
