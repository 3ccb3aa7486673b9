"""The wheel, not the source tree (issue [13]): scripts/smoke-wheel builds it, installs it into a fresh
virtualenv with the dependencies it declares, runs `cometmq serve` from there and sends and receives a message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_the_wheel_installs_serves_and_delivers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHON"] = sys.executable
    out = subprocess.run([str(ROOT / "scripts" / "smoke-wheel"), str(tmp_path / "smoke")], capture_output=True,
                         text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sent and received" in out.stderr and "smoke-wheel: ok" in out.stderr
