"""The lite-pull consumer's bookkeeping: one state per assigned queue, a pulled batch, a subscription."""

from __future__ import annotations

import asyncio
import dataclasses

from cometmq.client.message import MessageExt, MessageQueue
from cometmq.common.java_text import JAVA_TRIM
from cometmq.protocol.client_bodies import SubscriptionData
from cometmq.protocol.taghash import split_tags

__all__ = ["Batch", "QueueState", "Subscription"]


class QueueState:
    __slots__ = (
        "blocked",
        "buffered",
        "buffered_bytes",
        "committed",
        "consumed",
        "expression",
        "expression_type",
        "paused",
        "pull_offset",
        "queue",
        "reported",
        "sub_version",
        "tags",
        "task",
        "wake",
    )

    def __init__(self, queue: MessageQueue, expression: str, expression_type: str, sub_version: int) -> None:
        self.queue = queue
        self.expression = expression
        self.expression_type = expression_type
        self.sub_version = sub_version
        #: the tags taken (None: every message); the broker filters by hash code, which may collide
        self.tags = frozenset(Subscription(queue.topic, expression, expression_type, sub_version).data().tags) or None
        self.pull_offset = -1  # next offset to pull; -1 = not known yet
        self.consumed = -1  # offset after the last message poll returned (what a commit writes); -1 = none
        self.committed = -1  # what the broker holds, as far as we know
        self.buffered = 0
        self.buffered_bytes = 0  # the bodies' bytes (as inflated) of the messages buffered
        self.paused = False
        self.blocked = False
        self.reported: tuple[int, str] | None = None
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()


class Batch:
    __slots__ = ("msgs", "next_offset", "size", "state")

    def __init__(self, state: QueueState, msgs: list[MessageExt], next_offset: int, size: int) -> None:
        self.state = state
        self.msgs = msgs  # those not yet taken
        self.next_offset = next_offset
        self.size = size  # the bodies' bytes of msgs


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str
    expression_type: str
    version: int

    def data(self) -> SubscriptionData:
        tags = () if self.expression.strip(JAVA_TRIM) in ("", "*") or self.expression_type != "TAG" else tuple(
            split_tags(self.expression))
        return SubscriptionData(self.topic, self.expression, self.version, self.expression_type, tags)
