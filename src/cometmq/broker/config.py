"""The broker's configuration: a frozen dataclass read from a RocketMQ-style broker.conf.

``broker.conf`` uses RocketMQ's key names. Keys that belong to the store go to StoreConfig; a key no
component knows is reported (``ConfigError``) rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cometmq.net.limits import ConnectionLimits
from cometmq.net.tls_settings import ALL_TLS_KEYS, TlsConfig, TlsError, tls_config_from_properties
from cometmq.store.config import (
    STORE_KEYS,
    ConfigError,
    StoreConfig,
    convert_keys,
    float_in,
    int_in,
    parse_properties,
    property_bool,
    property_port,
    read_properties,
    store_config_from_properties,
)
from cometmq.timer.config import TimerConfig, TimerConfigError

__all__ = ["BROKER_KEYS", "IGNORED_KEYS", "BrokerConfig", "ConfigError", "broker_config_from_properties",
           "load_broker_conf", "parse_delay_levels", "parse_properties"]

log = logging.getLogger(__name__)

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """"1s 5s 1m" -> (1000, 5000, 60000); level n is index n-1."""
    levels = []
    for item in text.split():
        m = re.fullmatch(r"(\d+)([smhd])", item.strip())
        if not m:
            raise ConfigError(f"messageDelayLevel: bad level {item!r}")
        levels.append(int(m.group(1)) * _UNITS_MS[m.group(2)])
    if not levels:
        raise ConfigError("messageDelayLevel is empty")
    return tuple(levels)


@dataclass(frozen=True)
class BrokerConfig:
    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    namesrv_addr: str = ""
    listen_host: str = "127.0.0.1"
    listen_port: int = 10911
    #: the address clients and nameservers are given for this broker ("" = listen host:port)
    broker_ip: str = ""
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 4
    long_polling_enable: bool = True
    short_polling_time_ms: int = 1000
    #: the safety-net re-check of held pulls; wake-ups come from arrivals, not from this
    hold_check_interval_ms: int = 5000
    register_interval_ms: int = 30_000
    #: full registrations deflated in Java's compact layout (RocketMQ's compressedRegister; its default is false)
    compressed_register: bool = True
    #: full table every round, without asking the nameserver's data version first (RocketMQ's default is true)
    force_register: bool = False
    #: full tables sent as several registrations of split_registration_size topics (RocketMQ's keys)
    enable_split_registration: bool = False
    split_registration_size: int = 800
    #: topic changes registered with REGISTER_TOPIC_IN_NAMESRV, one per topic, instead of a REGISTER_BROKER
    enable_single_topic_register: bool = False
    channel_expired_ms: int = 120_000
    #: NOTIFY_CONSUMER_IDS_CHANGED to a group's clients when its membership changes (RocketMQ's key); False: none,
    #: whatever the groups' own notifyConsumerIdsChangedEnable says
    notify_consumer_ids_changed_enable: bool = True
    #: a group's notices are coalesced: the first change is told at once, the others within a window (1 ms per
    #: member, at most this) once at its end (cometmq's key; 0: every change told at once, as RocketMQ does)
    notify_consumer_ids_changed_window_ms: int = 500
    max_reconsume_times: int = 16
    message_delay_level: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    lock_max_live_time_ms: int = 60_000
    consumer_offset_persist_interval_ms: int = 5000
    enable_property_filter: bool = False
    broker_permission: int = 6
    #: timer messages (RocketMQ 5); see cometmq.timer.config for the measured defaults
    timer_wheel_enable: bool = True
    timer_precision_ms: int = 100
    timer_max_delay_sec: int = 90 * 86_400
    #: 0: one day of slots
    timer_roll_window_slot: int = 0
    timer_flush_interval_ms: int = 1000
    timer_log_file_size: int = 100 * 1024 * 1024
    recall_message_enable: bool = True
    #: POP consumption: how often expired deliveries are looked for, and how often state is snapshotted
    pop_revive_interval_ms: int = 100
    pop_snapshot_interval_ms: int = 2000
    #: the longest a POP or NOTIFICATION is held waiting (a longer pollTime is cut to it): RocketMQ's proxy cuts
    #: long polling to grpcClientConsumerMaxLongPollingTimeoutMillis, 20 s
    pop_max_poll_time_ms: int = 20_000
    #: transactions (RocketMQ's keys and defaults): first check-back this long after the half was stored, at
    #: most this many checks, this long between two checks of one transaction (see docs/transactions.md)
    transaction_timeout_ms: int = 6000
    transaction_check_max: int = 15
    transaction_check_interval_ms: int = 30_000
    #: replication (RocketMQ 5's auto-switch HA; docs/replication.md). -1: the broker port + 1
    ha_listen_port: int = -1
    #: an acknowledged send waits until every member of the SyncStateSet has it (RocketMQ's default is false)
    all_ack_in_sync_state_set: bool = True
    #: fewer in-sync replicas (the master counts) than this refuse sends before writing
    min_in_sync_replicas: int = 1
    #: a replica that has not caught up for this long leaves the SyncStateSet
    ha_max_time_slave_not_catchup_ms: int = 15_000
    #: the master's heartbeat on an idle HA link; a link silent for 4 intervals is closed
    ha_send_heartbeat_interval_ms: int = 5_000
    #: how often the master looks at the SyncStateSet
    ha_housekeeping_interval_ms: int = 5_000
    #: a send waits this long for the in-sync replicas' acks, then answers FLUSH_SLAVE_TIMEOUT
    slave_ack_timeout_ms: int = 3_000
    #: the most log bytes one transfer frame carries (RocketMQ: 32 KiB; its replicas read up to 4 MiB)
    ha_transfer_batch_size: int = 256 * 1024
    #: controller mode (RocketMQ 5's keys; docs/replication.md "Controller mode"): the controller hands out the
    #: broker id, elects the master and keeps the SyncStateSet. Off by default.
    enable_controller_mode: bool = False
    #: the controllers, "host:port;host:port"
    controller_addr: str = ""
    #: how often a broker heartbeats to every controller (oneway BROKER_HEARTBEAT)
    broker_heartbeat_interval_ms: int = 1000
    #: a broker not heard from for this long is dead to the controller; a master also uses it for its lease
    controller_heartbeat_timeout_ms: int = 10_000
    #: how often a replica asks the controller leader for the group's master and set (GET_REPLICA_INFO)
    sync_broker_metadata_period_ms: int = 5000
    #: how often a broker asks the controllers who their leader is (GET_METADATA_INFO)
    sync_controller_metadata_period_ms: int = 5000
    #: lower is preferred in elections (RocketMQ's default: Integer.MAX_VALUE)
    election_priority: int = 2**31 - 1
    #: seconds between the broker's one-line stats summaries in its log (broker/stats_log.py); 0: none
    stats_log_interval_s: float = 60
    #: metrics (RocketMQ 5's keys; docs/operations.md "Metrics"): DISABLE (no counting at all) or PROM (a Prometheus
    #: endpoint, /metrics, on metricsPrometheusHost:metricsPrometheusPort; needs the ``metrics`` extra)
    metrics_exporter_type: str = "DISABLE"
    metrics_prometheus_port: int = 5557
    #: the web dashboard (docs/dashboard.md) on this port of the metrics host; 0: off (the default)
    dashboard_port: int = 0
    #: "": the broker's listen host
    metrics_prometheus_host: str = ""
    #: access control (RocketMQ's ACL 1.0; docs/security.md): off by default; the file is reloaded when it changes
    acl_enable: bool = False
    #: "": plain_acl.yml in the broker's data folder (storePathRootDir)
    acl_file: str = ""
    #: (accessKey, secretKey) the broker signs its own requests with (to nameservers and other brokers)
    inner_credentials: tuple[str, str] | None = None
    #: the remoting port's connection limits (cometmq.net.limits; issue [15]): an incomplete frame closes its
    #: connection after this many seconds, a connection with nothing received after serverChannelMaxIdleTimeSeconds
    #: (RocketMQ's, 120); connections in total and per IP; bytes of incomplete frames of all connections; queued
    #: reply bytes of one peer that does not read. 0 turns one off.
    server_read_timeout_s: float = ConnectionLimits.read_timeout_s
    server_idle_timeout_s: float = ConnectionLimits.idle_timeout_s
    server_max_connections: int = ConnectionLimits.max_connections
    server_max_connections_per_ip: int = ConnectionLimits.max_connections_per_ip
    server_max_partial_frame_bytes: int = ConnectionLimits.max_partial_bytes
    server_write_buffer_hard_limit: int = ConnectionLimits.write_hard_limit
    server_write_stall_timeout_s: float = ConnectionLimits.write_stall_timeout_s
    server_max_write_buffer_bytes: int = ConnectionLimits.max_write_buffer_bytes
    store: StoreConfig = field(default_factory=StoreConfig)
    #: TLS of the remoting and gRPC ports, RocketMQ's tls.* keys (net/tls.py; docs/security.md "TLS")
    tls: TlsConfig = field(default_factory=TlsConfig)

    @property
    def advertised_addr(self) -> str:
        return f"{self.broker_ip or self.listen_host}:{self.listen_port}"

    @property
    def ha_port(self) -> int:
        return self.ha_listen_port if self.ha_listen_port >= 0 else self.listen_port + 1

    @property
    def ha_addr(self) -> str:
        return f"{self.broker_ip or self.listen_host}:{self.ha_port}"

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(read_timeout_s=self.server_read_timeout_s, idle_timeout_s=self.server_idle_timeout_s,
                                max_connections=self.server_max_connections,
                                max_connections_per_ip=self.server_max_connections_per_ip,
                                max_partial_bytes=self.server_max_partial_frame_bytes,
                                write_hard_limit=self.server_write_buffer_hard_limit,
                                write_stall_timeout_s=self.server_write_stall_timeout_s,
                                max_write_buffer_bytes=self.server_max_write_buffer_bytes)

    @property
    def acl_path(self) -> Path:
        return Path(self.acl_file) if self.acl_file else Path(self.store.store_path) / "plain_acl.yml"

    @property
    def controller_addrs(self) -> list[str]:
        return [a.strip() for a in self.controller_addr.replace(",", ";").split(";") if a.strip()]

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)


#: the metricsExporterType values cometmq serves (RocketMQ 5 also has OTLP_GRPC and LOG)
METRICS_EXPORTER_TYPES = ("DISABLE", "PROM")


def _metrics_exporter_type(v: str) -> str:
    s = v.strip().upper()
    if s not in METRICS_EXPORTER_TYPES:
        raise ValueError(f"must be one of {', '.join(METRICS_EXPORTER_TYPES)}"
                         + (" (cometmq has no OTLP or log exporter)" if s in ("OTLP_GRPC", "LOG") else ""))
    return s




def _credentials(v: str) -> tuple[str, str]:
    """RocketMQ 5's ``innerClientAuthenticationCredentials``: ``{"accessKey":"ak","secretKey":"sk"}``."""
    import json

    try:
        raw = json.loads(v)
    except ValueError:
        raise ValueError('must be JSON: {"accessKey":"...","secretKey":"..."}') from None
    if not isinstance(raw, dict) or not isinstance(raw.get("accessKey"), str) or not isinstance(
            raw.get("secretKey"), str) or not raw["accessKey"] or not raw["secretKey"]:
        raise ValueError('must name both keys: {"accessKey":"...","secretKey":"..."}')
    return raw["accessKey"], raw["secretKey"]




BROKER_KEYS: dict[str, tuple[str, Any]] = {
    "brokerName": ("broker_name", str),
    "brokerClusterName": ("broker_cluster_name", str),
    "brokerId": ("broker_id", int_in(0)),
    "namesrvAddr": ("namesrv_addr", str),
    "listenPort": ("listen_port", property_port),
    "brokerIP1": ("broker_ip", str),
    "autoCreateTopicEnable": ("auto_create_topic_enable", property_bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", property_bool),
    "defaultTopicQueueNums": ("default_topic_queue_nums", int_in(1, 1024)),
    "longPollingEnable": ("long_polling_enable", property_bool),
    "shortPollingTimeMills": ("short_polling_time_ms", int_in(1)),
    "registerBrokerInterval": ("register_interval_ms", int_in(1000)),
    "registerNameServerPeriod": ("register_interval_ms", int_in(1000)),  # RocketMQ's BrokerConfig field name
    "compressedRegister": ("compressed_register", property_bool),
    "forceRegister": ("force_register", property_bool),
    "enableSplitRegistration": ("enable_split_registration", property_bool),
    "splitRegistrationSize": ("split_registration_size", int_in(1)),
    "enableSingleTopicRegister": ("enable_single_topic_register", property_bool),
    "channelExpiredTimeout": ("channel_expired_ms", int_in(1)),
    "notifyConsumerIdsChangedEnable": ("notify_consumer_ids_changed_enable", property_bool),
    "notifyConsumerIdsChangedWindowMs": ("notify_consumer_ids_changed_window_ms", int_in(0)),
    "maxReconsumeTimes": ("max_reconsume_times", int_in(0)),
    "messageDelayLevel": ("message_delay_level", parse_delay_levels),
    "lockMaxLiveTime": ("lock_max_live_time_ms", int_in(1)),
    "flushConsumerOffsetInterval": ("consumer_offset_persist_interval_ms", int_in(1)),
    "enablePropertyFilter": ("enable_property_filter", property_bool),
    "brokerPermission": ("broker_permission", int_in(0, 7)),
    "timerWheelEnable": ("timer_wheel_enable", property_bool),
    "timerPrecisionMs": ("timer_precision_ms", int_in(1)),
    "timerMaxDelaySec": ("timer_max_delay_sec", int_in(1)),
    "timerRollWindowSlot": ("timer_roll_window_slot", int_in(0)),
    "timerFlushIntervalMs": ("timer_flush_interval_ms", int_in(10)),
    "mappedFileSizeTimerLog": ("timer_log_file_size", int_in(4096)),
    "recallMessageEnable": ("recall_message_enable", property_bool),
    "popReviveIntervalMs": ("pop_revive_interval_ms", int_in(1)),
    "popSnapshotIntervalMs": ("pop_snapshot_interval_ms", int_in(1)),
    "popMaxPollTimeMs": ("pop_max_poll_time_ms", int_in(1)),
    "transactionTimeOut": ("transaction_timeout_ms", int_in(1)),
    "transactionCheckMax": ("transaction_check_max", int_in(1)),
    "transactionCheckInterval": ("transaction_check_interval_ms", int_in(1)),
    "haListenPort": ("ha_listen_port", int_in(-1, 65535)),
    "allAckInSyncStateSet": ("all_ack_in_sync_state_set", property_bool),
    "minInSyncReplicas": ("min_in_sync_replicas", int_in(1)),
    "haMaxTimeSlaveNotCatchup": ("ha_max_time_slave_not_catchup_ms", int_in(1)),
    "haSendHeartbeatInterval": ("ha_send_heartbeat_interval_ms", int_in(1)),
    "haHousekeepingInterval": ("ha_housekeeping_interval_ms", int_in(1)),
    "slaveTimeout": ("slave_ack_timeout_ms", int_in(1)),
    "haTransferBatchSize": ("ha_transfer_batch_size", int_in(1)),
    "enableControllerMode": ("enable_controller_mode", property_bool),
    "controllerAddr": ("controller_addr", str),
    "brokerHeartbeatInterval": ("broker_heartbeat_interval_ms", int_in(1)),
    "controllerHeartBeatTimeoutMills": ("controller_heartbeat_timeout_ms", int_in(1)),
    "syncBrokerMetadataPeriod": ("sync_broker_metadata_period_ms", int_in(1)),
    "syncControllerMetadataPeriod": ("sync_controller_metadata_period_ms", int_in(1)),
    "brokerElectionPriority": ("election_priority", int_in(0)),
    "electionPriority": ("election_priority", int_in(0)),
    "statsLogIntervalSec": ("stats_log_interval_s", float_in(0)),
    "metricsExporterType": ("metrics_exporter_type", _metrics_exporter_type),
    "metricsPrometheusPort": ("metrics_prometheus_port", property_port),
    "dashboardPort": ("dashboard_port", property_port),
    "metricsPromExporterPort": ("metrics_prometheus_port", property_port),  # RocketMQ 5's BrokerConfig field name
    "metricsPrometheusHost": ("metrics_prometheus_host", str),
    "metricsPromExporterHost": ("metrics_prometheus_host", str),
    "aclEnable": ("acl_enable", property_bool),
    "aclFile": ("acl_file", str),
    "innerClientAuthenticationCredentials": ("inner_credentials", _credentials),
    "serverChannelMaxIdleTimeSeconds": ("server_idle_timeout_s", float_in(0)),  # RocketMQ's NettyServerConfig key
    "serverFrameReadTimeoutSeconds": ("server_read_timeout_s", float_in(0)),
    "serverMaxConnections": ("server_max_connections", int_in(0)),
    "serverMaxConnectionsPerIp": ("server_max_connections_per_ip", int_in(0)),
    "serverMaxPartialFrameBytes": ("server_max_partial_frame_bytes", int_in(0)),
    "serverWriteBufferHardLimit": ("server_write_buffer_hard_limit", int_in(0)),
    "serverWriteStallTimeoutSeconds": ("server_write_stall_timeout_s", float_in(0)),
    "serverMaxWriteBufferBytes": ("server_max_write_buffer_bytes", int_in(0)),
}
#: Keys RocketMQ users often carry in broker.conf that have no meaning here; accepted with no effect, and listed in
#: one WARNING line when a configuration that has them is read (at start-up), never silently.
IGNORED_KEYS = frozenset({"brokerRole", "sendMessageThreadPoolNums", "pullMessageThreadPoolNums",
                          "storePathCommitLog", "storePathConsumeQueue", "storePathIndex", "storeCheckpoint",
                          "abortFile", "brokerIP2", "traceTopicEnable"})


def broker_config_from_properties(props: Mapping[str, str], base: BrokerConfig | None = None) -> BrokerConfig:
    unknown = sorted(k for k in props if k not in BROKER_KEYS and k not in STORE_KEYS and k not in IGNORED_KEYS
                     and k not in ALL_TLS_KEYS)
    if unknown:
        raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
    ignored = sorted(k for k in props if k in IGNORED_KEYS)
    if ignored:
        log.warning("configuration keys accepted but not acted on by cometmq (they have no effect here): %s",
                    ", ".join(ignored))
    base = base or BrokerConfig()
    changes = convert_keys(props, BROKER_KEYS)
    changes["store"] = store_config_from_properties(props, base.store)
    try:
        changes["tls"] = tls_config_from_properties(props, base.tls)
    except TlsError as exc:
        raise ConfigError(str(exc)) from None
    cfg = dataclasses.replace(base, **changes)
    if cfg.ha_port > 65535:
        raise ConfigError(f"listenPort={cfg.listen_port}: the HA port (listenPort + 1) would be {cfg.ha_port}; "
                          "give a lower listenPort or set haListenPort")
    try:
        timer_config_of(cfg)  # the timer's own checks (cometmq.timer.config)
    except TimerConfigError as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in props.items() if k.startswith("timer") or k.endswith("TimerLog"))
        raise ConfigError(f"{exc} ({given})") from None
    return cfg


def timer_config_of(c: BrokerConfig) -> TimerConfig:
    """The timer service's settings from the broker's."""
    return TimerConfig(enable=c.timer_wheel_enable, precision_ms=c.timer_precision_ms,
                       max_delay_sec=c.timer_max_delay_sec, roll_window_slot=c.timer_roll_window_slot,
                       timerlog_file_size=c.timer_log_file_size, flush_interval_ms=c.timer_flush_interval_ms,
                       preallocate=c.store.preallocate)


def load_broker_conf(path: str | Path, base: BrokerConfig | None = None) -> BrokerConfig:
    return broker_config_from_properties(read_properties(path), base)
