"""The controller's replicated state machine: broker groups, their masters, epochs and SyncStateSets. Pure.

Requests are turned into events by ``decide_*`` handlers, which check them against the current state and return a
``Decision`` (a response code and the events to append to the replicated log). Nothing changes until an event is
``apply``'d, in log order, on every node; ``apply`` makes every check again (the same ``_check_*`` function the
handler used) and turns a stale or invalid event into a no-op with a code, so two decisions taken against the same
state cannot both land (RocketMQ #5663) and every node ends in the same state. Callers answer from the apply
outcome, never from the proposal. Liveness enters as the heartbeat evidence an event carries (``events.py``).

A group is known by its broker name (RocketMQ's requests carry only the name in places: ALTER_SYNC_STATE_SET,
GET_REPLICA_INFO); its cluster is kept and checked. Epochs of a removed group are remembered, so a group created
again under the same name continues above them and brokers, which act only on a higher epoch, follow it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..protocol.codes import ResponseCode as RC
from .elect import alive_ids, elect
from .events import AlterSyncStateSet, ApplyBrokerId, CleanBrokerData, ElectMaster, Event, UpdateBrokerAddress
from .heartbeats import LiveInfo

#: MixAll.FIRST_BROKER_CONTROLLER_ID: ids handed out start at 1 (0 is the master's role id in the nameserver)
FIRST_BROKER_ID = 1
#: bounds on what APPLY_BROKER_ID and REGISTER_BROKER store for good (anyone may send them when ACL is off);
#: checked when deciding only, so a log written before them replays as it did
MAX_BROKER_IDS_PER_GROUP = 64
MAX_GROUPS = 10_000
MAX_NAME_LENGTH = 255
MAX_CHECK_CODE_LENGTH = 512


@dataclass(frozen=True)
class Outcome:
    """The result of a check: SUCCESS, or the RocketMQ code and a remark for the requester."""

    code: int = RC.SUCCESS
    remark: str = ""

    @property
    def ok(self) -> bool:
        return self.code == RC.SUCCESS


OK = Outcome()


@dataclass(frozen=True)
class Decision:
    """What a handler decided: the code to answer with (once the events are applied) and the events to append.

    A code other than SUCCESS can come with events (an election by the controller that found no candidate
    records that the master is gone, and answers CONTROLLER_MASTER_NOT_AVAILABLE).
    """

    code: int = RC.SUCCESS
    remark: str = ""
    events: tuple[Event, ...] = ()

    @classmethod
    def reject(cls, outcome: Outcome) -> Decision:
        return cls(outcome.code, outcome.remark)


@dataclass(frozen=True)
class Replica:
    address: str
    check_code: str


@dataclass
class BrokerGroup:
    """One broker group (RocketMQ's BrokerReplicaInfo and SyncStateInfo together)."""

    cluster: str
    broker_name: str
    replicas: dict[int, Replica] = field(default_factory=dict)
    next_broker_id: int = FIRST_BROKER_ID
    master: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0

    @property
    def first_election(self) -> bool:
        """No master was ever elected (or every in-sync replica was cleaned away): the requester becomes master."""
        return self.master is None and not self.sync_state_set

    def address_of(self, broker_id: int | None) -> str | None:
        replica = self.replicas.get(broker_id) if broker_id is not None else None
        return replica.address if replica else None

    def to_json(self) -> dict[str, object]:
        return {"cluster": self.cluster, "brokerName": self.broker_name, "nextBrokerId": self.next_broker_id,
                "replicas": {str(i): [r.address, r.check_code] for i, r in sorted(self.replicas.items())},
                "master": self.master, "masterEpoch": self.master_epoch,
                "syncStateSet": sorted(self.sync_state_set), "syncStateSetEpoch": self.sync_state_set_epoch}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BrokerGroup:
        return cls(cluster=d["cluster"], broker_name=d["brokerName"],
                   replicas={int(i): Replica(a, c) for i, (a, c) in d["replicas"].items()},
                   next_broker_id=d["nextBrokerId"], master=d["master"], master_epoch=d["masterEpoch"],
                   sync_state_set=frozenset(d["syncStateSet"]), sync_state_set_epoch=d["syncStateSetEpoch"])


def _too_long(limit: int = MAX_NAME_LENGTH, **fields: str) -> str:
    """What is wrong with the first field longer than ``limit``, or ""."""
    return next((f"{key} is longer than {limit} characters" for key, value in fields.items() if len(value) > limit),
                "")


class ControllerState:
    """Every broker group the controller knows, changed only by ``apply``."""

    def __init__(self) -> None:
        self._groups: dict[str, BrokerGroup] = {}
        #: (master epoch, set epoch) of removed groups: a group created again starts above them
        self._retired: dict[str, tuple[int, int]] = {}

    # -- reads ------------------------------------------------------------------------------------------------
    def group(self, broker_name: str) -> BrokerGroup | None:
        """A copy of the group (callers cannot change the state behind ``apply``'s back)."""
        g = self._groups.get(broker_name)
        return replace(g, replicas=dict(g.replicas)) if g else None

    def broker_names(self) -> list[str]:
        return sorted(self._groups)

    def holds(self, cluster: str, broker_name: str, broker_id: int) -> bool:
        """Whether the broker id is registered in the group of that cluster."""
        g = self._groups.get(broker_name)
        return g is not None and g.cluster == cluster and broker_id in g.replicas

    def replica_count(self) -> int:
        """How many broker ids are registered, over every group."""
        return sum(len(g.replicas) for g in self._groups.values())

    def next_broker_id(self, broker_name: str) -> int:
        """GET_NEXT_BROKER_ID: the id a new broker of the group should apply for."""
        g = self._groups.get(broker_name)
        return g.next_broker_id if g else FIRST_BROKER_ID

    def groups_needing_election(self, is_alive: Callable[[str, str, int], bool]) -> list[str]:
        """Groups whose master is lost while some replica lives (RocketMQ's scanNeedReelectBrokerSets)."""
        return [name for name, g in sorted(self._groups.items())
                if g.master is not None and not is_alive(g.cluster, name, g.master)
                and any(is_alive(g.cluster, name, i) for i in g.replicas)]

    def to_json(self) -> bytes:
        """The whole state, deterministic bytes (equal states give equal bytes): for snapshots and comparisons."""
        doc = {"groups": [g.to_json() for _, g in sorted(self._groups.items())],
               "retired": {name: list(epochs) for name, epochs in sorted(self._retired.items())}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ControllerState:
        doc = json.loads(data)
        state = cls()
        for d in doc["groups"]:
            g = BrokerGroup.from_json(d)
            state._groups[g.broker_name] = g
        state._retired = {name: (int(m), int(s)) for name, (m, s) in doc["retired"].items()}
        return state

    # -- request handlers: validate, propose events -------------------------------------------------------------
    def decide_apply_broker_id(self, cluster: str, broker_name: str, broker_id: int, check_code: str) -> Decision:
        """APPLY_BROKER_ID; the address is the first field of the register check code ("addr;timestamp")."""
        too_long = _too_long(cluster=cluster, brokerName=broker_name) or _too_long(MAX_CHECK_CODE_LENGTH,
                                                                                     registerCheckCode=check_code)
        if too_long:
            return Decision(RC.CONTROLLER_INVALID_REQUEST, too_long)
        g = self._groups.get(broker_name)
        if g is None and len(self._groups) >= MAX_GROUPS:
            return Decision(RC.CONTROLLER_INVALID_REQUEST,
                            f"the controller holds {MAX_GROUPS} broker groups, its most; clean one first")
        if g is not None and broker_id not in g.replicas and len(g.replicas) >= MAX_BROKER_IDS_PER_GROUP:
            return Decision(RC.CONTROLLER_BROKER_ID_INVALID,
                            f"{broker_name} holds {MAX_BROKER_IDS_PER_GROUP} broker ids, its most; clean the dead "
                            "ones first (cometmq admin clean-broker-data)")
        event = ApplyBrokerId(cluster, broker_name, broker_id, check_code.split(";")[0], check_code)
        return self._decide(event)

    def decide_register(self, cluster: str, broker_name: str, broker_id: int, address: str) -> Decision:
        """REGISTER_BROKER: known ids only; an address change becomes an event. The reply is read from the group."""
        too_long = _too_long(brokerAddress=address)
        if too_long:
            return Decision(RC.CONTROLLER_INVALID_REQUEST, too_long)
        g = self._groups.get(broker_name)
        if g is None or broker_id not in g.replicas:
            return Decision(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, f"{broker_name}/{broker_id} has no broker id")
        if g.cluster != cluster:
            return Decision(RC.CONTROLLER_INVALID_REQUEST, f"{broker_name} belongs to cluster {g.cluster}")
        if g.replicas[broker_id].address == address:
            return Decision()
        return self._decide(UpdateBrokerAddress(cluster, broker_name, broker_id, address))

    def decide_elect(self, broker_name: str, requester: int | None, now_ms: int, evidence: Iterable[LiveInfo], *,
                     designate: bool = False, unclean: bool = False) -> Decision:
        """ELECT_MASTER; ``requester`` None (RocketMQ's -1) when the controller triggers it for a lost master."""
        g = self._groups.get(broker_name)
        if g is None:
            return Decision(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, f"{broker_name} is not registered")
        relevant = tuple(sorted((i for i in evidence if i.broker_id in g.replicas), key=lambda i: i.broker_id))
        if g.first_election:
            new_master = requester
        else:
            new_master = elect(g.sync_state_set, frozenset(g.replicas), g.master, relevant, now_ms,
                               unclean=unclean, designate=requester if designate else None)
        if new_master is not None and new_master == g.master:
            return Decision(RC.CONTROLLER_MASTER_STILL_EXIST, f"master {g.master} of {broker_name} is alive")
        if new_master is None and (requester is not None or g.master is None):
            return Decision(RC.CONTROLLER_ELECT_MASTER_FAILED, f"no candidate to be master of {broker_name}")
        event = ElectMaster(g.cluster, broker_name, g.master_epoch, g.sync_state_set_epoch, g.master, new_master,
                            requester, designate, unclean, now_ms, relevant)
        decision = self._decide(event)
        if decision.events and new_master is None:  # the master is recorded as gone; the requester learns why
            return replace(decision, code=RC.CONTROLLER_MASTER_NOT_AVAILABLE,
                           remark=f"master of {broker_name} lost and no candidate alive")
        return decision

    def decide_alter_sync_state_set(self, broker_name: str, master_id: int, master_epoch: int,
                                    sync_state_set_epoch: int, new_set: Iterable[int], now_ms: int,
                                    evidence: Iterable[LiveInfo]) -> Decision:
        """ALTER_SYNC_STATE_SET from the master: the new set's epoch will be the current one + 1."""
        g = self._groups.get(broker_name)
        if g is None:
            return Decision(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, f"{broker_name} is not registered")
        members = frozenset(new_set)
        relevant = tuple(sorted((i for i in evidence if i.broker_id in members), key=lambda i: i.broker_id))
        return self._decide(AlterSyncStateSet(g.cluster, broker_name, master_id, master_epoch,
                                              sync_state_set_epoch, members, now_ms, relevant))

    def decide_clean(self, broker_name: str, broker_ids: Iterable[int] | None, now_ms: int,
                     evidence: Iterable[LiveInfo], *, clean_living: bool = False) -> Decision:
        """CLEAN_BROKER_DATA (mqadmin cleanBrokerMetadata): dead replicas, or the whole group when its master is."""
        g = self._groups.get(broker_name)
        if g is None:
            return Decision(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, f"{broker_name} is not registered")
        ids = None if broker_ids is None else frozenset(broker_ids)
        relevant = tuple(sorted((i for i in evidence if i.broker_id in g.replicas), key=lambda i: i.broker_id))
        return self._decide(CleanBrokerData(g.cluster, broker_name, ids, clean_living, now_ms, relevant))

    def _decide(self, event: Event) -> Decision:
        outcome = self.check(event)
        if not outcome.ok:
            return Decision.reject(outcome)
        return Decision(events=(event,))

    # -- the checks, made when deciding and again when applying ---------------------------------------------------
    def check(self, event: Event) -> Outcome:
        """Whether ``event`` may change the current state; the same answer on every node."""
        match event:
            case ApplyBrokerId():
                return self._check_apply_broker_id(event)
            case UpdateBrokerAddress():
                return self._check_update_address(event)
            case ElectMaster():
                return self._check_elect(event)
            case AlterSyncStateSet():
                return self._check_alter(event)
            case CleanBrokerData():
                return self._check_clean(event)

    def _check_apply_broker_id(self, e: ApplyBrokerId) -> Outcome:
        g = self._groups.get(e.broker_name)
        if e.broker_id < FIRST_BROKER_ID:
            return Outcome(RC.CONTROLLER_BROKER_ID_INVALID, f"broker id {e.broker_id} is below {FIRST_BROKER_ID}")
        if g is None:
            if e.broker_id != FIRST_BROKER_ID:
                return Outcome(RC.CONTROLLER_BROKER_ID_INVALID,
                               f"{e.broker_name} is not registered; its first broker id is {FIRST_BROKER_ID}")
            return OK
        if g.cluster != e.cluster:
            return Outcome(RC.CONTROLLER_INVALID_REQUEST, f"{e.broker_name} belongs to cluster {g.cluster}")
        taken = g.replicas.get(e.broker_id)
        if taken is not None and taken.check_code != e.check_code:
            return Outcome(RC.CONTROLLER_BROKER_ID_INVALID, f"broker id {e.broker_id} of {e.broker_name} is taken")
        return OK

    def _check_update_address(self, e: UpdateBrokerAddress) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None or e.broker_id not in g.replicas or g.cluster != e.cluster:
            return Outcome(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, f"{e.broker_name}/{e.broker_id} is unknown")
        return OK

    def _check_fence(self, g: BrokerGroup, master: int | None, master_epoch: int, set_epoch: int) -> Outcome:
        if master_epoch != g.master_epoch:
            return Outcome(RC.CONTROLLER_FENCED_MASTER_EPOCH,
                           f"master epoch of {g.broker_name} is {g.master_epoch}, not {master_epoch}")
        if set_epoch != g.sync_state_set_epoch:
            return Outcome(RC.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                           f"SyncStateSet epoch of {g.broker_name} is {g.sync_state_set_epoch}, not {set_epoch}")
        if master != g.master:
            return Outcome(RC.CONTROLLER_INVALID_MASTER, f"master of {g.broker_name} is {g.master}, not {master}")
        return OK

    def _check_elect(self, e: ElectMaster) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None or g.cluster != e.cluster:
            return Outcome(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, f"{e.broker_name} is not registered")
        fenced = self._check_fence(g, e.old_master, e.master_epoch, e.sync_state_set_epoch)
        if not fenced.ok:
            return fenced
        if g.first_election:
            if e.requester is None or e.new_master != e.requester:
                return Outcome(RC.CONTROLLER_ELECT_MASTER_FAILED, "a first election elects the broker that asks")
            if e.requester not in g.replicas:
                return Outcome(RC.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                               f"{e.broker_name}/{e.requester} has no broker id")
            return OK
        expected = elect(g.sync_state_set, frozenset(g.replicas), g.master, e.evidence, e.decided_at_ms,
                         unclean=e.unclean, designate=e.requester if e.designate else None)
        if expected != e.new_master:
            return Outcome(RC.CONTROLLER_ELECT_MASTER_FAILED,
                           f"policy elects {expected} for {e.broker_name}, not {e.new_master}")
        if expected is not None and expected == g.master:
            return Outcome(RC.CONTROLLER_MASTER_STILL_EXIST, f"master {g.master} of {e.broker_name} is alive")
        if expected is None and (g.master is None or e.requester is not None):
            return Outcome(RC.CONTROLLER_ELECT_MASTER_FAILED, f"no candidate to be master of {e.broker_name}")
        return OK

    def _check_alter(self, e: AlterSyncStateSet) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None or g.cluster != e.cluster:
            return Outcome(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, f"{e.broker_name} is not registered")
        if g.master is None or e.master_id != g.master:
            return Outcome(RC.CONTROLLER_INVALID_MASTER, f"master of {e.broker_name} is {g.master}, not {e.master_id}")
        fenced = self._check_fence(g, e.master_id, e.master_epoch, e.sync_state_set_epoch)
        if not fenced.ok:
            return fenced
        if e.new_set == g.sync_state_set:
            return Outcome(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, "the SyncStateSet is unchanged")
        unknown = sorted(e.new_set - g.replicas.keys())
        if unknown:
            return Outcome(RC.CONTROLLER_INVALID_REPLICAS, f"replicas {unknown} of {e.broker_name} do not exist")
        dead = sorted(e.new_set - alive_ids(e.evidence, e.decided_at_ms))
        if dead:
            return Outcome(RC.CONTROLLER_BROKER_NOT_ALIVE, f"replicas {dead} of {e.broker_name} are not alive")
        if g.master not in e.new_set:
            return Outcome(RC.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, f"the new set lacks the master {g.master}")
        return OK

    def _check_clean(self, e: CleanBrokerData) -> Outcome:
        g = self._groups.get(e.broker_name)
        if g is None or g.cluster != e.cluster:
            return Outcome(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, f"{e.broker_name} is not registered")
        unknown = sorted(e.broker_ids - g.replicas.keys()) if e.broker_ids is not None else []
        if unknown:  # a typo must not be answered "forgotten"; a race lost to another clean lands here too
            return Outcome(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                           f"brokers {unknown} are not in {e.broker_name}")
        if e.clean_living:
            return OK
        if e.broker_ids is None:
            if g.master is not None:
                return Outcome(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, f"{e.broker_name} still has a master")
            alive = sorted(alive_ids(e.evidence, e.decided_at_ms) & g.replicas.keys())
        else:
            alive = sorted(alive_ids(e.evidence, e.decided_at_ms) & e.broker_ids)
        if alive:
            return Outcome(RC.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, f"brokers {alive} are still alive")
        return OK

    # -- apply --------------------------------------------------------------------------------------------------
    def apply(self, event: Event) -> Outcome:
        """Check ``event`` against the current state and, if it still holds, make its change. Deterministic:
        the same state and event give the same result on every node; a rejected event changes nothing."""
        outcome = self.check(event)
        if not outcome.ok:
            return outcome
        match event:
            case ApplyBrokerId():
                self._apply_broker_id(event)
            case UpdateBrokerAddress():
                g = self._groups[event.broker_name]
                g.replicas[event.broker_id] = replace(g.replicas[event.broker_id], address=event.address)
            case ElectMaster():
                g = self._groups[event.broker_name]
                g.master = event.new_master
                g.master_epoch += 1
                if event.new_master is not None:  # the set restarts from the new master and grows back
                    g.sync_state_set = frozenset({event.new_master})
                    g.sync_state_set_epoch += 1
            case AlterSyncStateSet():
                g = self._groups[event.broker_name]
                g.sync_state_set = event.new_set
                g.sync_state_set_epoch += 1
            case CleanBrokerData():
                self._apply_clean(event)
        return outcome

    def _apply_broker_id(self, e: ApplyBrokerId) -> None:
        g = self._groups.get(e.broker_name)
        if g is None:
            master_epoch, set_epoch = self._retired.get(e.broker_name, (0, 0))
            g = self._groups[e.broker_name] = BrokerGroup(e.cluster, e.broker_name, master_epoch=master_epoch,
                                                          sync_state_set_epoch=set_epoch)
        if e.broker_id not in g.replicas:
            g.replicas[e.broker_id] = Replica(e.address, e.check_code)
            g.next_broker_id = max(g.next_broker_id, e.broker_id + 1)

    def _apply_clean(self, e: CleanBrokerData) -> None:
        g = self._groups[e.broker_name]
        ids = frozenset(g.replicas) if e.broker_ids is None else e.broker_ids
        for i in ids:
            g.replicas.pop(i, None)
        if g.master in ids:  # a master removed is a master change: a new epoch, so no one acts on the old one
            g.master = None
            g.master_epoch += 1
        if g.sync_state_set & ids:
            g.sync_state_set -= ids
            g.sync_state_set_epoch += 1
        if not g.replicas:
            del self._groups[e.broker_name]
            self._retired[e.broker_name] = (g.master_epoch, g.sync_state_set_epoch)
