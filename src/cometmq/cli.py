"""The ``cometmq`` command: namesrv, controller, broker, serve (namesrv and broker in one process), and cluster
(a local broker group)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cometmq import __version__
from cometmq.logsetup import LogSpec, log_options

if TYPE_CHECKING:
    from cometmq.broker.config import BrokerConfig
    from cometmq.broker.controller import BrokerController
    from cometmq.net.tls import TlsConfig
    from cometmq.protocol.acl import Credentials

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cometmq: a RocketMQ-compatible message broker written in Python.")

log = logging.getLogger("cometmq")


def _stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM. Installed before anything starts, so a signal that arrives while
    the servers start (or just after the ready line) still stops them cleanly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _server_gc() -> None:
    from cometmq.common.gc_tuning import tune_for_server

    try:
        tune_for_server()
    except ValueError as exc:  # the servers are up by now: say so and keep Python's collector settings
        logging.getLogger("cometmq").error("%s; the garbage collector keeps its default settings", exc)


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
        raise typer.BadParameter(str(exc), param_hint="-c/--config") from None
    changes: dict[str, object] = {"listen_host": host}
    if port is not None:
        changes["listen_port"] = port
    if namesrv is not None:
        changes["namesrv_addr"] = namesrv
    if broker_ip is not None:
        changes["broker_ip"] = broker_ip.strip()
    if data is not None or conf is None:
        changes["store"] = cfg.store.replace(store_path=(data or Path("data")).resolve())
    return _advertised(cfg.replace(**changes))


def _advertised(cfg: BrokerConfig) -> BrokerConfig:
    """The address given to nameservers and clients (brokerIP1) must be one they can reach: a wildcard is refused;
    unset while binding a wildcard, it is this machine's address on its default route (RocketMQ's default too)."""
    import ipaddress

    from cometmq.net.addr import is_wildcard, local_address

    hint = "--broker-ip/brokerIP1"
    if cfg.broker_ip:
        if is_wildcard(cfg.broker_ip):
            raise typer.BadParameter(f"{cfg.broker_ip} is not an address clients can reach; give the address "
                                     "they use for this machine", param_hint=hint)
        try:
            ipaddress.ip_address(cfg.broker_ip)
        except ValueError:
            raise typer.BadParameter(f"{cfg.broker_ip!r} is not an IP address (message ids carry it)",
                                     param_hint=hint) from None
    elif is_wildcard(cfg.listen_host):
        addr = local_address()
        if addr is None:
            raise typer.BadParameter(f"--host {cfg.listen_host} binds every address and this machine has no "
                                     "address besides loopback to advertise; give --broker-ip", param_hint=hint)
        log.warning("brokerIP1 is not set: advertising %s (this machine's address on its default route); "
                    "set --broker-ip if clients reach this broker by another address", addr)
        cfg = cfg.replace(broker_ip=addr)
    return cfg


_GRPC_PORT_HELP = "gRPC (RocketMQ 5) endpoint port; 0 = off [default: 8081, skipped with a warning if busy]"
_ACCESS_KEYS_HELP = "turn gRPC authentication on with these 'accessKey:secretKey,...' pairs"
_BROKER_IP_HELP = ("address given to nameservers and clients (brokerIP1) [default: --host; with --host 0.0.0.0, "
                   "this machine's address on its default route]")


async def _start_grpc(port: int | None, namesrv: str | None, host: str, access_keys: str | None,
                      broker: BrokerController | None = None, tls: object | None = None) -> object | None:
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
    options = _auth_options(access_keys)
    if tls is not None:
        options["tls"] = tls
    if broker is not None and broker.config.acl_enable:  # the broker's ACL (docs/security.md) on its gRPC port too
        options.update(acl_file=str(broker.config.acl_path), inner_credentials=broker.config.inner_credentials)
    proxy = GrpcProxy(ProxyConfig(namesrv=namesrv, host=host, port=DEFAULT_GRPC_PORT if port is None else port,
                                  **options), local=local)  # type: ignore[arg-type]
    try:
        await proxy.start()
    except OSError as exc:
        if explicit:
            raise
        log.warning("gRPC endpoint off: %s", exc)
        return None
    return proxy


def _auth_options(access_keys: str | None) -> dict[str, object]:
    if not access_keys:
        return {}
    from cometmq.grpc.auth import parse_access_keys

    try:
        return {"auth_enabled": True, "access_keys": parse_access_keys(access_keys)}
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--access-keys") from None


TlsModeOption = Annotated[str | None, typer.Option(
    "--tls-mode", envvar="COMETMQ_TLS_MODE", show_default=False,
    help="TLS of the remoting and gRPC ports: disabled, permissive (TLS and plaintext on one port) or enforcing "
         "(tls.server.mode) [default: disabled]")]
TlsCertOption = Annotated[Path | None, typer.Option(
    "--tls-cert", envvar="COMETMQ_TLS_CERT", show_default=False,
    help="PEM certificate chain (tls.server.certPath); reloaded when it changes")]
TlsKeyOption = Annotated[Path | None, typer.Option(
    "--tls-key", envvar="COMETMQ_TLS_KEY", show_default=False, help="PEM private key (tls.server.keyPath)")]


def _tls_config(conf: Path | None, mode: str | None, cert: Path | None, key: Path | None,  # type: ignore[no-untyped-def]
                tls_file: Path | None = None):
    """TLS settings: RocketMQ's tls.* keys of broker.conf (or of ``tls_file``, a tls.properties), then the
    --tls-* options; checked (the certificate and key load) before anything starts."""
    from cometmq.net.tls import TlsConfig, TlsError, tls_config_from_properties

    try:
        if conf is not None:
            from cometmq.broker.config import load_broker_conf
            from cometmq.store.config import ConfigError

            try:
                tls = load_broker_conf(conf).tls
            except ConfigError as exc:
                raise typer.BadParameter(str(exc), param_hint="-c/--config") from None
        else:
            tls = TlsConfig()
        if tls_file is not None:
            tls = tls_config_from_properties({"tls.config.file": str(tls_file)}, tls)
        props = {k: str(v) for k, v in (("tls.server.mode", mode), ("tls.server.certPath", cert),
                                         ("tls.server.keyPath", key)) if v is not None}
        return tls_config_from_properties(props, tls).check()
    except TlsError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-mode/--tls-cert/--tls-key (tls.server.*)") from None


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
            raise typer.BadParameter("metricsExporterType=PROM needs the metrics extra "
                                     "(pip install 'cometmq[metrics]')", param_hint="-c/--config") from None


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


_DASHBOARD_PORT_HELP = "serve the web dashboard (docs/dashboard.md) on this port of the metrics host; 0 = off"


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
    try:
        # the broker's own credentials and TLS towards the cluster (innerClientAuthenticationCredentials, tls.enable)
        return await start_dashboard(namesrv, host, port, credentials=ctl.config.inner_credentials,
                                     tls=ctl.config.tls.client_context() or False)
    except OSError as exc:
        raise SystemExit(f"cannot serve the dashboard on {host}:{port}: {exc}") from None


def _dashboard_note(server: object | None) -> str:
    return f", dashboard {server.url}" if server is not None else ""  # type: ignore[attr-defined]


InnerCredentialsOption = Annotated[str | None, typer.Option(
    "--inner-credentials", envvar="COMETMQ_INNER_CREDENTIALS", show_default=False,
    help="accessKey:secretKey (or RocketMQ's JSON form) this process signs its own requests with: an admin account "
         "of the brokers' ACL (innerClientAuthenticationCredentials); prefer the environment variable")]


def _inner_credentials(text: str | None, base: Credentials | None = None) -> Credentials | None:
    """--inner-credentials (or the environment) over the config file's; a bad value names the option, never the
    secret."""
    if text is None:
        return base
    from cometmq.acl.remoting import parse_credentials

    try:
        return parse_credentials(text)
    except ValueError as exc:
        raise typer.BadParameter(f"the value {exc}", param_hint="--inner-credentials") from None


def _check_acl_file(path: str, hint: str, *, must_exist: bool = False) -> None:
    """A plain_acl.yml that does not parse stops the command before anything starts, naming its line and key."""
    from cometmq.acl.control import AccessControl
    from cometmq.acl.model import AclConfigError

    if must_exist and not Path(path).is_file():
        raise typer.BadParameter(f"{path} does not exist", param_hint=hint)
    try:
        AccessControl(path).load()
    except AclConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def _server_tls(base: TlsConfig, mode: str | None, cert: Path | None, key: Path | None) -> TlsConfig:
    """The --tls-* options over ``base`` (from a config file); checked (the files load) before anything starts."""
    from cometmq.net.tls import TlsError, tls_config_from_properties

    props = {k: str(v) for k, v in (("tls.server.mode", mode), ("tls.server.certPath", cert),
                                     ("tls.server.keyPath", key)) if v is not None}
    try:
        return tls_config_from_properties(props, base).check()
    except TlsError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-mode/--tls-cert/--tls-key (tls.server.*)") from None


@app.command()
@log_options
def namesrv(
    config: Annotated[Path | None, typer.Option(
        "-c", "--config", help="a RocketMQ-style namesrv.properties (listenPort, bindAddress, aclEnable, tls.*, …)")
    ] = None,
    port: Annotated[int | None, typer.Option(help="port to listen on (listenPort) [default: 9876]",
                                             show_default=False)] = None,
    host: Annotated[str | None, typer.Option(help="address to bind (bindAddress) [default: 127.0.0.1]",
                                             show_default=False)] = None,
    controller_data: Annotated[Path | None, typer.Option(
        help="run the controller in this nameserver, its log in DIR (RocketMQ's enableControllerInNamesrv)")] = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    inner_credentials: InnerCredentialsOption = None,
) -> None:
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
        raise typer.BadParameter(str(exc), param_hint="-c/--config") from None
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


@app.command()
@log_options
def controller(
    data: Annotated[Path, typer.Option(help="folder of the controller's log (controller.log; with --peers, its "
                                            "etcd member's data and log)")],
    port: Annotated[int | None, typer.Option(help="port to listen on (listenPort) [default: 9878]",
                                             show_default=False)] = None,
    host: Annotated[str | None, typer.Option(help="address to bind (bindAddress) [default: 127.0.0.1]",
                                             show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "-c", "--config", show_default=False,
        help="a controller.properties: aclEnable, aclFile (default DATA/plain_acl.yml), "
             "innerClientAuthenticationCredentials, tls.*, enableElectUncleanMaster, listenPort, bindAddress")] = None,
    peers: Annotated[str | None, typer.Option(
        help="the controller nodes, NAME=HOST:PORT,… (3 or 5): each runs an etcd member beside it (peers on "
             "PORT+1, clients on PORT+2) and their decisions are entries of that etcd cluster's log",
        show_default=False)] = None,
    node: Annotated[str | None, typer.Option(help="this node's NAME in --peers", show_default=False)] = None,
    etcd_endpoints: Annotated[str | None, typer.Option(
        help="instead of --peers: an etcd cluster run apart, HOST:PORT,…", show_default=False)] = None,
    group: Annotated[str, typer.Option(help="the controller group's name (its etcd keys)")] = "cometmq-controller",
    advertise: Annotated[str | None, typer.Option(
        help="HOST:PORT brokers and other nodes reach this node at (default: its --peers entry, else HOST:PORT)",
        show_default=False)] = None,
    heartbeat_timeout_ms: Annotated[int, typer.Option(
        min=100, help="a broker that states no timeout is dead after this long without a heartbeat")] = 10_000,
    startup_grace_ms: Annotated[int | None, typer.Option(
        min=0, help="after a start, how long a recorded master is presumed alive before its first heartbeat "
                    "(default: the heartbeat timeout)", show_default=False)] = None,
    scan_interval: Annotated[float, typer.Option(min=0.05, help="seconds between scans for lost masters")] = 1.0,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    inner_credentials: InnerCredentialsOption = None,
) -> None:
    """Run a controller node: elects each broker group's master. Alone, its decisions go to a durable local log;
    with --peers (or --etcd-endpoints), to a log on etcd shared by 3 or 5 nodes (docs/controller.md)."""
    from cometmq.controller.config import ControllerFile, load_controller_conf
    from cometmq.controller.etcd_member import EtcdMember, Peer, PeersError, parse_peers
    from cometmq.controller.log import LocalLog, ReplicatedLog
    from cometmq.controller.server import ControllerConfig, ControllerServer
    from cometmq.store.config import ConfigError

    try:
        conf = load_controller_conf(config) if config else ControllerFile()
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="-c/--config") from None
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
        raise typer.BadParameter(str(exc)) from None

    async def main() -> None:
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


@app.command()
@log_options
def broker(
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    data: Annotated[Path | None, typer.Option(help="data folder (storePathRootDir)")] = None,
    port: Annotated[int | None, typer.Option(help="remoting port (listenPort)")] = None,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    namesrv: Annotated[str | None, typer.Option(help="nameservers, 'host:port;host:port'")] = None,
    broker_ip: Annotated[str | None, typer.Option(help=_BROKER_IP_HELP, show_default=False,
                                                  envvar="COMETMQ_BROKER_IP")] = None,
    grpc_port: Annotated[int | None, typer.Option(help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    dashboard_port: Annotated[int | None, typer.Option(min=0, max=65535, help=_DASHBOARD_PORT_HELP, show_default=False,
                                                       envvar="COMETMQ_DASHBOARD_PORT")] = None,
) -> None:
    """Run a broker that registers with the given nameservers."""
    from cometmq.broker.controller import BrokerController

    cfg = _broker_config(config, data, host, port, namesrv, broker_ip)
    cfg = cfg.replace(tls=_tls_config(config, tls_mode, tls_cert, tls_key))
    _check_metrics(cfg)

    async def main() -> None:
        stop = _stop_event()
        ctl = BrokerController(cfg)
        await ctl.start()
        metrics = dash = None
        try:
            metrics = await _start_metrics(ctl)
            dash = await _start_dashboard(ctl, dashboard_port, cfg.namesrv_addr)
            proxy = await _start_grpc(grpc_port, cfg.namesrv_addr, host, access_keys, ctl, cfg.tls)
        except BaseException:
            await _stop_metrics(dash)
            await _stop_metrics(metrics)
            await ctl.stop()
            raise
        _server_gc()
        print(f"cometmq broker {cfg.broker_name} listening on {ctl.addr}{_grpc_note(proxy)}, "
              f"data in {cfg.store.store_path}{_metrics_note(metrics)}{_dashboard_note(dash)}", flush=True)
        try:
            await stop.wait()
        finally:
            await _stop_metrics(dash)
            await _stop_metrics(metrics)
            await _stop_grpc(proxy)
            await ctl.stop()

    _run(main())


@app.command()
@log_options
def serve(
    data: Annotated[Path | None, typer.Option(help="data folder")] = None,
    namesrv_port: Annotated[int, typer.Option(help="nameserver port")] = 9876,
    broker_port: Annotated[int, typer.Option(help="broker remoting port")] = 10911,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    broker_ip: Annotated[str | None, typer.Option(help=_BROKER_IP_HELP, show_default=False,
                                                  envvar="COMETMQ_BROKER_IP")] = None,
    grpc_port: Annotated[int | None, typer.Option(help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    dashboard_port: Annotated[int | None, typer.Option(min=0, max=65535, help=_DASHBOARD_PORT_HELP, show_default=False,
                                                       envvar="COMETMQ_DASHBOARD_PORT")] = None,
) -> None:
    """Run a nameserver and a broker in one process (development, tests, single machine). TLS settings apply to
    the nameserver's, the broker's and the gRPC ports alike."""
    from cometmq.broker.controller import BrokerController
    from cometmq.namesrv.server import NamesrvConfig, NamesrvController

    tls_cfg = _tls_config(config, tls_mode, tls_cert, tls_key)

    async def main() -> None:
        stop = _stop_event()
        # enforcing: the broker and the gRPC endpoint reach this nameserver with TLS too
        tls = tls_cfg.replace(client_enable=True) if tls_cfg.mode.value == "enforcing" else tls_cfg
        kv_path = (data or Path("data")).resolve() / "namesrv" / "kvConfig.json"  # KV configs outlive a restart
        ns = NamesrvController(NamesrvConfig(host=host, port=namesrv_port, tls=tls, kv_config_path=kv_path))
        await ns.start()
        try:
            cfg = _broker_config(config, data, host, broker_port, f"{host}:{ns.port}", broker_ip).replace(tls=tls)
            _check_metrics(cfg)
        except BaseException:
            await ns.stop()
            raise
        ctl = BrokerController(cfg)
        await ctl.start()
        metrics = dash = None
        try:
            metrics = await _start_metrics(ctl)
            dash = await _start_dashboard(ctl, dashboard_port, f"{host}:{ns.port}")
            proxy = await _start_grpc(grpc_port, f"{host}:{ns.port}", host, access_keys, ctl, tls)
        except BaseException:
            await _stop_metrics(dash)
            await _stop_metrics(metrics)
            await ctl.stop()
            await ns.stop()
            raise
        _server_gc()
        print(f"cometmq serving: namesrv {host}:{ns.port}, broker {ctl.addr}{_grpc_note(proxy)}, "
              f"data in {cfg.store.store_path}{_metrics_note(metrics)}{_dashboard_note(dash)}", flush=True)
        try:
            await stop.wait()
        finally:
            await _stop_metrics(dash)
            await _stop_metrics(metrics)
            await _stop_grpc(proxy)
            await ctl.stop()
            await ns.stop()

    _run(main())


@app.command()
@log_options
def proxy(
    namesrv: Annotated[str, typer.Option(help="nameservers, 'host:port;host:port'")] = "127.0.0.1:9876",
    grpc_port: Annotated[int, typer.Option(min=1, max=65535, help="gRPC port to listen on")] = 8081,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP)] = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_config: Annotated[Path | None, typer.Option(
        "--tls-config", envvar="COMETMQ_TLS_CONFIG", show_default=False,
        help="a RocketMQ tls.properties (tls.server.*, and tls.enable / tls.client.* for the remoting connections "
             "to nameservers and brokers); the --tls-* options win")] = None,
    acl_file: Annotated[Path | None, typer.Option(
        "--acl-file", envvar="COMETMQ_ACL_FILE", show_default=False,
        help="check every gRPC call against this plain_acl.yml (the brokers' aclEnable=true + aclFile; reloaded "
             "when it changes): credentials and topic/group permissions, as the brokers' remoting port")] = None,
    inner_credentials: InnerCredentialsOption = None,
) -> None:
    """Serve the RocketMQ 5 gRPC protocol, talking remoting to the brokers found through the nameservers."""
    try:
        from cometmq.grpc.config import ProxyConfig
        from cometmq.grpc.server import GrpcProxy
    except ImportError as exc:
        raise typer.BadParameter(f"the grpc extra is not installed (pip install 'cometmq[grpc]'): {exc}") from None
    auth = _auth_options(access_keys)
    if acl_file is not None:
        if access_keys:
            raise typer.BadParameter("give --acl-file or --access-keys, not both (an ACL file has its own accounts)",
                                     param_hint="--acl-file")
        _check_acl_file(str(acl_file), "--acl-file", must_exist=True)
        auth = {"acl_file": str(acl_file)}
    credentials = _inner_credentials(inner_credentials)
    cfg = ProxyConfig(namesrv=namesrv, host=host, port=grpc_port, **auth,  # type: ignore[arg-type]
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


@app.command()
@log_options
def dashboard(
    namesrv: Annotated[str, typer.Option(help="nameservers of the cluster, 'host:port;host:port'")] = "127.0.0.1:9876",
    port: Annotated[int, typer.Option(min=0, max=65535, help="HTTP port to listen on (0: a free one)")] = 8080,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    read_only: Annotated[bool, typer.Option("--read-only", help="pages only: no create, delete, send, reset or "
                                                                "re-send")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="seconds between samples for the live charts")] = 5.0,
    users_file: Annotated[Path | None, typer.Option(
        "--users-file", envvar="COMETMQ_DASHBOARD_USERS_FILE", show_default=False,
        help="login required: rocketmq-dashboard's users.properties, name=password[,1] per line (,1: an admin, "
             "who may act; others read); passwords clear, sha256:HEX or scrypt:… (python -m "
             "cometmq.dashboard.passwd). Without it the dashboard is open to anyone who reaches the port")] = None,
    session_secret: Annotated[str | None, typer.Option(
        "--session-secret", envvar="COMETMQ_DASHBOARD_SESSION_SECRET", show_default=False,
        help="key the session cookies are signed with (sessions then outlive a restart); default: a random one "
             "made at start")] = None,
    session_hours: Annotated[float, typer.Option(min=0.01, help="how long a login lasts")] = 8.0,
    access_key: Annotated[str | None, typer.Option(help="ACL access key of the dashboard's admin client",
                                                   envvar="COMETMQ_ACCESS_KEY", show_default=False)] = None,
    secret_key: Annotated[str | None, typer.Option(help="ACL secret key", envvar="COMETMQ_SECRET_KEY",
                                                   show_default=False)] = None,
    tls: Annotated[bool, typer.Option("--tls", envvar="COMETMQ_TLS", show_envvar=False,
                                      help="reach the cluster with TLS (also $COMETMQ_TLS=true)")] = False,
    tls_ca: Annotated[str | None, typer.Option("--tls-ca", envvar="COMETMQ_TLS_CA", show_envvar=False,
                                               help="CA file the servers' certificates are verified against "
                                                    "(default: the system's CAs)")] = None,
    tls_insecure: Annotated[bool, typer.Option("--tls-insecure", envvar="COMETMQ_TLS_INSECURE", show_envvar=False,
                                               help="accept any server certificate (self-signed, tests)")] = False,
) -> None:
    """Serve the web dashboard (docs/dashboard.md) for the cluster of these nameservers."""
    try:
        from cometmq.dashboard import DashboardServer
        from cometmq.dashboard.auth import UsersFileError
    except ImportError as exc:
        raise typer.BadParameter(f"the dashboard extra is not installed (pip install 'cometmq[dashboard]'): "
                                 f"{exc}") from None
    if bool(access_key) != bool(secret_key):
        raise typer.BadParameter("give both --access-key and --secret-key", param_hint="--access-key")

    async def main() -> None:
        stop = _stop_event()
        try:
            server = DashboardServer(namesrv, host, port, read_only=read_only or None, interval=interval,
                                     access_key=access_key, secret_key=secret_key, tls=tls,
                                     tls_ca_file=tls_ca, tls_insecure=tls_insecure, users_file=users_file,
                                     session_secret=session_secret, session_hours=session_hours)
        except UsersFileError as exc:
            raise SystemExit(f"cometmq dashboard: {exc}") from None
        await server.start()
        print(f"cometmq dashboard on {server.url} (nameservers {namesrv})", flush=True)
        try:
            await stop.wait()
        finally:
            await server.stop()

    _run(main())


@app.command()
@log_options
def cluster(
    data: Annotated[Path, typer.Option(help="folder of the cluster: DIR/broker-0, DIR/broker-1, … (data, "
                                            "broker.conf, broker.log), DIR/controller-0, …, DIR/namesrv.log")],
    replicas: Annotated[int, typer.Option(min=0, max=9, help="replicas besides the master")] = 2,
    controllers: Annotated[int, typer.Option(help="0: a fixed master, failover by `cometmq admin promote`; 1: a "
                                                  "controller in the nameserver; 3 or 5: controller processes on "
                                                  "an etcd cluster (etcd-server installed); the controller elects "
                                                  "the master and elects again when it is lost")] = 0,
    base_port: Annotated[int, typer.Option(min=1, max=65400, help="broker i listens on BASE+10*i, its HA port "
                                                                  "on BASE+10*i+1")] = 10911,
    namesrv_port: Annotated[int, typer.Option(help="nameserver port")] = 9876,
    controller_port: Annotated[int, typer.Option(min=1, max=65400, help="controller i listens on PORT+10*i, its "
                                                                        "etcd member on PORT+10*i+1 (peers) "
                                                                        "and +2 (clients)")] = 9878,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    start_timeout: Annotated[float, typer.Option(min=1, help="seconds each process may take to be ready")] = 60.0,
    stop_timeout: Annotated[float, typer.Option(min=0.1, help="seconds to stop before SIGKILL")] = 15.0,
    log_spec: LogSpec | None = None,
) -> None:
    """Run a nameserver and one broker group (a master and REPLICAS replicas), with CONTROLLERS controllers,
    each in its own process, until Ctrl-C or SIGTERM; see docs/replication.md and docs/controller.md. The
    processes log at --log-level in --log-format to DIR/…/*.log; --log-file is this supervisor's own log."""
    import os

    from cometmq.local_cluster import ClusterError, LocalCluster

    spec = log_spec or LogSpec()
    os.environ["COMETMQ_LOG_FORMAT"] = spec.format  # the children's (local_cluster passes only the level)

    try:
        group = LocalCluster(data, replicas, base_port=base_port, namesrv_port=namesrv_port, host=host,
                             controllers=controllers, controller_port=controller_port, log_level=spec.level_text,
                             start_timeout=start_timeout, stop_timeout=stop_timeout,
                             out=lambda line: print(line, flush=True))
        group.run()
    except ClusterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


from cometmq.cli_admin import admin_app  # noqa: E402 - the sub-app lives in its own module

app.add_typer(admin_app, name="admin")

from cometmq.cli_bench import bench_app  # noqa: E402 - the sub-app lives in its own module

app.add_typer(bench_app, name="bench")


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
