"""The pure parts of transactions: the pending table (time passed in) and the record builders."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.broker.transaction import messages as tm
from cometmq.broker.transaction.state import OutcomeMemory, PendingHalf, TransactionTable
from cometmq.protocol.message import MessageRecord, decode_record
from cometmq.protocol.properties import RawProperties, decode_properties, encode_properties
from cometmq.store.message import MessageInner


def half(origin: int, due: int, op_mark: int = 0) -> PendingHalf:
    return PendingHalf(origin, origin, origin * 100, "g", 0, due, op_mark)


def test_due_checks_come_out_in_time_order_and_stale_entries_are_skipped() -> None:
    t = TransactionTable()
    t.add(half(0, 500))
    t.add(half(1, 100))
    t.add(half(2, 300))
    assert t.next_due() == 100
    assert [h.origin for h in t.pop_due(99, 10)] == []
    assert [h.origin for h in t.pop_due(300, 10)] == [1, 2]
    t.resolve(0)  # resolved before its check: never comes out
    assert t.next_due() is None and t.pop_due(10_000, 10) == []
    h3 = half(3, 100)
    t.add(h3)
    t.schedule(h3, 900)  # rescheduled: the old heap item is stale
    assert t.pop_due(800, 10) == [] and t.next_due() == 900
    assert t.pop_due(900, 10) == [h3]


def test_a_transaction_put_back_after_a_failed_append_is_checked_once() -> None:
    t = TransactionTable()
    h = half(7, 100)
    t.add(h)
    assert t.resolve(7) is h
    t.add(h)  # what the END path does when its append fails: the transaction is pending again, same due time
    assert t.pop_due(100, 10) == [h]
    t.schedule(h, 200)  # the check ran and set the next one
    assert t.pop_due(150, 10) == [] and t.pop_due(200, 10) == [h]


def test_pop_due_honours_the_limit() -> None:
    t = TransactionTable()
    for i in range(5):
        t.add(half(i, 10))
    assert len(t.pop_due(10, 3)) == 3 and len(t.pop_due(10, 3)) == 2


def test_progress_follows_the_oldest_latest_record() -> None:
    t = TransactionTable()
    assert t.progress(7, 4) == (7, 4)  # nothing pending: the queues' ends
    t.add(half(2, 0, op_mark=1))
    t.add(half(5, 0, op_mark=3))
    assert t.progress(9, 6) == (2, 1)
    # A check re-appended transaction 2 at half offset 8 (op queue at 5 then): 5 is now the oldest record.
    t.record_appended(2, 8, 800, 1, 5)
    assert t.progress(9, 6) == (5, 3)
    t.record_appended(2, 6, 600, 9, 9)  # an older record never replaces a newer one
    assert t.get(2).latest_offset == 8  # type: ignore[union-attr]
    t.resolve(5)
    assert t.progress(9, 6) == (8, 5)


def test_record_builders_round_trip() -> None:
    msg = MessageInner(topic="Orders", body=b"b", queue_id=3,
                       properties={"UNIQ_KEY": "U", "KEYS": "k", "TRAN_MSG": "true", "x": "1",
                                   "TRANSACTION_CHECK_TIMES": "9"}, sys_flag=0x4 | 0x1)
    tm.to_half(msg, "pg")
    assert (msg.topic, msg.queue_id, msg.sys_flag) == (tm.HALF_TOPIC, 0, 0x1)
    assert msg.properties["REAL_TOPIC"] == "Orders" and msg.properties["REAL_QID"] == "3"
    assert msg.properties["PGROUP"] == "pg" and "TRANSACTION_CHECK_TIMES" not in msg.properties
    rec = MessageRecord(topic=tm.HALF_TOPIC, body=b"b", queue_offset=4, physical_offset=4000, sys_flag=0x1,
                        properties=msg.properties)
    assert tm.origin_of(rec.properties, 4) == 4
    copy = tm.copy_for_check(rec, 4, 2)
    assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "4" and tm.check_times_of(copy.properties) == 2
    assert tm.origin_of(copy.properties, 11) == 4
    final = tm.committed(rec, 4000)
    assert (final.topic, final.queue_id, final.sys_flag, final.prepared_transaction_offset) == ("Orders", 3, 0x9,
                                                                                                4000)
    assert set(final.properties) == {"UNIQ_KEY", "KEYS", "x", "PGROUP"}
    shown, _ = decode_record(tm.check_request_body(rec))
    assert (shown.topic, shown.queue_id, shown.queue_offset, shown.physical_offset) == ("Orders", 3, 4, 4000)
    assert tm.discarded(rec).topic == tm.CHECK_MAX_TOPIC


def test_a_renewed_half_keeps_its_due_time_and_a_producer_cannot_set_it() -> None:
    """A renewal (progress.py) copies the half with the store time its check counts from: the copy's due time is
    the original's (a renewal of a renewal too); a check's copy counts from its own store time again. A producer's
    TRAN_CHECK_FROM_MS is dropped from its half (both paths), and a discarded half goes without it."""
    props = {"UNIQ_KEY": "U", "TRAN_MSG": "true", "PGROUP": "g", "REAL_TOPIC": "T", "REAL_QID": "0",
             "CHECK_IMMUNITY_TIME_IN_SECONDS": "86400"}
    first = MessageRecord(topic=tm.HALF_TOPIC, body=b"b", queue_offset=4, physical_offset=400, store_timestamp=1000,
                          properties=props)
    day = 86_400_000
    assert tm.due_ms(first.properties, 1000, 6000, 500) == 1000 + day
    renewed = tm.renewed(first, 4)
    assert renewed.properties[tm.TRAN_CHECK_FROM_MS] == "1000" and tm.origin_of(renewed.properties, 50) == 4
    again = dataclasses.replace(first, properties=dict(renewed.properties), queue_offset=50, store_timestamp=70_000)
    assert tm.due_ms(again.properties, 70_000, 6000, 500) == 1000 + day
    twice = tm.renewed(again, 4)
    assert twice.properties[tm.TRAN_CHECK_FROM_MS] == "1000" and tm.check_times_of(twice.properties) == 0
    checked = tm.copy_for_check(again, 4, 1)
    assert tm.TRAN_CHECK_FROM_MS not in checked.properties
    assert tm.due_ms(checked.properties, day + 5000, 6000, 500) == day + 5500
    later = tm.renewed(dataclasses.replace(first, properties=dict(checked.properties), store_timestamp=day + 5000), 4)
    assert later.properties[tm.TRAN_CHECK_FROM_MS] == str(day + 5000) and tm.check_times_of(later.properties) == 1
    assert tm.TRAN_CHECK_FROM_MS not in tm.discarded(again).properties
    forged = {"UNIQ_KEY": "U", "TRAN_MSG": "true", "PGROUP": "g", tm.TRAN_CHECK_FROM_MS: "0"}
    msg = MessageInner(topic="T", body=b"b", queue_id=0, properties=dict(forged))
    tm.to_half(msg, "g")
    assert tm.TRAN_CHECK_FROM_MS not in msg.properties
    raw = encode_properties(forged)
    msg = MessageInner(topic="T", body=b"b", queue_id=0, properties=RawProperties(raw), properties_raw=raw)
    tm.to_half(msg, "g")
    assert tm.TRAN_CHECK_FROM_MS not in decode_properties(msg.properties_raw or encode_properties(msg.properties))


_op_offsets = st.one_of(
    st.lists(st.integers(-(2**70), 2**70), max_size=40),
    st.builds(lambda a, n: list(range(a, a + n)), st.integers(0, 2**63 - 1), st.integers(0, 300)),  # one range
    st.lists(st.integers(0, 2**63 - 1), max_size=40).map(sorted),  # ascending, perhaps with repeats
    st.lists(st.integers(0, 50), max_size=40).map(lambda xs: sorted(set(xs))),  # strictly increasing
)


@settings(max_examples=500, deadline=None)
@given(_op_offsets)
def test_op_body_is_the_references(offsets: list[int]) -> None:
    """The op body formatted at once (strictly increasing offsets taken as they are): the reference's bytes."""
    before = list(offsets)
    assert tm.op_body(offsets) == tm.op_body_reference(offsets)
    assert tm.op_record(offsets, 0).body == tm.op_body_reference(offsets)
    assert offsets == before  # (not sorted in place)


def test_op_bodies_and_immunity() -> None:
    op = tm.op_record([5, 3, 5], 0)
    assert op.body == b"3,5" and op.properties == {"TAGS": "d"} and op.topic == tm.OP_TOPIC
    assert tm.parse_op_body(b"3,5") == [3, 5]
    assert tm.parse_op_body(b"7") == [7]
    assert tm.parse_op_body(b"x,,-1, 8 ") == [8]
    assert tm.immunity_ms({}, 6000) == 6000
    assert tm.immunity_ms({"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"}, 6000) == 60_000
    assert tm.immunity_ms({"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"}, 6000) == 6000  # never shorter than the timeout
    assert tm.immunity_ms({"CHECK_IMMUNITY_TIME_IN_SECONDS": "soon"}, 6000) == 6000
    assert tm.check_times_of({"TRANSACTION_CHECK_TIMES": "-3"}) == 0


def test_stale_items_are_dropped_in_bulk_and_nothing_else_changes() -> None:
    """A batch of commits leaves a stale heap item per transaction: the heap is rebuilt from the pending ones
    instead of popping each, and the checks still come out in due order, rescheduled ones at their new time."""
    t = TransactionTable()
    halves = [half(i, 10_000 + (i * 7919) % 5000) for i in range(5000)]
    for h in halves:
        t.add(h)
    for h in halves[:4900]:
        t.resolve(h.origin)
    left = halves[4900:]
    for h in left[:10]:
        t.schedule(h, 20_000 + h.origin)  # two items each now, one stale
    assert len(t._heap) == 5010
    assert t.next_due() == min(h.next_check_ms for h in left)
    assert len(t._heap) == len(left)  # rebuilt: one item per pending transaction
    expected = sorted(left, key=lambda h: (h.next_check_ms, h.origin))
    assert t.pop_due(30_000, 1000) == expected
    assert t.next_due() is None and t.pop_due(10**9, 10) == []


_NAMES = st.sampled_from(["TRAN_MSG", "PGROUP", "UNIQ_KEY", "KEYS", "TAGS", "CHECK_IMMUNITY_TIME_IN_SECONDS",
                          "REAL_TOPIC", "REAL_QID", "TRANSACTION_CHECK_TIMES", "TRAN_PREPARED_QUEUE_OFFSET",
                          "TRANSFER", "REAL_x", "x", "ü"])
_VALUES = st.sampled_from(["true", "false", "", "pg", "60", "ünï", "a b"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8), st.integers(0, 7))
def test_a_half_from_encoded_properties_is_the_half_from_the_dict(pairs: list[tuple[str, str]], queue_id: int) -> None:
    """to_half's byte path (properties still encoded, as a half batch's items come) makes the half its dict path
    makes: the same properties (decoded; byte for byte when no name repeats), topic, queue, sys flag, and the same
    PGROUP and immunity for the transaction table. Pairs repeat names and hold the names it looks for."""
    raw = b"".join(f"{k}\x01{v}\x02".encode() for k, v in pairs)
    fast = MessageInner("T", b"b", queue_id, RawProperties(raw), raw, 0, 0x4, 0, b"\x7f\x00\x00\x01\x00\x00\x00\x01", 0)
    props = decode_properties(raw)
    slow = MessageInner("T", b"b", queue_id, dict(props), None, 0, 0x4, 0, b"\x7f\x00\x00\x01\x00\x00\x00\x01", 0)
    kept_fast, kept_slow = tm.to_half(fast, "grp"), tm.to_half(slow, "grp")
    assert kept_fast == kept_slow
    assert (fast.topic, fast.queue_id, fast.sys_flag) == (slow.topic, slow.queue_id, slow.sys_flag) == (
        tm.HALF_TOPIC, 0, 0)
    assert dict(fast.properties) == dict(slow.properties)
    if fast.properties_raw is not None and type(fast.properties) is RawProperties:  # the byte path was taken
        assert decode_properties(fast.properties_raw) == dict(slow.properties)
        if len({k for k, _ in pairs}) == len(pairs):
            assert fast.properties_raw == encode_properties(slow.properties)


_HARMLESS = st.sampled_from(["UNIQ_KEY", "KEYS", "TAGS", "CHECK_IMMUNITY_TIME_IN_SECONDS", "x", "ü"])


@st.composite
def half_items(draw: st.DrawFn) -> list[tuple[str, str]]:
    """An item's properties as a half batch's usually are (TRAN_MSG=true and a PGROUP somewhere among others), or
    now and then not."""
    pairs = draw(st.lists(st.tuples(_HARMLESS, _VALUES), max_size=4, unique_by=lambda p: p[0]))
    if not draw(st.integers(0, 4)):
        pairs.append(draw(st.tuples(_NAMES, _VALUES)))  # maybe one the helper declines
    if draw(st.integers(0, 9)):
        pairs.insert(draw(st.integers(0, len(pairs))), ("TRAN_MSG", "true"))
    if draw(st.integers(0, 9)):
        pairs.insert(draw(st.integers(0, len(pairs))), ("PGROUP", draw(st.sampled_from(["pg", "ü-group"]))))
    return pairs


@settings(max_examples=400, deadline=None)
@given(st.lists(half_items(), min_size=1, max_size=4), st.integers(0, 7), st.sampled_from(["T", "Tö", "x" * 127]))
def test_half_batches_made_halves_in_c_are_what_to_half_makes(batch: list[list[tuple[str, str]]], queue_id: int,
                                                              topic: str) -> None:
    """The C helper's to_halves takes a half batch only when each message is one it can turn, and then turns each
    into what to_half makes of it, byte for byte; when it declines, nothing changed."""
    def msgs() -> list[MessageInner]:
        out = []
        for pairs in batch:
            raw = b"".join(f"{k}\x01{v}\x02".encode() for k, v in pairs)
            out.append(MessageInner(topic, b"b", queue_id, RawProperties(raw), raw, 0, 0x4, 0,
                                    b"\x7f\x00\x00\x01\x00\x00\x00\x01", 0))
        return out

    c_msgs, py_msgs = msgs(), msgs()
    kept = tm.to_halves(c_msgs)
    if tm.C_TX is None:
        pytest.skip("the C helper is not built")
    if kept is None:
        assert [vars_of(m) for m in c_msgs] == [vars_of(m) for m in msgs()]
        return
    assert kept == [tm.to_half(m, "grp") for m in py_msgs]
    assert [vars_of(m) for m in c_msgs] == [vars_of(m) for m in py_msgs]
    assert all(type(m.properties) is RawProperties for m in c_msgs)


def vars_of(m: MessageInner) -> dict[str, object]:
    out = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    out["properties"] = dict(m.properties)
    return out


def test_to_halves_takes_a_half_batch_as_the_sdk_sends_it() -> None:
    raw = b"UNIQ_KEY\x01AB\x02TRAN_MSG\x01true\x02PGROUP\x01pg\x02CHECK_IMMUNITY_TIME_IN_SECONDS\x0160\x02"
    msgs = [MessageInner("T", b"b", 2, RawProperties(raw), raw, 0, 0x4, 0, b"\x7f\x00\x00\x01\x00\x00\x00\x01", 0)]
    if tm.C_TX is None:
        pytest.skip("the C helper is not built")
    assert tm.to_halves(msgs) == [("pg", "60")]
    assert msgs[0].properties_raw == raw + b"REAL_TOPIC\x01T\x02REAL_QID\x012\x02"
    assert (msgs[0].topic, msgs[0].queue_id, msgs[0].sys_flag) == (tm.HALF_TOPIC, 0, 0)


def _step_and_agree(op: str, a: int, b: int, table: TransactionTable, ref: TransactionTable) -> None:
    """The steps both table tests make alike (reschedule a pending half, or pop what is due and compare; any other
    op was applied by the caller), then the check after every step: the same next due time and pending halves."""
    if op == "schedule":
        for t in (table, ref):
            half = t.get(a)
            if half is not None:
                t.schedule(half, b)
    elif op == "pop":
        got = table.pop_due(a, b)
        assert [(h.origin, h.next_check_ms) for h in got] == [(h.origin, h.next_check_ms) for h in ref.pop_due(a, b)]
    assert table.next_due() == ref.next_due() and table.pending == ref.pending


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(1, 6), st.integers(0, 50)),
    st.tuples(st.just("resolve"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("schedule"), st.integers(0, 40), st.integers(0, 60)),
    st.tuples(st.just("pop"), st.integers(0, 60), st.integers(1, 5))), max_size=40))
def test_a_batch_added_at_once_is_checked_as_if_added_one_by_one(ops: list[tuple[str, int, int]]) -> None:
    """add_batch (a half batch's transactions, heap items appended when none of the heap's is larger) against
    add of each: the same transactions come due in the same order, whatever else happens between."""
    batched, single = TransactionTable(), TransactionTable()
    next_origin = 0
    for op, a, b in ops:
        if op == "batch":
            origins = list(range(next_origin, next_origin + a))
            next_origin += a
            batched.add_batch(origins, [o * 10 for o in origins], "g", b, 7)
            for o in origins:
                single.add(PendingHalf(o, o, o * 10, "g", 0, b, 7))
        elif op == "resolve":
            assert batched.resolve(a) == single.resolve(a)
        _step_and_agree(op, a, b, batched, single)


class _HeapOnly(TransactionTable):
    """The table as it was before the sorted fast path: stale items always popped one by one (the reference)."""

    @property  # type: ignore[override]
    def _sorted(self) -> bool:
        return False

    @_sorted.setter
    def _sorted(self, value: bool) -> None:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(1, 6), st.integers(0, 50)),
    st.tuples(st.just("add"), st.integers(0, 40), st.integers(0, 60)),
    st.tuples(st.just("resolve"), st.integers(0, 40), st.integers(1, 8)),
    st.tuples(st.just("schedule"), st.integers(0, 40), st.integers(0, 60)),
    st.tuples(st.just("pop"), st.integers(0, 60), st.integers(1, 5))), max_size=50))
def test_stale_items_dropped_from_a_sorted_heap_change_nothing(ops: list[tuple[str, int, int]]) -> None:
    """While every item came in no smaller than those before it (due times growing, the usual case) the table drops
    stale items at the front of its heap in one slice: the same checks come due, in the same order, as when each is
    popped off the heap; a half put back (``add`` again) or a due time out of order leaves that path."""
    fast, ref = TransactionTable(), _HeapOnly()
    next_origin = 0
    for op, a, b in ops:
        if op == "batch":
            origins = list(range(next_origin, next_origin + a))
            next_origin += a
            for table in (fast, ref):
                table.add_batch(origins, [o * 10 for o in origins], "g", b, 7)
        elif op == "add":  # a new transaction, or one put back after a failed append (maybe resolved meanwhile)
            origin = a if a < next_origin else next_origin
            next_origin = max(next_origin, origin + 1)
            for table in (fast, ref):
                table.add(PendingHalf(origin, origin, origin * 10, "g", 0, b, 7))
        elif op == "resolve":  # a run of them, as a batched commit resolves them
            for origin in range(a, a + b):
                assert fast.resolve(origin) == ref.resolve(origin)
        _step_and_agree(op, a, b, fast, ref)
    assert fast.pop_due(10**9, 10**6) == ref.pop_due(10**9, 10**6)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.lists(st.one_of(
    st.tuples(st.just("one"), st.integers(0, 30), st.sampled_from(["committed", "rolled back"])),
    st.tuples(st.just("all"), st.integers(0, 30), st.integers(1, 6)),
    st.tuples(st.just("forget"), st.integers(0, 30), st.just(""))), max_size=60))
def test_outcomes_of_at_least_the_last_n_are_remembered(size: int, ops: list[tuple[str, int, Any]]) -> None:
    """The outcome memory holds the outcomes of (at least) the last ``size`` origins remembered, and at most about
    twice as many: a claim forgotten after a failed append is gone, a later outcome of one origin replaces the
    earlier."""
    memory, ref = OutcomeMemory(size), collections.OrderedDict[int, str]()
    for op, origin, arg in ops:
        if op == "one":
            memory.remember(origin, arg)
            ref[origin] = arg
            ref.move_to_end(origin)
        elif op == "all":
            memory.remember_all(range(origin, origin + arg), "committed")
            for o in range(origin, origin + arg):
                ref[o] = "committed"
                ref.move_to_end(o)
        else:
            memory.forget(origin)
            ref.pop(origin, None)
            assert memory.get(origin) is None
        while len(ref) > size:
            ref.popitem(last=False)
        assert all(memory.get(o) == outcome for o, outcome in ref.items())
        assert len(memory) <= 2 * size + 6
