"""What a server's connections may cost it: timeouts, counts and buffered bytes (issue [15]).

A ``ConnectionGuard`` belongs to one ``RemotingServer``. It admits or refuses each accepted connection (a cap
in total and per peer IP), sums the bytes every connection holds for a frame not yet complete (one budget for
the server), and sweeps the connections now and then for two timeouts: a frame begun but not finished within
``read_timeout_s``, and a connection from which nothing arrived for ``idle_timeout_s`` (RocketMQ's
``serverChannelMaxIdleTimeSeconds``; clients heartbeat every 30 s, so a live client is never idle that long).
The write side's cap (a peer that does not read its replies) is enforced by the connection itself
(``RemotingConnection``'s ``write_hard_limit``).

Every refusal or close is logged at WARNING, but at most once per peer IP and reason per ``LOG_INTERVAL_S``
(``LogLimiter``): a peer that reconnects and misbehaves in a loop costs one line a minute, not one per frame.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from cometmq.net.connection import RemotingConnection

log = logging.getLogger("cometmq.net.limits")

#: seconds between two log lines about one peer and one reason
LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """A server's limits; 0 turns one off. The defaults are for a broker (see docs/reliability.md, [15])."""

    #: a frame whose first byte arrived this long ago and is still incomplete closes its connection: a peer that
    #: announces 16 MiB and sends 15 holds that memory only this long. A whole 16 MiB frame takes well under a
    #: second on any link a broker is used over; 30 s leaves room for a congested one.
    read_timeout_s: float = 30.0
    #: nothing received for this long closes the connection (RocketMQ's serverChannelMaxIdleTimeSeconds, 120 s;
    #: the Java, C++ and cometmq clients heartbeat every 30 s and refresh routes every 30 s)
    idle_timeout_s: float = 120.0
    #: connections open at once; beyond it new ones are accepted and closed at once. Below the usual 65536 open
    #: files limit with room left for the store's files; ~16k idle connections cost the broker ~100 MiB.
    max_connections: int = 16384
    #: connections from one IP address: a NAT gateway fronting ~2000 client processes (one connection each per
    #: broker) still fits, while one host can take at most an eighth of the total
    max_connections_per_ip: int = 2048
    #: bytes held for incomplete frames, all connections together; beyond it the connections whose incomplete frame
    #: is oldest are closed until it fits again (see ``ConnectionGuard.on_buffered``)
    max_partial_bytes: int = 256 * 1024 * 1024
    #: a peer with this many bytes of replies queued and not read is disconnected (above the 4 MiB high-water mark
    #: reading from it has stopped already; this bounds what its in-flight requests can still queue)
    write_hard_limit: int = 64 * 1024 * 1024
    #: a peer whose replies have stayed above the high-water mark this long is disconnected (it stopped reading)
    write_stall_timeout_s: float = 30.0
    #: queued reply bytes of all stalled peers together; beyond it the largest are disconnected (checked every sweep)
    max_write_buffer_bytes: int = 256 * 1024 * 1024


class LogLimiter:
    """``allow(key)``: True at most once per ``interval_s`` per key; remembers at most ``max_keys`` keys (oldest
    forgotten first), and counts what it held back so the next line can say how many."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, max_keys: int = 4096) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._last: OrderedDict[object, tuple[float, int]] = OrderedDict()

    def allow(self, key: object) -> tuple[bool, int]:
        """(whether to log now, how many lines for this key were held back since the last one logged)."""
        now = time.monotonic()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.interval_s:
            self._last[key] = (seen[0], seen[1] + 1)
            return False, 0
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        return True, 0 if seen is None else seen[1]

    def warning(self, logger: logging.Logger, key: object, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless ``key`` was logged within the interval."""
        ok, held = self.allow(key)
        if ok:
            if held:
                logger.warning(msg + " (and %d more like it since the last report)", *args, held)
            else:
                logger.warning(msg, *args)


#: refusals and closes of all servers of the process share one limiter
limited_log = LogLimiter()


def peer_ip(address: str) -> str:
    """The host part of ``host:port`` / ``[v6]:port``."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") else (host or address)


class ConnectionGuard:
    """The limits of one server's connections (see the module docstring)."""

    def __init__(self, limits: ConnectionLimits, what: str = "remoting server") -> None:
        self.limits = limits
        self.what = what
        self.connections = 0
        self.per_ip: dict[str, int] = {}
        #: bytes held for incomplete frames by all admitted connections
        self.partial_bytes = 0
        self._partial: set[RemotingConnection] = set()
        self._task: asyncio.Task[None] | None = None
        #: counts, for tests and the load test
        self.refused = 0
        self.closed_read_timeout = 0
        self.closed_idle = 0
        self.closed_partial_budget = 0
        self.closed_write_stall = 0

    # -- admission ----------------------------------------------------------------------------------------
    def admit(self, conn: RemotingConnection) -> bool:
        """Count ``conn`` in, or close it (False) when a connection cap is reached."""
        if not self.take(peer_ip(conn.remote_address)):
            conn.abort()
            return False
        conn.set_buffer_observer(self.on_buffered)
        conn.add_close_callback(self._released)
        return True

    def take(self, ip: str) -> bool:
        """Count in a connection from ``ip`` (``give_back`` when it closes), or False (logged) when a cap is
        reached. ``admit`` for a ``RemotingConnection``; the gRPC relay's connections use it directly."""
        from_ip = self.per_ip.get(ip, 0)
        if not self._room(ip, self.connections, from_ip):
            return False
        self.connections += 1
        self.per_ip[ip] = from_ip + 1
        return True

    def give_back(self, ip: str) -> None:
        """A connection counted in by ``take`` closed."""
        self.connections -= 1
        left = self.per_ip.get(ip, 1) - 1
        if left > 0:
            self.per_ip[ip] = left
        else:
            self.per_ip.pop(ip, None)

    def may_open(self, ip: str, pending: int, pending_from_ip: int) -> bool:
        """Whether a socket just accepted from ``ip`` may be set up, while ``pending`` others (``pending_from_ip``
        from ``ip``) are being set up and not admitted yet (the TLS listener's peek and handshake, up to 70 s): the
        caps count those too, else silent sockets held file descriptors past them. False: refused (and logged)."""
        return self._room(ip, self.connections + pending, self.per_ip.get(ip, 0) + pending_from_ip)

    def _room(self, ip: str, total: int, from_ip: int) -> bool:
        limits = self.limits
        reason = ""
        if limits.max_connections and total >= limits.max_connections:
            reason = f"{total} connections are open (maxConnections {limits.max_connections})"
        elif limits.max_connections_per_ip and from_ip >= limits.max_connections_per_ip:
            reason = f"{from_ip} connections from it are open (maxConnectionsPerIp {limits.max_connections_per_ip})"
        if reason:
            self.refused += 1
            limited_log.warning(log, ("refused", ip), "%s refuses connections from %s: %s", self.what, ip, reason)
            return False
        return True

    def _released(self, conn: RemotingConnection) -> None:
        self.give_back(peer_ip(conn.remote_address))
        self._partial.discard(conn)

    # -- bytes held for incomplete frames ----------------------------------------------------------------------
    def on_buffered(self, conn: RemotingConnection, delta: int) -> None:
        """``conn`` now holds ``delta`` more (or fewer) bytes of an incomplete frame. Over the budget, the
        connections whose incomplete frame began first are closed until the rest fits: those frames are the
        likeliest to be stalled (a live peer finishes a frame in milliseconds), and the read timeout would
        close them next anyway. Neither the newest (the peer sending right now is the one most likely alive)
        nor the largest (a legitimate 16 MiB send in progress) is a better guess."""
        self.partial_bytes += delta
        if conn.buffered_bytes:
            self._partial.add(conn)
        else:
            self._partial.discard(conn)
        budget = self.limits.max_partial_bytes
        if not budget or self.partial_bytes <= budget:
            return
        for victim in sorted(self._partial, key=_partial_start):
            if self.partial_bytes <= budget:
                break
            self.closed_partial_budget += 1
            ip = peer_ip(victim.remote_address)
            limited_log.warning(log, ("partial-budget", ip),
                                "%s closes the connection from %s: incomplete frames of all connections hold %d "
                                "bytes (maxPartialFrameBytes %d) and its %d bytes are the oldest", self.what,
                                victim.remote_address, self.partial_bytes, budget, victim.buffered_bytes)
            victim.abort()  # its close gives its bytes back (on_buffered with a negative delta)

    # -- timeouts -------------------------------------------------------------------------------------------
    def start(self, connections: set[RemotingConnection]) -> None:
        limits = self.limits
        timeouts = [t for t in (limits.read_timeout_s, limits.idle_timeout_s, limits.write_stall_timeout_s) if t > 0]
        if limits.max_write_buffer_bytes:
            timeouts.append(4.0)  # the write budget is checked at least every second
        if timeouts:
            import asyncio  # here, not at the top: ConnectionLimits is read with a server's settings, before asyncio
            # is imported (cometmq.net.no_openssl)

            interval = min(5.0, max(0.05, min(timeouts) / 4))
            self._task = asyncio.get_running_loop().create_task(self._sweep_loop(connections, interval))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            import asyncio

            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _sweep_loop(self, connections: set[RemotingConnection], interval: float) -> None:
        import asyncio

        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep(connections)
            except Exception:  # pragma: no cover - a bug here must not end the sweeping
                log.exception("connection sweep failed")

    def sweep(self, connections: set[RemotingConnection]) -> None:
        """Close the connections past a timeout (the sweep runs every quarter of the shorter one, at most 5 s)."""
        import asyncio

        limits = self.limits
        now = asyncio.get_running_loop().time()
        read_timeout, idle_timeout = limits.read_timeout_s, limits.idle_timeout_s
        stall_timeout = limits.write_stall_timeout_s
        stalled: list[tuple[int, RemotingConnection]] = []
        for conn in list(connections):
            if conn.closed:
                continue
            paused = conn.write_paused_since
            if paused is not None:
                if stall_timeout > 0 and now - paused > stall_timeout:
                    self._close_stalled(conn, f"its replies have not drained for {now - paused:.0f} s (write stall "
                                              f"timeout {stall_timeout:g} s)")
                    continue
                stalled.append((conn.write_buffer_size, conn))
            started = conn.partial_since
            if read_timeout > 0 and started is not None and now - started > read_timeout:
                self.closed_read_timeout += 1
                limited_log.warning(log, ("read-timeout", peer_ip(conn.remote_address)),
                                    "%s closes the connection from %s: a frame begun %.0f s ago is still incomplete "
                                    "(%d bytes; read timeout %g s)", self.what, conn.remote_address, now - started,
                                    conn.buffered_bytes, read_timeout)
                conn.abort()
            elif idle_timeout > 0 and now - conn.last_read > idle_timeout:
                self.closed_idle += 1
                limited_log.warning(log, ("idle", peer_ip(conn.remote_address)),
                                    "%s closes the connection from %s: nothing received for %.0f s "
                                    "(serverChannelMaxIdleTimeSeconds %g)", self.what, conn.remote_address,
                                    now - conn.last_read, idle_timeout)
                conn.abort()
        budget = limits.max_write_buffer_bytes
        total = sum(size for size, _ in stalled)
        if budget and total > budget:
            for size, conn in sorted(stalled, key=lambda item: -item[0]):
                if total <= budget:
                    break
                total -= size
                self._close_stalled(conn, f"stalled peers hold {total + size} bytes of replies "
                                          f"(maxWriteBufferBytes {budget}) and its {size} are the most")

    def _close_stalled(self, conn: RemotingConnection, why: str) -> None:
        self.closed_write_stall += 1
        limited_log.warning(log, ("write-stall", peer_ip(conn.remote_address)),
                            "%s closes the connection to %s: %s", self.what, conn.remote_address, why)
        conn.abort()


def _partial_start(conn: RemotingConnection) -> float:
    started = conn.partial_since
    return float("inf") if started is None else started
