"""TLS on the gRPC port (net/tls.py holds the settings and the per-connection listener).

* disabled: a plaintext port;
* enforcing: grpc's own TLS with *dynamic* credentials: grpc asks for them at each handshake, and gets new ones
  once the certificate files changed (the reload of the remoting port, same files, same check);
* permissive: grpc cannot tell TLS from plaintext on one port, so the public port is cometmq's
  :class:`~cometmq.net.tls.TlsListener` (the remoting port's: it peeks the first byte, terminates TLS itself) and
  every connection is relayed, decrypted, to grpc's plaintext port on 127.0.0.1 (an OS-chosen port). The relay
  costs a copy of each byte in Python: use enforcing (or disabled) when throughput matters.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import grpc

from cometmq.net.tls import ServerTls, TlsListener, start_tls_listener

log = logging.getLogger("cometmq.grpc")


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


class _Relay(asyncio.Protocol):
    """One accepted connection (plaintext, or TLS already terminated) relayed to grpc's plaintext port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._front: asyncio.Transport | None = None
        self._back: asyncio.Transport | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._front = cast(asyncio.Transport, transport)
        self._front.pause_reading()
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
        if self._back is not None:
            self._back.close()

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
        if self._front._front is not None:
            self._front._front.close()

    def pause_writing(self) -> None:  # grpc reads slowly: stop reading the client
        if self._front._front is not None:
            self._front._front.pause_reading()

    def resume_writing(self) -> None:
        if self._front._front is not None:
            self._front._front.resume_reading()


async def start_permissive_front(host: str, port: int, tls: ServerTls, grpc_port: int) -> TlsListener:
    """The public port of permissive mode: TLS or plaintext per connection, relayed to 127.0.0.1:``grpc_port``."""
    return await start_tls_listener(lambda: _Relay(("127.0.0.1", grpc_port)), host, port, tls)
