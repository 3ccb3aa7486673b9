"""TLS on the gRPC port (net/tls.py holds the settings and the per-connection listener).

* disabled: a plaintext port;
* enforcing: grpc's own TLS with *dynamic* credentials: grpc asks for them at each handshake, and gets new ones
  once the certificate files changed (the reload of the remoting port, same files, same check);
* permissive: grpc cannot tell TLS from plaintext on one port, so the public port is cometmq's
  :class:`~cometmq.net.tls.TlsListener` (the remoting port's: it peeks the first byte, terminates TLS itself) and
  every connection is relayed, decrypted, to grpc's plaintext port on 127.0.0.1 (an OS-chosen port). The relay
  costs a copy of each byte in Python: use enforcing (or disabled) when throughput matters.

  grpc then sees every client as 127.0.0.1, so the relay keeps a :class:`RelayPeers` table: the local port of each
  of its own connections to grpc -> the address of the client it relays. The ACL check of a call maps
  ``context.peer()`` back through it (:meth:`RelayPeers.client_host`); a loopback peer that is not one of the
  relay's open connections (something on this host dialling grpc's internal port) gets no address at all, so no
  address allow-list lets it in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import grpc

from cometmq.net.limits import ConnectionGuard
from cometmq.net.tls import ServerTls, TlsListener, start_tls_listener

log = logging.getLogger("cometmq.grpc")

#: the relay dials grpc from here (and grpc listens here): the only peers :class:`RelayPeers` maps
RELAY_HOST = "127.0.0.1"
#: at most this many relayed connections are mapped at a time (one per local port: the OS bounds it lower anyway);
#: a connection beyond it still works, its calls just get no address
MAX_RELAYED = 65_536


def dynamic_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """grpc server credentials that follow certificate changes (new handshakes get the new certificate)."""

    def configuration() -> grpc.ServerCertificateConfiguration:
        key, chain, roots = tls.read_pem()
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)

    def fetch() -> grpc.ServerCertificateConfiguration | None:  # runs in a grpc thread, at each handshake
        try:
            if not tls.files_changed() or not tls.reload():
                return None
            return configuration()
        except Exception as exc:  # never into grpc's core: keep the current certificate
            log.error("gRPC TLS certificate reload failed, keeping the previous one: %s", exc)
            return None

    return grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=tls.config.need_client_auth == "require")


class RelayPeers:
    """The permissive relay's connections to grpc: their local port (on 127.0.0.1) -> the client's address.

    An entry is added once the relay's connection to grpc is open, before any byte of the client reaches grpc, and
    removed when that connection closes. While it is open no other socket can have the same (127.0.0.1:port ->
    grpc's port) pair, so a grpc peer found here is the relayed client. Not thread-safe: the event loop's only.
    """

    def __init__(self, limit: int = MAX_RELAYED) -> None:
        self.limit = limit
        self._clients: dict[int, tuple[str, int]] = {}
        self._full_logged = False

    def __len__(self) -> int:
        return len(self._clients)

    def add(self, local_port: int, client: tuple[str, int]) -> bool:
        """Map the relay connection leaving from ``local_port`` to ``client`` (host, port); False when full."""
        if local_port not in self._clients and len(self._clients) >= self.limit:
            if not self._full_logged:
                self._full_logged = True
                log.warning("gRPC relay: %d connections open, the clients of newer ones get no address (address "
                            "allow-lists do not apply to them)", self.limit)
            return False
        self._clients[local_port] = client
        return True

    def remove(self, local_port: int, client: tuple[str, int]) -> None:
        if self._clients.get(local_port) == client:
            del self._clients[local_port]
            if len(self._clients) < self.limit:
                self._full_logged = False

    def client_of(self, grpc_peer: str) -> tuple[str, int] | None:
        """The relayed client behind grpc's ``context.peer()`` (``ipv4:127.0.0.1:PORT``), None when it is not one
        of the relay's open connections."""
        kind, _, rest = grpc_peer.partition(":")
        host, _, port = rest.rpartition(":")
        if kind != "ipv4" or host != RELAY_HOST or not port.isdigit():
            return None
        return self._clients.get(int(port))

    def client_host(self, grpc_peer: str) -> str:
        """The address the ACL checks for a call: the relayed client's host; for any other peer a text that is no
        address (``unrelayed ipv4:127.0.0.1:PORT``), which only an allow-list of ``*`` matches."""
        client = self.client_of(grpc_peer)
        return client[0] if client is not None else f"unrelayed {grpc_peer or '?'}"


class _Relay(asyncio.Protocol):
    """One accepted connection (plaintext, or TLS already terminated) relayed to grpc's plaintext port."""

    def __init__(self, target: tuple[str, int], peers: RelayPeers | None = None,
                 guard: ConnectionGuard | None = None) -> None:
        self._target = target
        self._peers = peers
        #: the port's connection caps: this connection is counted in while open (``_counted``: its client's IP)
        self._guard = guard
        self._counted: str | None = None
        self._front: asyncio.Transport | None = None
        self._back: asyncio.Transport | None = None
        self._early: list[bytes] = []
        #: the client's (host, port) and the local port of the connection to grpc, while mapped in ``_peers``
        self._client: tuple[str, int] | None = None
        self._local_port: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._front = cast(asyncio.Transport, transport)
        self._front.pause_reading()
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._client = (str(peer[0]), int(peer[1]))
        if self._guard is not None:
            ip = self._client[0] if self._client is not None else "?"
            if not self._guard.take(ip):  # over a cap (logged): closed before grpc is dialled
                front, self._front = self._front, None
                front.abort()
                return
            self._counted = ip
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            back, _ = await loop.create_connection(lambda: _Back(self), *self._target)
        except OSError as exc:
            log.warning("gRPC relay cannot reach the gRPC server on %s:%d: %s", *self._target, exc)
            if self._front is not None:
                self._front.close()
            return
        self._back = back
        if self._front is None or self._front.is_closing():
            back.close()
            return
        if self._peers is not None and self._client is not None:  # before any byte of the client reaches grpc
            local = back.get_extra_info("sockname")
            if isinstance(local, tuple) and self._peers.add(int(local[1]), self._client):
                self._local_port = int(local[1])
        if self._early:
            back.writelines(self._early)
            self._early.clear()
        self._front.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._back is not None:
            self._back.write(data)
        else:  # uvloop may deliver bytes before the pause_reading of connection_made takes effect
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._back is not None and self._back.can_write_eof():
            self._back.write_eof()
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._front = None
        ip, self._counted = self._counted, None
        if ip is not None and self._guard is not None:
            self._guard.give_back(ip)
        if self._back is not None:
            self._back.close()

    def back_lost(self) -> None:
        """The connection to grpc closed: its local port no longer names this client."""
        port, self._local_port = self._local_port, None
        if port is not None and self._peers is not None and self._client is not None:
            self._peers.remove(port, self._client)

    def pause_writing(self) -> None:  # the client reads slowly: stop reading grpc
        if self._back is not None:
            self._back.pause_reading()

    def resume_writing(self) -> None:
        if self._back is not None:
            self._back.resume_reading()


class _Back(asyncio.Protocol):
    def __init__(self, front: _Relay) -> None:
        self._front = front
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._front._front is not None:
            self._front._front.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._front.back_lost()
        if self._front._front is not None:
            self._front._front.close()

    def pause_writing(self) -> None:  # grpc reads slowly: stop reading the client
        if self._front._front is not None:
            self._front._front.pause_reading()

    def resume_writing(self) -> None:
        if self._front._front is not None:
            self._front._front.resume_reading()


async def start_permissive_front(host: str, port: int, tls: ServerTls, grpc_port: int,
                                 peers: RelayPeers | None = None, guard: ConnectionGuard | None = None) -> TlsListener:
    """The public port of permissive mode: TLS or plaintext per connection, relayed to 127.0.0.1:``grpc_port``;
    ``peers`` gets the client of each relayed connection. ``guard``'s caps count the relayed connections and the
    sockets still in their first-byte wait or handshake (as the remoting port's): those past them are closed."""
    return await start_tls_listener(lambda: _Relay((RELAY_HOST, grpc_port), peers, guard), host, port, tls,
                                    admit=guard.may_open if guard is not None else None)
