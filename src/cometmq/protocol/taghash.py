"""Tag hash codes: Java ``String.hashCode()`` of the TAGS property, as the consume queue stores them."""

from __future__ import annotations

from functools import lru_cache

from cometmq.common.java_text import JAVA_TRIM


@lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """``h = 31*h + c`` over UTF-16 code units, wrapped to a signed 32-bit int."""
    h = 0
    # surrogatepass: a Java String may hold a lone surrogate (a JSON "\ud800" escape gives one in Python
    # too); Java hashes it as the single code unit it is, so must we, rather than raise.
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def split_tags(expression: str) -> list[str]:
    """The tags of "TagA || TagB" as RocketMQ's FilterAPI takes them: split on "||", each ``String.trim()``ed,
    empty ones dropped."""
    return [t for t in (part.strip(JAVA_TRIM) for part in expression.split("||")) if t]


def tags_code(tags: str | None) -> int:
    """The consume-queue tag code of a message: 0 when it has no tag."""
    if not tags:
        return 0
    return java_string_hash(tags)
