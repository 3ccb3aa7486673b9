"""The wheel as a pure structure: slot arithmetic, placement (past, window edge, roll, 40 days with an
injected clock), delete-marker counts, occupied-slot search and encode/decode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.timer.wheel import (
    HEADER_SIZE,
    SLOT_SIZE,
    Slot,
    TimerWheel,
    WheelFormatError,
    new_wheel_bytes,
    read_header,
    wheel_size,
)

P = 100
N = 1000
ROLL = 900
NOW = 1_790_000_000_000  # an injected "now" in ms
DAY = 86_400_000


def test_slot_arithmetic() -> None:
    w = TimerWheel(N, P)
    assert w.slot_of(NOW) == NOW // P
    assert w.slot_of(NOW + 99) == w.slot_of(NOW)
    assert w.slot_of(NOW + 100) == w.slot_of(NOW) + 1
    assert w.slot_start(w.slot_of(NOW + 150)) == NOW + 100


def test_link_head_get_and_delete_counts() -> None:
    w = TimerWheel(N, P)
    s = w.slot_of(NOW)
    assert w.get(s) == Slot(s) and w.get(s).empty and w.head(s) == -1
    w.link(s, 0)
    w.link(s, 56)
    w.link(s, 112, delete=True)
    rec = w.get(s)
    assert (rec.first_pos, rec.last_pos, rec.num, rec.num_delete) == (0, 112, 2, 1)
    assert w.head(s) == 112
    assert w.occupied[s % N] == 1
    w.mark_done(s)
    assert w.occupied[s % N] == 0
    assert w.get(s).num == 2  # the record stays (a crash may replay the slot)


def test_another_turn_of_the_wheel_reads_empty() -> None:
    w = TimerWheel(N, P)
    s = w.slot_of(NOW)
    w.link(s, 560)
    assert w.get(s + N).empty and w.head(s + N) == -1
    w.link(s + N, 1120)  # the record is reused by the next turn
    assert w.get(s).empty
    rec = w.get(s + N)
    assert (rec.first_pos, rec.last_pos, rec.num) == (1120, 1120, 1)


def test_position_zero_is_a_real_entry() -> None:
    w = TimerWheel(N, P)
    w.link(5, 0)
    assert w.head(5) == 0 and not w.get(5).empty


@pytest.mark.parametrize(("due", "read", "open_", "expected"), [
    # due in its own slot, within the window
    (NOW + 1000, NOW // P, None, (NOW // P + 10, False, False)),
    # already past: the first slot not yet taken, delivered at once
    (NOW - 5000, NOW // P, None, (NOW // P, False, True)),
    # due in (or before) the slot being delivered: that slot
    (NOW + 50, NOW // P + 1, NOW // P, (NOW // P, False, True)),
    # last slot inside the window: no roll
    (NOW + (ROLL - 1) * P, NOW // P, None, (NOW // P + ROLL - 1, False, False)),
])
def test_place(due: int, read: int, open_: int | None, expected: tuple[int, bool, bool]) -> None:
    assert tuple(TimerWheel(N, P).place(due, read, ROLL, open_)) == expected


def test_place_rolls_at_the_window_edge() -> None:
    w = TimerWheel(N, P)
    read = NOW // P
    p = w.place(NOW + ROLL * P, read, ROLL)
    assert p.roll and read <= p.slot < read + ROLL
    # A hop that would land just short of the due time goes half a window instead.
    assert p.slot == read + ROLL // 2
    far = w.place(NOW + 10 * ROLL * P, read, ROLL)
    assert far.roll and far.slot == read + ROLL - 1


def test_forty_days_roll_to_the_exact_slot() -> None:
    """A 40-day delay on a one-day window (100 ms slots) reaches its own slot by rolling."""
    roll = DAY // P
    w = TimerWheel(roll + roll // 16 + 16, P)
    due = NOW + 40 * DAY + 1234
    read = w.slot_of(NOW)
    hops = 0
    while True:
        p = w.place(due, read, roll)
        assert read <= p.slot < read + roll
        if not p.roll:
            break
        hops += 1
        read = p.slot + 1  # the dequeue reaches the roll slot and puts the message back
    assert p.slot == w.slot_of(due) and not p.late
    assert 39 <= hops <= 41
    # the last placement happens well ahead of the due time (at least a quarter window)
    assert w.slot_of(due) - read >= roll // 4


@given(due_off=st.integers(-10 * DAY, 60 * DAY), read_off=st.integers(-100, 100),
       open_off=st.one_of(st.none(), st.integers(-5, 0)))
def test_place_invariants(due_off: int, read_off: int, open_off: int | None) -> None:
    w = TimerWheel(N, P)
    read = NOW // P + read_off
    open_slot = None if open_off is None else read - 1 + open_off
    if open_slot is not None:
        read = open_slot + 1
    due = NOW + due_off
    p = w.place(due, read, ROLL, open_slot)
    due_slot = due // P
    if open_slot is not None and due_slot <= open_slot:
        assert p.slot == open_slot and p.late
        return
    assert read <= p.slot < read + ROLL  # never two turns of the wheel in one record
    if p.roll:
        assert due_slot - read >= ROLL and p.slot < due_slot
    elif p.late:
        assert due_slot < read and p.slot == read
    else:
        assert p.slot == due_slot


def test_next_occupied_with_wrap_around() -> None:
    w = TimerWheel(N, P)
    base = 10 * N + 990  # index 990
    w.link(base + 5, 56)  # index 995
    w.link(base + 20, 112)  # index 10 after the wrap
    assert w.next_occupied(base, base + N) == base + 5
    assert w.next_occupied(base + 6, base + N) == base + 20
    assert w.next_occupied(base + 6, base + 20) is None
    assert w.next_occupied(base + 21, base + 21 + N) == base + 5 + N  # the same index, next turn
    assert w.next_occupied(base, base) is None


def test_rebuild_counts_pending_slots_only() -> None:
    w = TimerWheel(N, P)
    read = NOW // P
    w.link(read - 3, 0)  # already delivered
    w.link(read, 56)
    w.link(read + 7, 112)
    w.link(read + 7, 168, delete=True)
    w.occupied[:] = bytes(N)
    assert w.rebuild(read) == (2, 1)
    assert w.next_occupied(read, read + N) == read
    assert w.occupied[(read - 3) % N] == 0
    assert w.pointing_past(read, 112) == [read + 7]
    assert w.pointing_past(read, 1000) == []


def test_encode_decode_round_trip() -> None:
    w = TimerWheel(N, P)
    for i in range(50):
        w.link(NOW // P + i * 3, i * 56, delete=i % 7 == 0)
    data = w.encode()
    assert len(data) == wheel_size(N) == HEADER_SIZE + N * SLOT_SIZE
    w2 = TimerWheel.decode(data)
    assert (w2.slots, w2.precision_ms) == (N, P)
    for i in range(50):
        assert w2.get(NOW // P + i * 3) == w.get(NOW // P + i * 3)
    assert w2.encode() == data
    assert read_header(data) == (N, P)


def test_decode_rejects_other_shapes_and_garbage() -> None:
    data = TimerWheel(N, P).encode()
    with pytest.raises(WheelFormatError):
        TimerWheel(N, 1000, bytearray(data))
    with pytest.raises(WheelFormatError):
        TimerWheel.decode(b"XXXX" + data[4:])
    with pytest.raises(WheelFormatError):
        TimerWheel.decode(bytes(wheel_size(N)))  # no header
    with pytest.raises(WheelFormatError):
        TimerWheel(N, P, bytearray(10))


def test_an_all_zero_buffer_is_an_empty_wheel() -> None:
    buf = bytearray(wheel_size(N))
    w = TimerWheel(N, P, buf)
    assert read_header(buf) == (N, P)
    assert w.rebuild(0) == (0, 0)
    assert new_wheel_bytes(N, P) == buf


def test_reset_forgets_everything() -> None:
    w = TimerWheel(N, P)
    w.link(NOW // P, 56)
    w.reset()
    assert w.get(NOW // P).empty and w.occupied.find(b"\x01") < 0


def test_the_occupied_map_holds_no_memory_until_marked_and_the_scan_finds_slots_at_chunk_edges() -> None:
    """``occupied`` is an anonymous private mapping (its pages take memory once marked, issue [16]); the start-up
    scan reads the records in chunks and finds used slots on both sides of every chunk edge."""
    from cometmq.timer import wheel as wheel_mod

    n = 3 * wheel_mod._SCAN_SLOTS + 5
    occ = wheel_mod.zeroed_map(n)
    assert len(occ) == n and occ.find(b"\x01") < 0
    occ[n - 1] = 1
    assert occ[n - 1] == 1 and occ.find(b"\x01") == n - 1
    w = TimerWheel(n, P)
    read = NOW // P
    edges = [0, wheel_mod._SCAN_SLOTS - 1, wheel_mod._SCAN_SLOTS, 2 * wheel_mod._SCAN_SLOTS + 1, n - 1]
    for k, offset in enumerate(edges):
        w.link(read + offset, 10 * k)
    image = w.encode()
    back = TimerWheel.decode(image)
    assert back.occupied.find(b"\x01") < 0  # derived: empty until rebuilt
    assert back.rebuild(read) == (len(edges), 0)
    found, slot = [], read
    while (nxt := back.next_occupied(slot, read + n)) is not None:
        found.append(nxt - read)
        slot = nxt + 1
    assert found == edges
