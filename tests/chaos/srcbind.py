"""Run a Python module with every outgoing loopback connection bound to one source address (no root needed).

    python tests/chaos/srcbind.py 127.0.3.2 -m cometmq.cli broker -c broker.conf

cometmq's dialers (``net/client.py``, the HA replica's ``asyncio.open_connection``) connect from the kernel's
choice, 127.0.0.1, for any 127.x destination. The fault proxies filter faults by the client's source address, so
this launcher patches ``create_connection`` of asyncio's and uvloop's loops to default ``local_addr`` to the
node's own 127.x address before the module runs. SIGUSR1 dumps the threads' stacks, SIGUSR2 the
asyncio tasks' stacks, to the process's log. Test-only: the product has no source-address option.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import os
import runpy
import signal
import sys
from collections.abc import Callable
from typing import Any


def _bound(orig: Callable[..., Any], source: str) -> Callable[..., Any]:
    async def create_connection(self: Any, protocol_factory: Any, host: Any = None, port: Any = None,
                                *args: Any, **kw: Any) -> Any:
        if kw.get("local_addr") is None and kw.get("sock") is None and isinstance(host, str) \
                and host.startswith("127."):
            kw["local_addr"] = (source, 0)
        return await orig(self, protocol_factory, host, port, *args, **kw)

    return create_connection


def install(source: str) -> None:
    base: Any = asyncio.BaseEventLoop
    base.create_connection = _bound(base.create_connection, source)
    try:
        import uvloop
    except ImportError:
        return
    loop_cls: Any = uvloop.Loop
    loop_cls.create_connection = _bound(loop_cls.create_connection, source)


def _dump_tasks(signum: int, frame: Any) -> None:
    """SIGUSR2: every asyncio task's stack to stderr (where a stuck broker waits)."""
    out = io.StringIO()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        print("srcbind: no running loop", file=sys.stderr, flush=True)
        return
    for task in asyncio.all_tasks(loop):
        out.write(f"--- {task!r}\n")
        task.print_stack(limit=12, file=out)
    print(f"srcbind: asyncio tasks\n{out.getvalue()}", file=sys.stderr, flush=True)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: srcbind.py SOURCE_IP -m MODULE [ARGS...]")
    if sys.path and sys.path[0].rstrip("/").endswith("chaos"):
        del sys.path[0]  # this file's folder: its modules must not shadow anything
    source, module = sys.argv[1], sys.argv[3]
    install(source)
    # `cometmq <server command>` would exec a fresh interpreter (cometmq.server_main) without the patch: serve here
    os.environ["COMETMQ_SERVER_EXEC"] = "0"
    faulthandler.register(signal.SIGUSR1)  # threads' stacks
    signal.signal(signal.SIGUSR2, _dump_tasks)  # asyncio tasks' stacks
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
