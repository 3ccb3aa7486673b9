"""Event loop selection: uvloop when it is installed, the stdlib loop otherwise."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None when uvloop is unavailable (e.g. Windows, PyPy)."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def install_uvloop() -> bool:
    """Make uvloop the default for loops created from now on; False (and nothing changed) without it."""
    try:
        import uvloop
    except ImportError:
        log.debug("uvloop not installed; using the asyncio event loop")
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on a uvloop loop when available (without touching the global policy)."""
    factory = uvloop_factory() if use_uvloop else None
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main)
