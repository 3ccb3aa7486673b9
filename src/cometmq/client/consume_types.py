"""Value types of the push consumer: what a listener returns, its counters, and a parsed subscription."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from cometmq.client.errors import InvalidArgumentError
from cometmq.client.message import MessageExt
from cometmq.common.java_text import JAVA_TRIM
from cometmq.protocol.client_bodies import SubscriptionData
from cometmq.protocol.taghash import split_tags


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def task_cancelled() -> bool:
    """For a CancelledError caught around a listener call: whether the calling task is being cancelled (the consumer
    closing), not the listener raising one of its own (it awaited something cancelled; a plain one called result()
    on a cancelled future) — that is a failure like any exception, as RocketMQ's listener calls catch every
    Throwable."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class ConsumeStatus(enum.Enum):
    """What a listener returns for its batch of messages."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    #: deliver these messages again later (through the group's retry topic; after ``max_reconsume_times``
    #: redeliveries a message goes to the group's dead-letter topic ``%DLQ%<group>``)
    RECONSUME_LATER = "RECONSUME_LATER"


#: ``listener(msgs)`` -> ConsumeStatus | None, or a coroutine function returning one
MessageListener = Callable[[list[MessageExt]], Any]


@dataclasses.dataclass
class ConsumerStats:
    """Counters of a push consumer (messages, not batches)."""

    pulled: int = 0
    consumed: int = 0
    #: messages the listener asked to have again (RECONSUME_LATER or an exception)
    failed: int = 0
    #: messages sent back to the broker for redelivery
    retried: int = 0
    #: messages whose send-back failed: they are consumed again locally after a delay
    send_back_failed: int = 0
    #: messages the broker sent that the client-side tag check dropped
    filtered: int = 0
    #: pulls delayed because a queue held too many (or too large) unconsumed messages
    flow_controlled: int = 0
    pull_errors: int = 0
    #: orderly: messages put back by a ROLLBACK
    rolled_back: int = 0
    #: orderly: messages still failing after ``max_reconsume_times`` local retries, sent to the DLQ (or retry topic)
    given_up: int = 0
    #: orderly: times a queue's lock was lost (not renewed, taken by another consumer, connection dropped)
    locks_lost: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str = "*"
    expression_type: str = "TAG"
    #: for TAG subscriptions, the tags taken (None = every message); None for SQL92 (the broker filters)
    tags: frozenset[str] | None = None
    version: int = 0

    @classmethod
    def parse(cls, topic: str, expression: str | None, expression_type: str) -> Subscription:
        kind = (expression_type or "TAG").upper()
        text = (expression or "").strip()
        if kind == "TAG":
            text = (expression or "").strip(JAVA_TRIM)  # as the broker and RocketMQ take tags (String.trim)
            if not text or text == "*":
                return cls(topic, "*", kind, None, _now_ms())
            tags = frozenset(split_tags(text))
            if not tags:
                raise InvalidArgumentError(f"tag expression {expression!r} for {topic} names no tag")
            return cls(topic, text, kind, tags, _now_ms())
        if kind == "SQL92":
            if not text:
                raise InvalidArgumentError(f"the SQL92 expression for {topic} is empty")
            return cls(topic, text, kind, None, _now_ms())
        raise InvalidArgumentError(f"expression_type must be 'TAG' or 'SQL92', not {expression_type!r}")

    def matches(self, msg: MessageExt) -> bool:
        """The client-side re-check: the broker filters tags by hash code, which may collide."""
        return self.tags is None or msg.tags in self.tags

    def data(self) -> SubscriptionData:
        return SubscriptionData(self.topic, self.expression, self.version, self.expression_type,
                                tuple(sorted(self.tags or ())))
