"""The server processes' garbage-collector settings (cometmq.common.gc_tuning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cometmq.common.gc_tuning import SERVER_THRESHOLDS, thresholds_from_env

PROBE = ("import gc, json; from cometmq.common.gc_tuning import tune_for_server; before = gc.get_threshold(); "
         "tune_for_server(); print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))")


def probe(value: str | None) -> tuple[list[int], list[int], int]:
    env = dict(os.environ)
    env.pop("COMETMQ_GC_THRESHOLDS", None)
    if value is not None:
        env["COMETMQ_GC_THRESHOLDS"] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after, frozen = json.loads(out.stdout)
    return before, after, frozen


def test_server_defaults_raise_thresholds_and_freeze_startup_objects() -> None:
    before, after, frozen = probe(None)
    assert tuple(after) == SERVER_THRESHOLDS != tuple(before)
    assert frozen > 1000  # the imported modules' objects, at least


def test_env_sets_thresholds_or_keeps_pythons() -> None:
    assert probe("20000,5")[1][:2] == [20000, 5]
    before, after, frozen = probe("default")
    assert after == before and frozen == 0


@pytest.mark.parametrize("bad", ["fast", "1,2,3,4", "-5", "1,,2"])
def test_bad_values_name_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="COMETMQ_GC_THRESHOLDS"):
        thresholds_from_env(bad)


@pytest.mark.parametrize("pure", [False, True])
def test_trim_heap_returns_the_freed_heap_where_glibc_can(pure: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Called once the servers are up (server_main._server_gc); a no-op answering False without glibc. Through the
    C helper (cometmq.common._osc) when built, through ctypes otherwise (COMETMQ_PURE_PYTHON turns the helpers off)."""
    import platform

    from cometmq.common.gc_tuning import trim_heap
    from cometmq.common.native import PURE_PYTHON_ENV

    if pure:
        monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert trim_heap() is (sys.platform == "linux" and platform.libc_ver()[0] == "glibc")


def test_fix_malloc_thresholds_where_glibc_and_the_helper_are_unless_the_environment_set_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Called once the servers are up (server_main._server_gc): glibc's mmap and trim thresholds fixed, unless the
    operator set either; nothing done without glibc or the C helper (cometmq.common._osc)."""
    import platform

    from cometmq.common.gc_tuning import fix_malloc_thresholds
    from cometmq.common.native import load_c_helper

    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    assert fix_malloc_thresholds() is (glibc and load_c_helper("cometmq.common._osc") is not None)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert fix_malloc_thresholds() is False
