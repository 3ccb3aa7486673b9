"""The SDK over TLS: a nameserver and a broker with tls.server.mode=enforcing (the broker registering over TLS,
tls.enable), a producer and a consumer whose ClientInstance has ``tls=True``; a plaintext client is refused and
the broker goes on. Pulled bodies above the sendfile threshold must come encrypted, not from the file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.broker.config import BrokerConfig
from cometmq.broker.controller import BrokerController
from cometmq.client import Admin, ClientInstance, LitePullConsumer, Message, MessageQueue, Producer
from cometmq.client.errors import InvalidArgumentError, MQClientError
from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from cometmq.net.tls_settings import TlsConfig, TlsMode
from tests.net.tlskit import Certs, make_certs

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def cluster(tmp_path: Path, certs: Certs) -> AsyncIterator[tuple[str, BrokerController]]:
    tls = TlsConfig(mode=TlsMode.ENFORCING, cert_path=str(certs.cert), key_path=str(certs.key),
                    client_enable=True, client_auth_server=True, client_trust_cert_path=str(certs.ca))
    ns = NamesrvController(NamesrvConfig(port=0, tls=tls))
    await ns.start()
    try:
        cfg = BrokerConfig(listen_port=0, broker_name="broker-tls", namesrv_addr=f"127.0.0.1:{ns.port}", tls=tls)
        b = BrokerController(cfg.replace(store=cfg.store.replace(
            store_path=tmp_path / "broker", commitlog_segment_size=4 << 20, consume_queue_units_per_file=1000,
            max_hash_slot_num=1024, max_index_num=8192, max_message_size=1 << 20)))
        await b.start()
        try:
            yield f"127.0.0.1:{ns.port}", b
        finally:
            await b.stop()
    finally:
        await ns.stop()


async def test_producer_and_consumer_over_tls(cluster: tuple[str, BrokerController], certs: Certs) -> None:
    namesrv, _ = cluster

    def instance() -> ClientInstance:
        return ClientInstance(namesrv, tls=True, tls_ca_file=str(certs.ca))

    async with Admin(instance=instance()) as admin:
        await admin.create_topic("Tls", read_queues=1, write_queues=1)
    q = MessageQueue("Tls", "broker-tls", 0)
    bodies = [b"small", b"x" * 200_000]  # the second above the sendfile threshold
    async with Producer("pg-tls", instance=instance()) as p:
        sent = [await p.send(Message("Tls", body), queue=q) for body in bodies]
    assert all(r.ok for r in sent)
    async with LitePullConsumer("cg-tls", instance=instance(), consume_from="first", long_poll_timeout=1.0) as c:
        await c.assign([q])
        got = []
        for _ in range(20):
            got += await c.poll(0.5)
            if len(got) >= 2:
                break
    assert [m.body for m in got] == bodies


async def test_a_plaintext_client_is_refused_and_the_broker_goes_on(cluster: tuple[str, BrokerController],
                                                                    certs: Certs) -> None:
    namesrv, broker = cluster
    async with Admin(instance=ClientInstance(namesrv, request_timeout=1.0, tls=False)) as plain:
        with pytest.raises(MQClientError):
            await plain.create_topic("Plain", read_queues=1, write_queues=1)
    async with Admin(instance=ClientInstance(namesrv, tls=True, tls_ca_file=str(certs.ca))) as admin:
        await admin.create_topic("AfterPlain", read_queues=1, write_queues=1)
    assert broker.server is not None and broker.server.tls is not None


def test_a_bad_ca_file_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="CA"):
        ClientInstance("127.0.0.1:9876", tls=True, tls_ca_file=str(tmp_path / "missing.pem"))
