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

    # -- links ------------------------------------------------------------------------------------------------
    def connected(self, replica_id: int, now: int) -> None:
        """A replica's link completed its handshake: its acks count from now on."""
        self.replicas.setdefault(replica_id, _Replica(caught_up_at=now))

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
        """A replica reports it has the log up to ``offset``. True when the set grew (it joined)."""
        rep = self.replicas.get(replica_id)
        if rep is None:
            return False  # not a handshaken replica: ignored
        rep.ack = max(rep.ack, offset)
        if rep.ack >= rep.target or rep.ack >= master_max:
            rep.caught_up_at = now
        if replica_id not in self.members and rep.ack >= self.confirm_offset(master_max) \
                and rep.ack >= self.epoch_start:
            self.members = self.members | {replica_id}
            self.epoch += 1
            return True
        return False

    def shrink(self, now: int) -> frozenset[int]:
        """Drop the members that have not caught up for ``max_not_catchup_ms``; returns who left."""
        gone = frozenset(rid for rid in self.members if rid != MASTER_ID and (
            rid not in self.replicas or now - self.replicas[rid].caught_up_at > self.max_not_catchup_ms))
        if gone:
            self.members = self.members - gone
            self.epoch += 1
        return gone

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
