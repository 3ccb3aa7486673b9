"""The long-running commands (``cometmq namesrv|controller|broker|serve|proxy|dashboard``) without the command
line's libraries.

``cometmq.cli`` declares these commands' options (typer); once typer has parsed and checked them, the process
replaces itself (``os.execve``, same PID, stdout and stderr) with ``python -m cometmq.server_main COMMAND …``,
the options as JSON in ``$COMETMQ_SERVER_ARGS`` (an environment variable, not the command line: options such as
--inner-credentials may hold secrets read from the environment). So a running server does not hold typer, rich,
pydantic, click or the admin commands in memory (issue [16]). This module imports none of them: a mistake found
here (a bad broker.conf key, a TLS key that does not load) is a :class:`UsageError`, printed as typer prints a
bad parameter, exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cometmq.logsetup import LogSpec, configure

if TYPE_CHECKING:
    import asyncio

    from cometmq.broker.config import BrokerConfig
    from cometmq.broker.controller import BrokerController
    from cometmq.net.tls_settings import TlsConfig
    from cometmq.protocol.acl import Credentials

#: the environment variable carrying the command, its options and the log options from ``cometmq.cli``
ARGS_ENV = "COMETMQ_SERVER_ARGS"
#: the options that are paths (JSON carries them as strings)
_PATHS = frozenset({"config", "data", "controller_data", "tls_cert", "tls_key", "tls_config", "acl_file",
                    "users_file"})

log = logging.getLogger("cometmq")


class UsageError(Exception):
    """A bad option or configuration value, found before the servers start: exit code 2, as typer's
    BadParameter."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param_hint = param_hint

    def format_message(self) -> str:
        hint = f" for {self.param_hint}" if self.param_hint else ""
        return f"Invalid value{hint}: {self.message}"


def print_usage_error(prog: str, exc: UsageError) -> None:
    """As typer (with rich) prints a bad parameter: the usage line, the help hint, the message in a box as wide as
    the terminal (80 columns when stderr is not one)."""
    import shutil
    import textwrap

    width = max(shutil.get_terminal_size((80, 24)).columns, 20)
    lines = [line for paragraph in exc.format_message().splitlines()
             for line in textwrap.wrap(paragraph, width - 4, break_on_hyphens=False) or [""]]
    box = ["╭─ Error " + "─" * (width - 10) + "╮", *(f"│ {line:<{width - 4}} │" for line in lines),
           "╰" + "─" * (width - 2) + "╯"]
    print(f"Usage: {prog} [OPTIONS]\nTry '{prog} --help' for help.", *box, sep="\n", file=sys.stderr, flush=True)


def _stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM. Installed before anything starts, so a signal that arrives while
    the servers start (or just after the ready line) still stops them cleanly."""
    import asyncio

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _server_gc() -> None:
    """Once the servers are up: the collector's settings, start-up's freed heap pages back to the system, then
    glibc's fixed mmap and trim thresholds."""
    from cometmq.common.gc_tuning import fix_malloc_thresholds, trim_heap, tune_for_server

    try:
        tune_for_server()
    except ValueError as exc:  # the servers are up by now: say so and keep Python's collector settings
        logging.getLogger("cometmq").error("%s; the garbage collector keeps its default settings", exc)
    trim_heap()
    fix_malloc_thresholds()


def _run(main: object) -> None:
    from cometmq.net.loop import run
    from cometmq.store.epoch_file import EpochFileCorrupt

    try:
        run(main)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass
    except EpochFileCorrupt as exc:  # a damaged store file: say which, without a traceback (docs/reliability.md)
        raise SystemExit(f"cometmq: cannot start: {exc}") from None


def _broker_config(conf: Path | None, data: Path | None, host: str, port: int | None, namesrv: str | None,  # type: ignore[no-untyped-def]
                   broker_ip: str | None = None):
    from cometmq.broker.config import BrokerConfig, load_broker_conf
    from cometmq.store.config import ConfigError

    try:
        cfg = load_broker_conf(conf) if conf else BrokerConfig()
    except ConfigError as exc:
        raise UsageError(str(exc), param_hint="-c/--config") from None
    changes: dict[str, object] = {"listen_host": host}
    if port is not None:
        changes["listen_port"] = port
    if namesrv is not None:
        changes["namesrv_addr"] = namesrv
    if broker_ip is not None:
        changes["broker_ip"] = broker_ip.strip()
    # the data folder: --data, else the file's storePathRootDir, else ./data; made absolute here, once
    changes["store"] = cfg.store.replace(store_path=Path(data or cfg.store.store_path).resolve())
    return _advertised(cfg.replace(**changes))


def _serve_kv_config_path(cfg: BrokerConfig) -> Path:
    """Where ``cometmq serve``'s nameserver keeps its KV configs (RocketMQ's kvConfigPath): in the data folder
    _broker_config chose, beside the store and under its lock, so each server has its own wherever it starts."""
    return cfg.store.store_path / "namesrv" / "kvConfig.json"


def _advertised(cfg: BrokerConfig) -> BrokerConfig:
    """The address given to nameservers and clients (brokerIP1) must be one they can reach: a wildcard is refused;
    unset while binding a wildcard, it is this machine's address on its default route (RocketMQ's default too)."""
    import ipaddress

    from cometmq.net.addr import is_wildcard, local_address

    hint = "--broker-ip/brokerIP1"
    if cfg.broker_ip:
        if is_wildcard(cfg.broker_ip):
            raise UsageError(f"{cfg.broker_ip} is not an address clients can reach; give the address "
                             "they use for this machine", param_hint=hint)
        try:
            ipaddress.ip_address(cfg.broker_ip)
        except ValueError:
            raise UsageError(f"{cfg.broker_ip!r} is not an IP address (message ids carry it)",
                             param_hint=hint) from None
    elif is_wildcard(cfg.listen_host):
        addr = local_address()
        if addr is None:
            raise UsageError(f"--host {cfg.listen_host} binds every address and this machine has no "
                             "address besides loopback to advertise; give --broker-ip", param_hint=hint)
        log.warning("brokerIP1 is not set: advertising %s (this machine's address on its default route); "
                    "set --broker-ip if clients reach this broker by another address", addr)
        cfg = cfg.replace(broker_ip=addr)
    return cfg


async def _start_grpc(port: int | None, namesrv: str | None, host: str, access_keys: str | None,
                      broker: BrokerController | None = None, tls: object | None = None,
                      settings: dict[str, object] | None = None) -> object | None:
    """Start the embedded gRPC endpoint (a proxy over remoting; ``broker``, the BrokerController of this process,
    is reached in process instead of over loopback TCP). Off when the port is 0, when the ``grpc`` extra is
    missing, or (default port only) when the port is busy; an explicit port must bind."""
    explicit = port is not None
    if port == 0:
        log.info("gRPC endpoint off (--grpc-port 0)")
        return None
    try:
        from cometmq.grpc.config import DEFAULT_GRPC_PORT, ProxyConfig
        from cometmq.grpc.server import GrpcProxy
    except ImportError as exc:
        log.warning("gRPC endpoint off: the grpc extra is not installed (pip install 'cometmq[grpc]'): %s", exc)
        return None
    if not namesrv:
        log.warning("gRPC endpoint off: it needs a nameserver (namesrvAddr / --namesrv)")
        return None
    local = {}
    if broker is not None and broker.server is not None:
        from cometmq.net.local import local_connector

        local[broker.addr] = local_connector(broker.server, broker.addr)
    options = {**(settings or {}), **_auth_options(access_keys)}  # (--grpc-config's keys: limits only)
    if tls is not None:
        options["tls"] = tls
    if broker is not None:  # the broker's serverMaxConnections / serverMaxConnectionsPerIp on its gRPC port too
        options["connection_limits"] = broker.config.connection_limits
    if broker is not None and broker.config.acl_enable:  # the broker's ACL (docs/security.md) on its gRPC port too
        options.update(acl_file=str(broker.config.acl_path), inner_credentials=broker.config.inner_credentials)
    proxy = GrpcProxy(ProxyConfig(namesrv=namesrv, host=host, port=DEFAULT_GRPC_PORT if port is None else port,
                                  **options), local=local)  # type: ignore[arg-type]
    try:
        await proxy.start()
    except OSError as exc:
        if explicit:  # (checked before the start with the other ports: taken since)
            raise SystemExit(f"cometmq: cannot start: {exc} (--grpc-port)") from None
        log.warning("gRPC endpoint off: %s", exc)
        return None
    return proxy


def _grpc_settings(path: Path | None) -> dict[str, object]:
    """The gRPC endpoint's keys from ``--grpc-config`` (a RocketMQ rmq-proxy.json), checked before anything starts."""
    if path is None:
        return {}
    from cometmq.grpc.config import load_proxy_json

    try:
        return load_proxy_json(path)
    except ValueError as exc:
        raise UsageError(str(exc), param_hint="--grpc-config") from None


def _explicit_grpc_port(port: int | None, namesrv: str | None) -> list[tuple[str, int]]:
    """The gRPC port for _check_ports: one given must bind (the default one is skipped when busy)."""
    return [("--grpc-port", port)] if port and namesrv else []


def _auth_options(access_keys: str | None) -> dict[str, object]:
    if not access_keys:
        return {}
    from cometmq.grpc.auth import parse_access_keys

    try:
        return {"auth_enabled": True, "access_keys": parse_access_keys(access_keys)}
    except ValueError as exc:
        raise UsageError(str(exc), param_hint="--access-keys") from None


def _tls_config(conf: Path | None, mode: str | None, cert: Path | None, key: Path | None,  # type: ignore[no-untyped-def]
                tls_file: Path | None = None):
    """TLS settings: RocketMQ's tls.* keys of broker.conf (or of ``tls_file``, a tls.properties), then the
    --tls-* options; checked (the certificate and key load) before anything starts."""
    from cometmq.net.tls_settings import TlsConfig, TlsError, tls_config_from_properties

    try:
        if conf is not None:
            from cometmq.broker.config import load_broker_conf
            from cometmq.store.config import ConfigError

            try:
                tls = load_broker_conf(conf).tls
            except ConfigError as exc:
                raise UsageError(str(exc), param_hint="-c/--config") from None
        else:
            tls = TlsConfig()
        if tls_file is not None:
            tls = tls_config_from_properties({"tls.config.file": str(tls_file)}, tls)
        props = {k: str(v) for k, v in (("tls.server.mode", mode), ("tls.server.certPath", cert),
                                         ("tls.server.keyPath", key)) if v is not None}
        return tls_config_from_properties(props, tls).check()
    except TlsError as exc:
        raise UsageError(str(exc), param_hint="--tls-mode/--tls-cert/--tls-key (tls.server.*)") from None


@dataclasses.dataclass(frozen=True)
class _ServiceNotes:
    grpc: str  # ", gRPC host:port" or ""
    rest: str  # the metrics and dashboard notes


@contextlib.asynccontextmanager
async def _broker_services(ctl: BrokerController, namesrv: str, host: str, *, dashboard_port: int | None,
                           grpc_port: int | None, access_keys: str | None, tls: TlsConfig,
                           grpc_settings: dict[str, object]) -> AsyncIterator[_ServiceNotes]:
    """What runs beside a started broker (metrics, dashboard, gRPC endpoint, each as configured): started in
    that order, stopped (those that started) when the block ends or a later one fails to start. The broker itself
    is the caller's to stop."""
    metrics = dash = proxy = None
    try:
        metrics = await _start_metrics(ctl)
        dash = await _start_dashboard(ctl, dashboard_port, namesrv)
        proxy = await _start_grpc(grpc_port, namesrv, host, access_keys, ctl, tls, grpc_settings)
        yield _ServiceNotes(_grpc_note(proxy), _metrics_note(metrics) + _dashboard_note(dash))
    finally:
        await _stop_metrics(dash)
        await _stop_metrics(metrics)
        await _stop_grpc(proxy)


def _grpc_note(proxy: object | None) -> str:
    return f", gRPC {proxy.addr}" if proxy is not None else ""  # type: ignore[attr-defined]


async def _stop_grpc(proxy: object | None) -> None:
    if proxy is not None:
        await proxy.stop()  # type: ignore[attr-defined]


def _check_metrics(cfg: BrokerConfig) -> None:
    """metricsExporterType=PROM needs the ``metrics`` extra: say so before anything starts."""
    if cfg.metrics_exporter_type == "PROM":
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise UsageError("metricsExporterType=PROM needs the metrics extra "
                             "(pip install 'cometmq[metrics]')", param_hint="-c/--config") from None


def _check_ports(host: str, ports: list[tuple[str, int]]) -> None:
    """Each (option or key, port) can be bound on ``host`` now: a busy port stops the start here, before the data
    folder is read or written (the servers bind after the store is recovered). Port 0 is any free one."""
    import socket

    for hint, port in ports:
        if port == 0:
            continue
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
                sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", param_hint=hint) from None


def _ha_port(cfg: BrokerConfig) -> int:
    """The HA port the broker will bind (with listenPort 0, a free one unless haListenPort names one)."""
    return cfg.ha_port if cfg.listen_port else max(cfg.ha_listen_port, 0)


def _lock_data_folder(folder: Path) -> None:
    """One broker per data folder (store/dir_lock.py): another process's lock stops the start here, before
    anything is read or written there. This process keeps the lock until it ends."""
    from cometmq.store.config import ConfigError
    from cometmq.store.dir_lock import DataFolderInUse, lock_data_folder

    try:
        lock_data_folder(folder)
    except DataFolderInUse as exc:
        raise SystemExit(f"cometmq: cannot start: {exc}") from None
    except ConfigError as exc:
        raise UsageError(str(exc), param_hint="--data/storePathRootDir") from None


def _openssl_only_if_used(cfg: BrokerConfig, dashboard_port: int | None) -> None:
    """A broker whose settings use no TLS runs without OpenSSL (:mod:`cometmq.net.no_openssl`, 4.1 MiB): called
    once its settings are read and checked, before anything imports asyncio. TLS on either side keeps it, and so
    does the dashboard (aiohttp builds TLS contexts when it loads)."""
    dashboard = dashboard_port if dashboard_port is not None else cfg.dashboard_port
    if cfg.tls.enabled or cfg.tls.client_enable or dashboard:
        return
    from cometmq.net.no_openssl import keep_out

    if not keep_out():
        log.debug("ssl or asyncio was imported before the settings were read: OpenSSL stays loaded")


async def _start_metrics(ctl: BrokerController) -> object | None:
    """The Prometheus endpoint (metricsExporterType=PROM), or None; a port that cannot be bound stops the start."""
    cfg = ctl.config
    if cfg.metrics_exporter_type != "PROM":
        return None
    from cometmq.metrics import start_exporter

    host = cfg.metrics_prometheus_host or cfg.listen_host
    try:
        return await start_exporter(ctl, host, cfg.metrics_prometheus_port)
    except OSError as exc:
        raise SystemExit(f"cannot serve metrics on {host}:{cfg.metrics_prometheus_port} "
                         f"(metricsPrometheusHost/metricsPrometheusPort): {exc}") from None


def _metrics_note(exporter: object | None) -> str:
    return f", metrics http://{exporter.addr}/metrics" if exporter is not None else ""  # type: ignore[attr-defined]


async def _stop_metrics(exporter: object | None) -> None:
    if exporter is not None:
        await exporter.stop()  # type: ignore[attr-defined]


async def _start_dashboard(ctl: BrokerController, port: int | None, namesrv: str) -> object | None:
    """The broker's own dashboard (off by default: it samples the cluster every few seconds and holds its page
    code in memory); it reads the cluster through the admin client, as ``cometmq dashboard`` does."""
    port = port if port is not None else ctl.config.dashboard_port  # --dashboard-port, else broker.conf dashboardPort
    if not port:
        return None
    if not namesrv:
        log.warning("dashboard off: it needs a nameserver (namesrvAddr / --namesrv)")
        return None
    try:
        from cometmq.dashboard import start_dashboard
    except ImportError as exc:
        raise SystemExit(f"--dashboard-port needs the dashboard extra (pip install 'cometmq[dashboard]'): "
                         f"{exc}") from None
    host = ctl.config.metrics_prometheus_host or ctl.config.listen_host
    if ctl.config.acl_enable and not os.environ.get("COMETMQ_DASHBOARD_USERS_FILE") and not _loopback(host):
        raise SystemExit(f"the broker's dashboard on {host}:{port} has no login (no COMETMQ_DASHBOARD_USERS_FILE) "
                         f"and acts with the broker's own credentials: with aclEnable=true anyone who reaches it "
                         f"would pass the ACL. Give it a users file, or bind it to a loopback address "
                         f"(metricsPrometheusHost=127.0.0.1)")
    try:
        # the broker's own credentials and TLS towards the cluster (innerClientAuthenticationCredentials, tls.enable)
        return await start_dashboard(namesrv, host, port, credentials=ctl.config.inner_credentials,
                                     tls=ctl.config.tls.client_context() or False)
    except OSError as exc:
        raise SystemExit(f"cannot serve the dashboard on {host}:{port}: {exc}") from None


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _dashboard_note(server: object | None) -> str:
    return f", dashboard {server.url}" if server is not None else ""  # type: ignore[attr-defined]


def _inner_credentials(text: str | None, base: Credentials | None = None) -> Credentials | None:
    """--inner-credentials (or the environment) over the config file's; a bad value names the option, never the
    secret."""
    if text is None:
        return base
    from cometmq.acl.remoting import parse_credentials

    try:
        return parse_credentials(text)
    except ValueError as exc:
        raise UsageError(f"the value {exc}", param_hint="--inner-credentials") from None


def _check_acl_file(path: str, hint: str, *, must_exist: bool = False) -> None:
    """A plain_acl.yml that does not parse stops the command before anything starts, naming its line and key."""
    from cometmq.acl.control import AccessControl
    from cometmq.acl.model import AclConfigError

    if must_exist and not Path(path).is_file():
        raise UsageError(f"{path} does not exist", param_hint=hint)
    try:
        AccessControl(path).load()
    except AclConfigError as exc:
        raise UsageError(str(exc), param_hint=hint) from None


def _server_tls(base: TlsConfig, mode: str | None, cert: Path | None, key: Path | None) -> TlsConfig:
    """The --tls-* options over ``base`` (from a config file); checked (the files load) before anything starts."""
    from cometmq.net.tls_settings import TlsError, tls_config_from_properties

    props = {k: str(v) for k, v in (("tls.server.mode", mode), ("tls.server.certPath", cert),
                                     ("tls.server.keyPath", key)) if v is not None}
    try:
        return tls_config_from_properties(props, base).check()
    except TlsError as exc:
        raise UsageError(str(exc), param_hint="--tls-mode/--tls-cert/--tls-key (tls.server.*)") from None


def namesrv(config: Path | None, port: int | None, host: str | None, controller_data: Path | None,
            tls_mode: str | None, tls_cert: Path | None, tls_key: Path | None, inner_credentials: str | None) -> None:
    """Run a nameserver (route registry)."""
    from cometmq.controller.config import NamesrvExtras, split_namesrv_properties
    from cometmq.namesrv.config import NamesrvFile, namesrv_config_from_properties
    from cometmq.namesrv.server import EmbeddedService, NamesrvConfig, NamesrvController
    from cometmq.store.config import ConfigError

    try:
        if config:
            own, extras = split_namesrv_properties(config)  # tls.* and the embedded controller's credentials
            try:
                conf = namesrv_config_from_properties(own)
            except ConfigError as exc:
                raise ConfigError(f"{config}: {exc}") from None
        else:
            conf, extras = NamesrvFile(NamesrvConfig()), NamesrvExtras()
    except ConfigError as exc:
        raise UsageError(str(exc), param_hint="-c/--config") from None
    tls = _server_tls(extras.tls, tls_mode, tls_cert, tls_key)
    credentials = _inner_credentials(inner_credentials, extras.inner_credentials)
    ns_config = dataclasses.replace(conf.namesrv, tls=tls if tls.enabled else None)
    if host is not None:
        ns_config = dataclasses.replace(ns_config, host=host)
    if port is not None:
        ns_config = dataclasses.replace(ns_config, port=port)
    if ns_config.acl_enable:
        _check_acl_file(ns_config.acl_file, "-c/--config (aclFile)")
    host, port = ns_config.host, ns_config.port
    controller_data = controller_data or conf.controller_store_path

    async def main() -> None:
        stop = _stop_event()
        embedded: list[EmbeddedService] = []
        if controller_data is not None:
            from cometmq.controller.log import LocalLog
            from cometmq.controller.processors import ControllerConfig, ControllerProcessors

            # the nameserver's port, TLS and ACL; its credentials sign the role changes sent to brokers
            embedded.append(ControllerProcessors(
                ControllerConfig(host=host, port=port, inner_credentials=credentials, tls=tls),
                LocalLog(controller_data), address=lambda: ctl.addr))
        ctl = NamesrvController(ns_config, embedded=embedded)
        await ctl.start()
        _server_gc()
        note = f", TLS {tls.mode.value}" if tls.enabled else ""
        print(f"cometmq namesrv listening on {host}:{ctl.port}{note}", flush=True)
        try:
            await stop.wait()
        finally:
            await ctl.stop()

    _run(main())


def controller(data: Path, port: int | None, host: str | None, config: Path | None, peers: str | None,
               node: str | None, etcd_endpoints: str | None, group: str, advertise: str | None,
               heartbeat_timeout_ms: int, startup_grace_ms: int | None, scan_interval: float, tls_mode: str | None,
               tls_cert: Path | None, tls_key: Path | None, inner_credentials: str | None) -> None:
    """Run a controller node."""
    from cometmq.controller.config import ControllerFile, load_controller_conf
    from cometmq.controller.etcd_member import EtcdMember, Peer, PeersError, parse_peers
    from cometmq.controller.log import LocalLog, ReplicatedLog
    from cometmq.controller.server import ControllerConfig, ControllerServer
    from cometmq.store.config import ConfigError

    try:
        conf = load_controller_conf(config) if config else ControllerFile()
    except ConfigError as exc:
        raise UsageError(str(exc), param_hint="-c/--config") from None
    tls = _server_tls(conf.tls, tls_mode, tls_cert, tls_key)
    credentials = _inner_credentials(inner_credentials, conf.inner_credentials)
    listen_port: int = port if port is not None else conf.port if conf.port is not None else 9878
    listen_host: str = host if host is not None else conf.host or "127.0.0.1"
    acl_file = conf.acl_file or str(data / "plain_acl.yml")
    if conf.acl_enable:
        _check_acl_file(acl_file, "-c/--config (aclFile)")
    member: EtcdMember | None = None
    advertised = advertise
    node_id = node or "n0"
    nodes: list[Peer] = []
    try:
        if peers is not None and etcd_endpoints is not None:
            raise PeersError("give --peers or --etcd-endpoints, not both")
        endpoints: list[str] = []
        if peers is not None:
            nodes = parse_peers(peers)
            me = next((p for p in nodes if p.name == node), None)
            if me is None:
                raise PeersError(f"--node must name one of {', '.join(p.name for p in nodes)}")
            if me.port != listen_port:
                raise PeersError(f"--port {listen_port} differs from {me.name}'s port in --peers ({me.port})")
            member = EtcdMember(me, nodes, data, token=group)
            advertised = advertised or me.address
            endpoints = [p.client_endpoint for p in nodes]
        elif etcd_endpoints is not None:
            endpoints = [e.strip() for e in etcd_endpoints.split(",") if e.strip()]
            if not endpoints:
                raise PeersError("--etcd-endpoints names no endpoint")
    except PeersError as exc:
        raise UsageError(str(exc)) from None

    async def main() -> None:
        import asyncio

        stop = _stop_event()
        config = ControllerConfig(host=listen_host, port=listen_port, group=group, node_id=node_id,
                                  peers=tuple(f"{p.name}={p.address}" for p in nodes), advertised_addr=advertised,
                                  heartbeat_timeout_ms=heartbeat_timeout_ms, startup_grace_ms=startup_grace_ms,
                                  scan_interval_s=scan_interval, inner_credentials=credentials,
                                  tls=tls if tls.enabled or tls.client_enable else None,
                                  acl_enable=conf.acl_enable, acl_file=acl_file,
                                  elect_unclean_master=bool(conf.elect_unclean_master))
        ctl: ControllerServer | None = None
        if endpoints:
            try:
                from cometmq.controller.etcd_log import EtcdLog
            except ImportError as exc:
                raise SystemExit(f"the etcd extra is not installed (pip install 'cometmq[etcd]'): {exc}") from None
            log_: ReplicatedLog = EtcdLog(endpoints, group,
                                          lambda: ctl.addr if ctl else advertised or f"{listen_host}:{listen_port}")
        else:
            log_ = LocalLog(data)
        ctl = ControllerServer(config, log_)
        await ctl.start()
        where = f", log on etcd {','.join(endpoints)}" if endpoints else f", log in {data}"
        where += f", TLS {tls.mode.value}" if tls.enabled else ""
        where += f", ACL {acl_file}" if conf.acl_enable else ""
        print(f"cometmq controller listening on {ctl.addr} (node {node_id}{where})", flush=True)
        watch = asyncio.ensure_future(member.watch()) if member is not None else None
        try:
            await stop.wait()
        finally:
            if watch is not None:
                watch.cancel()
            await ctl.stop()

    if member is not None:
        member.start()
    try:
        _run(main())
    finally:
        if member is not None:
            member.stop()


def broker(config: Path | None, data: Path | None, port: int | None, host: str, namesrv: str | None,
           broker_ip: str | None, grpc_port: int | None, access_keys: str | None, grpc_config: Path | None,
           tls_mode: str | None, tls_cert: Path | None, tls_key: Path | None, dashboard_port: int | None) -> None:
    """Run a broker that registers with the given nameservers."""
    grpc_settings = _grpc_settings(grpc_config)
    cfg = _broker_config(config, data, host, port, namesrv, broker_ip)
    cfg = cfg.replace(tls=_tls_config(config, tls_mode, tls_cert, tls_key))
    _check_metrics(cfg)
    _check_ports(host, [("--port/listenPort", cfg.listen_port), ("haListenPort", _ha_port(cfg)),
                        *_explicit_grpc_port(grpc_port, cfg.namesrv_addr)])
    _lock_data_folder(cfg.store.store_path)
    _openssl_only_if_used(cfg, dashboard_port)
    from cometmq.broker.controller import BrokerController

    async def main() -> None:
        stop = _stop_event()
        ctl = BrokerController(cfg)
        await ctl.start()
        try:
            async with _broker_services(ctl, cfg.namesrv_addr, host, dashboard_port=dashboard_port,
                                        grpc_port=grpc_port, access_keys=access_keys, tls=cfg.tls,
                                        grpc_settings=grpc_settings) as notes:
                _server_gc()
                print(f"cometmq broker {cfg.broker_name} listening on {ctl.addr}{notes.grpc}, "
                      f"data in {cfg.store.store_path}{notes.rest}", flush=True)
                await stop.wait()
        finally:
            await ctl.stop()

    _run(main())


def serve(data: Path | None, namesrv_port: int, broker_port: int, host: str, config: Path | None,
          broker_ip: str | None, grpc_port: int | None, access_keys: str | None, grpc_config: Path | None,
          tls_mode: str | None, tls_cert: Path | None, tls_key: Path | None, dashboard_port: int | None) -> None:
    """Run a nameserver and a broker in one process."""
    grpc_settings = _grpc_settings(grpc_config)
    tls_cfg = _tls_config(config, tls_mode, tls_cert, tls_key)
    # enforcing: the broker and the gRPC endpoint reach this nameserver with TLS too
    tls = tls_cfg.replace(client_enable=True) if tls_cfg.mode.value == "enforcing" else tls_cfg
    # the broker's settings, checked before anything starts (its nameserver address is set once that one listens)
    base = _broker_config(config, data, host, broker_port, None, broker_ip).replace(tls=tls)
    _check_metrics(base)
    _check_ports(host, [("--namesrv-port", namesrv_port), ("--broker-port", base.listen_port),
                        ("haListenPort", _ha_port(base)), *_explicit_grpc_port(grpc_port, "this process")])
    _lock_data_folder(base.store.store_path)  # before the nameserver, which keeps its KV file there too
    _openssl_only_if_used(base, dashboard_port)
    from cometmq.broker.controller import BrokerController
    from cometmq.namesrv.server import NamesrvConfig, NamesrvController

    async def main() -> None:
        stop = _stop_event()
        ns = NamesrvController(NamesrvConfig(host=host, port=namesrv_port, tls=tls,
                                             kv_config_path=_serve_kv_config_path(base)))  # outlive a restart
        await ns.start()
        cfg = base.replace(namesrv_addr=f"{host}:{ns.port}")
        try:
            ctl = BrokerController(cfg)
            await ctl.start()  # (stops what it started when it fails)
        except BaseException:
            await ns.stop()
            raise
        try:
            async with _broker_services(ctl, f"{host}:{ns.port}", host, dashboard_port=dashboard_port,
                                        grpc_port=grpc_port, access_keys=access_keys, tls=tls,
                                        grpc_settings=grpc_settings) as notes:
                _server_gc()
                print(f"cometmq serving: namesrv {host}:{ns.port}, broker {ctl.addr}{notes.grpc}, "
                      f"data in {cfg.store.store_path}{notes.rest}", flush=True)
                await stop.wait()
        finally:
            await ctl.stop()
            await ns.stop()

    _run(main())


def proxy(namesrv: str, grpc_port: int, host: str, access_keys: str | None, grpc_config: Path | None,
          tls_mode: str | None, tls_cert: Path | None, tls_key: Path | None, tls_config: Path | None,
          acl_file: Path | None, inner_credentials: str | None) -> None:
    """Serve the RocketMQ 5 gRPC protocol over the brokers found through the nameservers."""
    try:
        from cometmq.grpc.config import ProxyConfig
        from cometmq.grpc.server import GrpcProxy
    except ImportError as exc:
        raise UsageError(f"the grpc extra is not installed (pip install 'cometmq[grpc]'): {exc}") from None
    auth = _auth_options(access_keys)
    if acl_file is not None:
        if access_keys:
            raise UsageError("give --acl-file or --access-keys, not both (an ACL file has its own accounts)",
                             param_hint="--acl-file")
        _check_acl_file(str(acl_file), "--acl-file", must_exist=True)
        auth = {"acl_file": str(acl_file)}
    credentials = _inner_credentials(inner_credentials)
    options = {**_grpc_settings(grpc_config), **auth}
    cfg = ProxyConfig(namesrv=namesrv, host=host, port=grpc_port, **options,  # type: ignore[arg-type]
                      tls=_tls_config(None, tls_mode, tls_cert, tls_key, tls_config),
                      inner_credentials=(credentials.access_key, credentials.secret_key) if credentials else None)

    async def main() -> None:
        stop = _stop_event()
        gp = GrpcProxy(cfg)
        await gp.start()
        _server_gc()
        note = f", ACL {acl_file}" if acl_file is not None else ""
        print(f"cometmq proxy listening on {gp.addr} (gRPC), nameservers {namesrv}{note}", flush=True)
        try:
            await stop.wait()
        finally:
            await gp.stop()

    _run(main())


def dashboard(namesrv: str, port: int, host: str, read_only: bool, interval: float, users_file: Path | None,
              session_secret: str | None, session_hours: float, allowed_host: list[str] | None,
              access_key: str | None, secret_key: str | None, tls: bool, tls_ca: str | None,
              tls_insecure: bool) -> None:
    """Serve the web dashboard for the cluster of these nameservers."""
    try:
        from cometmq.dashboard import DashboardServer
        from cometmq.dashboard.auth import UsersFileError
    except ImportError as exc:
        raise UsageError(f"the dashboard extra is not installed (pip install 'cometmq[dashboard]'): {exc}") from None
    if bool(access_key) != bool(secret_key):
        raise UsageError("give both --access-key and --secret-key", param_hint="--access-key")

    async def main() -> None:
        stop = _stop_event()
        try:
            server = DashboardServer(namesrv, host, port, read_only=read_only or None, interval=interval,
                                     access_key=access_key, secret_key=secret_key, tls=tls,
                                     tls_ca_file=tls_ca, tls_insecure=tls_insecure, users_file=users_file,
                                     session_secret=session_secret, session_hours=session_hours,
                                     allowed_hosts=allowed_host or None)
        except UsersFileError as exc:
            raise SystemExit(f"cometmq dashboard: {exc}") from None
        await server.start()
        print(f"cometmq dashboard on {server.url} (nameservers {namesrv})", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()

    _run(main())


COMMANDS: dict[str, Callable[..., None]] = {"namesrv": namesrv, "controller": controller, "broker": broker,
                                            "serve": serve, "proxy": proxy, "dashboard": dashboard}


def run(request: dict[str, Any]) -> None:
    """Run ``request``: {"command", "prog" (for messages), "args" (the command's options), "log" (LogSpec's
    fields)}. A UsageError is printed as typer prints a bad parameter, and exits with code 2."""
    command, prog, spec_fields = request["command"], request["prog"], request["log"]
    args = {k: Path(v) if k in _PATHS and v is not None else v for k, v in request["args"].items()}
    spec = LogSpec(**{**spec_fields, "file": Path(spec_fields["file"]) if spec_fields["file"] else None})
    try:
        try:
            configure(spec)
        except (ValueError, OSError) as exc:  # the log file cannot be opened
            raise UsageError(f"{spec.file}: {exc}", param_hint="--log-file") from None
        COMMANDS[command](**args)
    except UsageError as exc:
        print_usage_error(prog, exc)
        raise SystemExit(2) from None


def main() -> None:
    """``python -m cometmq.server_main``: the command ``cometmq.cli`` parsed, from $COMETMQ_SERVER_ARGS."""
    text = os.environ.pop(ARGS_ENV, None)  # not for the processes this one starts (an etcd member)
    if text is None:
        raise SystemExit("cometmq.server_main runs what `cometmq namesrv|controller|broker|serve|proxy|dashboard` "
                         "asks for: start those")
    run(json.loads(text))


if __name__ == "__main__":
    main()
