"""The controller's configuration file (``cometmq controller -c controller.properties``), RocketMQ's key names, and
the keys a nameserver that embeds the controller takes besides its own (``cometmq namesrv -c``).

Security keys (docs/security.md): ``aclEnable`` / ``aclFile`` put the controller's port under an ACL (the
nameserver's rule: reads open, every change needs an admin account), ``innerClientAuthenticationCredentials``
(RocketMQ 5's key, ``{"accessKey":"…","secretKey":"…"}``) signs what the controller sends to brokers
(NOTIFY_BROKER_ROLE_CHANGED), and RocketMQ's ``tls.*`` keys (net/tls.py) set the TLS of its port and, with
``tls.enable``, of its connections to brokers. A key nothing here knows is an error that names it; RocketMQ
controller keys with no meaning here (DLedger/JRaft settings, thread pools) are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..acl.remoting import parse_credentials
from ..net.tls_settings import ALL_TLS_KEYS, TlsConfig, TlsError, tls_config_from_properties
from ..protocol.acl import Credentials
from ..store.config import ConfigError, convert_keys, property_bool, property_port, read_properties

#: RocketMQ 5's key of the credentials a server signs its own requests with
INNER_CREDENTIALS_KEY = "innerClientAuthenticationCredentials"






def _file(value: str) -> str:
    if not value.strip():
        raise ValueError("names no file")
    return value.strip()


#: RocketMQ key -> (ControllerFile field, converter)
CONTROLLER_FILE_KEYS: dict[str, tuple[str, Any]] = {
    "listenPort": ("port", property_port),
    "bindAddress": ("host", str.strip),
    "enableElectUncleanMaster": ("elect_unclean_master", property_bool),
    "aclEnable": ("acl_enable", property_bool),
    "aclFile": ("acl_file", _file),
}
#: RocketMQ controller keys accepted with no effect (its DLedger/JRaft consensus, thread pools, paths)
IGNORED_KEYS = frozenset({
    "rocketmqHome", "configStorePath", "controllerType", "controllerDLegerGroup", "controllerDLegerPeers",
    "controllerDLegerSelfId", "controllerStorePath", "mappedFileSize", "controllerThreadPoolNums",
    "controllerRequestThreadPoolQueueCapacity", "notifyBrokerRoleChanged", "scanNotActiveBrokerInterval",
    "scanInactiveMasterInterval", "jRaftGroupId", "jRaftServerId", "jRaftInitConf", "jRaftControllerRPCAddr",
    "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads", "serverOnewaySemaphoreValue",
    "serverAsyncSemaphoreValue", "serverChannelMaxIdleTimeSeconds", "useEpollNativeSelector",
})


@dataclass(frozen=True)
class ControllerFile:
    """What a controller.properties says; None: not given (the command line's value or default applies)."""

    host: str | None = None
    port: int | None = None
    elect_unclean_master: bool | None = None
    acl_enable: bool = False
    acl_file: str | None = None
    inner_credentials: Credentials | None = None
    tls: TlsConfig = field(default_factory=TlsConfig)


def _tls(props: Mapping[str, str]) -> TlsConfig:
    try:
        return tls_config_from_properties(props)
    except TlsError as exc:
        raise ConfigError(str(exc)) from None


def _inner(props: Mapping[str, str]) -> Credentials | None:
    """The credentials key's value, parsed; the error names the key and never repeats the value (a secret)."""
    raw = props.get(INNER_CREDENTIALS_KEY)
    if raw is None:
        return None
    try:
        return parse_credentials(raw)
    except ValueError as exc:
        raise ConfigError(f"{INNER_CREDENTIALS_KEY} {exc}") from None


def controller_file_from_properties(props: Mapping[str, str]) -> ControllerFile:
    unknown = sorted(k for k in props if k not in CONTROLLER_FILE_KEYS and k not in ALL_TLS_KEYS
                     and k not in IGNORED_KEYS and k != INNER_CREDENTIALS_KEY)
    if unknown:
        raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
    return dataclasses.replace(ControllerFile(tls=_tls(props), inner_credentials=_inner(props)),
                               **convert_keys(props, CONTROLLER_FILE_KEYS))


def _read(path: str | Path) -> dict[str, str]:
    return read_properties(path)


def load_controller_conf(path: str | Path) -> ControllerFile:
    props = _read(path)
    try:
        return controller_file_from_properties(props)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class NamesrvExtras:
    """The keys of a namesrv.properties the nameserver's own reader does not take: its TLS (``tls.*``) and the
    embedded controller's ``innerClientAuthenticationCredentials``."""

    tls: TlsConfig = field(default_factory=TlsConfig)
    inner_credentials: Credentials | None = None


def split_namesrv_properties(path: str | Path) -> tuple[dict[str, str], NamesrvExtras]:
    """A namesrv.properties read: (the nameserver's own keys, for namesrv.config, and the extras); ConfigError
    naming the file and the key when a value is bad."""
    props = _read(path)
    extras = {k: props.pop(k) for k in list(props) if k in ALL_TLS_KEYS or k == INNER_CREDENTIALS_KEY}
    try:
        return props, NamesrvExtras(_tls(extras), _inner(extras))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


__all__ = ["CONTROLLER_FILE_KEYS", "INNER_CREDENTIALS_KEY", "ControllerFile", "NamesrvExtras",
           "controller_file_from_properties", "load_controller_conf", "split_namesrv_properties"]
