"""Message filters for pulls: tag expressions by hash code (and the client re-checks the tag text)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.taghash import java_string_hash

TagFilter = Callable[[int], bool]


def parse_tag_expression(expression: str | None) -> frozenset[str] | None:
    """"TagA || TagB" -> {"TagA", "TagB"}; "" or "*" -> None (everything)."""
    if expression is None:
        return None
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"cannot parse tag expression {expression!r}")
    return tags


@lru_cache(maxsize=1024)
def tag_filter_for(expression: str | None) -> TagFilter | None:
    """A filter on consume-queue tag codes, or None when the expression takes every message."""
    tags = parse_tag_expression(expression)
    if tags is None:
        return None
    codes = frozenset(java_string_hash(t) for t in tags)
    return codes.__contains__
