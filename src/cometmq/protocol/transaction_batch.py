"""cometmq's batched transaction extensions (RocketMQ has none of them; docs/transactions.md, "Batches"):

Half batch
    A SEND_BATCH_MESSAGE (or a batch SEND_MESSAGE/_V2) with the request field ``cometmqHalfBatch=true``
    (:data:`HALF_BATCH_FIELD`) whose every item is transactional (``TRAN_MSG=true``; the header's sys flag may say
    PREPARED too). The broker stores the items as halves in one append and answers as for a batch: the offset msg
    ids comma-separated and the first half's queue offset (the others follow it). Without the field a
    transactional batch is refused MESSAGE_ILLEGAL, as RocketMQ refuses it, so RocketMQ clients see no change.

END_TRANSACTION_BATCH (31037)
    Extension fields ``producerGroup`` (every half must be of that group) and, optional, ``topic`` (every half
    must be of that topic: NO_PERMISSION for one that is not; with ACLs on, PUB on it, or an admin account when
    the request names no topic); the body is JSON
    ``{"entries": [[commitLogOffset, tranStateTableOffset, commitOrRollback, msgId], ...]}``. Each entry is
    decided as a single END_TRANSACTION would decide it. The answer is SUCCESS with the body
    ``{"results": [[code, remark], ...]}`` in entry order (code 0: done, or nothing to do, the remark says which;
    4 TRANSACTION_FAILED: a decision contradicting an earlier one; 1 SYSTEM_ERROR: no such half, another group's, a
    bad state; 10/12: stored but not durable in time). A request the broker cannot read at all is refused as a
    whole (nothing decided).

    A *range* entry has a fifth element, ``count`` (>= 1): the halves at the half-queue offsets
    ``tranStateTableOffset`` … ``+ count - 1`` (a half batch's, stored in one append), the first at
    ``commitLogOffset``; ``msgId`` names the first. It decides each of them as a single entry would (the same
    checks per half) and answers ``[code, remark, alreadyResolved]``: code 0 when every half is decided now or was
    before (``alreadyResolved`` of them before), else the first failure's code and a remark naming the half and
    how many failed. A request names at most :data:`MAX_END_ENTRIES` halves, ranges counted by their halves.

Packed half
    One transactional message (``TRAN_MSG=true``) with the property ``cometmqPacked=<n>`` (:data:`PACKED_PROPERTY`):
    its body is a batch (SEND_BATCH_MESSAGE's body layout) of ``n`` messages, not compressed, none with a delay or
    timer property. It is sent as a SEND_BATCH_MESSAGE (or a batch SEND_MESSAGE/_V2) with the request field
    ``cometmqHalfBatch=packed`` (:data:`PACKED_HALF`), the header's properties the half's own, the batch body its
    body, so that a broker without the extension refuses it (RocketMQ refuses a transactional batch; an older
    cometmq a ``cometmqHalfBatch`` that is not a boolean) rather than storing it as a plain half whose commit would
    deliver the batch as one message; the field without the property is refused MESSAGE_ILLEGAL. A single send with
    the property is taken the same way. The broker checks the body when it is sent
    (MESSAGE_ILLEGAL, nothing stored, when it does not hold ``n`` such messages) and stores it as one half: one
    record, one half-queue unit, one pending transaction, however many messages it holds. A COMMIT delivers its
    ``n`` messages to the real topic and queue, each as a half of its own would have been delivered (its own
    properties, the COMMIT sys flag), in one append with the op record; a ROLLBACK drops them all. It is decided
    by a single entry (END_TRANSACTION, or END_TRANSACTION_BATCH without ``count``); a range entry decides the
    packed halves in it one by one, the same way. A half batch's item may not carry the property.

Pure codecs: bytes in, values out; :class:`RemoteProtocolError` for what a peer got wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from cometmq.protocol.errors import RemoteProtocolError

#: the send request field that asks for a batch of halves
HALF_BATCH_FIELD = "cometmqHalfBatch"
#: the property of a packed half: how many messages its body holds
PACKED_PROPERTY = "cometmqPacked"
#: :data:`HALF_BATCH_FIELD`'s value on a packed half sent as a batch request (what a broker without the extension
#: refuses: RocketMQ refuses a transactional batch, an older cometmq a field that is not a boolean)
PACKED_HALF = "packed"
#: entries of one END_TRANSACTION_BATCH at most
MAX_END_ENTRIES = 65_536
_STATES = (0, 8, 12)


@dataclass(frozen=True, slots=True)
class EndEntry:
    """One decision: the half (as END_TRANSACTION names it) and COMMIT 8 / ROLLBACK 12 / UNKNOWN 0."""

    commit_log_offset: int
    tran_state_table_offset: int
    commit_or_rollback: int
    msg_id: str = ""
    #: halves from this one on (a range entry when > 1)
    count: int = 1


@dataclass(frozen=True, slots=True)
class EndOutcome:
    """What became of one entry: a response code and its remark."""

    code: int
    remark: str = ""
    #: of a range entry: how many of its halves were decided before (-1: a single entry's outcome)
    already: int = -1

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def already_resolved(self) -> bool:
        """Decided before (the same decision): nothing was written for it now (of a range: for some of its halves,
        :attr:`resolved_before` says how many)."""
        if self.already >= 0:
            return self.code == 0 and self.already > 0
        return self.code == 0 and "already resolved" in self.remark

    @property
    def resolved_before(self) -> int:
        """How many halves the entry named were decided before: a range's count, else 1 or 0."""
        return self.already if self.already >= 0 else int(self.already_resolved)


def _int(v: object, what: str) -> int:
    if type(v) is not int or not 0 <= v < 1 << 63:
        raise RemoteProtocolError(f"{what} must be a non-negative int64, not {v!r:.40}")
    return v


def _doc(body: bytes | bytearray | memoryview, key: str) -> list[object]:
    try:
        doc = json.loads(bytes(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise RemoteProtocolError(f'the body must be a JSON object with a list "{key}"')
    items: list[object] = doc[key]
    return items


def encode_end_entries(entries: Sequence[EndEntry]) -> bytes:
    return json.dumps({"entries": [
        [e.commit_log_offset, e.tran_state_table_offset, e.commit_or_rollback, e.msg_id] if e.count == 1 else
        [e.commit_log_offset, e.tran_state_table_offset, e.commit_or_rollback, e.msg_id, e.count]
        for e in entries]}, separators=(",", ":")).encode()


def decode_end_entries(body: bytes | bytearray | memoryview) -> list[EndEntry]:
    return [EndEntry(*fields) for fields in decode_end_entry_fields(body)]


#: one past the largest offset an entry may name
_OFFSET_END = 1 << 63


def decode_end_entry_fields(body: bytes | bytearray | memoryview) -> list[tuple[int, int, int, str, int]]:
    """:func:`decode_end_entries` as plain ``(commitLogOffset, tranStateTableOffset, commitOrRollback, msgId,
    count)`` tuples (what the broker reads: no object per entry); the same checks, the same errors."""
    items = _doc(body, "entries")
    if len(items) > MAX_END_ENTRIES:
        raise RemoteProtocolError(f"{len(items)} entries: at most {MAX_END_ENTRIES} in one END_TRANSACTION_BATCH")
    out: list[tuple[int, int, int, str, int]] = []
    add = out.append
    halves = 0
    for n, item in enumerate(items):
        # One test for an entry as a peer writes it (JSON makes exact types); any other is checked in order by
        # _entry_fields, for the error to name what is wrong.
        if type(item) is list and len(item) == 4:
            offset, table_offset, state, msg_id = item
            if (type(msg_id) is str and type(state) is int and state in _STATES and type(offset) is int
                    and 0 <= offset < _OFFSET_END and type(table_offset) is int and 0 <= table_offset < _OFFSET_END):
                add((offset, table_offset, state, msg_id, 1))
                halves += 1
                continue
        fields = _entry_fields(n, item)
        halves += fields[4]
        add(fields)
    if halves > MAX_END_ENTRIES:
        raise RemoteProtocolError(f"{halves} halves: at most {MAX_END_ENTRIES} in one END_TRANSACTION_BATCH (a "
                                  "range entry counts its halves)")
    return out


def _entry_fields(n: int, item: object) -> tuple[int, int, int, str, int]:
    """Entry ``n`` checked field by field: its fields, or the error that names what is wrong."""
    if not isinstance(item, list) or len(item) not in (4, 5) or not isinstance(item[3], str):
        raise RemoteProtocolError(f"entry {n} must be [commitLogOffset, tranStateTableOffset, commitOrRollback,"
                                  f" msgId] or with a fifth element, count, not {item!r:.80}")
    state = item[2]
    if type(state) is not int or state not in _STATES:
        raise RemoteProtocolError(f"entry {n}: commitOrRollback {state!r} is not 0, 8 or 12")
    count = 1
    if len(item) == 5:
        count = item[4]
        if type(count) is not int or not 1 <= count <= MAX_END_ENTRIES:
            raise RemoteProtocolError(f"entry {n}: count {count!r:.40} is not an int from 1 to {MAX_END_ENTRIES}")
        if _int(item[1], f"entry {n}: tranStateTableOffset") + count > _OFFSET_END:
            raise RemoteProtocolError(f"entry {n}: tranStateTableOffset + count is past the largest offset")
    return (_int(item[0], f"entry {n}: commitLogOffset"), _int(item[1], f"entry {n}: tranStateTableOffset"), state,
            item[3], count)


def encode_end_outcomes(outcomes: Sequence[EndOutcome]) -> bytes:
    """``{"results": [[code, remark], ...]}`` (compact JSON; a range entry's ``[code, remark, already]``). Each
    distinct outcome object is encoded once: the broker's answer shares one between the entries of an append, and
    JSON-encoding the whole list costs about a microsecond an entry."""
    parts: dict[int, tuple[EndOutcome, str]] = {}  # by id, the outcome kept: no id is reused meanwhile
    out: list[str] = []
    add = out.append
    for o in outcomes:
        known = parts.get(id(o))
        if known is None:
            fields: list[object] = [o.code, o.remark] if o.already < 0 else [o.code, o.remark, o.already]
            known = parts[id(o)] = (o, json.dumps(fields, separators=(",", ":")))
        add(known[1])
    return ('{"results":[' + ",".join(out) + "]}").encode()


def decode_end_outcomes(body: bytes | bytearray | memoryview) -> list[EndOutcome]:
    out: list[EndOutcome] = []
    for n, item in enumerate(_doc(body, "results")):
        if (not isinstance(item, list) or len(item) not in (2, 3) or type(item[0]) is not int
                or not isinstance(item[1], str) or (len(item) == 3 and (type(item[2]) is not int or item[2] < 0))):
            raise RemoteProtocolError(f"result {n} must be [code, remark] or [code, remark, alreadyResolved], not "
                                      f"{item!r:.80}")
        out.append(EndOutcome(item[0], item[1], item[2] if len(item) == 3 else -1))
    return out
