"""The remoting protocol's request signature (RocketMQ's ACL 1.0, ``AclClientRPCHook`` / ``AclUtils``): sans-I/O.

A client with credentials adds ``AccessKey`` (and ``SecurityToken`` when it has one) to a request's ext fields,
then signs: the values (not the keys) of every ext field except ``Signature``, in the order of their keys, joined
with nothing, then the body's bytes; HMAC-SHA1 of that with the secret key, base64. The result goes in
``Signature``. The C++ client also adds ``OnsChannel`` before signing, so it is signed like any other field.
The server recomputes the same content from what it received (dropping ``Signature`` and ``_UNIQUE_KEY_QUERY``,
as RocketMQ's ``PlainAccessResource`` does) and compares in constant time (cometmq.acl).
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cometmq.protocol.remoting import RemotingCommand

#: SessionCredentials' ext field names
ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: the C++ (and ONS) clients' channel field, signed like the others
ONS_CHANNEL = "OnsChannel"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: left out of the signed content by the server
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"

_UNSIGNED = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret key (RocketMQ's SessionCredentials); ``repr`` hides the secret."""

    access_key: str
    secret_key: str
    security_token: str = ""

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"


def signed_content(ext_fields: Mapping[str, str], body: bytes) -> bytes:
    """What the signature covers: the ext field values sorted by key (``Signature`` and ``_UNIQUE_KEY_QUERY``
    left out), UTF-8, then the body."""
    text = "".join(ext_fields[k] for k in sorted(ext_fields) if k not in _UNSIGNED)
    return text.encode("utf-8") + bytes(body)


def calc_signature(content: bytes, secret_key: str) -> str:
    """RocketMQ's AclSigner: base64(HMAC-SHA1(secretKey, content))."""
    import hashlib  # (here: a server without access control never loads OpenSSL's digests)
    import hmac

    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return binascii.b2a_base64(digest, newline=False).decode("ascii")


def sign_request(cmd: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """``cmd`` with ``AccessKey`` (``SecurityToken``) and ``Signature`` added to its ext fields."""
    fields = {k: v if isinstance(v, str) else str(v) for k, v in cmd.ext_fields.items()}
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields.pop(SIGNATURE, None)
    fields[SIGNATURE] = calc_signature(signed_content(fields, cmd.body), credentials.secret_key)
    return replace(cmd, ext_fields=fields)
