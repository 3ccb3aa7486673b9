"""What every RPC shares: authentication, the caller's identity, and turning failures into a response
``status`` (the 5.x clients read the status of every response; a transport error is not what they expect)."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from cometmq.acl.control import AccessControl, AccessDenied, Attempt, NotAuthenticated, accounts_config, host_of
from cometmq.acl.model import ANY, PUB, SUB
from cometmq.acl.policy import Need, group_need, topic_need
from cometmq.grpc.auth import AuthError, parse_authorization
from cometmq.grpc.backend import Backend
from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.handles import ReceiptHandle
from cometmq.grpc.renewal import Renewer
from cometmq.grpc.sessions import Sessions
from cometmq.grpc.status import GrpcError, status
from cometmq.grpc.tls import RelayPeers
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.protocol.errors import ProtocolError

log = logging.getLogger("cometmq.grpc")

R = TypeVar("R")
Svc = TypeVar("Svc", bound="RpcBase")


class RpcBase:
    #: the renewal of auto-renewing receives (set by the service, which has the CHANGE_MESSAGE_INVISIBLETIME)
    renewer: Renewer

    def __init__(self, backend: Backend, config: ProxyConfig, sessions: Sessions) -> None:
        self.backend = backend
        self.config = config
        self.sessions = sessions
        #: the access model shared with the remoting port (cometmq.acl): an ACL file, or ``access_keys`` as admin
        #: accounts (authentication only); None: every call is let in
        self.acl: AccessControl | None = None
        if config.acl_file:
            self.acl = AccessControl(config.acl_file)
            self.acl.load()
        elif config.auth_enabled:
            self.acl = AccessControl.from_config(accounts_config(config.access_keys.items()))
        #: permissive TLS: the relay's table of real client addresses (grpc/tls.py), set by GrpcProxy.start
        self.relay_peers: RelayPeers | None = None

    def client_host(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The address the ACL checks: grpc's peer, or, behind the permissive-TLS relay, the relayed client's."""
        peer = context.peer() or ""
        return self.relay_peers.client_host(peer) if self.relay_peers is not None else host_of(peer)

    def check_auth(self, context: grpc.aio.ServicerContext[Any, Any], rpc: str = "",
                   request: Any = None) -> Caller | None:
        """Authenticate the call (the 5.x ``authorization`` header) and check the permissions ``rpc`` needs on the
        topics and groups ``request`` names: UNAUTHORIZED or FORBIDDEN with RocketMQ's reason. Returns the
        authenticated caller (None without ACL), for the later checks of a stream (:meth:`check_caller`)."""
        acl = self.acl
        if acl is None:
            return None
        acl.start()  # the ACL file's reload watcher (idempotent; needs the running loop)
        host = self.client_host(context)
        metadata = metadata_of(context)
        access_key: str | None = None
        verify: Callable[[str], bool] = _no_signature
        try:
            access_key, verify = parse_authorization(metadata, self.config.max_clock_skew_s)
        except AuthError as exc:
            if "authorization" in metadata and not acl.globally_allowed(host):
                acl.refused(host, str(exc), f"gRPC {rpc or 'call'}")
                raise GrpcError(pb.Code.UNAUTHORIZED, str(exc)) from None
        caller = Caller(host, access_key, verify)
        self.check_caller(caller, rpc, grpc_needs(rpc, request))
        return caller

    def check_caller(self, caller: Caller | None, rpc: str, needs: Sequence[Need]) -> None:
        """Check ``needs`` for a caller :meth:`check_auth` let in earlier (a Telemetry stream's later commands),
        against the ACL in force now; the signature's date is not looked at again (the stream outlives it)."""
        acl = self.acl
        if acl is None or caller is None:
            return
        try:
            acl.check(Attempt(caller.host, caller.access_key, caller.verify, rpc, False, needs))
        except AccessDenied as exc:
            acl.refused(caller.host, str(exc), f"gRPC {rpc or 'call'}")
            code = pb.Code.UNAUTHORIZED if isinstance(exc, NotAuthenticated) else pb.Code.FORBIDDEN
            raise GrpcError(code, str(exc)) from None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who an authenticated call comes from: its address (as the ACL sees it), access key and signature check."""

    host: str
    access_key: str | None
    verify: Callable[[str], bool]


def _no_signature(secret: str) -> bool:
    return False


def _name(msg: Any, field: str) -> str | None:
    """``msg.<field>.name`` (a Resource), None when the message has no such field or it is empty."""
    resource = getattr(msg, field, None)
    name = getattr(resource, "name", None)
    return name if isinstance(name, str) and name else None


def grpc_needs(rpc: str, request: Any) -> list[Need]:
    """The permissions an RPC needs (RocketMQ's PlainAccessResource.parse for the 5.x messages)."""
    if request is None:
        return []
    if rpc == "SendMessage":
        return [need for m in request.messages for need in topic_need(_name(m, "topic"), PUB)]
    if rpc in ("EndTransaction", "RecallMessage"):
        return topic_need(_name(request, "topic"), PUB)
    if rpc == "QueryRoute":
        return topic_need(_name(request, "topic"), ANY)
    if rpc in ("ReceiveMessage", "PullMessage", "UpdateOffset", "GetOffset", "QueryOffset"):
        queue = getattr(request, "message_queue", None)
        return topic_need(_name(queue, "topic"), SUB) + group_need(_name(request, "group"))
    if rpc in ("QueryAssignment", "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue",
               "SyncLiteSubscription"):
        return (topic_need(_name(request, "topic"), SUB) + group_need(_name(request, "group"))
                + _handle_needs(rpc, request))
    if rpc in ("Heartbeat", "NotifyClientTermination"):
        return group_need(_name(request, "group"))
    if rpc == "Telemetry":
        return settings_needs(request) if isinstance(request, pb.Settings) else []
    return []


def _handle_needs(rpc: str, request: Any) -> list[Need]:
    """SUB on the topic of each receipt handle the request carries: the handle is the client's to write, and the
    broker acts on the topic it names, not on the request's ``topic`` (a handle that does not decode is refused
    by the RPC itself, INVALID_RECEIPT_HANDLE)."""
    if rpc == "AckMessage":
        texts = [entry.receipt_handle for entry in request.entries]
    elif rpc in ("ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"):
        texts = [request.receipt_handle]
    else:
        return []
    out: list[Need] = []
    for text in texts:
        try:
            topic = ReceiptHandle.decode(text).topic
        except ProtocolError:
            continue
        out += topic_need(topic, SUB)
    return out


def settings_needs(settings: pb.Settings) -> list[Need]:
    """What a Telemetry settings command announces (RocketMQ 5's proxy checks the same): PUB on every topic a
    producer publishes to; SUB on a consumer's group and on every topic it subscribes to. GrpcError BAD_REQUEST
    for settings that are neither a producer's nor a consumer's."""
    if settings.HasField("publishing"):
        return [need for topic in settings.publishing.topics for need in topic_need(topic.name, PUB)]
    if settings.HasField("subscription"):
        sub = settings.subscription
        return group_need(sub.group.name) + [need for entry in sub.subscriptions
                                             for need in topic_need(entry.topic.name, SUB)]
    raise GrpcError(pb.Code.BAD_REQUEST, "settings command doesn't have publishing or subscription")


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
                self.check_auth(context, fn.__name__, request)
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
                self.check_auth(context, fn.__name__, request)
                async for item in fn(self, request, context):
                    yield item
            except Exception as exc:
                yield response(status=_failure(exc, fn.__name__))

        return handler

    return wrap


def remaining_ms(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    left = context.time_remaining()
    return None if left is None else left * 1000
