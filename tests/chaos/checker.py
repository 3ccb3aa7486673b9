"""The offline checker of a chaos run: the history against the stopped brokers' commit logs and epoch files.

``check(history, brokers, topic, ...)`` reads every broker's data folder (``tests.ha.cluster.read_log``), and
checks the invariants of reference/controller-ha.md §2:

1. ``no_acked_loss``: every ``ok`` send is in the final master's log (and in the drain, when there is one), at
   the (queue, offset) its SendResult named.
2. ``no_phantoms``: every payload stored or read was invoked by a producer; every record's body CRC is intact.
3. ``queue_integrity``: per queue, offsets contiguous from the first, one message per offset, on every broker;
   each replica's per-queue sequence equals (``identical``) or is a prefix of (``prefix``) the master's.
4. ``no_divergence``: each replica's commit log (its valid region) is a byte prefix of the master's; epoch files
   well ordered and agreeing on shared entries; no replica holds data of an epoch the master does not know.
5. ``no_dirty_reads``: every message a reader (or the drain) saw is in the final master's log at the same
   (queue, offset) with the same payload.
6. ``one_master_per_epoch``: of the (epoch, master) observations the runner sampled, no epoch has two masters.
7. ``refused_not_stored``: no ``fail`` send (refused before storing) is in any log.

Counts: acknowledged / failed / indeterminate sends, indeterminate found / not found, duplicates (allowed, a payload
stored more than once), ok sends at another (queue, offset) than acknowledged (a violation of 1), reads, drain.
"""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cometmq.protocol.message import MessageRecord, body_crc
from cometmq.store.epoch_file import EpochEntry
from tests.chaos.history import Op, Seen, load
from tests.ha.cluster import BrokerLog, read_log

MAX_DETAILS = 20
INVARIANTS = ("no_acked_loss", "no_phantoms", "queue_integrity", "no_divergence", "no_dirty_reads",
              "one_master_per_epoch", "refused_not_stored")


@dataclass
class FinalBroker:
    """One broker of the group after the run, stopped. Give ``data_dir`` (read with ``read_log``) or ``log``
    (tests); ``epochs`` overrides the epoch file read from the folder."""

    name: str
    data_dir: Path | None = None
    master: bool = False
    log: BrokerLog | None = None
    epochs: Sequence[tuple[int, int]] | None = None


@dataclass
class InvariantResult:
    name: str
    checked: int = 0
    violation_count: int = 0
    violations: list[str] = field(default_factory=list)
    skipped: str | None = None  # why it could not be checked (not a failure)

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def fail(self, msg: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_DETAILS:
            self.violations.append(msg)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked": self.checked, "violations": self.violation_count,
                "details": self.violations, **({"skipped": self.skipped} if self.skipped else {})}


@dataclass
class Result:
    invariants: dict[str, InvariantResult]
    counts: dict[str, int]
    replicas: dict[str, str]  # replica name -> identical | prefix | diverged
    master: str
    errors: list[str] = field(default_factory=list)  # logs that could not be read (also counted as violations)

    @property
    def ok(self) -> bool:
        return all(inv.ok for inv in self.invariants.values())

    def failed(self) -> list[str]:
        return [name for name, inv in self.invariants.items() if not inv.ok]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "master": self.master, "invariants": {k: v.to_json() for k, v in
                                                                    self.invariants.items()},
                "counts": self.counts, "replicas": self.replicas, "errors": self.errors}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)

    def report(self) -> str:
        lines = [f"chaos check: {'PASS' if self.ok else 'FAIL'} (final master {self.master})"]
        for name, inv in self.invariants.items():
            state = "skip" if inv.skipped and inv.ok else ("ok" if inv.ok else "FAIL")
            extra = f" ({inv.skipped})" if inv.skipped else ""
            lines.append(f"  {state:4} {name}: {inv.checked} checked, {inv.violation_count} violations{extra}")
            lines += [f"         - {v}" for v in inv.violations[:5]]
            if inv.violation_count > 5:
                lines.append(f"         ... {inv.violation_count - 5} more")
        c = self.counts
        lines.append(f"  sends: {c['invoked']} invoked, {c['ok']} ok, {c['fail']} fail, {c['info']} indeterminate "
                     f"({c['info_found']} found, {c['info_not_found']} not found); {c['duplicates']} duplicated "
                     f"payloads; {c['ok_lost']} ok lost, {c['ok_offset_mismatch']} ok at another offset")
        lines.append(f"  reads: {c['read_messages']} messages seen, {c['drained']} drained; master log "
                     f"{c['master_records']} records")
        if self.replicas:
            lines.append("  replicas: " + ", ".join(f"{k} {v}" for k, v in self.replicas.items()))
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


# -- reading ------------------------------------------------------------------------------------------------------
def payload_of(rec: MessageRecord) -> str:
    body = rec.body
    if rec.sys_flag & 1:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass
    return body.decode("utf-8", errors="replace")


@dataclass
class _Log:
    name: str
    master: bool
    log: BrokerLog
    epochs: list[EpochEntry]
    topic_records: list[MessageRecord]
    per_queue: dict[int, list[MessageRecord]]


def _empty_log() -> BrokerLog:
    return BrokerLog(b"", 0, [], [], 0)


def _read(b: FinalBroker, topic: str, errors: list[str], phantoms: InvariantResult) -> _Log:
    log = b.log
    if log is None:
        if b.data_dir is None:
            raise ValueError(f"broker {b.name}: give data_dir or log")
        try:
            log = read_log(b.data_dir, check_crc=False)
        except Exception as exc:  # a segment gap, a bad epoch file, a record that does not decode
            errors.append(f"{b.name}: cannot read {b.data_dir}: {type(exc).__name__}: {exc}")
            log = _empty_log()
    for rec in log.records:
        phantoms.checked += 1
        if rec.body_crc is not None and rec.body_crc != body_crc(rec.body):
            phantoms.fail(f"{b.name}: body CRC mismatch in the record at {rec.physical_offset} "
                          f"({rec.topic}/{rec.queue_id}@{rec.queue_offset})")
    epochs = [EpochEntry(e, s) for e, s in b.epochs] if b.epochs is not None else list(log.epochs)
    recs = [r for r in log.records if r.topic == topic]
    return _Log(b.name, b.master, log, epochs, recs, log.per_queue(topic))


def _first_difference(a: bytes, b: bytes, n: int, chunk: int = 1 << 16) -> int:
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        if a[start:end] != b[start:end]:
            return next(i for i in range(start, end) if a[i] != b[i])
    return n


# -- the check ----------------------------------------------------------------------------------------------------
def check(history: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Sequence[Op],
          brokers: Sequence[FinalBroker], topic: str, *, drained: Sequence[Seen] | None = None,
          master_observations: Iterable[tuple[int, int | str]] = ()) -> Result:
    """Check a run. ``history``: the JSONL file(s) (or ops already loaded); ``brokers``: every broker of the group,
    stopped, exactly one flagged ``master`` (the final master); ``drained``: the final drain (None: the history's
    ``drain`` ops, if any); ``master_observations``: (epoch, master broker id or name) pairs the runner sampled."""
    if isinstance(history, list | tuple) and all(isinstance(o, Op) for o in history):
        ops: list[Op] = [o for o in history if isinstance(o, Op)]
    else:
        ops = load(history)  # type: ignore[arg-type]
    masters = [b for b in brokers if b.master]
    if len(masters) != 1:
        raise ValueError(f"exactly one final master expected, got {[b.name for b in masters]}")
    inv = {name: InvariantResult(name) for name in INVARIANTS}
    errors: list[str] = []
    logs = [_read(b, topic, errors, inv["no_phantoms"]) for b in brokers]
    for err in errors:
        inv["no_divergence"].fail(f"unreadable log: {err}")
    master = next(lg for lg in logs if lg.master)
    replicas = [lg for lg in logs if not lg.master]

    # -- the history -------------------------------------------------------------------------------------------
    final: dict[str, Op] = {}  # payload -> its send's completion
    invoked: set[str] = set()
    reads: list[tuple[str, Seen]] = []
    drain_ops: list[Seen] = []
    for op in ops:
        if op.f == "send" and op.value is not None:
            if op.type == "invoke":
                invoked.add(op.value)
            else:
                final[op.value] = op
        elif op.f == "read" and op.type == "ok":
            reads += [(op.proc, m) for m in op.messages]
        elif op.f == "drain" and op.type == "ok":
            drain_ops += op.messages
    if drained is None and drain_ops:
        drained = drain_ops

    master_by_pos: dict[tuple[int, int], str] = {(r.queue_id, r.queue_offset): payload_of(r)
                                                 for r in master.topic_records}
    master_payloads = Counter(payload_of(r) for r in master.topic_records)
    stored_anywhere: set[str] = set(master_payloads)
    for lg in replicas:
        stored_anywhere.update(payload_of(r) for r in lg.topic_records)

    counts: dict[str, int] = Counter()
    counts["invoked"] = len(invoked)
    counts["master_records"] = len(master.topic_records)
    counts["read_messages"] = len(reads)
    counts["drained"] = len(drained) if drained is not None else 0

    # 1. no acknowledged loss; 7. refused sends not stored; the counts
    lost = inv["no_acked_loss"]
    drained_set = {m.payload for m in drained} if drained is not None else None
    if drained is None:
        lost.skipped = "no drain: checked against the master's log only"
    refused = inv["refused_not_stored"]
    for payload in invoked:
        done = final.get(payload)
        kind = done.type if done is not None else "info"  # never completed: indeterminate
        counts[kind] += 1
        in_master = payload in master_payloads
        if kind == "ok":
            assert done is not None
            lost.checked += 1
            if not in_master:
                counts["ok_lost"] += 1
                lost.fail(f"acknowledged {payload} ({done.queue_id}@{done.queue_offset}, acked at t={done.t:.3f}) is "
                          f"not in the master's log")
            elif done.queue_id is not None and done.queue_offset is not None and done.queue_offset >= 0 and \
                    master_by_pos.get((done.queue_id, done.queue_offset)) != payload:
                counts["ok_offset_mismatch"] += 1
                lost.fail(f"acknowledged {payload} at {done.queue_id}@{done.queue_offset}, the master holds "
                          f"{master_by_pos.get((done.queue_id, done.queue_offset))!r} there")
            if drained_set is not None and payload not in drained_set:
                counts["ok_not_drained"] += 1
                lost.fail(f"acknowledged {payload} is not in the drain")
        elif kind == "info":
            counts["info_found" if in_master else "info_not_found"] += 1
        elif kind == "fail":
            refused.checked += 1
            if payload in stored_anywhere:
                refused.fail(f"{payload} was refused ({done.status if done else ''}: "
                             f"{(done.error or '')[:120] if done else ''}) but is stored")
    for payload in final.keys() - invoked:
        lost.fail(f"{payload} completed without an invoke (a broken history)")
    dups = {p: n for p, n in master_payloads.items() if n > 1}
    counts["duplicates"] = len(dups)
    counts["duplicate_records"] = sum(n - 1 for n in dups.values())

    # 2. no phantoms
    ph = inv["no_phantoms"]
    for lg in logs:
        for r in lg.topic_records:
            p = payload_of(r)
            if p not in invoked:
                ph.fail(f"{lg.name} stores {p!r} at {r.queue_id}@{r.queue_offset}, never sent")
    for source, seen in [*reads, *(("drain", m) for m in drained or ())]:
        ph.checked += 1
        if seen.payload not in invoked:
            ph.fail(f"{source} read {seen.payload!r} at {seen.queue_id}@{seen.queue_offset} from "
                    f"{seen.broker_addr}, never sent")

    # 3. queue integrity
    qi = inv["queue_integrity"]
    replica_state: dict[str, str] = {}
    for lg in logs:
        for q, recs in sorted(lg.per_queue.items()):
            qi.checked += len(recs)
            first = recs[0].queue_offset
            for i, r in enumerate(recs):
                if r.queue_offset != first + i:
                    prev = recs[i - 1].queue_offset if i else None
                    what = "twice" if r.queue_offset == prev else f"after {prev}"
                    qi.fail(f"{lg.name} queue {q}: offset {r.queue_offset} {what} (expected {first + i})")
                    break
    master_seq = {q: [(r.queue_offset, payload_of(r)) for r in recs] for q, recs in master.per_queue.items()}
    for lg in replicas:
        state = "identical"
        for q in sorted(set(lg.per_queue) | set(master_seq)):
            mine = [(r.queue_offset, payload_of(r)) for r in lg.per_queue.get(q, [])]
            theirs = master_seq.get(q, [])
            if mine == theirs:
                continue
            if theirs[:len(mine)] == mine:
                state = "prefix"
                continue
            state = "diverged"
            k = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), len(theirs))
            qi.fail(f"replica {lg.name} queue {q} is not a prefix of the master's: at index {k} it holds "
                    f"{mine[k] if k < len(mine) else None}, the master {theirs[k] if k < len(theirs) else None}")
        replica_state[lg.name] = state

    # 4. no divergence: byte prefix, epoch files
    dv = inv["no_divergence"]
    mlog = master.log
    for lg in replicas:
        dv.checked += 1
        end = lg.log.end
        if end > mlog.end:
            dv.fail(f"replica {lg.name} ends at {end}, past the master's end {mlog.end}")
            replica_state[lg.name] = "diverged"
        n = min(end, mlog.end)
        if lg.log.data[:n] != mlog.data[:n]:
            at = _first_difference(lg.log.data, mlog.data, n)
            by_pos = {r.physical_offset: r for r in mlog.records}
            rec = next((r for r in reversed(lg.log.records) if r.physical_offset <= at), None)
            where = f" (in its record at {rec.physical_offset}: {payload_of(rec)!r}; master has " \
                    f"{payload_of(by_pos[rec.physical_offset])!r} there)" \
                if rec is not None and rec.physical_offset in by_pos else ""
            dv.fail(f"replica {lg.name}'s log differs from the master's at byte {at}{where}")
            replica_state[lg.name] = "diverged"
        elif replica_state.get(lg.name) == "identical" and end != mlog.end:
            replica_state[lg.name] = "prefix"
    for lg in logs:
        for ep, ec in zip(lg.epochs, lg.epochs[1:], strict=False):
            if ec.epoch <= ep.epoch or ec.start_offset < ep.start_offset:
                dv.fail(f"{lg.name}'s epoch file out of order: {ep.epoch}-{ep.start_offset} then "
                        f"{ec.epoch}-{ec.start_offset}")
    for i, one in enumerate(logs):
        for other in logs[i + 1:]:
            starts = {ent.epoch: ent.start_offset for ent in other.epochs}
            for ent in one.epochs:
                if ent.epoch in starts:
                    dv.checked += 1
                    if starts[ent.epoch] != ent.start_offset:
                        dv.fail(f"epoch {ent.epoch} starts at {ent.start_offset} on {one.name}, at "
                                f"{starts[ent.epoch]} on {other.name}")
    master_epochs = {ent.epoch for ent in master.epochs}
    for lg in replicas:
        ends = [ent.start_offset for ent in lg.epochs[1:]] + [lg.log.end]
        for ent, e_end in zip(lg.epochs, ends, strict=True):
            if ent.epoch not in master_epochs and e_end > ent.start_offset:
                dv.fail(f"replica {lg.name} holds {e_end - ent.start_offset} bytes of epoch {ent.epoch} "
                        f"(from {ent.start_offset}), which the master's epoch file does not know")

    # 5. no dirty reads
    dr = inv["no_dirty_reads"]
    for source, seen in [*reads, *(("drain", m) for m in drained or ())]:
        dr.checked += 1
        there = master_by_pos.get((seen.queue_id, seen.queue_offset))
        if there != seen.payload:
            dr.fail(f"{source} read {seen.payload!r} at {seen.queue_id}@{seen.queue_offset} from "
                    f"{seen.broker_addr}; the final log holds {there!r} there")

    # 6. one master per epoch
    om = inv["one_master_per_epoch"]
    by_epoch: dict[int, set[str]] = defaultdict(set)
    for epoch, who in master_observations:
        om.checked += 1
        by_epoch[int(epoch)].add(str(who))
    if not om.checked:
        om.skipped = "no observations"
    for epoch, who_set in sorted(by_epoch.items()):
        if len(who_set) > 1:
            om.fail(f"epoch {epoch} had masters {sorted(who_set)}")

    for key in ("ok", "fail", "info", "info_found", "info_not_found", "ok_lost", "ok_offset_mismatch",
                "ok_not_drained", "duplicates", "duplicate_records"):
        counts.setdefault(key, 0)
    return Result(inv, dict(counts), replica_state, master.name, errors)

