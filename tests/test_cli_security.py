"""Security options of the standalone commands (docs/security.md): `cometmq namesrv` with TLS (its options and
namesrv.properties' tls.* keys), `cometmq controller` with an ACL and TLS from its controller.properties, and what
they refuse before anything starts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.client import Admin, ClientInstance
from cometmq.client.errors import MQClientError
from cometmq.net.client import RemotingClient
from cometmq.net.tls import client_context
from cometmq.net.tls_settings import TlsConfig
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.broker.conftest import broker_config
from tests.net.tlskit import Certs, make_certs
from tests.test_cli import cometmq, free_port
from tests.test_cli_controller import running

pytestmark = pytest.mark.timeout(120)

ADMIN = ("cliAdmin01", "cliAdminSecret1")
ACL = f"""\
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_namesrv_serves_routes_over_tls_only(tmp_path: Path, certs: Certs) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    conf = tmp_path / "namesrv.properties"
    # the certificate from the file, the mode from the command line
    conf.write_text(f"listenPort={port}\ntls.server.certPath={certs.cert}\ntls.server.keyPath={certs.key}\n")
    with running("namesrv", "-c", str(conf), "--tls-mode", "enforcing") as (_, line):
        assert line.strip() == f"cometmq namesrv listening on {addr}, TLS enforcing"

        async def main() -> None:
            tls = TlsConfig(client_enable=True, client_auth_server=True, client_trust_cert_path=str(certs.ca))
            broker = BrokerController(broker_config(tmp_path / "b", namesrv_addr=addr, broker_name="broker-tls",
                                                    tls=tls))
            await broker.start()  # registers over TLS
            try:
                async with Admin(instance=ClientInstance(addr, tls=True, tls_ca_file=str(certs.ca))) as admin:
                    for _ in range(100):
                        route = await admin.topic_route("TBW102")
                        if route.broker_datas:
                            break
                        await asyncio.sleep(0.1)
                    assert [b.broker_name for b in route.broker_datas] == ["broker-tls"]
                async with Admin(instance=ClientInstance(addr, request_timeout=1.0, tls=False)) as plain:
                    with pytest.raises(MQClientError):
                        await plain.topic_route("TBW102")
            finally:
                await broker.stop()

        asyncio.run(main())


async def _call(addr: str, cmd: RemotingCommand, *, creds: tuple[str, str] | None = None,
                tls: bool = True) -> RemotingCommand:
    async with RemotingClient(ssl=client_context(insecure=True) if tls else None) as client:
        if creds is not None:
            cmd = sign_request(cmd, Credentials(*creds))
        return await client.invoke(addr, cmd, 3)


def test_controller_with_acl_and_tls_from_its_properties(tmp_path: Path, certs: Certs) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    conf = tmp_path / "controller.properties"
    conf.write_text(f"listenPort={port}\naclEnable=true\naclFile={acl}\ntls.server.mode=enforcing\n"
                    f"tls.server.certPath={certs.cert}\ntls.server.keyPath={certs.key}\n"
                    "innerClientAuthenticationCredentials=" + json.dumps(
                        {"accessKey": ADMIN[0], "secretKey": ADMIN[1]}) + "\n")
    with running("controller", "--data", str(tmp_path / "ctl"), "-c", str(conf)) as (_, line):
        assert line.strip().startswith(f"cometmq controller listening on {addr} (node n0, log in ")
        assert f"TLS enforcing, ACL {acl}" in line

        async def main() -> None:
            elect = make_request(RequestCode.CONTROLLER_ELECT_MASTER, {"clusterName": "c", "brokerName": "g",
                                                                        "brokerId": 1})
            r = await _call(addr, elect)
            assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "No accessKey is configured")
            r = await _call(addr, elect, creds=ADMIN)  # decided: the group is not known
            assert r.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, (r.code, r.remark)
            r = await _call(addr, make_request(RequestCode.CONTROLLER_GET_METADATA_INFO))
            assert r.code == ResponseCode.SUCCESS
            with pytest.raises(Exception):  # noqa: B017 - plaintext: the connection is closed, whatever the error
                await _call(addr, make_request(RequestCode.CONTROLLER_GET_METADATA_INFO), tls=False)

        asyncio.run(main())


def test_serve_with_tls_in_its_broker_conf_loads_openssl_and_serves_both(tmp_path: Path, certs: Certs) -> None:
    """TLS settings keep the real ssl module (cometmq.net.no_openssl stays out): permissive, from broker.conf."""
    ns, bp = free_port(), free_port()
    conf = tmp_path / "broker.conf"
    conf.write_text(f"tls.server.mode=permissive\ntls.server.certPath={certs.cert}\ntls.server.keyPath={certs.key}\n")
    with running("serve", "--data", str(tmp_path / "d"), "-c", str(conf), "--namesrv-port", str(ns),
                 "--broker-port", str(bp), "--grpc-port", "0") as (proc, line):
        assert "cometmq serving" in line, line
        assert "/_ssl." in Path(f"/proc/{proc.pid}/maps").read_text()

        async def main() -> None:
            for tls in (True, False):
                r = await _call(f"127.0.0.1:{bp}", make_request(RequestCode.GET_BROKER_RUNTIME_INFO), tls=tls)
                assert r.code == ResponseCode.SUCCESS, (tls, r.code, r.remark)

        asyncio.run(main())


def test_bad_security_options_stop_the_commands(tmp_path: Path) -> None:
    def refused(*args: str) -> str:
        """The error, its words joined by single spaces (the box it is printed in may wrap it anywhere)."""
        out = subprocess.run(cometmq(*args), capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        return " ".join(w for w in out.stderr.replace("│", " ").split() if w.strip("╭╮╰╯─"))

    assert "needs tls.server.certPath" in refused("namesrv", "--port", "0", "--tls-mode", "enforcing")
    assert "must be disabled, permissive or enforcing, not 'sometimes'" in refused(
        "namesrv", "--port", "0", "--tls-mode", "sometimes")
    out = refused("controller", "--data", str(tmp_path / "c"), "--inner-credentials", "justOneSecretWord")
    assert "--inner-credentials" in out and "justOneSecretWord" not in out
    conf = tmp_path / "controller.properties"
    conf.write_text("aclEnable=true\naclFiel=x\n")
    assert "aclFiel" in refused("controller", "--data", str(tmp_path / "c"), "-c", str(conf))
    bad_acl = tmp_path / "bad.yml"
    bad_acl.write_text("accounts:\n  - accessKey: shortish1\n    secretKey: secret123\n    defaultTopicPerm: PUBLISH\n")
    conf.write_text(f"aclEnable=true\naclFile={bad_acl}\n")
    assert "PUBLISH" in refused("controller", "--data", str(tmp_path / "c"), "-c", str(conf))
    ns = tmp_path / "namesrv.properties"
    ns.write_text('innerClientAuthenticationCredentials={"accessKey": "ak"}\n')
    assert "innerClientAuthenticationCredentials must name both keys" in refused("namesrv", "-c", str(ns))
    assert not (tmp_path / "c").exists()  # nothing started, no log folder made
