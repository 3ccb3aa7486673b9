"""The pure POP state and its log records, with a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cometmq.broker.pop import log as poplog
from cometmq.broker.pop.state import QueueState
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.pop import BatchAck, ExtraInfo, decode_batch_ack_body, encode_batch_ack_body, parse_offset_info


def test_deliver_ack_and_committed_offset() -> None:
    qs = QueueState(committed=10, cursor=10)
    for off in range(10, 15):
        qs.deliver(off, pop_time=1000, invisible_ms=500, attempts=0, ck_offset=10)
    assert qs.cursor == 15 and qs.committed == 10
    assert qs.done(12, 1000) and qs.committed == 10  # a hole above the lowest does not move it
    assert qs.done(10, 1000) and qs.committed == 11
    assert not qs.done(11, 999)  # a stale pop time changes nothing
    assert qs.done(11, 1000) and qs.committed == 13
    assert qs.done(13, 1000) and qs.done(14, 1000)
    assert qs.committed == 15 and not qs.inflight


def test_expiry_due_and_redelivery_supersedes() -> None:
    qs = QueueState(committed=0, cursor=0)
    qs.deliver(0, 1000, 500, 0, 0)
    qs.deliver(1, 1000, 800, 0, 0)
    assert qs.next_expiry() == 1500
    assert qs.due(1499) == [] and qs.due(1500) == [0]
    qs.deliver(0, 1600, 500, 1, 0)  # delivered again: the old expiry no longer counts
    assert qs.next_expiry() == 1800
    assert qs.due(1900) == [1]
    assert qs.inflight[0].attempts == 1


def test_blocked_for_ordered_queues() -> None:
    qs = QueueState(committed=0, cursor=0)
    assert not qs.blocked(0)
    qs.deliver(0, 100, 50, 0, 0)
    assert qs.blocked(120) and not qs.blocked(150)


def test_filtered_offsets_advance_the_cursor_and_committed() -> None:
    qs = QueueState(committed=0, cursor=0)
    qs.advance_cursor(7)
    assert qs.committed == 7
    qs.deliver(9, 1, 10, 0, 9)
    assert qs.committed == 9 and qs.cursor == 10


def test_log_records_round_trip_and_replay(tmp_path: Path) -> None:
    key = ("g", "T", 2)
    ck = poplog.encode_ck(key, 13, 5000, 3000, 10, [(10, 0), (12, 2)])
    ack = poplog.encode_done(poplog.KIND_ACK, key, 13, [(12, 5000)])
    rec = poplog.decode(ck)
    assert rec.kind == poplog.KIND_CK and rec.key == key and rec.cursor == 13
    assert rec.ck == (5000, 3000, 10) and rec.entries == ((10, 0), (12, 2))
    states: dict[poplog.QueueKey, QueueState] = {}
    poplog.apply(states, rec)
    poplog.apply(states, poplog.decode(ack))
    qs = states[key]
    assert set(qs.inflight) == {10} and qs.cursor == 13 and qs.committed == 10
    path = tmp_path / "pop.json"
    poplog.save_snapshot(path, 2, states)
    offset, loaded = poplog.load_snapshot(path)
    assert offset == 2
    assert loaded[key].inflight == qs.inflight and loaded[key].cursor == 13 and loaded[key].committed == 10


def test_a_forget_record_drops_the_topic_s_or_the_group_s_queues_only() -> None:
    states: dict[poplog.QueueKey, QueueState] = {}
    for key in [("g", "T", 0), ("g", "T", 1), ("h", "T", 0), ("g", "U", 0), ("h", "U", 0)]:
        poplog.apply(states, poplog.decode(poplog.encode_ck(key, 1, 5000, 3000, 0, [(0, 0)])))
    rec = poplog.decode(poplog.encode_forget("", "T"))
    assert rec.kind == poplog.KIND_FORGET and rec.key == ("", "T", -1) and rec.entries == ()
    poplog.apply(states, rec)
    assert set(states) == {("g", "U", 0), ("h", "U", 0)}
    poplog.apply(states, poplog.decode(poplog.encode_forget("g", "")))
    assert set(states) == {("h", "U", 0)}
    with pytest.raises(ValueError):
        poplog.encode_forget("", "")
    with pytest.raises(poplog.PopLogError):  # one naming nothing would drop everything
        poplog.decode(bytes([poplog.KIND_FORGET]) + b"\x00\x00\x00\x00" + bytes(16))


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_one_error(data: bytes) -> None:
    try:
        poplog.decode(data)
    except poplog.PopLogError:
        pass


def test_extra_info_and_batch_ack_codecs() -> None:
    e = ExtraInfo(5, 1700000000000, 30000, 0, "0", "broker-a", 3, 9)
    assert ExtraInfo.parse(str(e)) == e
    for bad in ("", "1 2 3", "a b c d e f g h", "1 2 3 4 0 b 5"):
        with pytest.raises(ProtocolError):
            ExtraInfo.parse(bad)
    acks = [BatchAck("g", "T", "0", 100, 1, 0, 5, 6, (100, 101, 164, 300))]
    name, back = decode_batch_ack_body(encode_batch_ack_body("broker-a", acks))
    assert name == "broker-a" and back == acks
    for body in (b"", b"{", b'{"acks": 3}', b'{"acks": [{"so": 1}]}', b'{"acks": [{"c":"g","t":"t","so":1,'
                                                                         b'"q":0,"pt":1,"it":1,"b":"!!"}]}'):
        with pytest.raises(ProtocolError):
            decode_batch_ack_body(body)
    assert parse_offset_info("0 1 5;0 2 7,8") == {("0", 1): [5], ("0", 2): [7, 8]}
    with pytest.raises(ProtocolError):
        parse_offset_info("0 1 5;0 1 6")


@given(st.lists(st.tuples(st.sampled_from(["pop", "extend", "ack"]), st.integers(0, 1000), st.integers(1, 5000)),
                max_size=400))
def test_compacted_heaps_answer_as_a_full_scan_does(ops: list[tuple[str, int, int]]) -> None:
    """Pops, extensions and acks in any order: the committed offset and the next expiries are what a scan of
    ``inflight`` gives, and the heaps hold at most twice what is in flight plus HEAP_SLACK (they kept every ack)."""
    from cometmq.broker.pop.state import HEAP_SLACK

    qs = QueueState(committed=0, cursor=0)
    for pop_time, (op, pick, invisible) in enumerate(ops, 1):
        held = sorted(qs.inflight)
        if op == "pop":
            qs.deliver(qs.cursor, pop_time, invisible, 0, qs.cursor)
        elif held and op == "extend":
            qs.deliver(held[pick % len(held)], pop_time, invisible, 0, 0)
        elif held:
            offset = held[pick % len(held)]
            assert qs.done(offset, qs.inflight[offset].pop_time)
        assert qs.committed == min(qs.inflight, default=qs.cursor)
        assert qs.next_expiry() == min((d.visible_at for d in qs.inflight.values()), default=None)
        assert qs.next_expiry_after(pop_time) == min(
            (d.visible_at for d in qs.inflight.values() if d.visible_at > pop_time), default=None)
        assert qs.tracked() <= 2 * (2 * len(qs.inflight) + HEAP_SLACK + 1)
