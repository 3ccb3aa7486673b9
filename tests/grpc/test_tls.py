"""TLS on the gRPC port (grpc/tls.py), in process: enforcing with grpc's dynamic credentials (reloaded when the
files change), permissive through the sniffing front, disabled. Any answer to QueryRoute (the nameserver here is
unreachable, so a PROXY_TIMEOUT status) proves the transport."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest

from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.server import GrpcProxy
from cometmq.grpc.v2 import service_pb2, service_pb2_grpc
from cometmq.net.limits import ConnectionLimits
from cometmq.net.tls_settings import TlsConfig, TlsMode
from tests.net.tlskit import Certs, closed_by_server, make_certs

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


async def _answers(port: int, ca: Path | None) -> bool:
    """True when a QueryRoute gets an answer over TLS trusting ``ca`` (plaintext when None)."""
    target = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(target) if ca is None else \
        grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca.read_bytes()))
    async with channel:
        try:
            await service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(  # type: ignore[no-untyped-call]
                service_pb2.QueryRouteRequest(), timeout=3)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
            return False
    return True


def _proxy(mode: str, cert: Path, key: Path, **changes: Any) -> GrpcProxy:
    tls = TlsConfig(mode=TlsMode(mode), cert_path=str(cert), key_path=str(key))
    return GrpcProxy(ProxyConfig(namesrv="127.0.0.1:1", port=0, request_timeout_s=0.5, tls=tls, **changes))


async def test_enforcing_serves_tls_only_and_reloads_the_certificate(certs: Certs, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other")  # a second CA: a client trusting only it proves the reload
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(certs.cert.read_bytes())
    key.write_bytes(certs.key.read_bytes())
    proxy = _proxy("enforcing", cert, key)
    await proxy.start()
    try:
        assert await _answers(proxy.port, certs.ca)
        assert not await _answers(proxy.port, None)
        assert not await _answers(proxy.port, other.ca)
        key.write_bytes(other.key.read_bytes())
        cert.write_bytes(other.cert.read_bytes())
        os.utime(cert, ns=(1, 1))
        await asyncio.sleep(1.1)  # the files are looked at once a second at most
        assert await _answers(proxy.port, other.ca)
        assert not await _answers(proxy.port, certs.ca)
    finally:
        await proxy.stop()


async def test_permissive_serves_both_on_one_port(certs: Certs) -> None:
    proxy = _proxy("permissive", certs.cert, certs.key)
    await proxy.start()
    try:
        assert await _answers(proxy.port, certs.ca)
        assert await _answers(proxy.port, None)
    finally:
        await proxy.stop()


async def test_disabled_serves_plaintext_only(certs: Certs) -> None:
    proxy = _proxy("disabled", certs.cert, certs.key)
    await proxy.start()
    try:
        assert await _answers(proxy.port, None)
        assert not await _answers(proxy.port, certs.ca)
    finally:
        await proxy.stop()


async def test_the_permissive_relay_applies_the_connection_caps(certs: Certs) -> None:
    """The permissive relay's listener peeks each socket's first byte (up to 60 s) and handshakes (up to 10 s),
    then relays it to grpc, and no cap counted any of these: silent sockets each held a file descriptor for a
    minute, and relayed ones without bound. maxConnections now counts both; those past it are closed at once."""
    proxy = _proxy("permissive", certs.cert, certs.key, connection_limits=ConnectionLimits(max_connections=4))
    await proxy.start()
    loop = asyncio.get_running_loop()

    def dial() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        sock.setblocking(False)
        return sock

    try:
        silent = [dial() for _ in range(20)]
        try:
            closed = [await closed_by_server(sock, 0.3) for sock in silent]
            assert sum(closed) == 16
        finally:
            for sock in silent:
                sock.close()
        relayed: list[socket.socket] = []
        try:
            for _ in range(200):  # the silent ones gone, plaintext connections are relayed again
                sock = dial()
                await loop.sock_sendall(sock, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                if await closed_by_server(sock, 0.05):
                    sock.close()
                    await asyncio.sleep(0.01)
                    continue
                relayed.append(sock)
                if len(relayed) == 4:
                    break
            assert len(relayed) == 4
            late = dial()
            try:
                assert await closed_by_server(late, 2.0)  # four relayed: a fifth socket is over the cap
            finally:
                late.close()
        finally:
            for sock in relayed:
                sock.close()
        for _ in range(100):  # the relayed ones gone, a client gets in again
            if await _answers(proxy.port, None):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no client got in after the relayed connections closed")
    finally:
        await proxy.stop()
