"""RocketMQ's rule for topic names (TopicValidator): 1 to 127 characters, each a letter, a digit, ``%``, ``|``, ``-``
or ``_``. Kept once for the broker, the SDK and the gRPC endpoint, which each say in their own words what is wrong."""

from __future__ import annotations

import string

#: the longest topic name, in characters
TOPIC_NAME_MAX = 127
#: the characters a topic name (and a consumer group name) may hold
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "%|-_")


def has_name_chars_only(name: str) -> bool:
    """Whether every character of ``name`` is one of :data:`NAME_CHARS` (an empty name too: check emptiness first)."""
    return NAME_CHARS.issuperset(name)
