"""A bounded memory of keys a hot path has checked once (topic names, subscriptions)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def remember(seen: set[T], key: T, limit: int) -> None:
    """Add ``key`` to ``seen``, first emptying it when it holds ``limit`` keys (so it stays bounded whatever
    keys clients send; a forgotten key is only checked again)."""
    if len(seen) >= limit:
        seen.clear()
    seen.add(key)
