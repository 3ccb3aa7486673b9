"""The official Python 5.x client (rocketmq-python-client 5.1.2, ``tls_enable=True``) over TLS to ``cometmq serve``.

The client builds its secure channel with ``grpc.ssl_channel_credentials()`` (the system's roots, no option for
another CA), so the test CA reaches it through grpc's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH; the certificate names
127.0.0.1, the address the client dials.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.interop.grpc.conftest import ClientRunner, GrpcServer
from tests.net.tlskit import Certs, make_certs

Server = Callable[..., GrpcServer]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("grpc-certs"))


def _tls_server(grpc_server: Server, certs: Certs, mode: str) -> GrpcServer:
    s = grpc_server(conf={"tls.server.mode": mode, "tls.server.certPath": str(certs.cert),
                          "tls.server.keyPath": str(certs.key)})
    s.server.tls_ca = certs.ca if mode == "enforcing" else None
    return s


def _trusting(py5: ClientRunner, certs: Certs) -> ClientRunner:
    py5.env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(certs.ca)
    return py5


def test_python_client_sends_and_receives_over_tls(py5: ClientRunner, grpc_server: Server, certs: Certs) -> None:
    s = _tls_server(grpc_server, certs, "enforcing")
    s.server.create_topic("PyTls")  # over remoting with TLS: enforcing covers the broker's port too
    client = _trusting(py5, certs)
    sent = client.run("produce", endpoints=s.endpoints, topic="PyTls", count=5, tls=True)
    assert sent.rc == 0 and len(sent.events("sent")) == 5, sent.describe()
    got = client.run("simple", endpoints=s.endpoints, topic="PyTls", group="PyTlsG", count=5, timeout=30, tls=True)
    assert got.rc == 0, got.describe()
    assert sorted(m["body"] for m in got.events("received")) == [f"msg-{i}" for i in range(5)]
    assert {m["id"] for m in got.events("received")} == {m["id"] for m in sent.events("sent")}
    # the same client without TLS gets nowhere: the port speaks TLS only
    plain = client.run("produce", endpoints=s.endpoints, topic="PyTls", count=1, request_timeout=2, run_timeout=60)
    assert plain.rc != 0 and not plain.events("sent"), plain.describe()


def test_permissive_port_serves_the_client_with_and_without_tls(py5: ClientRunner, grpc_server: Server,
                                                                 certs: Certs) -> None:
    s = _tls_server(grpc_server, certs, "permissive")
    s.server.create_topic("PyTlsMixed")  # plaintext remoting: permissive
    client = _trusting(py5, certs)
    with_tls = client.run("produce", endpoints=s.endpoints, topic="PyTlsMixed", count=3, prefix="tls-", tls=True)
    assert with_tls.rc == 0 and len(with_tls.events("sent")) == 3, with_tls.describe()
    plain = client.run("produce", endpoints=s.endpoints, topic="PyTlsMixed", count=3, prefix="plain-")
    assert plain.rc == 0 and len(plain.events("sent")) == 3, plain.describe()
    got = client.run("simple", endpoints=s.endpoints, topic="PyTlsMixed", group="PyTlsMixedG", count=6, timeout=30,
                     tls=True)
    assert sorted(m["body"] for m in got.events("received")) == sorted(
        [f"tls-{i}" for i in range(3)] + [f"plain-{i}" for i in range(3)]), got.describe()


def test_a_tls_client_fails_against_a_plaintext_port(py5: ClientRunner, grpc_server: Server, certs: Certs,
                                                     tmp_path: Path) -> None:
    s = grpc_server()
    s.server.create_topic("PyNoTls")
    res = _trusting(py5, certs).run("produce", endpoints=s.endpoints, topic="PyNoTls", count=1, request_timeout=2,
                                    tls=True, run_timeout=60)
    assert res.rc != 0 and not res.events("sent"), res.describe()
