"""The gRPC endpoint's lifecycle: a ``grpc.aio`` server serving ``apache.rocketmq.v2.MessagingService`` on top
of a :class:`Backend` (remoting to the brokers found through the nameservers).

Used the same way standalone (``cometmq proxy``) and embedded in ``cometmq serve`` / ``cometmq broker``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import grpc

from cometmq.grpc.backend import Backend
from cometmq.grpc.config import ProxyConfig
from cometmq.grpc.consumer_rpcs import ConsumerRpcs
from cometmq.grpc.malformed import MalformedRequestInterceptor
from cometmq.grpc.producer_rpcs import ProducerRpcs
from cometmq.grpc.renewal import Renewer
from cometmq.grpc.sessions import Sessions
from cometmq.grpc.v2 import service_pb2_grpc
from cometmq.net.client import LocalConnector
from cometmq.net.limits import ConnectionGuard
from cometmq.net.tls import ServerTls, TlsListener
from cometmq.net.tls_settings import TlsMode

log = logging.getLogger("cometmq.grpc")


class MessagingService(ProducerRpcs, ConsumerRpcs, service_pb2_grpc.MessagingServiceServicer):
    """Every RPC of the service; the base servicer's defaults (UNIMPLEMENTED) are all overridden."""

    def __init__(self, backend: Backend, config: ProxyConfig, sessions: Sessions) -> None:
        super().__init__(backend, config, sessions)
        self.port = config.port
        self.renewer = Renewer(config, sessions, self._change_invisible, self._spawn)


#: the OTLP metrics service the 5.x clients export to when settings turn their metrics on
OTLP_METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def _metrics_sink() -> grpc.GenericRpcHandler:
    """Accept OTLP metric exports and drop them (an empty ExportMetricsServiceResponse is zero bytes)."""

    async def export(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b""

    handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(OTLP_METRICS_SERVICE, {"Export": handler})


class GrpcProxy:
    """``local``: broker address -> in-process connector, for the brokers of this process (the embedded
    endpoint); every other broker, and the nameservers, are reached over TCP."""

    def __init__(self, config: ProxyConfig, *, local: Mapping[str, LocalConnector] | None = None) -> None:
        self.config = config
        self.backend = Backend(config.namesrv, request_timeout=config.request_timeout_s,
                               route_refresh_s=config.route_refresh_s, heartbeat_s=config.heartbeat_s, local=local,
                               ssl=config.tls.client_context(), credentials=config.inner_credentials)
        self.sessions = Sessions()
        self.service = MessagingService(self.backend, config, self.sessions)
        self.backend.check_handler = self.service.on_transaction_check
        self._server: grpc.aio.Server | None = None
        #: permissive TLS: the public port, relaying to grpc's plaintext port on loopback (grpc/tls.py)
        self._front: TlsListener | None = None
        #: the port's connection caps, applied where cometmq owns the sockets (the permissive relay)
        self.guard = ConnectionGuard(config.connection_limits, what="gRPC endpoint")
        self.port = config.port
        #: grpc's own port: ``port``, except behind the permissive relay (an internal one on 127.0.0.1)
        self.grpc_port = 0

    @property
    def addr(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        await self.backend.start()
        # frames carry a whole message (4 MiB by default) plus headers
        limit = self.config.frame_limit
        server = grpc.aio.server(interceptors=[MalformedRequestInterceptor()],
                                 options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", limit),
                                          ("grpc.so_reuseport", 0)])
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        server.add_generic_rpc_handlers((_metrics_sink(),))
        tls = ServerTls(self.config.tls, alpn=("h2",)) if self.config.tls.enabled else None
        bind = "127.0.0.1:0" if tls is not None and tls.mode is TlsMode.PERMISSIVE else self.config.bind_addr
        try:
            if tls is not None and tls.mode is TlsMode.ENFORCING:
                from cometmq.grpc.tls import dynamic_credentials

                port = server.add_secure_port(bind, dynamic_credentials(tls))
            else:
                port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            await self.backend.close()
            raise OSError(f"cannot listen for gRPC on {self.config.bind_addr}: {exc}") from None
        if port == 0:
            await self.backend.close()
            raise OSError(f"cannot listen for gRPC on {self.config.bind_addr}")
        await server.start()
        self.grpc_port = port
        if tls is not None and tls.mode is TlsMode.PERMISSIVE:
            from cometmq.grpc.tls import RelayPeers, start_permissive_front

            # grpc sees the relay (127.0.0.1) as every client: the ACL looks the real one up in this table
            peers = self.service.relay_peers = RelayPeers()
            try:
                self._front = await start_permissive_front(self.config.host, self.config.port, tls, port, peers,
                                                           self.guard)
            except OSError as exc:
                await server.stop(None)
                await self.backend.close()
                raise OSError(f"cannot listen for gRPC on {self.config.bind_addr}: {exc}") from None
            port = self._front.sockets[0].getsockname()[1]
        self.port = self.service.port = port
        self._server = server
        log.info("gRPC endpoint (apache.rocketmq.v2) listening on %s:%d, nameservers %s%s%s", self.config.host, port,
                 self.config.namesrv, ", access control on" if self.service.acl is not None else "",
                 f", TLS {tls.mode.value}" if tls is not None else "")

    async def stop(self, grace: float = 1.0) -> None:
        server, self._server = self._server, None
        front, self._front = self._front, None
        if front is not None:
            front.close()
            await front.wait_closed()
        for cid in [s.client_id for s in list(self.sessions.publishers_all())]:
            self.sessions.remove(cid)
        if server is not None:
            await server.stop(grace)
        # what clients hold (no call of theirs reaches the endpoint now) is visible again in a second, not after the
        # rest of its invisible time (RocketMQ's proxy gives it back so when it shuts down)
        await self.service.renewer.close(timeout=self.config.request_timeout_s)
        if self.service.acl is not None:
            await self.service.acl.stop()
        await self.backend.close()
