"""TLS on the remoting port (net/tls.py): disabled, permissive and enforcing modes, certificate reload, and the
settings read from RocketMQ's keys. Each scenario runs on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnectError, RemotingConnection
from cometmq.net.loop import run, uvloop_factory
from cometmq.net.server import RemotingServer
from cometmq.net.tls import ServerTls, client_context, sdk_client_context
from cometmq.net.tls_settings import TlsConfig, TlsError, TlsMode, tls_config_from_properties
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from tests.net.tlskit import Certs, closed_by_server, make_certs

pytestmark = pytest.mark.timeout(60)

ECHO = 1000
LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(uvloop_factory() is None,
                                                                      reason="uvloop is not installed"))]


async def echo(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
    return make_response(cmd, 0, remark="tls" if conn._tls else "plain", body=cmd.body)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _run(loop: str, scenario: Callable[[], Awaitable[None]]) -> None:
    run(scenario(), use_uvloop=loop == "uvloop")  # type: ignore[arg-type]


def _server(certs: Certs, mode: str, **changes: object) -> RemotingServer:
    cfg = TlsConfig(mode=TlsMode(mode), cert_path=str(certs.cert), key_path=str(certs.key)).replace(**changes)
    return RemotingServer("127.0.0.1", 0, {ECHO: echo}, tls=ServerTls(cfg))


def _ctx(certs: Certs) -> ssl.SSLContext:
    return client_context(ca_file=str(certs.ca))


async def _ask(client: RemotingClient, port: int, body: bytes = b"hi") -> RemotingCommand:
    return await client.invoke(f"127.0.0.1:{port}", make_request(ECHO, body=body), timeout=5)


@pytest.mark.parametrize("loop", LOOPS)
def test_enforcing_serves_tls_and_refuses_plaintext(loop: str, certs: Certs) -> None:
    async def scenario() -> None:
        async with _server(certs, "enforcing") as server:
            async with RemotingClient(ssl=_ctx(certs)) as tls_client:
                reply = await _ask(tls_client, server.port, b"x" * 300_000)  # a body bigger than one TLS record
                assert (reply.remark, len(reply.body)) == ("tls", 300_000)
                conn = next(iter(server.connections))
                assert conn._tls
            async with RemotingClient(connect_timeout=3) as plain:
                with pytest.raises((ConnectionError, TimeoutError)):
                    await _ask(plain, server.port)
            listener = server._server
            assert listener is not None and listener.refused >= 1  # type: ignore[union-attr]
            async with RemotingClient(ssl=_ctx(certs)) as again:  # the server is fine after refusing
                assert (await _ask(again, server.port)).remark == "tls"

    _run(loop, scenario)


@pytest.mark.parametrize("loop", LOOPS)
def test_permissive_serves_both_on_one_port(loop: str, certs: Certs) -> None:
    async def scenario() -> None:
        async with _server(certs, "permissive") as server:
            async with RemotingClient(ssl=_ctx(certs)) as tls_client, RemotingClient() as plain:
                replies = await asyncio.gather(*(_ask(c, server.port, str(i).encode()) for i in range(5)
                                                 for c in (tls_client, plain)))
            assert sorted(str(r.remark) for r in replies) == ["plain"] * 5 + ["tls"] * 5

    _run(loop, scenario)


@pytest.mark.parametrize("loop", LOOPS)
def test_disabled_refuses_a_tls_client_cleanly(loop: str, certs: Certs) -> None:
    async def scenario() -> None:
        async with RemotingServer("127.0.0.1", 0, {ECHO: echo}) as server:
            async with RemotingClient(ssl=_ctx(certs), connect_timeout=3) as tls_client:
                with pytest.raises((RemotingConnectError, ConnectionError, TimeoutError)):
                    await _ask(tls_client, server.port)
            async with RemotingClient() as plain:
                assert (await _ask(plain, server.port)).remark == "plain"

    _run(loop, scenario)


def test_disabled_mode_keeps_the_plain_listener(certs: Certs) -> None:
    async def scenario() -> None:
        server = _server(certs, "disabled")
        assert server.tls is None
        async with server, RemotingClient() as plain:
            assert (await _ask(plain, server.port)).remark == "plain"

    _run("asyncio", scenario)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_verifying_against_another_ca_fails(loop: str, certs: Certs, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other")

    async def scenario() -> None:
        async with _server(certs, "enforcing") as server:
            async with RemotingClient(ssl=client_context(ca_file=str(other.ca)), connect_timeout=3) as client:
                with pytest.raises(RemotingConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await _ask(client, server.port)
            async with RemotingClient(ssl=client_context(insecure=True)) as insecure:
                assert (await _ask(insecure, server.port)).remark == "tls"

    _run(loop, scenario)


@pytest.mark.parametrize("loop", LOOPS)
def test_certificate_reload_applies_to_new_connections(loop: str, certs: Certs, tmp_path: Path) -> None:
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    live_cert.write_bytes(certs.cert.read_bytes())
    live_key.write_bytes(certs.key.read_bytes())
    new_cert, new_key = certs.issue(f"rotated-{loop}", cn="cometmq-server-2")

    def peer_cn(client: RemotingClient, port: int) -> str:
        conn = client.connections[f"127.0.0.1:{port}"]
        ssl_object = conn._transport.get_extra_info("ssl_object")  # type: ignore[union-attr]
        subject = dict(x[0] for x in ssl_object.getpeercert()["subject"])
        return str(subject["commonName"])

    async def scenario() -> None:
        tls = ServerTls(TlsConfig(mode=TlsMode.ENFORCING, cert_path=str(live_cert), key_path=str(live_key)),
                        check_interval=0)
        server = RemotingServer("127.0.0.1", 0, {ECHO: echo}, tls=tls)
        async with server, RemotingClient(ssl=_ctx(certs)) as first:
            await _ask(first, server.port)
            assert peer_cn(first, server.port) == "cometmq-server-1"
            live_key.write_bytes(new_key.read_bytes())
            live_cert.write_bytes(new_cert.read_bytes())
            os.utime(live_cert, ns=(1, 1))  # a different stamp even within the file system's resolution
            async with RemotingClient(ssl=_ctx(certs)) as second:
                await _ask(second, server.port)
                assert peer_cn(second, server.port) == "cometmq-server-2"
            assert tls.loads == 2
            await _ask(first, server.port)  # the open connection goes on with its session
            # a broken file is not taken: the last good context stays
            live_cert.write_text("not a certificate")
            async with RemotingClient(ssl=_ctx(certs)) as third:
                await _ask(third, server.port)
                assert peer_cn(third, server.port) == "cometmq-server-2"
            assert tls.loads == 2

    _run(loop, scenario)


def test_client_certificates_when_required(certs: Certs) -> None:
    client_cert, client_key = certs.issue("client", cn="a-client")

    async def scenario() -> None:
        server = _server(certs, "enforcing", need_client_auth="require", trust_cert_path=str(certs.ca))
        async with server:
            async with RemotingClient(ssl=_ctx(certs), connect_timeout=3) as anonymous:
                with pytest.raises((ConnectionError, TimeoutError)):
                    await _ask(anonymous, server.port)
            ctx = client_context(ca_file=str(certs.ca), cert_file=str(client_cert), key_file=str(client_key))
            async with RemotingClient(ssl=ctx) as known:
                assert (await _ask(known, server.port)).remark == "tls"

    _run("asyncio", scenario)


def test_encrypted_key_with_password(certs: Certs) -> None:
    cert, key = certs.issue("locked", key_password="s3cret")
    with pytest.raises(TlsError):
        ServerTls(TlsConfig(mode=TlsMode.ENFORCING, cert_path=str(cert), key_path=str(key), key_password="wrong"))
    tls = ServerTls(TlsConfig(mode=TlsMode.ENFORCING, cert_path=str(cert), key_path=str(key), key_password="s3cret"))
    with pytest.raises(TlsError, match="gRPC"):
        tls.read_pem()


def test_a_silent_connection_does_not_block_others(certs: Certs) -> None:
    async def scenario() -> None:
        async with _server(certs, "permissive") as server:
            silent = socket.create_connection(("127.0.0.1", server.port))
            try:
                async with RemotingClient() as plain, RemotingClient(ssl=_ctx(certs)) as tls_client:
                    assert (await _ask(plain, server.port)).remark == "plain"
                    assert (await _ask(tls_client, server.port)).remark == "tls"
            finally:
                silent.close()

    _run("asyncio", scenario)


def test_sockets_still_being_set_up_count_against_the_connection_caps(certs: Certs) -> None:
    """The TLS listener peeks each socket's first byte (up to 60 s) and handshakes (up to 10 s) before the server
    admits it, and the caps were applied only then: silent sockets were held past maxConnections, each a file
    descriptor, for a minute. The caps now count the sockets being set up: those past them are closed at once."""
    from cometmq.net.limits import ConnectionLimits

    async def scenario() -> None:
        cfg = TlsConfig(mode=TlsMode.PERMISSIVE, cert_path=str(certs.cert), key_path=str(certs.key))
        limits = ConnectionLimits(read_timeout_s=0, idle_timeout_s=0, max_connections=4)
        async with RemotingServer("127.0.0.1", 0, {ECHO: echo}, tls=ServerTls(cfg), limits=limits) as server:
            silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
            try:
                for sock in silent:
                    sock.setblocking(False)
                closed = [await closed_by_server(sock, 0.3) for sock in silent]
                assert sum(closed) == 16 and server.guard.refused == 16
            finally:
                for sock in silent:
                    sock.close()
            for _ in range(200):  # the silent ones gone, a client gets in again
                await asyncio.sleep(0.01)
                async with RemotingClient() as plain:
                    try:
                        if (await _ask(plain, server.port)).remark == "plain":
                            break
                    except (TimeoutError, OSError, RemotingConnectError):
                        continue
            else:
                raise AssertionError("no client got in after the silent sockets closed")

    _run("asyncio", scenario)


# -- settings --------------------------------------------------------------------------------------------------
def test_settings_from_rocketmq_keys_aliases_and_config_file(tmp_path: Path) -> None:
    cfg = tls_config_from_properties({"tls.server.mode": "Enforcing", "tls.server.certPath": "/c.pem",
                                      "tlsServerKeyPath": "/k.pem", "tls.enable": "true", "brokerName": "x"})
    assert (cfg.mode, cfg.cert_path, cfg.key_path, cfg.client_enable) == (TlsMode.ENFORCING, "/c.pem", "/k.pem", True)
    file = tmp_path / "tls.properties"
    file.write_text("# RocketMQ's tls.properties\ntls.server.certPath=/from-file.pem\ntls.server.keyPath=/f.key\n"
                    "tls.server.need.client.auth=optional\n")
    cfg = tls_config_from_properties({"tls.config.file": str(file), "tls.server.keyPath": "/given.key"})
    assert (cfg.cert_path, cfg.key_path, cfg.need_client_auth) == ("/from-file.pem", "/given.key", "optional")
    with pytest.raises(TlsError, match=r"tls\.server\.mode"):
        tls_config_from_properties({"tls.server.mode": "sometimes"})
    with pytest.raises(TlsError, match=r"need\.client\.auth"):
        tls_config_from_properties({"tls.server.need.client.auth": "maybe"})
    with pytest.raises(TlsError, match=r"needs tls\.server\.certPath and tls\.server\.keyPath"):
        TlsConfig(mode=TlsMode.PERMISSIVE).check()


def test_broker_conf_takes_the_tls_keys(tmp_path: Path) -> None:
    from cometmq.broker.config import ConfigError, broker_config_from_properties

    cfg = broker_config_from_properties({"tls.server.mode": "permissive", "tls.server.certPath": "/c.pem"})
    assert cfg.tls.mode is TlsMode.PERMISSIVE and cfg.tls.cert_path == "/c.pem"
    with pytest.raises(ConfigError, match=r"tls\.server\.mode"):
        broker_config_from_properties({"tls.server.mode": "on"})


def test_sdk_context_from_arguments_and_environment(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMETMQ_TLS", raising=False)
    assert sdk_client_context() is None
    assert sdk_client_context(True, ca_file=str(certs.ca)).verify_mode == ssl.CERT_REQUIRED  # type: ignore[union-attr]
    monkeypatch.setenv("COMETMQ_TLS", "true")
    monkeypatch.setenv("COMETMQ_TLS_INSECURE", "true")
    ctx = sdk_client_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE
    assert sdk_client_context(False) is None
