"""The election policy, as RocketMQ's DefaultElectPolicy: a pure function of the group and the liveness evidence.

Both the request handler (to propose an ElectMaster event) and ``apply`` (to check the event again) call
``elect`` on the same inputs, so every node reaches the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .heartbeats import LiveInfo


def alive_ids(evidence: Iterable[LiveInfo], now_ms: int) -> frozenset[int]:
    """The broker ids that ``evidence`` shows alive at ``now_ms``."""
    return frozenset(info.broker_id for info in evidence if info.alive_at(now_ms))


def _rank(info: LiveInfo) -> tuple[int, int, int, int]:
    # epoch desc, max offset desc, election priority asc; the id breaks ties so the answer never depends on order
    return (-info.epoch, -info.max_offset, info.priority, info.broker_id)


def _newest_last(info: LiveInfo) -> tuple[int, LiveInfo]:
    return (info.last_seen_ms, info)


def _try_elect(candidates: frozenset[int], live: Mapping[int, LiveInfo], old_master: int | None,
               designate: int | None) -> int | None:
    alive = frozenset(i for i in candidates if i in live)
    if not alive:
        return None
    if old_master in alive and designate in (None, old_master):
        return old_master
    if designate is not None:
        return designate if designate in alive else None
    return min((live[i] for i in alive), key=_rank).broker_id


def elect(sync_state_set: frozenset[int], replicas: frozenset[int], old_master: int | None,
          evidence: Iterable[LiveInfo], now_ms: int, *, unclean: bool = False,
          designate: int | None = None) -> int | None:
    """The broker id to be master, or None when no candidate is alive.

    Candidates are the members of ``sync_state_set`` that are registered (in ``replicas``) and alive at ``now_ms``;
    only when none qualifies and ``unclean`` is set, every alive registered replica. A live old master that is still
    a candidate stays; a ``designate``d broker is taken only if it is a candidate (else this tier elects nobody);
    otherwise the best by (epoch desc, max offset desc, priority asc) from the brokers' heartbeats.
    """
    # sorted: should a broker appear twice, the same record wins whatever the order (the newest, by last_seen)
    live = {info.broker_id: info for info in sorted(evidence, key=_newest_last)
            if info.alive_at(now_ms) and info.broker_id in replicas}
    chosen = _try_elect(sync_state_set & replicas, live, old_master, designate)
    if chosen is None and unclean:
        chosen = _try_elect(replicas, live, old_master, designate)
    return chosen
