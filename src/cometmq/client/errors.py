"""The SDK's exceptions: one hierarchy, mapped from response codes at one place.

A reply the SDK cannot read (a ``RemoteProtocolError`` on the client: the server sent a bad body or header) is
mapped here too, by ``reading_reply``: callers see a ``BrokerError`` with SYSTEM_ERROR, as for a failing server.
"""

from __future__ import annotations

from types import TracebackType
from typing import NoReturn

from cometmq.protocol.codes import RemotingError, ResponseCode, response_code_name
from cometmq.protocol.errors import LocalProtocolError, ProtocolError


class MQClientError(Exception):
    """Base of every error the SDK raises."""

    retriable = False


class InvalidArgumentError(MQClientError, ValueError):
    """A bad argument, rejected before any request was sent."""


class ClientStateError(MQClientError):
    """The client is not started, or already closed."""


class NoRouteError(MQClientError):
    """No nameserver knows a route for the topic."""

    retriable = True


class ClientConnectionError(MQClientError):
    """Connecting to, or talking with, a server failed."""

    retriable = True


class ClientTimeoutError(MQClientError, TimeoutError):
    """A request got no answer in time."""

    retriable = True


class BrokerError(MQClientError):
    """A server answered with an error code."""

    def __init__(self, code: int, remark: str, *, addr: str = "", context: str = "") -> None:
        self.code = code
        self.remark = remark
        self.addr = addr
        self.context = context
        where = f" from {addr}" if addr else ""
        what = f" ({context})" if context else ""
        super().__init__(f"{response_code_name(code)}({code}){where}{what}: {remark or 'no remark'}")

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return RemotingError(self.code).retriable or self.code in _PRODUCER_RETRY

    @property
    def response_code(self) -> ResponseCode | int:
        try:
            return ResponseCode(self.code)
        except ValueError:
            return self.code


#: codes a producer retries on another broker (RocketMQ's retryResponseCodes)
_PRODUCER_RETRY = {ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
                   ResponseCode.NO_PERMISSION, ResponseCode.SYSTEM_BUSY}


class ReadingReply:
    """Decode a server's reply inside this block (``with reading_reply(what, addr=..., context=...)``): a reply
    that does not follow the protocol becomes ``BrokerError(SYSTEM_ERROR, "<what>: <why>")`` (``addr`` and
    ``context`` as ``BrokerError`` takes them).

    A ``LocalProtocolError`` (our own bug) passes through unchanged. A bare ``ProtocolError`` counts as the
    server's: the record codec (``protocol/message.py``) does not yet say which side it blames. A class, not a
    generator context manager: it is entered once per pull answer, on the consumer's latency path."""

    __slots__ = ("addr", "context", "what")

    def __init__(self, what: str, *, addr: str = "", context: str = "") -> None:
        self.what, self.addr, self.context = what, addr, context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, ProtocolError) and not isinstance(exc, LocalProtocolError):  # (ours passes unchanged)
            raise_unreadable(self.what, exc, addr=self.addr, context=self.context)


reading_reply = ReadingReply


def raise_unreadable(what: str, exc: ProtocolError, *, addr: str = "", context: str = "") -> NoReturn:
    """What ``reading_reply`` does with a ``ProtocolError`` raised in its block, for a caller that catches it itself
    (``except ProtocolError``: free when nothing is raised, where the block's calls are not): a
    ``LocalProtocolError`` again as it is, any other as the server's ``BrokerError``."""
    if isinstance(exc, LocalProtocolError):
        raise exc
    raise BrokerError(ResponseCode.SYSTEM_ERROR, f"{what}: {exc}", addr=addr, context=context) from None
