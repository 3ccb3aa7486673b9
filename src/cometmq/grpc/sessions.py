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
#: what one Telemetry stream holds for a client that does not read it (commands, and their bytes): past either, the
#: endpoint reads none of the client's commands (HTTP/2 flow control then holds the client's writes) and sends its
#: transaction checks to another producer, or leaves them to the broker's next check
OUTBOX_MAX = 64
OUTBOX_MAX_BYTES = 8 << 20


class Outbox:
    """The commands waiting to go out on one Telemetry stream, in order, then ``None`` once it is to end. Bounded
    (``OUTBOX_MAX``, ``OUTBOX_MAX_BYTES``): the answers to a client's commands wait for room (:meth:`put`), a
    command of the endpoint's own is refused when there is none (:meth:`offer`). The end mark always goes in."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()
        self._bytes = 0
        self._room = asyncio.Event()

    def __len__(self) -> int:
        return self._queue.qsize()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def has_room(self) -> bool:
        return self._queue.qsize() < OUTBOX_MAX and self._bytes < OUTBOX_MAX_BYTES

    def offer(self, command: spb.TelemetryCommand) -> bool:
        """Queue ``command`` if there is room; False (nothing queued) otherwise."""
        if not self.has_room():
            return False
        self._bytes += command.ByteSize()
        self._queue.put_nowait(command)
        return True

    async def put(self, command: spb.TelemetryCommand) -> None:
        """Queue ``command`` once there is room (the stream took what was waiting)."""
        while not self.has_room():
            self._room.clear()
            await self._room.wait()
        self._bytes += command.ByteSize()
        self._queue.put_nowait(command)

    def close(self) -> None:
        """The stream is to end after what is queued."""
        self._queue.put_nowait(None)

    async def get(self) -> spb.TelemetryCommand | None:
        item = await self._queue.get()
        if item is not None:
            self._bytes -= item.ByteSize()
        self._room.set()
        return item


@dataclass
class ClientSession:
    client_id: str
    client_type: int = 0
    group: str | None = None
    #: topics a producer publishes (from its Settings)
    topics: set[str] = field(default_factory=set)
    #: whether the consumer group ``fifo_group`` consumes in order, as answered in the client's Settings reply for it
    #: (None: no such reply yet; a Heartbeat names a group, not its order)
    fifo: bool = False
    fifo_group: str | None = None
    outbox: Outbox | None = None
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
            s.outbox.close()

    def publishers_all(self) -> list[ClientSession]:
        """Sessions with an open Telemetry stream."""
        return [s for s in self._sessions.values() if s.outbox is not None]

    def publishers(self, topic: str) -> list[ClientSession]:
        """Producers of ``topic`` with an open Telemetry stream."""
        return [s for s in self._sessions.values() if s.outbox is not None and topic in s.topics]

    def send_to_publisher(self, topic: str, command: spb.TelemetryCommand) -> ClientSession | None:
        """Send ``command`` to one producer of ``topic`` (any; RocketMQ picks one too) whose stream has room for it;
        None if there is none (a producer that does not read its stream is not sent more)."""
        candidates = [s for s in self.publishers(topic) if s.outbox is not None and s.outbox.has_room()]
        if not candidates:
            return None
        s = random.choice(candidates)
        assert s.outbox is not None
        s.outbox.offer(command)
        return s

    def _expire(self) -> None:
        now = time.monotonic()
        if now - self._scanned_at < EXPIRY_SCAN_S:
            return
        self._scanned_at = now
        limit = now - SESSION_EXPIRY_S
        for cid in [cid for cid, s in self._sessions.items() if s.outbox is None and s.last_seen < limit]:
            del self._sessions[cid]
