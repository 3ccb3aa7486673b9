"""TLS for the remoting and gRPC ports, and for remoting clients: the one owner of TLS settings.

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

Modes, as RocketMQ's ``TlsModeHandler``: *disabled* serves plaintext only (a TLS ClientHello breaks remoting
framing, so the connection is closed); *enforcing* TLS only (a plaintext connection is closed before anything is
read from it); *permissive* both on one port: the first byte of each connection is peeked (never consumed) and a
TLS handshake record (0x16) gets a TLS transport, anything else a plain one.

Certificates are reloaded on change: :class:`ServerTls` looks at the files' modification times (at most once a
second, when a connection arrives) and builds a new ``SSLContext`` for the connections after; open connections
keep theirs. A file that fails to load is logged and the last good context stays in use.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16
#: RocketMQ's FileWatchService looks every 500 ms; we look when a connection arrives, at most this often
RELOAD_CHECK_S = 1.0
#: a connection that sends nothing for this long (its first byte decides plaintext or TLS) is closed
PEEK_TIMEOUT_S = 60.0
HANDSHAKE_TIMEOUT_S = 10.0


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


_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


def _bool(text: str) -> bool:
    s = text.strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise TlsError(f"not a boolean: {text!r}")


def _client_auth(text: str) -> str:
    s = text.strip().lower()
    if s not in _CLIENT_AUTH:
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
            server_context(self)  # the files load now, or the start fails with the reason
        return self

    def client_context(self) -> ssl.SSLContext | None:
        """The context of this process's own outgoing connections, or None when ``client_enable`` is off."""
        if not self.client_enable:
            return None
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
    "tls.server.authClient": ("auth_client", _bool),
    "tls.enable": ("client_enable", _bool),
    "tls.client.certPath": ("client_cert_path", str.strip),
    "tls.client.keyPath": ("client_key_path", str.strip),
    "tls.client.keyPassword": ("client_key_password", str),
    "tls.client.authServer": ("client_auth_server", _bool),
    "tls.client.trustCertPath": ("client_trust_cert_path", str.strip),
    "tls.test.mode.enable": ("test_mode", _bool),
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
        text = Path(path).read_text()
    except OSError as exc:
        raise TlsError(f"cannot read tls.config.file {path}: {exc}") from None
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            raise TlsError(f"{path}: not key=value: {line!r}")
        out[line[:cut].strip()] = line[cut + 1:].strip()
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


# -- contexts ------------------------------------------------------------------------------------------------
def server_context(cfg: TlsConfig, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """``alpn``: the protocols offered in the handshake (gRPC's clients insist on h2)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    try:
        ctx.load_cert_chain(cfg.cert_path, cfg.key_path, cfg.key_password or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the server certificate {cfg.cert_path} / key {cfg.key_path}: {exc}") from None
    mode = _CLIENT_AUTH[cfg.need_client_auth]
    if mode != ssl.CERT_NONE:
        if not cfg.trust_cert_path:
            raise TlsError("tls.server.need.client.auth needs tls.server.trustCertPath (the CA of client certificates)")
        try:
            ctx.load_verify_locations(cfg.trust_cert_path)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load tls.server.trustCertPath {cfg.trust_cert_path}: {exc}") from None
        ctx.verify_mode = mode
    return ctx


def client_context(*, ca_file: str | None = None, insecure: bool = False, cert_file: str | None = None,
                   key_file: str | None = None, key_password: str | None = None) -> ssl.SSLContext:
    """A client context: the server is verified against ``ca_file`` (else the system's CAs) and its name checked,
    unless ``insecure`` (any certificate is accepted: RocketMQ's default, tls.client.authServer=false)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None, key_password)
    return ctx


def _mtimes(paths: tuple[str, ...]) -> tuple[float, ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append(st.st_mtime_ns + st.st_size)
        except OSError:
            out.append(-1)
    return tuple(out)


class ServerTls:
    """The server's current SSLContext, rebuilt when the certificate, key or trust file changes."""

    def __init__(self, config: TlsConfig, *, check_interval: float = RELOAD_CHECK_S,
                 clock: Callable[[], float] = time.monotonic, alpn: tuple[str, ...] = ()) -> None:
        self.config = config.check()
        self.alpn = alpn
        self._paths = tuple(p for p in (config.cert_path, config.key_path, config.trust_cert_path) if p)
        self._check_interval = check_interval
        self._clock = clock
        self._stamp = _mtimes(self._paths)
        self._context = server_context(config, alpn)
        self._checked = clock()
        #: contexts built since the start (the first one included)
        self.loads = 1
        self._listeners: list[Callable[[], None]] = []

    @property
    def mode(self) -> TlsMode:
        return self.config.mode

    def on_reload(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def files_changed(self) -> bool:
        """True once per change of the files (rate-limited by the check interval)."""
        now = self._clock()
        if now - self._checked < self._check_interval:
            return False
        self._checked = now
        stamp = _mtimes(self._paths)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def context(self) -> ssl.SSLContext:
        """The context for a new connection (reloaded first when the files changed)."""
        if self.files_changed():
            self.reload()
        return self._context

    def reload(self) -> bool:
        try:
            ctx = server_context(self.config, self.alpn)
        except TlsError as exc:  # a certificate replaced in two steps may be half there: keep the last good one
            log.error("TLS certificate reload failed, keeping the previous one: %s", exc)
            return False
        self._context = ctx
        self.loads += 1
        log.info("TLS certificate reloaded from %s", self.config.cert_path)
        for callback in self._listeners:
            callback()
        return True

    def read_pem(self) -> tuple[bytes, bytes, bytes | None]:
        """(key, certificate chain, trust roots or None) as PEM bytes, for gRPC's credentials."""
        if self.config.key_password:
            raise TlsError("tls.server.keyPassword: the gRPC port needs an unencrypted key (grpc cannot decrypt it)")
        try:
            key = Path(self.config.key_path).read_bytes()
            chain = Path(self.config.cert_path).read_bytes()
            roots = Path(self.config.trust_cert_path).read_bytes() if self.config.trust_cert_path else None
        except OSError as exc:
            raise TlsError(f"cannot read the TLS files: {exc}") from None
        return key, chain, roots


# -- a listener that decides per connection ------------------------------------------------------------------
class TlsListener(asyncio.AbstractServer):
    """Accepts on ``sock`` and, per connection, peeks its first byte (never reading it): a TLS handshake record
    gets a TLS transport with the current context; anything else a plain transport in permissive mode, and is
    closed in enforcing mode. ``factory`` builds the protocol of each connection, as ``loop.create_server``'s."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], sock: socket.socket, tls: ServerTls, *,
                 peek_timeout: float = PEEK_TIMEOUT_S, handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self._loop = asyncio.get_running_loop()
        self._factory = factory
        self._sock = sock
        self._tls = tls
        self._peek_timeout = peek_timeout
        self._handshake_timeout = handshake_timeout
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._closed = False
        #: connections refused (plaintext under enforcing) and handshakes failed, for tests and stats
        self.refused = 0
        self.handshake_failures = 0

    @property
    def sockets(self) -> list[socket.socket]:
        return [] if self._closed else [self._sock]

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._accepting is not None and not self._closed

    async def start_serving(self) -> None:
        if self._accepting is None and not self._closed:
            self._sock.setblocking(False)
            self._accepting = self._loop.create_task(self._accept_loop())

    async def serve_forever(self) -> None:
        await self.start_serving()
        if self._accepting is not None:
            await asyncio.shield(self._accepting)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._accepting is not None:
            self._accepting.cancel()
        for task in self._pending:
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accepting, *self._pending) if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = await self._loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and the like: keep listening
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._open(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _first_byte(self, conn: socket.socket) -> bytes:
        fd = conn.fileno()
        while True:
            try:
                return conn.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                pass
            ready: asyncio.Future[None] = self._loop.create_future()
            self._loop.add_reader(fd, _set_once, ready)
            try:
                await ready
            finally:
                self._loop.remove_reader(fd)

    async def _open(self, conn: socket.socket) -> None:
        peer = "?"
        try:
            host, port = conn.getpeername()[:2]
            peer = f"{host}:{port}"
            async with asyncio.timeout(self._peek_timeout):
                first = await self._first_byte(conn)
        except (OSError, TimeoutError) as exc:
            log.debug("closing %s before its first byte: %r", peer, exc)
            conn.close()
            return
        except asyncio.CancelledError:
            conn.close()
            raise
        if not first:  # the peer closed without sending anything
            conn.close()
            return
        context: ssl.SSLContext | None = None
        if first[0] == TLS_HANDSHAKE_RECORD:
            context = self._tls.context()
        elif self._tls.mode is TlsMode.ENFORCING:
            self.refused += 1
            log.warning("closing a plaintext connection from %s: tls.server.mode is enforcing", peer)
            conn.close()
            return
        try:
            if context is None:
                await self._loop.connect_accepted_socket(self._factory, conn)
            else:
                await self._loop.connect_accepted_socket(self._factory, conn, ssl=context,
                                                         ssl_handshake_timeout=self._handshake_timeout)
        except asyncio.CancelledError:
            conn.close()
            raise
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self.handshake_failures += 1
            log.warning("TLS handshake with %s failed: %s", peer, exc)
            conn.close()


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def start_tls_listener(factory: Callable[[], asyncio.Protocol], host: str, port: int, tls: ServerTls, *,
                             backlog: int = 1024) -> TlsListener:
    """Bind ``host:port`` and serve it with a :class:`TlsListener`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    listener = TlsListener(factory, sock, tls)
    await listener.start_serving()
    return listener


#: environment variables the SDK reads when a ClientInstance is given no ``tls`` (RocketMQ's -Dtls.enable=true)
ENV_TLS = "COMETMQ_TLS"
ENV_TLS_CA = "COMETMQ_TLS_CA"
ENV_TLS_INSECURE = "COMETMQ_TLS_INSECURE"


def sdk_client_context(tls: bool | ssl.SSLContext | None = None, *, ca_file: str | None = None,
                       insecure: bool | None = None) -> ssl.SSLContext | None:
    """The SDK's TLS context: ``tls`` a context is used as is; True builds one verifying the server against
    ``ca_file`` (else the system's CAs) unless ``insecure``; None reads $COMETMQ_TLS, $COMETMQ_TLS_CA and
    $COMETMQ_TLS_INSECURE; False (or nothing set): plaintext."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    if tls is None:
        tls = _bool(os.environ.get(ENV_TLS, "false") or "false")
    if not tls:
        return None
    if ca_file is None:
        ca_file = os.environ.get(ENV_TLS_CA) or None
    if insecure is None:
        insecure = _bool(os.environ.get(ENV_TLS_INSECURE, "false") or "false")
    try:
        return client_context(ca_file=ca_file, insecure=insecure)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the TLS CA file {ca_file}: {exc}") from None
