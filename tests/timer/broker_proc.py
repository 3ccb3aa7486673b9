"""A broker in its own process for the kill -9 tests: prints its address, then runs until killed.

    python -m tests.timer.broker_proc DATA_DIR
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from cometmq.broker.controller import BrokerController
from tests.broker.conftest import broker_config


async def main(path: Path) -> None:
    broker = BrokerController(broker_config(path, timer_flush_interval_ms=200))
    await broker.start()
    print(f"READY {broker.addr}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
