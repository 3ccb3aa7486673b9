"""The clients the endpoint knows: what each said in its Settings and Heartbeats, and the open Telemetry
stream through which the server sends it commands (transaction checks)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from cometmq.grpc.v2 import service_pb2 as spb

#: a client silent for this long (no heartbeat, no stream) is forgotten
SESSION_EXPIRY_S = 120.0
#: the silent ones are looked for at most this often (each look scans the table: once per new client id made a
#: flood of made-up ids cost quadratic time)
EXPIRY_SCAN_S = 1.0


@dataclass
class ClientSession:
    client_id: str
    client_type: int = 0
    group: str | None = None
    #: topics a producer publishes (from its Settings)
    topics: set[str] = field(default_factory=set)
    #: whether the consumer group consumes in order (as answered in the Settings reply)
    fifo: bool = False
    outbox: asyncio.Queue[spb.TelemetryCommand | None] | None = None
    last_seen: float = field(default_factory=time.monotonic)


class Sessions:
    def __init__(self) -> None:
        self._sessions: dict[str, ClientSession] = {}
        self._scanned_at = -EXPIRY_SCAN_S

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, client_id: str) -> ClientSession:
        s = self._sessions.get(client_id)
        if s is None:
            self._expire()
            s = self._sessions[client_id] = ClientSession(client_id)
        s.last_seen = time.monotonic()
        return s

    def find(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def remove(self, client_id: str) -> None:
        s = self._sessions.pop(client_id, None)
        if s is not None and s.outbox is not None:
            s.outbox.put_nowait(None)

    def publishers_all(self) -> list[ClientSession]:
        """Sessions with an open Telemetry stream."""
        return [s for s in self._sessions.values() if s.outbox is not None]

    def publishers(self, topic: str) -> list[ClientSession]:
        """Producers of ``topic`` with an open Telemetry stream."""
        return [s for s in self._sessions.values() if s.outbox is not None and topic in s.topics]

    def send_to_publisher(self, topic: str, command: spb.TelemetryCommand) -> ClientSession | None:
        """Send ``command`` to one producer of ``topic`` (any; RocketMQ picks one too); None if there is none."""
        candidates = self.publishers(topic)
        if not candidates:
            return None
        s = random.choice(candidates)
        assert s.outbox is not None
        s.outbox.put_nowait(command)
        return s

    def _expire(self) -> None:
        now = time.monotonic()
        if now - self._scanned_at < EXPIRY_SCAN_S:
            return
        self._scanned_at = now
        limit = now - SESSION_EXPIRY_S
        for cid in [cid for cid, s in self._sessions.items() if s.outbox is None and s.last_seen < limit]:
            del self._sessions[cid]
