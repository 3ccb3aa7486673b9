"""The master's view of its broker group: each replica's acknowledged offset, the SyncStateSet, the confirm offset.

A pure structure: time comes in as ``now`` (ms), the master's log end as ``master_max``; the HA service feeds it
acks and asks it what changed. The rules are RocketMQ 5's (AutoSwitchHAService, controller-ha.md §1.2):

- A replica joins the set when its ack reaches the confirm offset and the current epoch's start offset.
- A member leaves after ``max_not_catchup_ms`` without being caught up (its ack at the master's end as it was
  when the master last sent to it). The master itself is always a member.
- With ``all_ack`` the confirm offset is the lowest ack in the set (the master's own is its log end): consumers
  see nothing above it, and a send is acknowledged once it is below it. Without ``all_ack`` it is the log end.
- While a change of the set is in flight (to a controller, [12]) acks count against the union of the old and the
  new set, so no message is acknowledged by a set that one side of the change does not know (#5663).
- With ``propose`` (controller mode) the master never changes the set itself: a join or a shrink becomes the
  ``pending`` proposal (one at a time), and the set changes only when the controller's answer is ``adopt``-ed.
- Only the ids of replicas whose link completed the handshake are tracked: an unknown peer cannot ack (#3015).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MASTER_ID = 0


@dataclass(slots=True)
class _Replica:
    ack: int = -1
    #: when it was last caught up (ms); it counts as caught up from the moment it connects
    caught_up_at: int = 0
    #: the master's log end when the master last sent to it: acking that much is being caught up
    target: int = 0
    #: when the master last heard from it (ms): its link's handshake or a report
    heard_at: int = 0


@dataclass
class SyncState:
    all_ack: bool = True
    max_not_catchup_ms: int = 15_000
    #: the SyncStateSet (broker ids; the master's is 0) and its epoch
    members: frozenset[int] = frozenset({MASTER_ID})
    epoch: int = 0
    #: a new set proposed but not yet in force ([12]: sent to the controller); None when none is in flight
    pending: frozenset[int] | None = None
    #: the current master epoch's start offset: a replica must have reached it to join
    epoch_start: int = 0
    replicas: dict[int, _Replica] = field(default_factory=dict)
    #: controller mode: changes of the set are proposed (``pending``), not made
    propose: bool = False

    # -- links ------------------------------------------------------------------------------------------------
    def connected(self, replica_id: int, now: int) -> None:
        """A replica's link completed its handshake: its acks count from now on."""
        self.replicas.setdefault(replica_id, _Replica(caught_up_at=now)).heard_at = now

    def disconnected(self, replica_id: int) -> None:
        """Its link closed. It stays in the set (and holds acks back) until it falls behind for too long."""
        rep = self.replicas.get(replica_id)
        if rep is not None:
            rep.target = max(rep.target, rep.ack + 1)  # it can't catch up while it is away

    def sent(self, replica_id: int, master_max: int) -> None:
        """The master sent the replica everything up to ``master_max``."""
        rep = self.replicas.get(replica_id)
        if rep is not None:
            rep.target = master_max

    def on_ack(self, replica_id: int, offset: int, master_max: int, now: int) -> bool:
        """A replica reports it has the log up to ``offset``. True when the set grew (it joined), or, with
        ``propose``, when its joining became the pending proposal."""
        rep = self.replicas.get(replica_id)
        if rep is None:
            return False  # not a handshaken replica: ignored
        rep.ack = max(rep.ack, offset)
        rep.heard_at = now
        if rep.ack >= rep.target or rep.ack >= master_max:
            rep.caught_up_at = now
        if replica_id not in self.members and rep.ack >= self.confirm_offset(master_max) \
                and rep.ack >= self.epoch_start:
            if self.propose:
                if self.pending is not None:
                    return False  # one change at a time: it is proposed again after the answer
                self.pending = self.members | {replica_id}
                return True
            self.members = self.members | {replica_id}
            self.epoch += 1
            return True
        return False

    def shrink(self, now: int) -> frozenset[int]:
        """Drop the members that have not caught up for ``max_not_catchup_ms``; returns who left (with
        ``propose``: who the pending proposal drops; nothing while another proposal is in flight)."""
        if self.propose and self.pending is not None:
            return frozenset()
        gone = frozenset(rid for rid in self.members if rid != MASTER_ID and (
            rid not in self.replicas or now - self.replicas[rid].caught_up_at > self.max_not_catchup_ms))
        if gone:
            if self.propose:
                self.pending = self.members - gone
            else:
                self.members = self.members - gone
                self.epoch += 1
        return gone

    def adopt(self, members: frozenset[int], epoch: int, now: int) -> None:
        """The set is now ``members`` at ``epoch`` (the controller's word); any proposal is over. A member not
        linked yet gets ``max_not_catchup_ms`` from now to link before it counts as behind; until it has acked,
        it holds the confirm offset back (it is in the set)."""
        self.members = members | {MASTER_ID}
        self.epoch = epoch
        self.pending = None
        for rid in self.members - {MASTER_ID}:
            self.replicas.setdefault(rid, _Replica(caught_up_at=now, heard_at=now))

    def last_heard(self) -> int | None:
        """When the master last heard from any replica (ms), or None."""
        return max((rep.heard_at for rep in self.replicas.values()), default=None)

    # -- what acknowledges ------------------------------------------------------------------------------------
    def counted(self) -> frozenset[int]:
        """Whose acks a write needs: the set, or the union of the old and the new one during a change."""
        return self.members if self.pending is None else self.members | self.pending

    def confirm_offset(self, master_max: int) -> int:
        """Below this every member has the log: what consumers may see and what a send may be acked for."""
        if not self.all_ack:
            return master_max
        low = master_max
        for rid in self.counted():
            if rid == MASTER_ID:
                continue
            rep = self.replicas.get(rid)
            low = min(low, rep.ack if rep is not None and rep.ack >= 0 else 0)
        return low

    def in_sync(self) -> int:
        """How many brokers the set holds (the master counts)."""
        return len(self.members)
