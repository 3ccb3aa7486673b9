"""The controller state machine: handlers decide, apply checks again; RocketMQ's codes for every rejection."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cometmq.controller.events import AlterSyncStateSet, ApplyBrokerId, ElectMaster, Event, decode_event, encode_event
from cometmq.controller.heartbeats import LiveInfo
from cometmq.controller.state import ControllerState, Decision
from cometmq.protocol.codes import ResponseCode as RC

C, A = "DefaultCluster", "broker-a"
NOW = 1_000_000


def live(broker_id: int, *, seen: int = NOW, epoch: int = 1, max_offset: int = 0) -> LiveInfo:
    return LiveInfo(broker_id, f"h:{broker_id}", seen, 10_000, epoch, max_offset, -1, 0)


def commit(state: ControllerState, decision: Decision) -> int:
    """Apply a decision's events as the log would (through their bytes); the code to answer with."""
    for event in decision.events:
        outcome = state.apply(decode_event(encode_event(event)))
        if not outcome.ok:
            return outcome.code
    return decision.code


def group_of(state: ControllerState, name: str = A) -> tuple[int | None, int, frozenset[int], int]:
    g = state.group(name)
    assert g is not None
    return g.master, g.master_epoch, g.sync_state_set, g.sync_state_set_epoch


def with_brokers(*ids: int) -> ControllerState:
    state = ControllerState()
    for i in ids:
        assert commit(state, state.decide_apply_broker_id(C, A, i, f"h:{i};{i}")) == RC.SUCCESS
    return state


def elected(ids: tuple[int, ...] = (1, 2, 3), members: frozenset[int] | None = None) -> ControllerState:
    """A group whose broker 1 was elected first, then (optionally) grew its set to ``members``."""
    state = with_brokers(*ids)
    assert commit(state, state.decide_elect(A, 1, NOW, [live(1)])) == RC.SUCCESS
    if members:
        d = state.decide_alter_sync_state_set(A, 1, 1, 1, members, NOW, [live(i) for i in members])
        assert commit(state, d) == RC.SUCCESS
    return state


# -- broker ids ---------------------------------------------------------------------------------------------------
def test_broker_ids_start_at_one_and_are_handed_out_in_turn() -> None:
    state = ControllerState()
    assert state.next_broker_id(A) == 1
    assert commit(state, state.decide_apply_broker_id(C, A, 2, "h:2;1")) == RC.CONTROLLER_BROKER_ID_INVALID
    assert commit(state, state.decide_apply_broker_id(C, A, 1, "h:1;1")) == RC.SUCCESS
    assert state.next_broker_id(A) == 2
    assert commit(state, state.decide_apply_broker_id(C, A, 5, "h:5;1")) == RC.SUCCESS
    assert state.next_broker_id(A) == 6
    g = state.group(A)
    assert g is not None and g.address_of(5) == "h:5" and g.cluster == C


def test_registrations_with_made_up_names_and_ids_are_bounded() -> None:
    """Anyone may send APPLY_BROKER_ID (ACL off), and what it registers is kept for good: ids per group, groups,
    and the length of what is stored are bounded; a refusal changes nothing."""
    from cometmq.controller.state import MAX_BROKER_IDS_PER_GROUP, MAX_GROUPS, MAX_NAME_LENGTH

    state = ControllerState()
    for i in range(1, MAX_BROKER_IDS_PER_GROUP + 1):
        assert commit(state, state.decide_apply_broker_id(C, A, i, f"h:{i};{i}")) == RC.SUCCESS
    before = state.to_json()
    d = state.decide_apply_broker_id(C, A, MAX_BROKER_IDS_PER_GROUP + 1, "h:x;1")
    assert (d.code, d.events) == (RC.CONTROLLER_BROKER_ID_INVALID, ()) and "clean" in d.remark
    assert commit(state, state.decide_apply_broker_id(C, A, 3, "h:3;3")) == RC.SUCCESS  # its own id again: fine
    for name, cluster, code in (("n" * (MAX_NAME_LENGTH + 1), C, "h:1;1"), ("b", "c" * (MAX_NAME_LENGTH + 1), "h:1;1"),
                                ("b", C, "h" * 1000 + ";1")):
        d = state.decide_apply_broker_id(cluster, name, 1, code)
        assert (d.code, d.events) == (RC.CONTROLLER_INVALID_REQUEST, ())
    d = state.decide_register(C, A, 1, "h" * 1000 + ":1")
    assert (d.code, d.events) == (RC.CONTROLLER_INVALID_REQUEST, ())
    assert state.to_json() == before

    state = ControllerState()
    for i in range(MAX_GROUPS):
        state.apply(ApplyBrokerId(C, f"g{i}", 1, "h:1", "h:1;1"))
    d = state.decide_apply_broker_id(C, "one-too-many", 1, "h:1;1")
    assert (d.code, d.events) == (RC.CONTROLLER_INVALID_REQUEST, ()) and str(MAX_GROUPS) in d.remark
    assert commit(state, state.decide_apply_broker_id(C, "g7", 2, "h:2;2")) == RC.SUCCESS  # known groups grow


def test_apply_broker_id_is_idempotent_for_its_owner_only() -> None:
    state = with_brokers(1)
    assert commit(state, state.decide_apply_broker_id(C, A, 1, "h:1;1")) == RC.SUCCESS
    assert state.next_broker_id(A) == 2
    assert commit(state, state.decide_apply_broker_id(C, A, 1, "h:9;7")) == RC.CONTROLLER_BROKER_ID_INVALID
    assert commit(state, state.decide_apply_broker_id(C, A, 0, "h:0;1")) == RC.CONTROLLER_BROKER_ID_INVALID
    assert commit(state, state.decide_apply_broker_id("Other", A, 2, "h:2;1")) == RC.CONTROLLER_INVALID_REQUEST


def test_two_brokers_racing_for_one_id_one_wins_at_apply() -> None:
    state = with_brokers(1)
    first = state.decide_apply_broker_id(C, A, 2, "h:2;1")
    second = state.decide_apply_broker_id(C, A, 2, "h:3;1")
    assert first.events and second.events  # both valid when decided
    assert commit(state, first) == RC.SUCCESS
    assert commit(state, second) == RC.CONTROLLER_BROKER_ID_INVALID
    g = state.group(A)
    assert g is not None and g.address_of(2) == "h:2"


# -- register ---------------------------------------------------------------------------------------------------
def test_register_needs_an_id_and_records_a_new_address() -> None:
    state = with_brokers(1)
    assert state.decide_register(C, A, 2, "h:2").code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert state.decide_register(C, "broker-z", 1, "h:2").code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert state.decide_register("Other", A, 1, "h:1").code == RC.CONTROLLER_INVALID_REQUEST
    assert state.decide_register(C, A, 1, "h:1") == Decision()
    assert commit(state, state.decide_register(C, A, 1, "10.0.0.9:10911")) == RC.SUCCESS
    g = state.group(A)
    assert g is not None and g.address_of(1) == "10.0.0.9:10911"
    assert g.replicas[1].check_code == "h:1;1"


# -- elections --------------------------------------------------------------------------------------------------
def test_first_election_elects_the_requester() -> None:
    state = with_brokers(1, 2)
    assert state.decide_elect(A, None, NOW, [live(1)]).code == RC.CONTROLLER_ELECT_MASTER_FAILED
    assert state.decide_elect("broker-z", 1, NOW, []).code == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert commit(state, state.decide_elect(A, 7, NOW, [])) == RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert commit(state, state.decide_elect(A, 2, NOW, [])) == RC.SUCCESS
    assert group_of(state) == (2, 1, frozenset({2}), 1)


def test_a_live_master_stays() -> None:
    state = elected(members=frozenset({1, 2}))
    d = state.decide_elect(A, 2, NOW, [live(1), live(2, max_offset=999)])
    assert d.code == RC.CONTROLLER_MASTER_STILL_EXIST and not d.events


def test_lost_master_best_in_sync_replica_wins_and_the_set_restarts() -> None:
    state = elected(members=frozenset({1, 2, 3}))
    ev = [live(2, max_offset=10), live(3, max_offset=20)]
    assert commit(state, state.decide_elect(A, None, NOW, ev)) == RC.SUCCESS
    assert group_of(state) == (3, 2, frozenset({3}), 3)


def test_no_candidate_records_the_master_lost_once() -> None:
    state = elected(members=frozenset({1, 2}))
    d = state.decide_elect(A, None, NOW, [live(3)])  # 3 is alive but not in sync
    assert d.code == RC.CONTROLLER_MASTER_NOT_AVAILABLE and len(d.events) == 1
    assert commit(state, d) == RC.CONTROLLER_MASTER_NOT_AVAILABLE
    assert group_of(state) == (None, 2, frozenset({1, 2}), 2)
    again = state.decide_elect(A, None, NOW, [live(3)])
    assert again.code == RC.CONTROLLER_ELECT_MASTER_FAILED and not again.events
    # an in-sync replica comes back: it is elected
    assert commit(state, state.decide_elect(A, None, NOW, [live(2)])) == RC.SUCCESS
    assert group_of(state) == (2, 3, frozenset({2}), 3)


def test_a_broker_asking_with_no_candidate_changes_nothing() -> None:
    state = elected(members=frozenset({1, 2}))
    d = state.decide_elect(A, 3, NOW, [live(3)])
    assert d.code == RC.CONTROLLER_ELECT_MASTER_FAILED and not d.events


def test_unclean_election_only_when_enabled() -> None:
    state = elected(members=frozenset({1, 2}))
    assert commit(state, state.decide_elect(A, 3, NOW, [live(3)], unclean=True)) == RC.SUCCESS
    assert group_of(state)[0] == 3


def test_designated_election() -> None:
    state = elected(members=frozenset({1, 2}))
    assert state.decide_elect(A, 3, NOW, [live(1), live(3)], designate=True).code == RC.CONTROLLER_ELECT_MASTER_FAILED
    assert commit(state, state.decide_elect(A, 2, NOW, [live(1), live(2)], designate=True)) == RC.SUCCESS
    assert group_of(state)[0] == 2


def test_two_elections_decided_on_one_state_only_the_first_lands() -> None:
    state = elected(members=frozenset({1, 2, 3}))
    first = state.decide_elect(A, None, NOW, [live(2, max_offset=5), live(3)])
    second = state.decide_elect(A, None, NOW, [live(3)])
    assert commit(state, first) == RC.SUCCESS
    assert commit(state, second) == RC.CONTROLLER_FENCED_MASTER_EPOCH
    assert group_of(state) == (2, 2, frozenset({2}), 3)


def test_apply_reruns_the_policy_on_the_evidence() -> None:
    state = elected(members=frozenset({1, 2, 3}))
    (event,) = state.decide_elect(A, None, NOW, [live(2, max_offset=5), live(3)]).events
    assert isinstance(event, ElectMaster) and event.new_master == 2
    before = state.to_json()
    forged: list[Event] = [
        replace(event, new_master=3),  # not the best candidate
        replace(event, decided_at_ms=NOW + 60_000),  # the evidence is stale at the decision time: no candidate
        replace(event, evidence=(live(2, seen=0), live(3))),  # 2 was dead: the policy picks 3
        replace(event, old_master=2),
        replace(event, sync_state_set_epoch=7),
    ]
    for bad in forged:
        assert not state.apply(bad).ok
        assert state.to_json() == before


# -- SyncStateSet -----------------------------------------------------------------------------------------------
def test_alter_grows_and_shrinks_the_set() -> None:
    state = elected()
    assert commit(state, state.decide_alter_sync_state_set(A, 1, 1, 1, {1, 2}, NOW, [live(1), live(2)])) == 0
    assert group_of(state) == (1, 1, frozenset({1, 2}), 2)
    assert commit(state, state.decide_alter_sync_state_set(A, 1, 1, 2, {1}, NOW, [live(1)])) == 0
    assert group_of(state) == (1, 1, frozenset({1}), 3)


@pytest.mark.parametrize(("master", "epoch", "set_epoch", "members", "evidence", "code"), [
    (2, 1, 1, {1, 2}, (1, 2), RC.CONTROLLER_INVALID_MASTER),
    (1, 0, 1, {1, 2}, (1, 2), RC.CONTROLLER_FENCED_MASTER_EPOCH),
    (1, 1, 0, {1, 2}, (1, 2), RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
    (1, 1, 1, {1, 9}, (1, 9), RC.CONTROLLER_INVALID_REPLICAS),
    (1, 1, 1, {1, 2}, (1,), RC.CONTROLLER_BROKER_NOT_ALIVE),
    (1, 1, 1, {1}, (1,), RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),  # unchanged
    (1, 1, 1, {2}, (2,), RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),  # lacks the master
])
def test_alter_rejections(master: int, epoch: int, set_epoch: int, members: set[int], evidence: tuple[int, ...],
                          code: int) -> None:
    state = elected()
    before = state.to_json()
    d = state.decide_alter_sync_state_set(A, master, epoch, set_epoch, members, NOW, [live(i) for i in evidence])
    assert d.code == code and not d.events
    assert state.to_json() == before


def test_alter_of_an_unknown_group() -> None:
    d = ControllerState().decide_alter_sync_state_set(A, 1, 1, 1, {1}, NOW, [])
    assert d.code == RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED


def test_rocketmq_5663_an_alter_decided_before_an_election_is_fenced() -> None:
    # changes of the set decided by master 1; meanwhile 1 is lost and 2 elected: they must not land afterwards
    state = elected(members=frozenset({1, 2}))
    grow = state.decide_alter_sync_state_set(A, 1, 1, 2, {1, 2, 3}, NOW, [live(1), live(2), live(3)])
    shrink = state.decide_alter_sync_state_set(A, 1, 1, 2, {1}, NOW, [live(1)])
    assert commit(state, state.decide_elect(A, None, NOW, [live(2)])) == RC.SUCCESS
    # the master changed (checked first, as RocketMQ): 2002; its epoch too
    assert commit(state, grow) == RC.CONTROLLER_INVALID_MASTER
    assert commit(state, shrink) == RC.CONTROLLER_INVALID_MASTER
    assert group_of(state) == (2, 2, frozenset({2}), 3)


def test_two_alters_on_one_set_epoch_only_the_first_lands() -> None:
    state = elected()
    a = state.decide_alter_sync_state_set(A, 1, 1, 1, {1, 2}, NOW, [live(1), live(2)])
    b = state.decide_alter_sync_state_set(A, 1, 1, 1, {1, 3}, NOW, [live(1), live(3)])
    assert commit(state, a) == RC.SUCCESS
    assert commit(state, b) == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert group_of(state)[2] == frozenset({1, 2})


def test_apply_checks_liveness_from_the_evidence_again() -> None:
    state = elected()
    (event,) = state.decide_alter_sync_state_set(A, 1, 1, 1, {1, 2}, NOW, [live(1), live(2)]).events
    assert isinstance(event, AlterSyncStateSet)
    stale = replace(event, evidence=(live(1), live(2, seen=NOW - 10_001)))
    assert state.apply(stale).code == RC.CONTROLLER_BROKER_NOT_ALIVE
    assert state.apply(replace(event, evidence=(live(1),))).code == RC.CONTROLLER_BROKER_NOT_ALIVE
    assert state.apply(event).ok
    assert state.apply(event).code == RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH  # applied twice: a no-op


# -- cleaning -----------------------------------------------------------------------------------------------------
def test_clean_refuses_a_group_with_a_master_or_live_brokers() -> None:
    state = elected(members=frozenset({1, 2}))
    assert state.decide_clean(A, None, NOW, []).code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    assert state.decide_clean(A, [3], NOW, [live(3)]).code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    assert state.decide_clean("broker-z", None, NOW, []).code == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA


def test_clean_dead_replicas_and_a_dead_master() -> None:
    state = elected(members=frozenset({1, 2}))
    assert commit(state, state.decide_clean(A, [3], NOW, [])) == RC.SUCCESS
    assert group_of(state) == (1, 1, frozenset({1, 2}), 2)
    assert commit(state, state.decide_clean(A, [1], NOW, [live(2)])) == RC.SUCCESS
    assert group_of(state) == (None, 2, frozenset({2}), 3)  # a master removed: a new epoch
    g = state.group(A)
    assert g is not None and sorted(g.replicas) == [2]


def test_clean_of_ids_the_group_does_not_hold_is_refused_and_changes_nothing() -> None:
    state = elected(members=frozenset({1, 2}))
    before = state.to_json()
    for ids, living in (([7], False), ([3, 7], False), ([0], True), ([-1], True)):
        d = state.decide_clean(A, ids, NOW, [live(1), live(2)], clean_living=living)
        assert (d.code, d.events) == (RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, ()), ids
        assert str(ids[-1]) in d.remark
    # an event decided before the id was cleaned by another is refused when applied
    d = state.decide_clean(A, [3], NOW, [])
    assert commit(state, state.decide_clean(A, [3], NOW, [])) == RC.SUCCESS
    after = state.to_json()
    assert commit(state, d) == RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    assert state.to_json() == after != before


def test_a_group_created_again_continues_above_its_old_epochs() -> None:
    state = elected(members=frozenset({1, 2}))
    assert commit(state, state.decide_clean(A, None, NOW, [live(1)], clean_living=True)) == RC.SUCCESS
    assert state.group(A) is None and state.broker_names() == []
    assert state.next_broker_id(A) == 1
    assert commit(state, state.decide_apply_broker_id(C, A, 1, "h:1;2")) == RC.SUCCESS
    assert commit(state, state.decide_elect(A, 1, NOW, [])) == RC.SUCCESS
    master, epoch, members, set_epoch = group_of(state)
    assert (master, members) == (1, frozenset({1})) and epoch > 1 and set_epoch > 2


# -- reads ----------------------------------------------------------------------------------------------------------
def test_groups_needing_election() -> None:
    state = elected(members=frozenset({1, 2}))
    assert commit(state, state.decide_apply_broker_id(C, "broker-b", 1, "h:b1;1")) == RC.SUCCESS
    alive: set[tuple[str, int]] = {(A, 2)}
    assert state.groups_needing_election(lambda c, n, i: (n, i) in alive) == [A]
    alive.add((A, 1))
    assert state.groups_needing_election(lambda c, n, i: (n, i) in alive) == []
    assert state.groups_needing_election(lambda c, n, i: False) == []  # nobody to elect


def test_group_is_a_copy() -> None:
    state = elected()
    g = state.group(A)
    assert g is not None
    g.replicas.clear()
    g.master = 9
    assert group_of(state)[0] == 1 and state.group(A) is not None


def test_state_json_round_trip() -> None:
    state = elected(members=frozenset({1, 2}))
    commit(state, state.decide_apply_broker_id(C, "broker-b", 1, "h:b1;1"))
    commit(state, state.decide_clean("broker-b", None, NOW, [], clean_living=True))
    copy = ControllerState.from_json(state.to_json())
    assert copy.to_json() == state.to_json()
    assert copy.decide_elect(A, None, NOW, [live(2)]) == state.decide_elect(A, None, NOW, [live(2)])
