"""The state machine, its events, the policy and the liveness table are pure: no I/O, no clocks, no asyncio."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cometmq.controller

PURE = ["state", "events", "elect", "heartbeats"]
BANNED = {"asyncio", "socket", "os", "time", "threading", "random", "pathlib", "cometmq.net", "cometmq.store",
          "cometmq.controller.log"}


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports(module: str) -> None:
    path = Path(cometmq.controller.__file__).parent / f"{module}.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("cometmq.controller." + (node.module or "") if node.level == 1 else node.module or "")
    bad = sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in BANNED))
    assert not bad, f"{module}.py imports {bad}"
