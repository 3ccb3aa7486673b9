"""TLS options of the source and sink: their checks, and a write and a read through Spark against a broker with
``tls.server.mode=enforcing`` that requires a client certificate; without ``tls=true`` the read fails at once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from cometmq.client import Admin, ClientInstance
from cometmq.spark.options import OptionError, TlsOptions, parse_read, parse_write
from tests.interop.cometmq_server import CometServer
from tests.net.tlskit import Certs, make_certs
from tests.spark.conftest import running

SparkError = (PySparkException, Py4JJavaError)
NS = {"namesrv": "127.0.0.1:9876"}
READ = {**NS, "subscribe": "T"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    made = make_certs(tmp_path_factory.mktemp("spark-certs"))
    made.issue("client", cn="spark-client")
    made.issue("locked", cn="spark-locked", key_password="s3cret")
    return made


def client_options(certs: Certs) -> dict[str, str]:
    """The options of a client that verifies the broker and presents its own certificate."""
    return {"tls": "true", "tlsClientTrustCertPath": str(certs.ca),
            "tlsClientCertPath": str(certs.folder / "client.pem"), "tlsClientKeyPath": str(certs.folder / "client.key")}


# -- options ------------------------------------------------------------------------------------------------------
def test_tls_options_parse(certs: Certs) -> None:
    assert parse_read(READ, streaming=False).tls is None
    assert parse_read({**READ, "tls": "false"}, streaming=False).tls is None
    tls = parse_read({**READ, "TLS": "true", "tlsclienttrustcertpath": str(certs.ca)}, streaming=True).tls
    assert tls == TlsOptions(trust_cert_path=str(certs.ca))
    full = parse_write({**NS, **client_options(certs)}).tls
    assert full is not None and full.auth_server and full.cert_path == str(certs.folder / "client.pem")
    locked = parse_write({**NS, "tls": "true", "tlsClientCertPath": str(certs.folder / "locked.pem"),
                          "tlsClientKeyPath": str(certs.folder / "locked.enc.key"),
                          "tlsClientKeyPassword": "s3cret", "tlsClientAuthServer": "false"}).tls
    assert locked is not None and not locked.auth_server and "s3cret" not in repr(locked)
    assert parse_write({**NS, "tls": "yes"}).tls == TlsOptions()


def test_bad_tls_options_name_the_option(certs: Certs, tmp_path: Path) -> None:
    ca, cert, key = str(certs.ca), str(certs.folder / "client.pem"), str(certs.folder / "client.key")
    locked = {"tls": "true", "tlsClientCertPath": str(certs.folder / "locked.pem"),
              "tlsClientKeyPath": str(certs.folder / "locked.enc.key")}
    cases = [
        ({"tls": "maybe"}, "option tls='maybe' is not true or false"),
        ({"tlsClientTrustCertPath": ca}, "option tlsClientTrustCertPath only applies with tls=true"),
        ({"tls": "false", "tlsClientAuthServer": "false"}, "option tlsClientAuthServer only applies with tls=true"),
        ({"tls": "true", "tlsClientTrustCertPath": str(tmp_path / "missing.pem")},
         "tlsClientTrustCertPath='" + str(tmp_path / "missing.pem") + "': no such file on the driver"),
        ({"tls": "true", "tlsClientTrustCertPath": " "}, "option tlsClientTrustCertPath is empty"),
        ({"tls": "true", "tlsClientTrustCertPath": str(tmp_path)}, "no such file"),
        ({"tls": "true", "tlsClientTrustCertPath": str(certs.ca_key)},
         "cannot load it as PEM CA certificate(s)"),
        ({"tls": "true", "tlsClientCertPath": cert}, "tlsClientCertPath and tlsClientKeyPath go together"),
        ({"tls": "true", "tlsClientKeyPath": key}, "tlsClientCertPath and tlsClientKeyPath go together"),
        ({"tls": "true", "tlsClientKeyPassword": "pw"}, "tlsClientKeyPassword only applies with tlsClientKeyPath"),
        ({"tls": "true", "tlsClientCertPath": cert, "tlsClientKeyPath": str(certs.key)}, "key values mismatch"),
        (locked, "an encrypted key needs the right tlsClientKeyPassword"),
        ({**locked, "tlsClientKeyPassword": "wrong"}, "cannot load the client certificate and its key"),
        ({"tls": "true", "tlsClientTrustCertPath": ca, "tlsClientAuthServer": "false"},
         "tlsClientTrustCertPath and tlsClientAuthServer=false contradict each other"),
        ({"tls": "true", "tlsClientAuthServer": "sometimes"}, "tlsClientAuthServer='sometimes' is not true or false"),
    ]
    for options, needle in cases:
        for parse in (lambda o: parse_read({**READ, **o}, streaming=False), lambda o: parse_write({**NS, **o})):
            with pytest.raises(OptionError) as info:
                parse(options)
            assert needle in str(info.value), (options, str(info.value))


# -- through Spark against an enforcing broker --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[CometServer]:
    """``cometmq serve`` accepting TLS only, from clients with a certificate of the test CA (the broker's own
    clients present the server certificate)."""
    conf = {"tls.server.mode": "enforcing", "tls.server.certPath": str(certs.cert),
            "tls.server.keyPath": str(certs.key), "tls.server.need.client.auth": "require",
            "tls.server.trustCertPath": str(certs.ca), "tls.client.certPath": str(certs.cert),
            "tls.client.keyPath": str(certs.key)}
    yield from running(tmp_path_factory, "spark-tls-broker", conf)


def create_topic(server: CometServer, certs: Certs, topic: str) -> None:
    async def go() -> None:
        tls = parse_write({"namesrv": server.namesrv, **client_options(certs)}).tls
        assert tls is not None
        async with Admin(instance=ClientInstance(server.namesrv, tls=tls.context())) as admin:
            await admin.create_topic(topic, read_queues=2, write_queues=2, wait=10.0)

    asyncio.run(go())


def test_write_and_read_back_over_tls(spark: SparkSession, tls_server: CometServer, certs: Certs) -> None:
    topic = "SparkTls"
    create_topic(tls_server, certs, topic)
    tls = client_options(certs)
    df = spark.createDataFrame([(f"m{i}", f"k{i % 3}") for i in range(60)], "body string, shardingKey string")
    df.write.format("cometmq").option("namesrv", tls_server.namesrv).option("topic", topic).options(**tls) \
        .mode("append").save()
    # the exactly-once sink: its tasks' transaction producers, the driver's commit and its commit-topic admin
    df.limit(10).selectExpr("concat('tx', body) AS body").write.format("cometmq") \
        .option("namesrv", tls_server.namesrv).option("topic", topic).option("transactional", "true") \
        .options(**tls).mode("append").save()
    rows = (spark.read.format("cometmq").option("namesrv", tls_server.namesrv).option("subscribe", topic)
            .options(**tls).load().select("body", "queueId").collect())
    assert Counter(r.body.decode() for r in rows) == Counter([f"m{i}" for i in range(60)] +
                                                             [f"txm{i}" for i in range(10)])
    assert {r.queueId for r in rows} == {0, 1}

    # without tls=true: refused at planning, with a hint; with TLS but no client certificate: refused too
    started = time.monotonic()
    plain = spark.read.format("cometmq").option("namesrv", tls_server.namesrv).option("subscribe", topic).load()
    with pytest.raises(SparkError) as info:
        plain.collect()
    assert f"cannot talk to {tls_server.namesrv}" in str(info.value)
    assert "closes plaintext connections: if the cluster uses TLS, set the option tls=true" in str(info.value)
    anonymous = (spark.read.format("cometmq").option("namesrv", tls_server.namesrv).option("subscribe", topic)
                 .option("tls", "true").option("tlsClientTrustCertPath", str(certs.ca)).load())
    with pytest.raises(SparkError) as info:
        anonymous.collect()
    assert f"cannot talk to {tls_server.namesrv}" in str(info.value)
    assert "closes plaintext connections" not in str(info.value)
    assert time.monotonic() - started < 8, "a refused connection must fail at once, not wait for a timeout"
