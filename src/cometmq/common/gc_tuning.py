"""Garbage-collector settings for the server processes (``cometmq serve``, ``broker``, ``namesrv``, ``proxy``).

A broker allocates a few short-lived objects per message (the decoded message, its properties view, dispatch
records), so with Python's default thresholds (700, 10, 10) the collector runs every few hundred messages and
a full collection, which walks every object the process holds, every 70,000 allocations. Measured on batched
sends (docs/benchmarks.md): 145-160k msg/s with the defaults, 164-190k with the settings below. They are set
only by the command-line servers, after start-up: a broker embedded in someone's process leaves that
process's collector alone.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

#: first-generation threshold 50,000 allocations; the older generations at 20 and 100 of the younger's runs
SERVER_THRESHOLDS = (50_000, 20, 100)
ENV = "COMETMQ_GC_THRESHOLDS"


def thresholds_from_env(value: str | None) -> tuple[int, ...] | None:
    """``COMETMQ_GC_THRESHOLDS``: unset → the server defaults; ``default`` → Python's own (nothing changed);
    otherwise one to three non-negative integers, comma-separated (``gc.set_threshold``'s arguments)."""
    if value is None or not value.strip():
        return SERVER_THRESHOLDS
    if value.strip().lower() == "default":
        return None
    try:
        parts = tuple(int(p) for p in value.split(","))
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected 'default' or up to three integers like 50000,20,100") from None
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts):
        raise ValueError(f"{ENV}={value!r}: expected 'default' or up to three non-negative integers")
    return parts


def tune_for_server() -> None:
    """Freeze what start-up allocated (the modules, configuration and loaded store metadata live for the
    whole run: full collections stop walking them) and raise the thresholds."""
    wanted = thresholds_from_env(os.environ.get(ENV))
    if wanted is None:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*wanted)
    log.debug("gc: froze %d start-up objects, thresholds %s", gc.get_freeze_count(), wanted)


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``), once the server is up:
    start-up frees much of what it allocated (import-time work, configuration parsing, store recovery) and glibc
    keeps those pages otherwise, ~0.7 MiB of an idle ``cometmq serve`` (docs/benchmarks.md, [16] idle memory).
    False where the C library has no ``malloc_trim`` (musl, macOS): nothing done. The C helper
    (cometmq.common._osc) makes the call; ctypes where it was not built."""
    from cometmq.common.native import load_c_helper

    osc = load_c_helper("cometmq.common._osc")
    if osc is not None:
        return bool(osc.malloc_trim())
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


#: glibc's mmap and trim thresholds once a server is up (fix_malloc_thresholds)
MALLOC_MMAP_THRESHOLD = 1 << 20
MALLOC_TRIM_THRESHOLD = 2 << 20


def fix_malloc_thresholds() -> bool:
    """Fix glibc's mmap threshold at 1 MiB and its trim threshold at 2 MiB, once the server is up (after
    :func:`trim_heap`: start-up allocates as before). glibc's own thresholds are dynamic: whether a batch frame's
    receive buffer (140 KB for 128 messages of 1 KiB) came from the heap or from a fresh mmap per frame depended on
    what start-up happened to free, and batched 1 KiB produce ran 20 % slower in the unlucky case
    (docs/benchmarks.md, session 19). False (nothing done) without glibc or the C helper, or when the environment
    sets either threshold (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``): the operator's choice stands."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    from cometmq.common.native import load_c_helper

    osc = load_c_helper("cometmq.common._osc")
    return bool(osc.malloc_thresholds(MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD)) if osc is not None else False
