"""Configuration of the gRPC endpoint (one frozen dataclass; no gRPC imports, so the CLI can build it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cometmq.net.limits import ConnectionLimits
from cometmq.net.tls_settings import TlsConfig

DEFAULT_GRPC_PORT = 8081


#: what a gRPC frame may carry besides one message body (its other fields, the frame's headers)
FRAME_OVERHEAD = 1024 * 1024


_TWELVE_HOURS = 12 * 3600 * 1000
_INT_RANGE = (-(1 << 63), (1 << 63) - 1)
#: the renewal settings' ranges (ProxyConfig checks them when made; --grpc-config by their RocketMQ key)
RENEW_RANGES: dict[str, tuple[int, int]] = {
    "default_invisible_ms": (1, _TWELVE_HOURS),
    "renew_ahead_ms": (0, _INT_RANGE[1]),
    "renew_period_ms": (1, _INT_RANGE[1]),
    "renew_max_ms": (0, _INT_RANGE[1]),
    "max_renew_retries": (0, _INT_RANGE[1]),
    "clear_invisible_ms": (0, _TWELVE_HOURS),
    "renew_max_per_client": (0, _INT_RANGE[1]),
    "renew_max_handles": (0, _INT_RANGE[1]),
}


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
    # The limits below are RocketMQ 5 proxy's (its ProxyConfig key in brackets), with its defaults; a limit of 0 or
    # less is off, as in RocketMQ. grpc/limits.py checks them before anything reaches a broker.
    #: refuse a message with an empty body, MESSAGE_BODY_EMPTY [enableMessageBodyEmptyCheck]
    empty_body_check: bool = True
    #: most user properties of a message, MESSAGE_PROPERTIES_TOO_LARGE [userPropertyMaxNum]
    max_user_properties: int = 128
    #: most UTF-8 bytes of a message's user property keys and values, tag and keys together,
    #: MESSAGE_PROPERTIES_TOO_LARGE [maxUserPropertySize]
    max_user_property_size: int = 16 * 1024
    #: a message group must be shorter than this many UTF-8 bytes, ILLEGAL_MESSAGE_GROUP [maxMessageGroupSize]
    max_message_group_size: int = 64
    #: how far ahead of now a delivery timestamp may be, ILLEGAL_DELIVERY_TIME [maxDelayTimeMills]
    max_delay_ms: int = 24 * 3600 * 1000
    #: longest orphaned transaction recovery duration of a transactional message, seconds, BAD_REQUEST
    #: [maxTransactionRecoverySecond]
    max_transaction_recovery_s: int = 3600
    #: shortest invisible duration a ReceiveMessage may ask for, ILLEGAL_INVISIBLE_TIME
    #: [minInvisibleTimeMillsForRecv]
    min_receive_invisible_ms: int = 10_000
    #: longest invisible duration of a ReceiveMessage or ChangeInvisibleDuration, ILLEGAL_INVISIBLE_TIME
    #: [maxInvisibleTimeMills]; brokers refuse more than 12 h whatever this says
    max_invisible_ms: int = 12 * 3600 * 1000
    #: invisible time of a ReceiveMessage without one, or with auto_renew (push consumers): what an auto-renewing
    #: delivery starts with [defaultInvisibleTimeMills]
    default_invisible_ms: int = 60_000
    # Renewal of auto-renewing receives while the client holds them (grpc/renewal.py), RocketMQ proxy's
    # ReceiptHandleProcessor; its ProxyConfig keys and defaults in brackets.
    #: renew auto-renewing receives; off, they are plain receives [enableProxyAutoRenew]
    auto_renew: bool = True
    #: renew a delivery once its invisible time ends within this [renewAheadTimeMillis]
    renew_ahead_ms: int = 10_000
    #: how often the held deliveries are looked at [renewSchedulePeriodMillis]
    renew_period_ms: int = 5_000
    #: renewing stops this long after the first pop; the message is then given back with the group's retry delay
    #: [renewMaxTimeMillis]
    renew_max_ms: int = 3 * 3600 * 1000
    #: renewals of one delivery that may fail in a row (timeouts, a broker not reached) [maxRenewRetryTimes]
    max_renew_retries: int = 3
    #: the invisible time of the n-th renewal, the last repeated (RocketMQ's RenewStrategyPolicy, fixed there)
    renew_steps_ms: tuple[int, ...] = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)
    #: what a client that ends or goes silent still holds is visible again after this [invisibleTimeMillisWhenClear]
    clear_invisible_ms: int = 1_000
    #: most deliveries renewed for one client, and for all clients: past them a delivery keeps default_invisible_ms
    renew_max_per_client: int = 4096
    renew_max_handles: int = 65_536
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

    def __post_init__(self) -> None:
        for name, (low, high) in RENEW_RANGES.items():
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"ProxyConfig.{name} must be an integer from {low} to {high}, not {value!r}")
        if not self.renew_steps_ms or not all(type(v) is int and 1 <= v <= _TWELVE_HOURS for v in self.renew_steps_ms):
            raise ValueError(f"ProxyConfig.renew_steps_ms must be one or more integers from 1 to {_TWELVE_HOURS}, "
                             f"not {self.renew_steps_ms!r}")

    def replace(self, **changes: Any) -> ProxyConfig:
        return replace(self, **changes)

    @property
    def frame_limit(self) -> int:
        """The largest gRPC frame taken or sent: one whole message (max_body_size) and the rest of the frame."""
        return self.max_body_size + FRAME_OVERHEAD

    @property
    def bind_addr(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: the keys of a RocketMQ 5 proxy's rmq-proxy.json that ``--grpc-config`` takes, and the ProxyConfig field of each:
#: the limits on what clients send (grpc/limits.py; an integer limit of 0 or less is off, as in RocketMQ) and the
#: renewal of auto-renewing receives (grpc/renewal.py; RENEW_RANGES)
PROXY_JSON_KEYS = {
    "maxMessageSize": "max_body_size",
    "enableMessageBodyEmptyCheck": "empty_body_check",
    "userPropertyMaxNum": "max_user_properties",
    "maxUserPropertySize": "max_user_property_size",
    "maxMessageGroupSize": "max_message_group_size",
    "maxDelayTimeMills": "max_delay_ms",
    "maxTransactionRecoverySecond": "max_transaction_recovery_s",
    "minInvisibleTimeMillsForRecv": "min_receive_invisible_ms",
    "maxInvisibleTimeMills": "max_invisible_ms",
    "defaultInvisibleTimeMills": "default_invisible_ms",
    "enableProxyAutoRenew": "auto_renew",
    "renewAheadTimeMillis": "renew_ahead_ms",
    "renewSchedulePeriodMillis": "renew_period_ms",
    "renewMaxTimeMillis": "renew_max_ms",
    "maxRenewRetryTimes": "max_renew_retries",
    "invisibleTimeMillisWhenClear": "clear_invisible_ms",
}
#: keys of RocketMQ's sample rmq-proxy.json that mean nothing here (the cluster is the nameservers'): taken, unused
_PROXY_JSON_IGNORED = frozenset({"rocketMQClusterName"})
#: maxMessageSize bounds grpc's receive limit too (a 32-bit length), so it is never off: 1 byte to 1 GiB
_MAX_BODY_RANGE = (1, 1 << 30)
_BOOLS = frozenset({"empty_body_check", "auto_renew"})


def load_proxy_json(path: Path) -> dict[str, Any]:
    """The ProxyConfig fields a RocketMQ-style rmq-proxy.json sets (:data:`PROXY_JSON_KEYS`). ValueError naming the
    file and the key for a file that cannot be read, is not one JSON object, repeats a key, names a key not taken
    here, or gives a value of the wrong type or out of range: nothing is half-applied."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read: {exc}") from None

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ValueError(f"{path}: the key {key!r} is given twice")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _PROXY_JSON_IGNORED:
            continue
        name = PROXY_JSON_KEYS.get(key)
        if name is None:
            raise ValueError(f"{path}: unknown key {key!r} (taken: {', '.join(sorted(PROXY_JSON_KEYS))})")
        if name in _BOOLS:
            if type(value) is not bool:
                raise ValueError(f"{path}: {key} must be true or false, not {value!r}")
        else:
            low, high = _MAX_BODY_RANGE if name == "max_body_size" else RENEW_RANGES.get(name, _INT_RANGE)
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"{path}: {key} must be an integer from {low} to {high}, not {value!r}")
        out[name] = value
    return out
