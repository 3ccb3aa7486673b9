"""The history of a chaos run: one JSON object per line, appended and flushed as each operation starts and ends.

Every line is one event of an operation (Jepsen's model)::

    {"t": 12.345, "proc": "p0", "type": "invoke", "f": "send", "value": "run1-p0-17"}
    {"t": 12.351, "proc": "p0", "type": "ok", "f": "send", "value": "run1-p0-17", "broker_name": "broker-ha",
     "broker_addr": "127.0.0.1:4321", "queue_id": 2, "queue_offset": 40, "msg_id": "...", "attempts": 1}
    {"t": 13.002, "proc": "p1", "type": "info", "f": "send", "value": "run1-p1-9", "error": "ClientTimeoutError: ..."}
    {"t": 13.100, "proc": "r2", "type": "ok", "f": "read", "value": null, "broker_addr": "127.0.0.1:4321",
     "queue_id": 2, "messages": [{"payload": "run1-p0-17", "queue_id": 2, "queue_offset": 40,
                                  "broker_addr": "127.0.0.1:4321"}]}

``t`` is ``time.monotonic()`` of the writing process. ``type``:

- ``invoke``: a send starts (reads are logged only when they end);
- ``ok``: acknowledged (a send: SEND_OK; a read or drain: what one pull returned, in ``messages``);
- ``fail``: definitely not written (refused before storing: no route, no master, SERVICE_NOT_AVAILABLE, ...);
- ``info``: indeterminate (timeout, connection lost, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE: may be stored).

``f`` is ``send``, ``read`` (pulls during the run) or ``drain`` (the final read of every queue). A send that
never completed (the worker was killed) has an ``invoke`` and nothing else: it counts as indeterminate.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: frozenset[str] = frozenset({"invoke", "ok", "fail", "info"})


@dataclass(frozen=True, slots=True)
class Seen:
    """One message a reader (or the drain) got: its payload and where it was."""

    payload: str
    queue_id: int
    queue_offset: int
    broker_addr: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"payload": self.payload, "queue_id": self.queue_id, "queue_offset": self.queue_offset,
                "broker_addr": self.broker_addr}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Seen:
        return cls(str(d["payload"]), int(d["queue_id"]), int(d["queue_offset"]), str(d.get("broker_addr", "")))


@dataclass(slots=True)
class Op:
    """One line of the history."""

    t: float
    proc: str
    type: str  # one of OP_TYPES
    f: str  # send | read | drain
    value: str | None = None
    broker_name: str | None = None
    broker_addr: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    msg_id: str | None = None
    status: str | None = None  # a send's SendStatus name, or the error's response code name
    error: str | None = None
    attempts: int | None = None
    messages: list[Seen] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("broker_name", "broker_addr", "queue_id", "queue_offset", "msg_id", "status", "error", "attempts")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"t": round(self.t, 6), "proc": self.proc, "type": self.type, "f": self.f,
                             "value": self.value}
        for name in self._FIELDS:
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        if self.messages:
            d["messages"] = [m.to_json() for m in self.messages]
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Op:
        known = {"t", "proc", "type", "f", "value", "messages", *cls._FIELDS}
        op = cls(t=float(d["t"]), proc=str(d["proc"]), type=str(d["type"]), f=str(d["f"]),
                 value=None if d.get("value") is None else str(d["value"]),
                 messages=[Seen.from_json(m) for m in d.get("messages") or ()],
                 extra={k: v for k, v in d.items() if k not in known})
        for name in cls._FIELDS:
            if d.get(name) is not None:
                setattr(op, name, d[name])
        if op.type not in OP_TYPES:
            raise ValueError(f"unknown op type {op.type!r}")
        return op


class History:
    """Appends ops to a JSONL file, one flushed line each (``fsync`` too when asked: survives a machine crash,
    not needed for a killed worker). One writer per file: the workers of one process share one ``History``."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False,
                 clock: Any = time.monotonic) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._fsync = fsync
        self._clock = clock
        self.count = 0

    def append(self, op: Op) -> Op:
        if self._file is None:
            raise ValueError(f"history {self.path} is closed")
        self._file.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self.count += 1
        return op

    def record(self, proc: str, type: OpType, f: str, value: str | None = None, *,
               messages: Iterable[Seen] = (), **fields: Any) -> Op:
        """Append one op stamped now; ``fields`` are Op's optional fields (others go to ``extra``)."""
        known = {k: v for k, v in fields.items() if k in Op._FIELDS}
        extra = {k: v for k, v in fields.items() if k not in Op._FIELDS}
        return self.append(Op(t=self._clock(), proc=proc, type=type, f=f, value=value, messages=list(messages),
                              extra=extra, **known))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_ops(path: str | os.PathLike[str]) -> Iterator[Op]:
    """The ops of one file in file order. A torn last line (a writer killed mid-write) is skipped; a bad line
    elsewhere raises ValueError naming it."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield Op.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            if i == last:  # no newline after it: the write was cut
                return
            raise ValueError(f"{path}:{i + 1}: bad history line: {exc}") from None


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Op]:
    """Every op of one history file, or of several (one per worker process) merged by time."""
    if isinstance(paths, str | os.PathLike):
        return list(iter_ops(paths))
    ops = [op for p in paths for op in iter_ops(p)]
    ops.sort(key=lambda op: op.t)
    return ops
