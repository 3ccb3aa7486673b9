"""Listening sockets bound without a name lookup (net/addr.py ``bound_socket``, issue [16]): a server on an IP
address starts no lookup threads and loads no ``idna`` codec."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cometmq.net.addr import bound_socket

SRC = Path(__file__).resolve().parents[2] / "src"


def test_an_ip_address_is_bound_as_create_server_binds_it() -> None:
    sock = bound_socket("127.0.0.1", 0)
    assert sock is not None
    with sock:
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
        if sys.platform != "win32":
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)


def test_an_ipv6_address_is_bound_ipv6_only() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        sock = bound_socket("::1", 0)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    assert sock is not None
    with sock:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)


@pytest.mark.parametrize("host", ["localhost", "", "fe80::1%lo", "127.000.000.001"])
def test_names_and_what_needs_a_lookup_are_left_to_the_loop(host: str) -> None:
    assert bound_socket(host, 0) is None


def test_a_busy_port_raises_as_the_loop_would() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match="error while attempting to bind on address") as info:
            bound_socket("127.0.0.1", port)
        assert info.value.errno == errno.EADDRINUSE


def test_a_server_on_an_ip_address_starts_no_lookup_threads_nor_the_idna_codec() -> None:
    """uvloop looks up even a numeric host in its thread pool (4 threads) through the idna codec (stringprep,
    unicodedata): ~0.5 MiB of an idle server. The remoting server and the HA port bind the address themselves."""
    code = """
import asyncio, os, sys
from cometmq.net.loop import run
from cometmq.net.server import RemotingServer

async def main():
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    server = RemotingServer("127.0.0.1", 0, {})
    await server.start()
    try:
        assert server.port > 0
        now = len(os.listdir("/proc/self/task")) if threads is not None else None
        print(sorted(m for m in ("encodings.idna", "stringprep", "unicodedata") if m in sys.modules), now == threads)
    finally:
        await server.stop()

run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"]
