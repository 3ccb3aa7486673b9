"""The optional C helpers (built at install by setup.py when a compiler is there; Python is the fallback)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: set to anything but "" or "0" to run the pure-Python reference code instead of every C helper
PURE_PYTHON_ENV = "COMETMQ_PURE_PYTHON"


def load_c_helper(module: str) -> ModuleType | None:
    """The compiled ``module``, or None when it was not built or COMETMQ_PURE_PYTHON turns the helpers off."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
