"""A broker in its own process for the kill -9 tests: prints its address, then runs until killed.

    python -m tests.timer.broker_proc DATA_DIR [TIMER_FLUSH_INTERVAL_MS]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from cometmq.broker.controller import BrokerController
from tests.broker.conftest import broker_config


async def main(path: Path, timer_flush_interval_ms: int = 200) -> None:
    broker = BrokerController(broker_config(path, timer_flush_interval_ms=timer_flush_interval_ms))
    await broker.start()
    print(f"READY {broker.addr}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:3])))
