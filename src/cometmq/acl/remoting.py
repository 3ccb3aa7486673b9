"""ACL on the remoting protocol: the guard over a server's handler table, and a client that signs what it sends.

``guard(dispatcher, acl, policy)`` is the one enforcement point of a broker or nameserver: a Mapping that hands the
connection, for each request code, a handler that checks the request first (``AccessControl.check``) and answers
a refusal with NO_PERMISSION (16) and RocketMQ's remark, without calling the real handler. The wrapped handlers
are made once per code (and again only if the table's handler for it changes), so the table can still gain
handlers after the server starts.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from cometmq.acl.control import AccessControl, AccessDenied, Attempt, host_of
from cometmq.acl.policy import Policy
from cometmq.net.client import RemotingClient
from cometmq.net.connection import Dispatcher, Handler, RemotingConnection
from cometmq.protocol.acl import ACCESS_KEY, SIGNATURE, Credentials, calc_signature, sign_request, signed_content
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import RemotingCommand, make_response

log = logging.getLogger("cometmq.acl")


def attempt_of(conn: RemotingConnection, cmd: RemotingCommand, policy: Policy) -> Attempt:
    """What ``cmd`` asks, for AccessControl.check (AccessDenied when its body cannot be read for that)."""
    ext = cmd.ext_fields
    signature = ext.get(SIGNATURE) or ""

    def verify(secret: str) -> bool:
        expected = calc_signature(signed_content(ext, cmd.body), secret)
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace"))

    try:
        needs = policy.needs_of(cmd)
    except (ProtocolError, ValueError, TypeError, KeyError) as exc:
        raise AccessDenied(f"cannot read the resources of request code={cmd.code}: {exc}") from None
    return Attempt(host_of(conn.remote_address), ext.get(ACCESS_KEY), verify, cmd.code, policy.needs_admin(cmd),
                   needs)


class _Guarded:
    __slots__ = ("acl", "eager_start", "inner", "policy")

    def __init__(self, inner: Handler, acl: AccessControl, policy: Policy) -> None:
        self.inner = inner
        self.acl = acl
        self.policy = policy
        self.eager_start = getattr(inner, "eager_start", False)

    async def __call__(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        try:
            self.acl.check(attempt_of(conn, cmd, self.policy))
        except AccessDenied as exc:
            remark = str(exc)
            self.acl.refused(host_of(conn.remote_address), remark, f"request code {cmd.code}")
            return make_response(cmd, ResponseCode.NO_PERMISSION, remark)
        return await self.inner(conn, cmd)


class GuardedDispatcher(Mapping[int, Handler]):
    """``dispatcher`` with every handler behind the ACL check (``policy.public_codes`` excepted)."""

    def __init__(self, dispatcher: Dispatcher, acl: AccessControl, policy: Policy) -> None:
        self.inner = dispatcher
        self.acl = acl
        self.policy = policy
        self._wrapped: dict[int, _Guarded] = {}

    def get(self, code: int, default: Any = None) -> Any:
        handler = self.inner.get(code)
        if handler is None:
            return default
        if code in self.policy.public_codes:
            return handler
        wrapped = self._wrapped.get(code)
        if wrapped is None or wrapped.inner is not handler:
            wrapped = self._wrapped[code] = _Guarded(handler, self.acl, self.policy)
        return wrapped

    def __getitem__(self, code: int) -> Handler:
        handler = self.get(code)
        if handler is None:
            raise KeyError(code)
        return handler  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[int]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def guard(dispatcher: Dispatcher, acl: AccessControl | None, policy: Policy) -> Dispatcher:
    """``dispatcher`` itself when ACL is off (no cost at all), else a GuardedDispatcher."""
    return dispatcher if acl is None else GuardedDispatcher(dispatcher, acl, policy)


class SigningRemotingClient(RemotingClient):
    """A RemotingClient that signs every request it sends with ``credentials`` (a broker's own requests to
    nameservers and other brokers: RocketMQ 5's ``innerClientAuthenticationCredentials``)."""

    def __init__(self, credentials: Credentials, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.credentials = credentials

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        return await super().invoke(addr, sign_request(cmd, self.credentials), timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        await super().invoke_oneway(addr, sign_request(cmd, self.credentials), timeout)


def parse_credentials(text: str) -> Credentials:
    """RocketMQ 5's ``innerClientAuthenticationCredentials`` value, ``{"accessKey":"ak","secretKey":"sk"}``, or the
    command line's shorter ``ak:sk``; ValueError naming the expected forms (never the secret)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError:
            raise ValueError('is not JSON: give {"accessKey":"...","secretKey":"..."}') from None
        ak, sk = (raw.get("accessKey"), raw.get("secretKey")) if isinstance(raw, dict) else (None, None)
        if not isinstance(ak, str) or not isinstance(sk, str) or not ak.strip() or not sk:
            raise ValueError('must name both keys: {"accessKey":"...","secretKey":"..."}')
        return Credentials(ak.strip(), sk)
    ak, sep, sk = text.partition(":")
    if not sep or not ak.strip() or not sk:
        raise ValueError('is neither {"accessKey":"...","secretKey":"..."} nor accessKey:secretKey')
    return Credentials(ak.strip(), sk)


def signing_client(credentials: Credentials | None, **kwargs: Any) -> RemotingClient:
    """A SigningRemotingClient with ``credentials``, or a plain RemotingClient without."""
    return SigningRemotingClient(credentials, **kwargs) if credentials is not None else RemotingClient(**kwargs)
