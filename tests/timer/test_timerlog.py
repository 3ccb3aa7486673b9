"""TimerLog segments: append, read, slot chains, CRC checks, recovery of the end, segment deletion."""

from __future__ import annotations

from pathlib import Path

from cometmq.timer.timerlog import (
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    UNIT_SIZE,
    TimerLog,
    decode_entry,
    encode_entry,
    entry_file_size,
)

SEG = UNIT_SIZE * 16


def open_log(path: Path) -> TimerLog:
    tl = TimerLog(path / "timerlog", SEG, preallocate=False)
    tl.load()
    tl.set_end(0)
    return tl


def test_entry_round_trip_and_crc() -> None:
    data = encode_entry(-1, MAGIC_DEFAULT | MAGIC_ROLL, 123456, 99, 4096, 300, 7)
    assert len(data) == UNIT_SIZE == 56
    e = decode_entry(data, 0, 560)
    assert e is not None
    assert (e.pos, e.prev_pos, e.due_ms, e.slot, e.offset_py, e.size_py, e.queue_offset) == \
        (560, -1, 123456, 99, 4096, 300, 7)
    assert e.is_roll and not e.is_delete
    bad = bytearray(data)
    bad[20] ^= 1
    assert decode_entry(bad, 0, 0) is None
    assert decode_entry(bytes(UNIT_SIZE), 0, 0) is None
    assert decode_entry(data[:-1], 0, 0) is None


def test_file_size_is_whole_entries() -> None:
    assert entry_file_size(100 * 1024 * 1024) % UNIT_SIZE == 0
    assert entry_file_size(10) == UNIT_SIZE * 16


def test_append_chain_and_segments(tmp_path: Path) -> None:
    tl = open_log(tmp_path)
    prev = -1
    positions = []
    for i in range(40):  # 2.5 segments
        magic = MAGIC_DEFAULT | (MAGIC_DELETE if i == 39 else 0)
        pos = tl.append(prev, magic, 1000 + i, 5, i * 100, 100, i)
        positions.append(pos)
        prev = pos
    assert positions == [i * UNIT_SIZE for i in range(40)]
    assert len(tl.segment_starts()) == 3 and tl.write_pos == 40 * UNIT_SIZE
    chain = list(tl.chain(prev))
    assert [e.queue_offset for e in chain] == list(range(39, -1, -1))
    assert chain[0].is_delete
    # a stop position ends the walk (entries linked after a read-ahead began)
    assert [e.queue_offset for e in tl.chain(prev, stop=positions[35])] == [39, 38, 37, 36]
    assert [e.queue_offset for e in tl.chain(prev, limit=3)] == [39, 38, 37]
    assert tl.read(tl.write_pos) is None


def test_recover_end_stops_at_a_torn_entry(tmp_path: Path) -> None:
    tl = open_log(tmp_path)
    for i in range(20):
        tl.append(-1, MAGIC_DEFAULT, i, i, i, 1, i)
    tl.flush()
    mf = tl.files.find(18 * UNIT_SIZE)
    assert mf is not None
    local = 18 * UNIT_SIZE - mf.file_from_offset
    mf.mm[local + 10] ^= 0xFF  # entry 18 torn
    tl.close()
    tl2 = TimerLog(tmp_path / "timerlog", SEG, preallocate=False)
    tl2.load()
    end, entries = tl2.recover_end(5 * UNIT_SIZE)
    assert end == 18 * UNIT_SIZE and [e.queue_offset for e in entries] == list(range(5, 18))
    tl2.set_end(end)
    assert tl2.write_pos == end
    assert list(tl2.scan(0))[-1].queue_offset == 17  # the tail past the end is zeroed
    assert tl2.append(-1, MAGIC_DEFAULT, 0, 0, 0, 1, 99) == end


def test_delete_leading_segments(tmp_path: Path) -> None:
    tl = open_log(tmp_path)
    for i in range(40):
        tl.append(-1, MAGIC_DEFAULT, i, i, i, 1, i)
    starts = tl.segment_starts()
    assert tl.delete_segments({starts[0], starts[2]}) == 1  # only leading ones, never the last
    assert tl.segment_starts() == starts[1:]
    assert tl.min_pos == SEG
    assert tl.read(0) is None and tl.read(SEG) is not None
    assert list(tl.chain(SEG + UNIT_SIZE)) and [e.pos for e in tl.chain(SEG + UNIT_SIZE)] == [SEG + UNIT_SIZE]
