"""Durability of POP state: change records in the commit log, and periodic snapshots.

Every change of POP state (a pop handing out offsets, an ack, a change of invisible time, a move to the
DLQ) is first appended to the commit log as a message of the internal topic ``rmq_sys_POP_LOG`` — the same
idea as RocketMQ's revive topic, where checkpoints (CK) and acks are stored as messages — so it shares the
commit log's group commit, flush and crash recovery. A snapshot of all queue states, with the pop-log queue
offset it covers, is written atomically every few seconds; on start the broker loads the snapshot and
replays the pop-log records after it.

Record bodies (big-endian)::

    kind:u8 | group:str16 | topic:str16 | queueId:i32 | cursor:i64 | n:i32 | entries
    CK    entries: popTime:i64 invisibleMs:i64 ckOffset:i64 then n x (offset:i64 attempts:i32)
    ACK / DLQ entries: n x (offset:i64 popTime:i64)
    FORGET: no entries (n = 0, queueId -1, cursor 0)

``cursor`` is the queue's pop cursor after the change, so offsets skipped by a filter are covered too. FORGET drops
the state of every queue of ``topic`` (a deleted topic) or of ``group`` (a deleted group whose offsets are cleaned),
whichever of the two names is not empty: a replay past it does not bring the state back.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cometmq.broker.pop.front import POP_LOG_TOPIC
from cometmq.broker.pop.state import Delivery, QueueState
from cometmq.common.atomic_file import write_atomic

KIND_CK = 1
KIND_ACK = 2
KIND_DLQ = 3
KIND_FORGET = 4

_HEAD = struct.Struct(">iqi")  # queueId cursor n
_CK = struct.Struct(">qqq")
_CK_ENTRY = struct.Struct(">qi")
_ACK_ENTRY = struct.Struct(">qq")
_STR_LEN = struct.Struct(">H")

QueueKey = tuple[str, str, int]


class PopLogError(ValueError):
    """A pop-log record or snapshot that does not parse."""


@dataclass(frozen=True, slots=True)
class PopRecord:
    kind: int
    key: QueueKey
    cursor: int
    #: CK: (popTime, invisibleMs, ckOffset)
    ck: tuple[int, int, int] | None
    #: CK: (offset, attempts); ACK/DLQ: (offset, popTime)
    entries: tuple[tuple[int, int], ...]


def _str(value: str) -> bytes:
    raw = value.encode()
    return _STR_LEN.pack(len(raw)) + raw


def encode_ck(key: QueueKey, cursor: int, pop_time: int, invisible_ms: int, ck_offset: int,
              entries: Iterable[tuple[int, int]]) -> bytes:
    items = list(entries)
    parts = [bytes([KIND_CK]), _str(key[0]), _str(key[1]), _HEAD.pack(key[2], cursor, len(items)),
             _CK.pack(pop_time, invisible_ms, ck_offset)]
    parts.extend(_CK_ENTRY.pack(o, a) for o, a in items)
    return b"".join(parts)


def encode_done(kind: int, key: QueueKey, cursor: int, entries: Iterable[tuple[int, int]]) -> bytes:
    items = list(entries)
    parts = [bytes([kind]), _str(key[0]), _str(key[1]), _HEAD.pack(key[2], cursor, len(items))]
    parts.extend(_ACK_ENTRY.pack(o, t) for o, t in items)
    return b"".join(parts)


def encode_forget(group: str, topic: str) -> bytes:
    if not group and not topic:
        raise ValueError("a FORGET record names a group or a topic")
    return b"".join([bytes([KIND_FORGET]), _str(group), _str(topic), _HEAD.pack(-1, 0, 0)])


def decode(body: bytes | memoryview) -> PopRecord:
    try:
        buf = memoryview(body)
        kind = buf[0]
        pos = 1
        names = []
        for _ in range(2):
            (n,) = _STR_LEN.unpack_from(buf, pos)
            pos += 2
            names.append(bytes(buf[pos:pos + n]).decode())
            pos += n
        qid, cursor, count = _HEAD.unpack_from(buf, pos)
        pos += _HEAD.size
        key = (names[0], names[1], qid)
        if kind == KIND_CK:
            ck = _CK.unpack_from(buf, pos)
            pos += _CK.size
            entries = tuple(_CK_ENTRY.unpack_from(buf, pos + i * _CK_ENTRY.size) for i in range(count))
            pos += count * _CK_ENTRY.size
            rec = PopRecord(kind, key, cursor, ck, entries)
        elif kind in (KIND_ACK, KIND_DLQ):
            entries = tuple(_ACK_ENTRY.unpack_from(buf, pos + i * _ACK_ENTRY.size) for i in range(count))
            pos += count * _ACK_ENTRY.size
            rec = PopRecord(kind, key, cursor, None, entries)
        elif kind == KIND_FORGET:
            if count != 0 or not (names[0] or names[1]):
                raise PopLogError("a FORGET record names a group or a topic and has no entries")
            rec = PopRecord(kind, key, cursor, None, ())
        else:
            raise PopLogError(f"unknown pop-log record kind {kind}")
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise PopLogError(f"truncated or corrupt pop-log record: {exc}") from None
    if pos != len(buf):
        raise PopLogError(f"pop-log record has {len(buf) - pos} trailing bytes")
    return rec


def apply(states: dict[QueueKey, QueueState], rec: PopRecord) -> None:
    """Replay one record (idempotent for records already reflected in a snapshot)."""
    if rec.kind == KIND_FORGET:
        forget(states, rec.key[0], rec.key[1])
        return
    qs = states.get(rec.key)
    if qs is None:
        first = min((o for o, _ in rec.entries), default=rec.cursor)
        qs = states[rec.key] = QueueState(committed=first, cursor=first)
    if rec.kind == KIND_CK:
        assert rec.ck is not None
        pop_time, invisible_ms, ck_offset = rec.ck
        for offset, attempts in rec.entries:
            current = qs.inflight.get(offset)
            if current is not None and current.pop_time >= pop_time:
                continue  # the snapshot already has this or a later delivery
            if current is None and offset < qs.cursor and offset < qs.committed:
                continue  # done before the snapshot
            qs.deliver(offset, pop_time, invisible_ms, attempts, ck_offset)
    else:
        for offset, pop_time in rec.entries:
            qs.done(offset, pop_time)
    qs.advance_cursor(rec.cursor)


def forget(states: dict[QueueKey, QueueState], group: str, topic: str) -> list[QueueKey]:
    """Drop the states of ``topic`` (every group) or of ``group`` (every topic), as a FORGET record says; the keys
    dropped."""
    keys = [k for k in states if (not group or k[0] == group) and (not topic or k[1] == topic)]
    for k in keys:
        del states[k]
    return keys


# -- snapshots -----------------------------------------------------------------------------------------------
def save_snapshot(path: Path, log_offset: int, states: dict[QueueKey, QueueState]) -> None:
    queues = []
    for (group, topic, qid), qs in states.items():
        inflight = [[o, d.pop_time, d.visible_at, d.attempts, d.ck_offset] for o, d in qs.inflight.items()]
        queues.append({"g": group, "t": topic, "q": qid, "committed": qs.committed, "cursor": qs.cursor,
                       "inflight": inflight})
    write_atomic(path, json.dumps({"version": 1, "logOffset": log_offset, "queues": queues},
                                  separators=(",", ":")).encode())


def load_snapshot(path: Path) -> tuple[int, dict[QueueKey, QueueState]]:
    """(pop-log queue offset covered, states); (0, {}) when there is no snapshot."""
    if not path.exists():
        return 0, {}
    try:
        raw = json.loads(path.read_bytes())
        states: dict[QueueKey, QueueState] = {}
        for q in raw["queues"]:
            qs = QueueState(committed=int(q["committed"]), cursor=int(q["cursor"]))
            for o, pop_time, visible_at, attempts, ck in q["inflight"]:
                qs.deliver(int(o), int(pop_time), int(visible_at) - int(pop_time), int(attempts), int(ck))
            qs.committed = qs.consume_offset()
            states[(str(q["g"]), str(q["t"]), int(q["q"]))] = qs
        return int(raw["logOffset"]), states
    except (ValueError, KeyError, TypeError) as exc:
        raise PopLogError(f"POP snapshot {path} is unreadable: {exc}") from None


__all__ = ["KIND_ACK", "KIND_CK", "KIND_DLQ", "KIND_FORGET", "POP_LOG_TOPIC", "Delivery", "PopLogError", "PopRecord",
           "apply", "decode", "encode_ck", "encode_done", "encode_forget", "forget", "load_snapshot", "save_snapshot"]
