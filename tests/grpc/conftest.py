"""tests/grpc needs the ``grpc`` extra; without it the directory is not collected. Fixtures live in kit.py."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("grpc") is None or importlib.util.find_spec("google.protobuf") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from tests.grpc.kit import endpoint, quick_endpoint  # noqa: F401  (fixtures)
