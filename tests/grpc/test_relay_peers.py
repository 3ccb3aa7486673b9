"""Permissive TLS on the gRPC port relays every connection to grpc through 127.0.0.1 (grpc/tls.py); the ACL still
sees each client's own address: the relay maps its connections' local ports back to their clients (RelayPeers).

grpcio cannot choose a channel's source address, so the clients here dial a small forwarder that connects on to
the endpoint from 127.0.0.2 or 127.0.0.3 (every 127.0.0.0/8 address is this host's). The nameserver is
unreachable: a call the ACL lets in ends in a backend error, one it refuses in UNAUTHORIZED."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cometmq.grpc.auth import authorization_header, date_time_now
from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.server import GrpcProxy
from cometmq.grpc.tls import RelayPeers
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from cometmq.grpc.v2 import service_pb2_grpc
from cometmq.net.tls_settings import TlsConfig, TlsMode
from tests.net.tlskit import Certs, make_certs

pytestmark = pytest.mark.timeout(60)

USER = ("relayUser01", "relaySecret01")
#: loopback itself is allow-listed globally (what would have let every relayed client in), the account only from
#: 127.0.0.2 (what no relayed client could have been allowed from)
ACL = f"""\
globalWhiteRemoteAddresses:
  - 127.0.0.1
accounts:
  - accessKey: {USER[0]}
    secretKey: {USER[1]}
    whiteRemoteAddress: 127.0.0.2
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
REFUSED = (pb.Code.UNAUTHORIZED, pb.Code.FORBIDDEN)


# -- the table -----------------------------------------------------------------------------------------------------
def test_relay_peers_maps_only_the_relays_open_connections() -> None:
    peers = RelayPeers(limit=2)
    assert peers.add(40001, ("203.0.113.7", 5555))
    assert peers.client_of("ipv4:127.0.0.1:40001") == ("203.0.113.7", 5555)
    assert peers.client_host("ipv4:127.0.0.1:40001") == "203.0.113.7"
    # not the relay's: another port, another loopback address, IPv6, garbage
    for peer in ("ipv4:127.0.0.1:40002", "ipv4:127.0.0.2:40001", "ipv6:[::1]:40001", "ipv4:127.0.0.1:x", "", "?"):
        assert peers.client_of(peer) is None, peer
        assert peers.client_host(peer).startswith("unrelayed "), peer
    assert peers.add(40002, ("198.51.100.1", 1))
    assert not peers.add(40003, ("198.51.100.2", 2))  # full: that connection's calls get no address
    assert peers.client_of("ipv4:127.0.0.1:40003") is None
    peers.remove(40001, ("10.0.0.1", 1))  # another client's entry is left alone
    assert len(peers) == 2
    peers.remove(40001, ("203.0.113.7", 5555))
    assert peers.client_of("ipv4:127.0.0.1:40001") is None and len(peers) == 1
    assert peers.add(40003, ("198.51.100.2", 2))


# -- through the relay ---------------------------------------------------------------------------------------------
class SourceForwarder:
    """Listens on 127.0.0.1 and carries each connection on to ``127.0.0.1:port`` from ``source``."""

    def __init__(self, port: int, source: str) -> None:
        self.port, self.source = port, source
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(self.source, 0))
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        assert up_writer.get_extra_info("sockname")[0] == self.source
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _route_status(port: int, creds: tuple[str, str] | None, ca: Path | None = None) -> pb.Status:
    now = date_time_now()
    md = [("x-mq-client-id", "relay-test"), ("x-mq-date-time", now), ("x-mq-language", "PYTHON"),
          ("x-mq-protocol", "v2")]
    if creds is not None:
        md.append(("authorization", authorization_header(creds[0], creds[1], now)))
    target = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(target) if ca is None else \
        grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca.read_bytes()))
    async with channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        r = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="RelayTopic")), metadata=md,
                                  timeout=10)
        return r.status  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def permissive(certs: Certs, tmp_path: Path) -> AsyncIterator[GrpcProxy]:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    tls = TlsConfig(mode=TlsMode.PERMISSIVE, cert_path=str(certs.cert), key_path=str(certs.key))
    proxy = GrpcProxy(ProxyConfig(namesrv="127.0.0.1:1", port=0, request_timeout_s=0.3, acl_file=str(acl), tls=tls))
    await proxy.start()
    yield proxy
    await proxy.stop()


async def _via(proxy: GrpcProxy, source: str, creds: tuple[str, str] | None, ca: Path | None = None) -> pb.Status:
    fwd = SourceForwarder(proxy.port, source)
    await fwd.start()
    try:
        return await _route_status(fwd.listen_port, creds, ca)
    finally:
        await fwd.close()


async def test_the_acl_sees_each_relayed_clients_own_address(permissive: GrpcProxy, certs: Certs,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cometmq.acl")
    unsigned = (USER[0], "not-the-secret")
    # a client on 127.0.0.1 (the global allow-list) needs nothing, plaintext or TLS
    assert (await _route_status(permissive.port, None)).code not in REFUSED
    assert (await _route_status(permissive.port, None, certs.ca)).code not in REFUSED
    # 127.0.0.3 is on no list: no credentials, or the account without its signature, are refused
    refused = await _via(permissive, "127.0.0.3", None)
    assert refused.code == pb.Code.UNAUTHORIZED and refused.message == "No accessKey is configured"
    refused = await _via(permissive, "127.0.0.3", unsigned, certs.ca)
    assert refused.code == pb.Code.UNAUTHORIZED and "Check signature failed" in refused.message
    assert "refused gRPC QueryRoute from 127.0.0.3: No accessKey is configured" in caplog.text
    assert f"refused gRPC QueryRoute from 127.0.0.3: Check signature failed for accessKey={USER[0]}" in caplog.text
    # 127.0.0.2 is on the account's list: let in without the signature, plaintext and TLS
    assert (await _via(permissive, "127.0.0.2", unsigned)).code not in REFUSED
    assert (await _via(permissive, "127.0.0.2", unsigned, certs.ca)).code not in REFUSED
    # but only for that account
    assert (await _via(permissive, "127.0.0.2", None)).code == pb.Code.UNAUTHORIZED
    assert "127.0.0.1" not in caplog.text
    # every relayed connection has been forgotten once closed
    peers = permissive.service.relay_peers
    assert peers is not None
    for _ in range(100):
        if not len(peers):
            break
        await asyncio.sleep(0.05)
    assert len(peers) == 0


async def test_a_connection_past_the_relay_gets_no_address(permissive: GrpcProxy,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """grpc's internal port, dialled directly from this host: its 127.0.0.1 is not the allow-listed client's."""
    caplog.set_level(logging.WARNING, logger="cometmq.acl")
    assert permissive.grpc_port not in (0, permissive.port)
    status = await _route_status(permissive.grpc_port, None)
    assert status.code == pb.Code.UNAUTHORIZED, status
    assert "refused gRPC QueryRoute from unrelayed ipv4:127.0.0.1:" in caplog.text
    # the signature still lets it in
    assert (await _route_status(permissive.grpc_port, USER)).code not in REFUSED
