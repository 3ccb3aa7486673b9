from collections.abc import AsyncIterator

import pytest

from cometmq.namesrv.server import NamesrvConfig, NamesrvController
from tests.broker.conftest import client, start_broker  # noqa: F401  (the broker suite's fixtures)
from tests.interop.conftest import cpp_client, cpp_client_env, rocketmq_wheel  # noqa: F401  (the C++ client)


@pytest.fixture
async def namesrv() -> AsyncIterator[str]:
    """An in-process nameserver; its address."""
    ns = NamesrvController(NamesrvConfig(port=0))
    await ns.start()
    try:
        yield f"127.0.0.1:{ns.port}"
    finally:
        await ns.stop()
