"""Which address of this machine to give others when a server binds a wildcard (0.0.0.0, ::); listening sockets
bound without a name lookup."""

from __future__ import annotations

import ipaddress
import socket
import sys

WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARDS


def local_address() -> str | None:
    """This machine's IPv4 address on its default route (the interface others most likely reach it on), as
    RocketMQ's brokerIP1 default picks a non-loopback address; else the host name's address if it is not a
    loopback one; None when there is neither. Sends nothing: a UDP connect only chooses the route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: any routable address works, nothing is sent
            addr = str(s.getsockname()[0])
        if not ipaddress.ip_address(addr).is_loopback and not ipaddress.ip_address(addr).is_unspecified:
            return addr
    except OSError:
        pass
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    except (OSError, ValueError):
        pass
    return None


def bound_socket(host: str, port: int) -> socket.socket | None:
    """A TCP socket bound to ``host:port`` (SO_REUSEADDR, IPv6 only for an IPv6 address: as ``create_server`` binds)
    when ``host`` is one IP address written out (``127.0.0.1``, ``0.0.0.0``, ``::1``), for ``create_server(sock=…)``.
    ``create_server(host, port)`` looks even such a host up, and uvloop does that in its thread pool (4 threads
    started) through the ``idna`` codec (stringprep, unicodedata): ~0.5 MiB of an idle ``cometmq serve`` (issue
    [16]). None for a host name, "" or a scoped IPv6 address: the loop resolves those as before. A failed bind
    raises OSError, worded as the loop's."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        return None
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if sys.platform != "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"error while attempting to bind on address {(host, port)!r}: "
                                     f"{(exc.strerror or str(exc)).lower()}") from None
    except BaseException:
        sock.close()
        raise
    return sock
