"""TLS for the remoting and gRPC ports, and for remoting clients: contexts, certificate reload and listeners.

The settings (the ``tls.*`` keys, :class:`TlsConfig`) are in :mod:`cometmq.net.tls_settings`.

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
import functools
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from cometmq.net.tls_settings import CLIENT_AUTH_VALUES, TlsConfig, TlsError, TlsMode, parse_bool

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16
#: RocketMQ's FileWatchService looks every 500 ms; we look when a connection arrives, at most this often
RELOAD_CHECK_S = 1.0
#: a connection that sends nothing for this long (its first byte decides plaintext or TLS) is closed
PEEK_TIMEOUT_S = 60.0
HANDSHAKE_TIMEOUT_S = 10.0

#: tls.server.need.client.auth's values, in CLIENT_AUTH_VALUES' order
_CLIENT_AUTH = dict(zip(CLIENT_AUTH_VALUES, (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED), strict=True))


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
Admit = Callable[[str, int, int], bool]
"""``admit(ip, pending, pending_from_ip)``: whether a socket just accepted from ``ip`` may be set up, while
``pending`` others (``pending_from_ip`` of them from ``ip``) are (a server's ``ConnectionGuard.may_open``)."""


class TlsListener(asyncio.AbstractServer):
    """Accepts on ``sock`` and, per connection, peeks its first byte (never reading it): a TLS handshake record
    gets a TLS transport with the current context; anything else a plain transport in permissive mode, and is
    closed in enforcing mode. ``factory`` builds the protocol of each connection, as ``loop.create_server``'s."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], sock: socket.socket, tls: ServerTls, *,
                 peek_timeout: float = PEEK_TIMEOUT_S, handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 admit: Admit | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        #: asked for each socket accepted, with how many are being set up (all, and from its IP): False closes it
        self._admit = admit
        self._pending_from: dict[str, int] = {}
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
                conn, addr = await self._loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and the like: keep listening
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            ip = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            from_ip = self._pending_from.get(ip, 0)
            if self._admit is not None and not self._admit(ip, len(self._pending), from_ip):
                conn.close()
                continue
            self._pending_from[ip] = from_ip + 1
            task = self._loop.create_task(self._open(conn))
            self._pending.add(task)
            task.add_done_callback(functools.partial(self._done, ip=ip))

    def _done(self, task: asyncio.Task[None], ip: str) -> None:
        self._pending.discard(task)
        left = self._pending_from.get(ip, 1) - 1
        if left > 0:
            self._pending_from[ip] = left
        else:
            self._pending_from.pop(ip, None)

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
                             backlog: int = 1024, admit: Admit | None = None) -> TlsListener:
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
    listener = TlsListener(factory, sock, tls, admit=admit)
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
        tls = parse_bool(os.environ.get(ENV_TLS, "false") or "false")
    if not tls:
        return None
    if ca_file is None:
        ca_file = os.environ.get(ENV_TLS_CA) or None
    if insecure is None:
        insecure = parse_bool(os.environ.get(ENV_TLS_INSECURE, "false") or "false")
    try:
        return client_context(ca_file=ca_file, insecure=insecure)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the TLS CA file {ca_file}: {exc}") from None
