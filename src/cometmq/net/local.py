"""In-process remoting: a connection pair that hands commands to the other end without sockets or bytes.

A component that runs in the same process and event loop as a :class:`RemotingServer` (the gRPC endpoint
embedded in ``cometmq serve``) can talk to it through :func:`connect_local` instead of loopback TCP. Each end
is a :class:`RemotingConnection`, so everything above keeps speaking remoting unchanged: requests, replies by
opaque, held requests answered later through ``send_response``, oneway and server-to-client requests (a broker's
CHECK_TRANSACTION_STATE reaches the client end's dispatcher), close callbacks on both ends. The server end is
registered with the server like an accepted socket, so the broker's connect/close callbacks run and
``RemotingServer.stop()`` closes it.

What is skipped is the frame codec and the kernel: a command crosses as the object itself, with the two things
a decoder would have guaranteed restored — ``ext_fields`` is a fresh dict of strings (the receiver may keep or
change it) and ``body`` is ``bytes``. There is no write buffer, so no back-pressure: the caller waits for each
reply as it would anyway.
"""

from __future__ import annotations

import itertools
import logging

from cometmq.net.client import LocalConnector
from cometmq.net.connection import (
    ConnectionClosedError,
    Dispatcher,
    FileSource,
    RemotingConnectError,
    RemotingConnection,
)
from cometmq.net.server import RemotingServer
from cometmq.protocol.remoting import RESPONSE_FLAG, RemotingCommand, decode, normalize_ext_fields

log = logging.getLogger(__name__)

__all__ = ["LocalConnection", "LocalConnector", "connect_local", "local_connector", "local_pair"]

#: the address a local client end shows as its own (IPv4 form, so the broker can pack it as a born host), with
#: a made-up port per connection (1..65535, then again)
LOCAL_CLIENT_ADDRESS = "127.0.0.1"
_ports = itertools.count(0)


def _as_received(cmd: RemotingCommand) -> RemotingCommand:
    """``cmd`` as a decoder would have produced it: its own dict of string ext fields, a bytes body."""
    fields = cmd.ext_fields
    for value in fields.values():
        if type(value) is not str:
            fields = normalize_ext_fields(fields)  # LocalProtocolError for values the wire cannot carry
            break
    else:
        fields = dict(fields)
    body = cmd.body
    if type(body) is not bytes:
        body = bytes(body)
    # positional construction: dataclasses.replace costs several times more, and this runs twice per request
    return RemotingCommand(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, fields, body,
                           cmd.serialize_type)


class LocalConnection(RemotingConnection):
    """One end of an in-process pair (see :func:`local_pair`)."""

    def __init__(self, dispatcher: Dispatcher | None, local_address: str, remote_address: str) -> None:
        super().__init__(dispatcher)
        self._peer: LocalConnection | None = None
        self.local_address = local_address
        self.remote_address = remote_address
        self._made.set_result(None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<LocalConnection {self.local_address} -> {self.remote_address} {state}>"

    def _can_write(self) -> bool:
        peer = self._peer
        return not self._closed and peer is not None and not peer._closed

    def close(self) -> None:
        """Close this end now and the peer on the next loop turn (as a socket close is seen by the peer):
        pending requests on either end fail."""
        self._shutdown("closed locally")

    def abort(self) -> None:
        self._shutdown("aborted")

    def _shutdown(self, how: str) -> None:
        peer, self._peer = self._peer, None
        self._finalize(ConnectionClosedError(f"connection to {self.remote_address} was {how}"))
        if not self._lost.done():
            self._lost.set_result(None)
        if peer is not None and peer._peer is self and not peer._closed:
            # The peer learns of it on the next loop turn, as from a socket (its close callbacks must not run
            # inside whatever called close() here); until then its writes fail and its replies are dropped.
            try:
                self._loop.call_soon(peer._shutdown, "closed by the peer")
            except RuntimeError:  # the loop is closing
                peer._shutdown("closed by the peer")

    def send_frame(self, frame: bytes, code: int, opaque: int) -> bool:
        """A reply already encoded (the broker's fast answers) reaches the peer as the command it encodes: False
        (nothing sent) if the peer has gone, as from a socket."""
        if not self._can_write():
            log.debug("dropping reply code %d opaque %d: %s is closed", code, opaque, self.remote_address)
            return False
        self._write(decode(frame))
        return True

    def _write(self, cmd: RemotingCommand, file_region: FileSource | None = None) -> None:
        # file_region is ignored: the body crosses as bytes
        peer = self._peer
        if self._closed or peer is None or peer._closed:
            raise ConnectionClosedError(f"connection to {self.remote_address} is closed")
        delivered = _as_received(cmd)
        if delivered.flag & RESPONSE_FLAG:
            peer._complete(delivered)
        else:
            peer._dispatch(delivered)


def local_pair(server_dispatcher: Dispatcher, client_dispatcher: Dispatcher | None, *,
               server_address: str = "local", client_address: str | None = None
               ) -> tuple[LocalConnection, LocalConnection]:
    """``(client end, server end)``: what the client end sends is served by ``server_dispatcher`` and the other
    way round. Requires a running event loop (handlers run as tasks of it)."""
    if client_address is None:
        client_address = f"{LOCAL_CLIENT_ADDRESS}:{next(_ports) % 65535 + 1}"
    client = LocalConnection(client_dispatcher, client_address, server_address)
    server = LocalConnection(server_dispatcher, server_address, client_address)
    client._peer, server._peer = server, client
    return client, server


def connect_local(server: RemotingServer, client_dispatcher: Dispatcher | None, *,
                  server_address: str | None = None) -> RemotingConnection:
    """A connection to ``server`` that stays in the process: its server end is served by the server's own
    dispatcher and counts among the server's connections (connect and close callbacks, ``stop()``)."""
    if server._server is None:  # not started, or stopped
        raise RemotingConnectError(f"the in-process server {server.host}:{server._port} is not running")
    if server_address is None:
        server_address = f"{server.host}:{server.port}"
    client, server_end = local_pair(server._dispatcher, client_dispatcher, server_address=server_address)
    server._accepted(server_end)  # what a socket's connection_made does for a _ServerConnection
    return client


def local_connector(server: RemotingServer, server_address: str | None = None) -> LocalConnector:
    """A :data:`LocalConnector` for :class:`RemotingClient`'s ``local`` option."""

    def connect(client_dispatcher: Dispatcher | None) -> RemotingConnection:
        return connect_local(server, client_dispatcher, server_address=server_address)

    return connect
