"""Bounded memories for hot paths: keys checked once (topic names, subscriptions), and results made from
client-written text (compiled subscription filters)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: text up to this many characters is a short key (``cached_by_length``)
SHORT_TEXT = 1024


def remember(seen: set[T], key: T, limit: int) -> None:
    """Add ``key`` to ``seen``, first emptying it when it holds ``limit`` keys (so it stays bounded whatever
    keys clients send; a forgotten key is only checked again)."""
    if len(seen) >= limit:
        seen.clear()
    seen.add(key)


def cached_by_length(make: Callable[[str], R], *, short_entries: int = 1024,
                     long_entries: int = 16) -> Callable[[str], R]:
    """``make`` memoised per text (errors are not cached), with a small cache of its own for texts longer than
    SHORT_TEXT: clients naming ever-new long texts (a subscription of megabytes) cannot fill memory."""
    short = lru_cache(maxsize=short_entries)(make)
    long = lru_cache(maxsize=long_entries)(make)

    def cached(text: str) -> R:
        return (short if len(text) <= SHORT_TEXT else long)(text)

    return cached
