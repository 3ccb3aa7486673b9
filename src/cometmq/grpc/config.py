"""Configuration of the gRPC endpoint (one frozen dataclass; no gRPC imports, so the CLI can build it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cometmq.net.limits import ConnectionLimits
from cometmq.net.tls_settings import TlsConfig

DEFAULT_GRPC_PORT = 8081


@dataclass(frozen=True)
class ProxyConfig:
    #: nameservers, ``host:port;host:port``
    namesrv: str = "127.0.0.1:9876"
    host: str = "127.0.0.1"
    #: 0 lets the OS pick a free port (tests); the bound port is on ``GrpcProxy.port``
    port: int = DEFAULT_GRPC_PORT
    #: remoting request timeout towards brokers and nameservers
    request_timeout_s: float = 3.0
    #: publishing.max_body_size told to producers, and enforced on SendMessage
    max_body_size: int = 4 * 1024 * 1024
    #: invisible time of a ReceiveMessage without one (push consumers), RocketMQ's popInvisibleTime
    default_invisible_ms: int = 60_000
    #: long polling of a ReceiveMessage without one, and told to push consumers in their settings
    long_polling_ms: int = 20_000
    #: answer a long poll this long before the client's deadline
    deadline_margin_ms: int = 1_000
    #: access key -> secret key; authentication is on when ``auth_enabled``
    access_keys: dict[str, str] = field(default_factory=dict)
    auth_enabled: bool = False
    #: a plain_acl.yml (docs/security.md): authentication and per-topic/group permissions from the same ACL as the
    #: brokers' remoting port (cometmq.acl); takes precedence over ``access_keys``
    acl_file: str = ""
    #: (accessKey, secretKey) the endpoint signs its remoting requests to brokers with (RocketMQ 5's
    #: innerClientAuthenticationCredentials): needed when the brokers have aclEnable=true
    inner_credentials: tuple[str, str] | None = None
    #: allowed distance between x-mq-date-time and the server clock
    max_clock_skew_s: float = 15 * 60
    #: where new consumer groups start: "min" (the queue's first message) or "max" (new messages only)
    init_mode: str = "min"
    route_refresh_s: float = 10.0
    heartbeat_s: float = 30.0
    #: TLS of the gRPC port (tls.server.*) and of the remoting connections to brokers and nameservers
    #: (tls.enable, tls.client.*): net/tls.py, grpc/tls.py
    tls: TlsConfig = field(default_factory=TlsConfig)
    #: maxConnections and maxConnectionsPerIp of the gRPC port (the broker's, when embedded); applied by the
    #: permissive TLS relay, which owns the port's sockets (grpc/tls.py)
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)

    def replace(self, **changes: Any) -> ProxyConfig:
        return replace(self, **changes)

    @property
    def bind_addr(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
