"""What every RPC shares: authentication, the caller's identity, and turning failures into a response
``status`` (the 5.x clients read the status of every response; a transport error is not what they expect)."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from cometmq.grpc.auth import Authenticator, AuthError
from cometmq.grpc.backend import Backend
from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.sessions import Sessions
from cometmq.grpc.status import GrpcError, status
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol.errors import ProtocolError

log = logging.getLogger("cometmq.grpc")

R = TypeVar("R")
Svc = TypeVar("Svc", bound="RpcBase")


class RpcBase:
    def __init__(self, backend: Backend, config: ProxyConfig, sessions: Sessions) -> None:
        self.backend = backend
        self.config = config
        self.sessions = sessions
        self.auth = (Authenticator(dict(config.access_keys), config.max_clock_skew_s)
                     if config.auth_enabled else None)

    def check_auth(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self.auth is None:
            return
        try:
            self.auth.verify(metadata_of(context))
        except AuthError as exc:
            raise GrpcError(pb.Code.UNAUTHORIZED, str(exc)) from None


def metadata_of(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        out[key] = value if isinstance(value, str) else value.decode("utf-8", "replace")
    return out


def client_id_of(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    return metadata_of(context).get("x-mq-client-id", "")


def _failure(exc: BaseException, what: str) -> pb.Status:
    if isinstance(exc, GrpcError):
        return status(exc.code, exc.message)
    if isinstance(exc, ProtocolError):
        # The gRPC endpoint's boundary: a handle or field the client got wrong. Local errors too, for here they
        # come from re-encoding the client's own data (its message properties) for the remoting protocol.
        return status(pb.Code.BAD_REQUEST, str(exc))
    log.exception("%s failed", what)
    return status(pb.Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


def unary(response: Callable[..., R]) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """An RPC handler that checks credentials first and answers failures with ``response(status=...)``."""

    def wrap(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def handler(self: RpcBase, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> R:
            try:
                self.check_auth(context)
                return await fn(self, request, context)
            except Exception as exc:
                return response(status=_failure(exc, fn.__name__))

        return handler

    return wrap


StreamFn = Callable[..., AsyncIterator[R]]


def streaming(response: Callable[..., R]) -> Callable[[StreamFn[R]], StreamFn[R]]:
    """The same for a server-streaming RPC: a failure ends the stream with one status item."""

    def wrap(fn: Callable[..., AsyncIterator[R]]) -> Callable[..., AsyncIterator[R]]:
        @functools.wraps(fn)
        async def handler(self: RpcBase, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[R]:
            try:
                self.check_auth(context)
                async for item in fn(self, request, context):
                    yield item
            except Exception as exc:
                yield response(status=_failure(exc, fn.__name__))

        return handler

    return wrap


def remaining_ms(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    left = context.time_remaining()
    return None if left is None else left * 1000
