"""common/failpoints.py: the spec is parsed strictly; a point dies at its N-th hit (in a child process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cometmq.common import failpoints


@pytest.mark.parametrize("spec", ["a@0", "a@x", "@3", "a@-1"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="NAME or NAME@N"):
        failpoints.arm(spec)


def test_a_point_dies_at_its_nth_hit() -> None:
    code = ("from cometmq.common import failpoints\n"
            "for i in range(5):\n    print(i, flush=True)\n    failpoints.hit('x')\n    failpoints.hit('y')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"COMETMQ_FAILPOINTS": "x@3", "PATH": "/usr/bin:/bin"})
    assert out.returncode == failpoints.EXIT_CODE
    assert out.stdout.split() == ["0", "1", "2"] and "failpoint x: exiting" in out.stderr
    unarmed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin"})
    assert unarmed.returncode == 0 and unarmed.stdout.split() == ["0", "1", "2", "3", "4"]
