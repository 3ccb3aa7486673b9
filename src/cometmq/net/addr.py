"""Which address of this machine to give others when a server binds a wildcard (0.0.0.0, ::)."""

from __future__ import annotations

import ipaddress
import socket

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
