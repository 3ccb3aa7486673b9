"""Authentication of gRPC calls: RocketMQ 5's ``MQv2-HMAC-SHA1`` signature over ``x-mq-date-time``.

A client signs each call with ``authorization: MQv2-HMAC-SHA1 Credential=<accessKey>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(secretKey, dateTime)>`` and sends the signed
``x-mq-date-time`` (``yyyyMMddTHHmmssZ``, UTC). A verifier built from configured access keys accepts a call when
the key is known, the signature matches, and the date-time is within the allowed clock skew. Pure: no gRPC here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
#: RocketMQ accepts a signed time this far from its own clock
DEFAULT_MAX_SKEW_S = 15 * 60

_PARTS = re.compile(r"(\w+)=([^,\s]*)")


class AuthError(Exception):
    """Missing or wrong credentials; the message says which (never the secret)."""


def sign(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization_header(access_key: str, secret_key: str, date_time: str) -> str:
    return (f"{ALGORITHM} Credential={access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={sign(secret_key, date_time)}")


def date_time_now(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime(DATE_TIME_FORMAT)


@dataclass(frozen=True)
class Authenticator:
    """``access_keys``: access key -> secret key. ``verify`` raises AuthError or returns the access key."""

    access_keys: Mapping[str, str] = field(default_factory=dict)
    max_skew_s: float = DEFAULT_MAX_SKEW_S

    def verify(self, metadata: Mapping[str, str], now: datetime | None = None) -> str:
        access_key, check = parse_authorization(metadata, self.max_skew_s, now)
        secret = self.access_keys.get(access_key)
        if secret is None:
            raise AuthError(f"unknown access key {access_key!r}")
        if not check(secret):
            raise AuthError(f"signature mismatch for access key {access_key!r}")
        return access_key


def parse_authorization(metadata: Mapping[str, str], max_skew_s: float = DEFAULT_MAX_SKEW_S,
                        now: datetime | None = None) -> tuple[str, Callable[[str], bool]]:
    """The access key of a call's ``authorization`` header and a ``verify(secret_key)`` that checks its signature
    (in constant time); AuthError when the header is missing or malformed, or ``x-mq-date-time`` is too far from
    the server's clock. cometmq.acl.AccessControl looks the key up and calls ``verify``."""
    header = metadata.get("authorization")
    if not header:
        raise AuthError("the call carries no authorization header")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthError(f"unsupported authorization algorithm {algorithm!r}")
    parts: dict[str, str] = {str(k): str(v) for k, v in _PARTS.findall(rest)}
    access_key, signature = parts.get("Credential", ""), parts.get("Signature", "")
    if not access_key:
        raise AuthError("the authorization header names no access key")
    date_time = metadata.get("x-mq-date-time", "")
    try:
        signed_at = datetime.strptime(date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise AuthError(f"x-mq-date-time {date_time!r} is not yyyyMMddTHHmmssZ") from None
    skew = abs(((now or datetime.now(UTC)) - signed_at).total_seconds())
    if skew > max_skew_s:
        raise AuthError(f"x-mq-date-time is {skew:.0f}s away from the server's clock (limit {max_skew_s:g}s)")

    def verify(secret: str) -> bool:
        return hmac.compare_digest(sign(secret, date_time), signature.lower())

    return access_key, verify


def parse_access_keys(text: str) -> dict[str, str]:
    """``"ak1:sk1,ak2:sk2"`` -> ``{"ak1": "sk1", "ak2": "sk2"}``; raises ValueError on a malformed item."""
    out: dict[str, str] = {}
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        ak, sep, sk = item.partition(":")
        if not sep or not ak or not sk:
            raise ValueError(f"access key item {item!r} is not accessKey:secretKey")
        out[ak] = sk
    return out
