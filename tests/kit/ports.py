"""Free loopback ports for servers a test starts in another process.

A port is picked below the kernel's ephemeral range (``ip_local_port_range``): a port picked there is released
before the server binds it, and in that window any outgoing connection of the machine may take it as its local
port (an etcd member that then cannot bind exits; CI once lost one that way). Below the range only a listener
can take it. Each candidate is checked by binding it.

Candidates come from one cursor per process that walks the range from a random start, so two picks in one test
never return the same port (a random pick each time once handed a gRPC endpoint its own nameserver's port: both
were free when picked, since neither server had bound yet). Under pytest-xdist each worker walks its own slice of
the range, so two workers never hand out the same port either.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterable

_LOW = 10_000
_cursor: int | None = None


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_slice() -> tuple[int, int]:
    """This process's ports: [low, high), the part of the range below the ephemeral one that is this pytest-xdist
    worker's (PYTEST_XDIST_WORKER gwN of PYTEST_XDIST_WORKER_COUNT), or all of it."""
    low, high = _LOW, _ephemeral_floor()
    try:
        index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        return low, high
    if count <= 1 or not 0 <= index < count:
        return low, high
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def _bindable(ports: Iterable[int]) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_block(nodes: int = 1, offsets: tuple[int, ...] = (0,), *, step: int = 10,
                    avoid: Iterable[int] = ()) -> int:
    """A port P with P + step*i + o free for every node i and offset o, none of them in ``avoid``."""
    global _cursor
    low, high = port_slice()
    top = high - step * nodes - max(offsets) - 1
    if top <= low:  # an odd range setting: fall back to any free port the kernel hands out
        top, low = 65000 - step * nodes - max(offsets), 1024
    taken = set(avoid)
    span = top + step * nodes + max(offsets) - low  # the same for every shape: one cursor, one wrap point
    if _cursor is None:
        _cursor = random.randrange(span)
    for _ in range(200):
        base = low + _cursor % span
        if base > top:  # the block would run past the range: wrap to its start
            _cursor += span - (base - low)
            continue
        _cursor += step * nodes + max(offsets) + 1
        ports = [base + step * i + o for i in range(nodes) for o in offsets]
        if not taken.intersection(ports) and _bindable(ports):
            return base
    raise AssertionError(f"no block of {nodes}x{offsets} free ports found")


def free_port() -> int:
    """One free port, below the ephemeral range."""
    return free_port_block()
