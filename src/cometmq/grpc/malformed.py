"""Requests whose bytes do not parse as the method's protobuf (issue [15]).

grpcio deserializes a request before any servicer code runs; a ``DecodeError`` there was answered UNKNOWN and
logged with a traceback at ERROR by grpcio itself, once per call and before authentication: a log flood anyone
could start. ``MalformedRequestInterceptor`` wraps each method's deserializer so a failure becomes a marker the
wrapped behaviour answers INVALID_ARGUMENT ("invalid protobuf byte sequence ..."), logged at WARNING without a
traceback and at most once a minute per peer (cometmq.net.limits.LogLimiter). RocketMQ's Java proxy (grpc-java)
answers the same failure INTERNAL "Invalid protobuf byte sequence"; INVALID_ARGUMENT says whose fault it is, and
the 5.x clients treat both as a failed call that is not worth retrying as is.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from cometmq.net.limits import limited_log

log = logging.getLogger("cometmq.grpc")


class _Malformed:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError, or anything a deserializer raises on bytes it cannot read
            return _Malformed(exc)

    return deserialize


def _peer_ip(context: Any) -> str:
    peer = str(context.peer() or "?")  # "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555"
    host = peer.partition(":")[2].rpartition(":")[0]
    return host.strip("[]") or peer


async def _refuse(request: _Malformed, context: Any, method: str) -> None:
    detail = f"invalid protobuf byte sequence for {method.rpartition('/')[2]}: {str(request.error)[:200]}"
    peer = _peer_ip(context)
    limited_log.warning(log, ("grpc-malformed", peer), "gRPC %s from %s: %s", method, context.peer(), detail)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)


def _wrap(handler: Any, method: str) -> Any:
    if handler.request_streaming:  # Telemetry: grpcio reads the stream; a bad item fails the stream's read
        deserializer = handler.request_deserializer

        def stream_safe(raw: bytes) -> Any:
            try:
                return deserializer(raw)
            except Exception as exc:
                limited_log.warning(log, ("grpc-malformed-stream", method), "gRPC %s: malformed stream item: %s",
                                    method, str(exc)[:200])
                raise

        return handler._replace(request_deserializer=stream_safe)
    if handler.response_streaming:
        inner_stream = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, _Malformed):
                await _refuse(request, context, method)
                return
            async for item in inner_stream(request, context):
                yield item

        return handler._replace(request_deserializer=_safe(handler.request_deserializer), unary_stream=unary_stream)
    inner: Callable[[Any, Any], Awaitable[Any]] = handler.unary_unary

    async def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, _Malformed):
            await _refuse(request, context, method)
        return await inner(request, context)

    return handler._replace(request_deserializer=_safe(handler.request_deserializer), unary_unary=unary_unary)


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers undecodable requests INVALID_ARGUMENT instead of letting grpcio log a traceback per call."""

    def __init__(self) -> None:
        self._wrapped: dict[str, Any] = {}

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:  # unknown method; raw-bytes handlers
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, _wrap(handler, method))
        return cached[1]
