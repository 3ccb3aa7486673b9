"""A server whose settings turn TLS off runs without OpenSSL (cometmq.net.no_openssl, issue [16]): the stand-in
lets asyncio and uvloop load and carry plaintext, refuses TLS by name, and is never put in place once the real
module may be in use. Each case runs in a fresh interpreter: the stand-in changes ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SRC = Path(__file__).resolve().parents[2] / "src"


def _python(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (this checkout's src first); it prints one JSON object last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])})
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_asyncio_and_uvloop_carry_plaintext_without_openssl_and_tls_is_refused_by_name() -> None:
    result = _python("""
        import json, sys
        from cometmq.net.no_openssl import TlsUnavailable, is_kept_out, keep_out

        placed = keep_out()
        import asyncio
        import ssl
        from cometmq.net.loop import run, uvloop_factory

        refusals = []

        async def main() -> str:
            async def echo(reader, writer):
                writer.write(await reader.readline())
                await writer.drain()
                writer.close()

            server = await asyncio.start_server(echo, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"plain\\n")
            line = await reader.readline()
            writer.close()
            try:
                await asyncio.open_connection("127.0.0.1", port, ssl=True)
            except TlsUnavailable as exc:
                refusals.append(str(exc))
            server.close()
            await server.wait_closed()
            return line.decode().strip()

        echoed = run(main())
        for make in (ssl.create_default_context, ssl.SSLContext, ssl.MemoryBIO):
            try:
                make()
            except TlsUnavailable as exc:
                refusals.append(str(exc))
        try:
            ssl.PROTOCOL_TLS_CLIENT
        except AttributeError as exc:
            refusals.append(str(exc))
        print(json.dumps({"placed": placed, "kept_out": is_kept_out(), "uvloop": uvloop_factory() is not None,
                          "openssl": "_ssl" in sys.modules, "echoed": echoed, "refusals": refusals}))
    """)
    assert result["placed"] is True and result["kept_out"] is True
    assert result["openssl"] is False
    assert result["echoed"] == "plain"
    refusals = result["refusals"]
    assert isinstance(refusals, list) and len(refusals) == 5, refusals
    assert all("OpenSSL is not loaded in this process" in r for r in refusals), refusals
    assert refusals[-1].startswith("ssl.PROTOCOL_TLS_CLIENT: ")


def test_once_asyncio_or_ssl_is_imported_the_real_module_stays() -> None:
    for first in ("asyncio", "ssl"):
        result = _python(f"""
            import json, sys
            import {first}
            from cometmq.net.no_openssl import is_kept_out, keep_out

            placed = keep_out()
            import ssl
            print(json.dumps({{"placed": placed, "kept_out": is_kept_out(), "openssl": "_ssl" in sys.modules,
                              "context": type(ssl.create_default_context()).__name__}}))
        """)
        assert result == {"placed": False, "kept_out": False, "openssl": True, "context": "SSLContext"}, first


def test_a_server_reads_its_settings_before_asyncio_or_ssl_is_imported(tmp_path: Path) -> None:
    """The order keep_out depends on: server_main, broker.conf's parser and the TLS settings load neither."""
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-x\ntls.server.mode=disabled\ntlsEnable=false\nlistenPort=10911\n")
    result = _python(f"""
        import json, sys
        import cometmq.server_main
        from cometmq.broker.config import load_broker_conf
        from cometmq.net.tls_settings import tls_config_from_properties

        cfg = load_broker_conf({str(conf)!r})
        tls = tls_config_from_properties({{"tls.server.mode": "permissive"}}, cfg.tls)
        print(json.dumps({{"loaded": sorted(m for m in ("asyncio", "ssl", "_ssl", "uvloop") if m in sys.modules),
                          "name": cfg.broker_name, "mode": tls.mode.value, "client": cfg.tls.client_enable}}))
    """)
    assert result == {"loaded": [], "name": "broker-x", "mode": "permissive", "client": False}
