from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cometmq.namesrv.server import NamesrvConfig, NamesrvController


@pytest.fixture
async def two_namesrvs() -> AsyncIterator[list[NamesrvController]]:
    """Two nameservers on free loopback ports, stopped after the test."""
    servers = [NamesrvController(NamesrvConfig(port=0)) for _ in range(2)]
    for s in servers:
        await s.start()
    yield servers
    for s in servers:
        await s.stop()
