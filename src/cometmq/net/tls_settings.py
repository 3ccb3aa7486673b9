"""TLS settings: the one owner of the ``tls.*`` keys, their parsing and their defaults.

This module loads neither ``ssl`` nor asyncio, so a server reads its configuration before deciding whether OpenSSL
is loaded at all (:mod:`cometmq.net.no_openssl`). The contexts, the certificate reload and the listeners are in
:mod:`cometmq.net.tls`.

Settings use Apache RocketMQ's ``TlsSystemConfig`` names (JVM system properties there, ``broker.conf`` keys here;
each also has a camelCase alias, ``tls.server.certPath`` = ``tlsServerCertPath``)::

    tls.server.mode              disabled | permissive | enforcing (cometmq's default: disabled)
    tls.server.certPath          PEM certificate chain of the server
    tls.server.keyPath           PEM private key of the server
    tls.server.keyPassword       password of an encrypted key (remoting only: gRPC needs an unencrypted key)
    tls.server.trustCertPath     CA(s) client certificates are verified against
    tls.server.need.client.auth  none | optional | require: ask clients for a certificate
    tls.server.authClient        accepted; client certificates asked for are always verified
    tls.enable                   the process's own remoting clients (broker -> nameserver, gRPC -> brokers) use TLS
    tls.client.certPath, tls.client.keyPath, tls.client.keyPassword   a client certificate to present
    tls.client.authServer        verify the server's certificate (against tls.client.trustCertPath, else the
                                 system's CAs)
    tls.client.trustCertPath
    tls.test.mode.enable         accepted, no effect: cometmq generates no certificate, it needs certPath/keyPath
    tls.config.file              a properties file holding any of the keys above (read first; keys given beside
                                 it win)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ssl import SSLContext


class TlsError(ValueError):
    """A TLS setting is invalid, or a certificate or key cannot be loaded."""


class TlsMode(enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"

    @classmethod
    def parse(cls, text: str) -> TlsMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise TlsError(f"tls.server.mode must be disabled, permissive or enforcing, not {text!r}") from None


#: tls.server.need.client.auth's values (cometmq.net.tls maps them to ssl.CERT_NONE/OPTIONAL/REQUIRED)
CLIENT_AUTH_VALUES = ("none", "optional", "require")


def parse_bool(text: str) -> bool:
    """A TLS key's boolean: true, 1 or yes; false, 0 or no; anything else is a TlsError."""
    s = text.strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise TlsError(f"not a boolean: {text!r}")


def _client_auth(text: str) -> str:
    s = text.strip().lower()
    if s not in CLIENT_AUTH_VALUES:
        raise TlsError(f"tls.server.need.client.auth must be none, optional or require, not {text!r}")
    return s


@dataclass(frozen=True)
class TlsConfig:
    """Server side (``mode`` ... ``need_client_auth``) and client side (``client_*``) TLS settings."""

    mode: TlsMode = TlsMode.DISABLED
    cert_path: str = ""
    key_path: str = ""
    key_password: str = ""
    trust_cert_path: str = ""
    need_client_auth: str = "none"
    auth_client: bool = False
    #: the process's own outgoing remoting connections use TLS (RocketMQ's tls.enable)
    client_enable: bool = False
    client_cert_path: str = ""
    client_key_path: str = ""
    client_key_password: str = ""
    client_auth_server: bool = False
    client_trust_cert_path: str = ""
    test_mode: bool = False
    config_file: str = ""

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED

    def replace(self, **changes: Any) -> TlsConfig:
        return replace(self, **changes)

    def check(self) -> TlsConfig:
        """Raise TlsError unless the server side can start (a mode other than disabled needs a cert and a key)."""
        if self.enabled:
            missing = [k for k, v in (("tls.server.certPath", self.cert_path), ("tls.server.keyPath", self.key_path))
                       if not v]
            if missing:
                raise TlsError(f"tls.server.mode={self.mode.value} needs {' and '.join(missing)}")
            from cometmq.net.tls import server_context

            server_context(self)  # the files load now, or the start fails with the reason
        return self

    def client_context(self) -> SSLContext | None:
        """The context of this process's own outgoing connections, or None when ``client_enable`` is off."""
        if not self.client_enable:
            return None
        from cometmq.net.tls import client_context

        return client_context(ca_file=self.client_trust_cert_path or None, insecure=not self.client_auth_server,
                              cert_file=self.client_cert_path or None, key_file=self.client_key_path or None,
                              key_password=self.client_key_password or None)


#: RocketMQ key -> (TlsConfig field, converter)
TLS_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "tls.server.mode": ("mode", TlsMode.parse),
    "tls.server.certPath": ("cert_path", str.strip),
    "tls.server.keyPath": ("key_path", str.strip),
    "tls.server.keyPassword": ("key_password", str),
    "tls.server.trustCertPath": ("trust_cert_path", str.strip),
    "tls.server.need.client.auth": ("need_client_auth", _client_auth),
    "tls.server.authClient": ("auth_client", parse_bool),
    "tls.enable": ("client_enable", parse_bool),
    "tls.client.certPath": ("client_cert_path", str.strip),
    "tls.client.keyPath": ("client_key_path", str.strip),
    "tls.client.keyPassword": ("client_key_password", str),
    "tls.client.authServer": ("client_auth_server", parse_bool),
    "tls.client.trustCertPath": ("client_trust_cert_path", str.strip),
    "tls.test.mode.enable": ("test_mode", parse_bool),
    "tls.config.file": ("config_file", str.strip),
}


def _camel(key: str) -> str:
    head, *rest = key.split(".")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


#: camelCase aliases (tlsServerMode, tlsServerCertPath, tlsConfigFile, ...)
TLS_KEY_ALIASES: dict[str, str] = {_camel(k): k for k in TLS_KEYS}
ALL_TLS_KEYS = frozenset(TLS_KEYS) | frozenset(TLS_KEY_ALIASES)


def _read_properties(path: str) -> dict[str, str]:
    """``key=value`` (or ``key: value``) lines of a Java properties file; ``#`` and ``!`` start comments."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsError(f"cannot read tls.config.file {path}: {exc}") from None
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            raise TlsError(f"{path}: not key=value: {line!r}")
        key = line[:cut].strip()
        if key in out:
            raise TlsError(f"{path}: {key} is given twice")
        out[key] = line[cut + 1:].strip()
    return out


def tls_config_from_properties(props: Mapping[str, str], base: TlsConfig | None = None) -> TlsConfig:
    """The TLS keys of ``props`` (other keys are ignored) over ``base``; ``tls.config.file`` is read first."""
    given = {TLS_KEY_ALIASES.get(k, k): v for k, v in props.items() if k in ALL_TLS_KEYS}
    merged: dict[str, str] = {}
    file = given.get("tls.config.file", "").strip()
    if file:
        from_file = _read_properties(file)
        unknown = sorted(k for k in from_file if k not in ALL_TLS_KEYS)
        if unknown:
            raise TlsError(f"{file}: unknown TLS key(s): {', '.join(unknown)}")
        merged.update({TLS_KEY_ALIASES.get(k, k): v for k, v in from_file.items()})
    merged.update(given)
    changes: dict[str, Any] = {}
    for key, value in merged.items():
        name, convert = TLS_KEYS[key]
        try:
            changes[name] = convert(value)
        except (TlsError, ValueError) as exc:
            raise TlsError(f"{key}: {exc}") from None
    return replace(base or TlsConfig(), **changes)


def tls_properties(cfg: TlsConfig) -> dict[str, str]:
    """The RocketMQ keys of the settings that differ from the defaults (for logs and docs)."""
    default = TlsConfig()
    by_field = {name: key for key, (name, _) in TLS_KEYS.items()}
    out = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value != getattr(default, f.name) and "password" not in f.name.lower():
            out[by_field[f.name]] = value.value if isinstance(value, TlsMode) else str(value).lower() \
                if isinstance(value, bool) else str(value)
    return out
