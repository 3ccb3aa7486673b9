"""Test certificates made with the ``openssl`` command: a CA, and server certificates it signs (SAN 127.0.0.1 and
localhost), unencrypted PEM files in a folder."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass
class Certs:
    folder: Path
    ca: Path
    ca_key: Path
    cert: Path
    key: Path

    def issue(self, name: str, cn: str = "cometmq-test", key_password: str | None = None) -> tuple[Path, Path]:
        """A new server (or client) certificate signed by the CA: (cert, key) files named ``name``."""
        key, csr, cert = (self.folder / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = self.folder / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.name, "-subj", f"/CN={cn}",
                 "-out", csr.name, cwd=self.folder)
        _openssl("x509", "-req", "-in", csr.name, "-CA", self.ca.name, "-CAkey", self.ca_key.name,
                 "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", cert.name, cwd=self.folder)
        if key_password is not None:
            enc = self.folder / f"{name}.enc.key"
            _openssl("pkey", "-in", key.name, "-aes256", "-passout", f"pass:{key_password}", "-out", enc.name,
                     cwd=self.folder)
            return cert, enc
        return cert, key


def make_certs(folder: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-subj", "/CN=cometmq test CA",
             "-days", "2", "-out", "ca.pem", cwd=folder)
    certs = Certs(folder, folder / "ca.pem", folder / "ca.key", folder / "server.pem", folder / "server.key")
    certs.issue("server", cn="cometmq-server-1")
    return certs


async def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes the non-blocking ``sock`` (or resets it) within ``within`` seconds."""
    try:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1), within)
    except TimeoutError:
        return False
    except OSError:
        return True
    return data == b""
