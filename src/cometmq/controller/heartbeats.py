"""Broker liveness, kept per controller node and never replicated (as RocketMQ's DLedger-mode controller).

Brokers send BROKER_HEARTBEAT (904) to every controller once a second. Each node keeps the last one per broker
here; only the leader's table matters for decisions, and it enters a decision as *evidence*: the handlers in
``state.py`` copy the records they relied on (``LiveInfo``) and the decision time into the event, so applying the
event checks liveness again, deterministically, on every node. Pure: time is passed in, nothing sleeps.

Keyed by ``BrokerIdentity`` (cluster, broker name, broker id) as RocketMQ 5.1+ does since broker ids are persistent:
elections are made by id, and an address may change across restarts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

#: controllerHeartBeatTimeoutMills / a broker's heartbeatTimeoutMillis (RocketMQ's default)
DEFAULT_TIMEOUT_MS = 10_000
#: a broker that sends no electionPriority ranks last among equals (RocketMQ: Integer.MAX_VALUE)
LOWEST_PRIORITY = 2**31 - 1


@dataclass(frozen=True, order=True)
class BrokerIdentity:
    cluster: str
    broker_name: str
    broker_id: int


@dataclass(frozen=True, order=True)
class LiveInfo:
    """One broker's last heartbeat. ``epoch`` and ``max_offset`` are those of its log (-1 when unknown)."""

    broker_id: int
    address: str
    last_seen_ms: int
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    priority: int = LOWEST_PRIORITY

    def alive_at(self, now_ms: int) -> bool:
        """RocketMQ's rule: alive while ``last + timeout >= now``."""
        return self.last_seen_ms + self.timeout_ms >= now_ms

    def to_json(self) -> dict[str, int | str]:
        return {"id": self.broker_id, "addr": self.address, "seen": self.last_seen_ms, "timeout": self.timeout_ms,
                "epoch": self.epoch, "max": self.max_offset, "confirm": self.confirm_offset, "prio": self.priority}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> LiveInfo:
        return cls(broker_id=_int(d["id"]), address=str(d["addr"]), last_seen_ms=_int(d["seen"]),
                   timeout_ms=_int(d["timeout"]), epoch=_int(d["epoch"]), max_offset=_int(d["max"]),
                   confirm_offset=_int(d["confirm"]), priority=_int(d["prio"]))


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v


class HeartbeatTable:
    """The last heartbeat of every broker this controller node heard from."""

    def __init__(self, default_timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.default_timeout_ms = default_timeout_ms
        self._table: dict[BrokerIdentity, LiveInfo] = {}
        #: each broker's HA address as its heartbeats state it (haServerAddr; not election evidence)
        self._ha: dict[BrokerIdentity, str] = {}

    def on_heartbeat(self, who: BrokerIdentity, address: str, now_ms: int, *, epoch: int | None = None,
                     max_offset: int | None = None, confirm_offset: int | None = None,
                     timeout_ms: int | None = None, priority: int | None = None,
                     ha_address: str | None = None) -> bool:
        """Record a heartbeat; True when the broker was not known (or had expired) before.

        Unlike RocketMQ, which keeps the highest (epoch, maxOffset) it ever saw, the latest report wins: a broker
        that truncated its log must not keep ranking by offsets it no longer has. Heartbeats of one broker come
        over one connection, in order.
        """
        prev = self._table.get(who)
        if ha_address:
            self._ha[who] = ha_address
        self._table[who] = LiveInfo(
            broker_id=who.broker_id,
            address=address,
            last_seen_ms=now_ms,
            timeout_ms=self.default_timeout_ms if timeout_ms is None or timeout_ms <= 0 else timeout_ms,
            epoch=-1 if epoch is None else epoch,
            max_offset=-1 if max_offset is None else max_offset,
            confirm_offset=-1 if confirm_offset is None else confirm_offset,
            priority=LOWEST_PRIORITY if priority is None else priority,
        )
        return prev is None or not prev.alive_at(now_ms)

    def touch(self, who: BrokerIdentity, now_ms: int) -> None:
        """Any request from a known broker proves it alive; keeps its last reported offsets."""
        prev = self._table.get(who)
        if prev is not None:
            self._table[who] = replace(prev, last_seen_ms=max(prev.last_seen_ms, now_ms))

    def ha_address(self, who: BrokerIdentity) -> str | None:
        """The HA address ``who`` last stated; it goes with the broker's record (a broker back states it again)."""
        return self._ha.get(who)

    def remove(self, who: BrokerIdentity) -> LiveInfo | None:
        """Forget a broker at once (its connection closed: RocketMQ elects without waiting for the timeout)."""
        self._ha.pop(who, None)
        return self._table.pop(who, None)

    def remove_address(self, address: str) -> list[BrokerIdentity]:
        """Forget every broker last heard from ``address`` (the wiring knows a closed channel by its peer)."""
        gone = [who for who, info in self._table.items() if info.address == address]
        for who in gone:
            self.remove(who)
        return gone

    def expire(self, now_ms: int) -> list[BrokerIdentity]:
        """Drop and return the brokers whose timeout passed (RocketMQ's scanNotActiveBroker)."""
        gone = sorted(who for who, info in self._table.items() if not info.alive_at(now_ms))
        for who in gone:
            self.remove(who)
        return gone

    def get(self, who: BrokerIdentity) -> LiveInfo | None:
        return self._table.get(who)

    def is_alive(self, who: BrokerIdentity, now_ms: int) -> bool:
        info = self._table.get(who)
        return info is not None and info.alive_at(now_ms)

    def group(self, cluster: str, broker_name: str) -> tuple[LiveInfo, ...]:
        """The records of one broker group, by broker id: the evidence a decision about the group carries."""
        return tuple(info for who, info in sorted(self._table.items())
                     if who.cluster == cluster and who.broker_name == broker_name)

    def __iter__(self) -> Iterator[tuple[BrokerIdentity, LiveInfo]]:
        return iter(sorted(self._table.items()))

    def __len__(self) -> int:
        return len(self._table)
