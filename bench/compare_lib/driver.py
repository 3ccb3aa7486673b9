"""The client process of one broker session: ``python -m compare_lib.driver SYSTEM CONFIG_JSON``.

Reads one JSON command a line on stdin (``{"op": "produce", "args": {...}, "timeout": s}``), runs it on a fresh
uvloop event loop and answers one JSON line on stdout: ``{"ok": true, "result": {...}}`` or ``{"ok": false,
"error": "..."}``. Its own CPU time per command is in ``client_cpu_s``. Exits at end of input.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import traceback
from collections.abc import Coroutine
from typing import Any

from compare_lib.clients import client_for
from compare_lib.clients.base import BenchClient

OPS = ("produce", "fill", "consume", "latency", "acked", "delete", "settings")


def _call(client: BenchClient, op: str, args: dict[str, Any]) -> Coroutine[Any, Any, Any]:
    if op == "produce":
        return client.produce(args["stream"], args["size"], args["max_count"], args["seconds"])
    if op == "fill":
        return client.fill(args["stream"], args["size"], args["count"])
    if op == "consume":
        return client.consume(args["stream"], args["count"])
    if op == "latency":
        return client.latency(args["stream"], args["count"], args["interval_ms"])
    if op == "acked" and args.get("auto_batch"):
        return client.acked_auto_batch(args["stream"], args["size"], args["producers"], args["max_count"],
                                       args["seconds"])
    if op == "acked":
        return client.acked(args["stream"], args["size"], args["producers"], args["max_count"], args["seconds"],
                            bool(args.get("fsync", True)))
    if op == "delete":
        return client.delete(args["stream"])
    raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def _run(coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    try:
        import uvloop
    except ImportError:
        return asyncio.run(bounded())
    return uvloop.run(bounded())


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    system, cfg = argv[0], json.loads(argv[1])
    client = client_for(system, cfg)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd["op"]
        c0 = time.process_time()
        try:
            if op == "settings":
                answer: dict[str, Any] = {"ok": True, "result": {"settings": client.settings}}
            else:
                result = _run(_call(client, op, cmd.get("args", {})), float(cmd.get("timeout", 600)))
                answer = {"ok": True, "result": result or {}}
        except BaseException as exc:  # report, keep serving; the orchestrator decides
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc(limit=6)}
        answer["client_cpu_s"] = round(time.process_time() - c0, 4)
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
