"""TLS on the gRPC port (grpc/tls.py), in process: enforcing with grpc's dynamic credentials (reloaded when the
files change), permissive through the sniffing front, disabled. Any answer to QueryRoute (the nameserver here is
unreachable, so a PROXY_TIMEOUT status) proves the transport."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.server import GrpcProxy
from cometmq.grpc.v2 import service_pb2, service_pb2_grpc
from cometmq.net.tls_settings import TlsConfig, TlsMode
from tests.net.tlskit import Certs, make_certs

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


def _proxy(mode: str, cert: Path, key: Path) -> GrpcProxy:
    tls = TlsConfig(mode=TlsMode(mode), cert_path=str(cert), key_path=str(key))
    return GrpcProxy(ProxyConfig(namesrv="127.0.0.1:1", port=0, request_timeout_s=0.5, tls=tls))


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
