"""The rewrites a send goes through before it is stored, as ordered hooks registered at start-up.

A delay level moves a message to the schedule topic, timer properties move it to the timer topic, a
transaction's half is stored out of sight: each is a ``SendHook`` registered by the service that owns it, in
the order they must run (RocketMQ's put-message hooks play the same part). The send processor knows none of
them: it runs the chain before the append and again after it.

A hook's ``before_put`` may rewrite the messages in place, refuse the send (raise ``RemotingError``), or take it
(return True: the later hooks do not run; a transaction's half is neither delayed nor timed). ``after_put`` sees
the result and may add fields to the answer (``SendContext.response_ext``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cometmq.store.message import MessageInner
from cometmq.store.status import PutResult


class SendKind(enum.Enum):
    #: SEND_MESSAGE / V2 / BATCH from a producer
    SEND = "send"
    #: CONSUMER_SEND_MSG_BACK: a consumer hands a message back for a retry (or the DLQ)
    SEND_BACK = "send_back"


@dataclass(slots=True)
class SendContext:
    kind: SendKind
    producer_group: str = ""
    batch: bool = False
    #: the batch asks to be stored as transaction halves (cometmq's extension, protocol/transaction_batch.py)
    half_batch: bool = False
    #: fields the hooks add to the send's answer (e.g. a timer message's recall handle)
    response_ext: dict[str, str] = field(default_factory=dict)
    #: the hooks that ran before the put, so that only they see the result
    ran: list[SendHook] = field(default_factory=list)
    #: set by a hook that must note where the records went the moment they are in the log, before anything
    #: else runs (a transaction's half); passed to ``Appender.put``
    on_stored: Callable[[PutResult], None] | None = None


class SendHook(Protocol):
    #: the kinds of send the hook looks at
    kinds: frozenset[SendKind]

    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> bool:
        """Rewrite ``msgs`` in place or raise RemotingError; True takes the send (no later hook runs)."""
        ...

    def after_put(self, msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        """Called with the stored result (also a timeout's: the records are stored)."""
        ...


class SendHooks:
    """The ordered chain; services register their hook at start-up."""

    def __init__(self) -> None:
        self._hooks: list[SendHook] = []

    def register(self, hook: SendHook) -> None:
        self._hooks.append(hook)

    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> None:
        for hook in self._hooks:
            if ctx.kind in hook.kinds:
                ctx.ran.append(hook)
                if hook.before_put(msgs, ctx):
                    return

    @staticmethod
    def after_put(msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        for hook in ctx.ran:
            hook.after_put(msgs, result, ctx)
