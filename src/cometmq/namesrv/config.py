"""The nameserver's configuration file (``cometmq namesrv -c namesrv.properties``), with RocketMQ's key names
(NamesrvConfig, NettyServerConfig, and the ControllerConfig keys of a controller run in the nameserver).

A key no component knows is an error that names it; RocketMQ keys with no meaning here (thread pools, socket
buffers, paths of files this nameserver does not keep) are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cometmq.namesrv.server import NamesrvConfig
from cometmq.store.config import ConfigError, convert_keys, property_bool, property_port, read_properties

#: RocketMQ key -> (NamesrvConfig field, converter)
NAMESRV_KEYS: dict[str, tuple[str, Any]] = {
    "listenPort": ("port", property_port),
    "bindAddress": ("host", str),
    "scanNotActiveBrokerInterval": ("scan_interval_s", lambda v: int(v) / 1000),
    "aclEnable": ("acl_enable", property_bool),
    "aclFile": ("acl_file", str),
    "orderMessageEnable": ("order_message_enable", property_bool),
    "kvConfigPath": ("kv_config_path", Path),
}
#: the controller in the nameserver (RocketMQ's enableControllerInNamesrv; its log in controllerStorePath)
CONTROLLER_KEYS: dict[str, tuple[str, Any]] = {
    "enableControllerInNamesrv": ("enabled", property_bool),
    "controllerStorePath": ("store_path", Path),
}
#: RocketMQ keys accepted with no effect
IGNORED_KEYS = frozenset({
    "rocketmqHome", "configStorePath", "productEnvName", "clusterTest",
    "returnOrderTopicConfigToBroker", "clientRequestThreadPoolNums", "defaultThreadPoolNums",
    "clientRequestThreadPoolQueueCapacity", "defaultThreadPoolQueueCapacity", "unRegisterBrokerQueueCapacity",
    "supportActingMaster", "enableAllTopicList", "enableTopicList", "notifyMinBrokerIdChanged",
    "needWaitForService", "waitSecondsForService", "configBlackList",
    "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads", "serverOnewaySemaphoreValue",
    "serverAsyncSemaphoreValue", "serverChannelMaxIdleTimeSeconds", "serverSocketSndBufSize",
    "serverSocketRcvBufSize", "serverPooledByteBufAllocatorEnable", "useEpollNativeSelector",
})


@dataclass(frozen=True)
class NamesrvFile:
    """What a namesrv.properties says: the nameserver's settings, and the controller's log folder when
    ``enableControllerInNamesrv=true`` (None otherwise)."""

    namesrv: NamesrvConfig
    controller_store_path: Path | None = None


def namesrv_config_from_properties(props: Mapping[str, str], base: NamesrvConfig | None = None) -> NamesrvFile:
    unknown = sorted(k for k in props if k not in NAMESRV_KEYS and k not in CONTROLLER_KEYS and k not in IGNORED_KEYS)
    if unknown:
        raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
    cfg = dataclasses.replace(base or NamesrvConfig(), **convert_keys(props, NAMESRV_KEYS))
    if cfg.scan_interval_s <= 0:
        raise ConfigError("scanNotActiveBrokerInterval must be above 0")
    controller = convert_keys(props, CONTROLLER_KEYS)
    path = controller.get("store_path")
    if not controller.get("enabled", False):
        return NamesrvFile(cfg)
    if path is None:
        raise ConfigError("enableControllerInNamesrv=true needs controllerStorePath (the controller's log folder)")
    return NamesrvFile(cfg, path)


def load_namesrv_conf(path: str | Path, base: NamesrvConfig | None = None) -> NamesrvFile:
    return namesrv_config_from_properties(read_properties(path), base)
