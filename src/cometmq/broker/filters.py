"""Message filters for pulls: tag expressions by hash code (the client re-checks the tag text), and SQL92
expressions on message properties, evaluated on the broker so non-matching messages never cross the network."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cometmq.common.java_text import JAVA_TRIM
from cometmq.common.memo import cached_by_length
from cometmq.protocol.codes import RemotingError, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import record_properties
from cometmq.protocol.taghash import java_string_hash, split_tags

TagFilter = Callable[[int], bool]
PropertyFilter = Callable[[Mapping[str, str]], bool]
RecordFilter = Callable[[memoryview], bool]


def property_filter_for(expression_type: str | None, expression: str | None,
                        enabled: bool) -> PropertyFilter | None:
    """A SQL92 filter on message properties, or None for tag subscriptions. Raises RemotingError when SQL92
    filtering is off on this broker or the expression does not parse."""
    if expression_type is None or expression_type.upper() in ("", "TAG"):
        return None
    if expression_type.upper() != "SQL92":
        raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"unknown expression type {expression_type}")
    if not enabled:
        raise RemotingError(ResponseCode.SYSTEM_ERROR,
                            "the broker does not filter by SQL92: set enablePropertyFilter=true")
    text = (expression or "").strip()
    if not text or text == "*":
        return None
    from cometmq.filter import FilterSyntaxError, cached_filter  # the SQL92 parser: only for SQL92 subscriptions

    try:
        return cached_filter(text)
    except FilterSyntaxError as exc:
        raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                            f"bad SQL92 expression {_shown(text)}: {exc}") from None


def _shown(expression: str) -> str:
    """An expression as a remark quotes it: a huge one cut short."""
    return repr(expression if len(expression) <= 200 else expression[:200] + "...")


def record_filter_for(prop_filter: PropertyFilter) -> RecordFilter:
    """Apply a property filter to stored records, reading only their properties."""

    def match(view: memoryview) -> bool:
        try:
            return prop_filter(record_properties(view))
        except ProtocolError:
            return False

    return match


def parse_tag_expression(expression: str | None) -> frozenset[str] | None:
    """"TagA || TagB" -> {"TagA", "TagB"}; "" or "*" -> None (everything)."""
    if expression is None:
        return None
    text = expression.strip(JAVA_TRIM)
    if not text or text == "*":
        return None
    tags = frozenset(split_tags(text))
    if not tags:
        raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"cannot parse tag expression {_shown(expression)}")
    return tags


#: the longest tag expression a subscription may have: its filter is made in ~50 ms and holds ~0.5 MB
MAX_TAG_EXPRESSION_LENGTH = 65_536


def tag_filter_for(expression: str | None) -> TagFilter | None:
    """A filter on consume-queue tag codes, or None when the expression takes every message. Raises RemotingError
    for an expression it cannot parse or longer than MAX_TAG_EXPRESSION_LENGTH."""
    if expression is None:
        return None
    if len(expression) > MAX_TAG_EXPRESSION_LENGTH:
        raise RemotingError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"tag expression {_shown(expression)} is "
                            f"longer than {MAX_TAG_EXPRESSION_LENGTH} characters")
    return _cached_tag_filter(expression)


def _tag_filter(expression: str) -> TagFilter | None:
    tags = parse_tag_expression(expression)
    if tags is None:
        return None
    codes = frozenset(java_string_hash(t) for t in tags)
    return codes.__contains__


_cached_tag_filter = cached_by_length(_tag_filter)
