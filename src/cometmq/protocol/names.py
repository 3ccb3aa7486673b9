"""RocketMQ's rules for topic names (TopicValidator): 1 to 127 characters, each a letter, a digit, ``%``, ``|``, ``-``
or ``_``; which names are the system's; the values of a topic's message type. Kept once for the broker, the SDK, the
gRPC endpoint and the tools, which each say in their own words what is wrong."""

from __future__ import annotations

import string

#: the longest topic name, in characters
TOPIC_NAME_MAX = 127
#: the characters a topic name (and a consumer group name) may hold
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "%|-_")


def has_name_chars_only(name: str) -> bool:
    """Whether every character of ``name`` is one of :data:`NAME_CHARS` (an empty name too: check emptiness first)."""
    return NAME_CHARS.issuperset(name)


#: the longest consumer group name, in characters (RocketMQ's TopicValidator: a group's name becomes part of its
#: %RETRY% and %DLQ% topics' names)
GROUP_NAME_MAX = 120


def name_problem(name: str, max_length: int) -> str | None:
    """What is wrong with a topic or group name (RocketMQ's TopicValidator), in words after the name, or None."""
    if not name.strip():
        return "is blank"
    if len(name) > max_length:
        return f"is {len(name)} characters long: longer than {max_length}"
    if not has_name_chars_only(name):
        return "has characters other than letters, digits, %, |, - and _"
    return None


def group_name_problem(name: str) -> str | None:
    """What RocketMQ's TopicValidator.validateGroup refuses in a consumer group's name, in words, or None."""
    return name_problem(name, GROUP_NAME_MAX)


#: RocketMQ's system topics (TopicValidator's SYSTEM_TOPIC_SET) and the prefix of the others (``rmq_sys_``): no
#: admin may create or rewrite one, no gRPC client name one; the metrics mark their series as system ones
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "CHECKPOINT_TOPIC",
})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
#: the prefixes of a consumer group's retry topic and dead-letter topic (MixAll)
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
#: the prefix of RocketMQ's system consumer groups
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
#: the values of a topic's ``message.type`` attribute (RocketMQ's TopicMessageType)
TOPIC_MESSAGE_TYPES = frozenset({"UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"})


def is_system_topic(topic: str) -> bool:
    """RocketMQ's TopicValidator.isSystemTopic: one of :data:`SYSTEM_TOPICS` or a name starting ``rmq_sys_``."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)
