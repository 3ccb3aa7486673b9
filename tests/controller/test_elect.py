"""The election policy (RocketMQ's DefaultElectPolicy) as a pure function."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cometmq.controller.elect import alive_ids, elect
from cometmq.controller.heartbeats import LiveInfo

NOW = 100_000


def live(broker_id: int, *, epoch: int = 1, max_offset: int = 0, priority: int = 0, seen: int = NOW) -> LiveInfo:
    return LiveInfo(broker_id, f"h:{broker_id}", seen, 10_000, epoch, max_offset, -1, priority)


ALL = frozenset({1, 2, 3})


def test_keeps_a_live_old_master_in_the_set() -> None:
    ev = [live(1, max_offset=10), live(2, max_offset=99)]
    assert elect(frozenset({1, 2}), ALL, 1, ev, NOW) == 1


def test_dead_old_master_is_replaced_by_the_best_candidate() -> None:
    ev = [live(1, seen=NOW - 20_000, max_offset=500), live(2, max_offset=10), live(3, max_offset=20)]
    assert elect(frozenset({1, 2, 3}), ALL, 1, ev, NOW) == 3


def test_order_is_epoch_then_offset_then_priority() -> None:
    s = frozenset({1, 2, 3})
    assert elect(s, ALL, None, [live(1, epoch=3, max_offset=0), live(2, epoch=2, max_offset=999)], NOW) == 1
    assert elect(s, ALL, None, [live(1, max_offset=5), live(2, max_offset=6)], NOW) == 2
    assert elect(s, ALL, None, [live(1, priority=5), live(2, priority=1), live(3, priority=9)], NOW) == 2
    # full tie: the lowest id, whatever the order of the evidence
    assert elect(s, ALL, None, [live(3), live(2)], NOW) == 2


def test_only_alive_members_of_the_set_unless_unclean() -> None:
    ev = [live(1, seen=0), live(3, max_offset=1_000)]
    assert elect(frozenset({1, 2}), ALL, 1, ev, NOW) is None
    assert elect(frozenset({1, 2}), ALL, 1, ev, NOW, unclean=True) == 3
    # unclean still prefers an alive member of the set
    assert elect(frozenset({1, 2}), ALL, 1, [*ev, live(2)], NOW, unclean=True) == 2


def test_unregistered_brokers_are_never_candidates() -> None:
    assert elect(frozenset({1, 9}), frozenset({1}), None, [live(9, max_offset=9)], NOW) is None
    assert elect(frozenset({1}), frozenset({1}), None, [live(9)], NOW, unclean=True) is None


def test_designated_broker_only_if_a_candidate() -> None:
    s = frozenset({1, 2})
    ev = [live(1), live(2), live(3)]
    assert elect(s, ALL, 1, ev, NOW, designate=2) == 2  # replaces even a live master
    assert elect(s, ALL, 1, ev, NOW, designate=1) == 1
    assert elect(s, ALL, 1, ev, NOW, designate=3) is None  # alive but not in sync
    assert elect(s, ALL, 1, ev, NOW, designate=3, unclean=True) == 3
    assert elect(s, ALL, 1, [live(1)], NOW, designate=2) is None  # not alive


def test_no_evidence_no_master() -> None:
    assert elect(ALL, ALL, 1, [], NOW) is None
    assert alive_ids([live(1), live(2, seen=0)], NOW) == frozenset({1})


infos = st.builds(live, st.integers(1, 5), epoch=st.integers(0, 4), max_offset=st.integers(0, 50),
                  priority=st.integers(0, 3), seen=st.sampled_from([NOW, NOW - 5_000, NOW - 20_000]))
ids = st.frozensets(st.integers(1, 5))


@given(ids, ids, st.none() | st.integers(1, 5), st.lists(infos, max_size=8), st.booleans(),
       st.none() | st.integers(1, 5))
def test_the_result_is_always_a_legal_candidate(sset: frozenset[int], replicas: frozenset[int], old: int | None,
                                                ev: list[LiveInfo], unclean: bool, designate: int | None) -> None:
    chosen = elect(sset, replicas, old, ev, NOW, unclean=unclean, designate=designate)
    alive = {i.broker_id for i in ev if i.alive_at(NOW)} & replicas
    if chosen is None:
        assert not (alive & sset) or designate is not None
        return
    assert chosen in alive
    assert chosen in sset or unclean
    if designate is not None:
        assert chosen == designate
    if designate is None and old in alive & sset:
        assert chosen == old
    # the answer does not depend on the order of the evidence
    assert elect(sset, replicas, old, list(reversed(ev)), NOW, unclean=unclean, designate=designate) == chosen
