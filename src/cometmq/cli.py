"""The ``cometmq`` command: namesrv, controller, broker, serve (namesrv and broker in one process), proxy,
dashboard, cluster (a local broker group), admin and bench.

The long-running commands are declared here (options, help, checks) and run by ``cometmq.server_main``: once
typer has parsed their options, the process replaces itself with ``python -m cometmq.server_main`` (same PID,
stdout and stderr), which holds neither typer, rich, pydantic nor the admin commands (issue [16])."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from cometmq import __version__
from cometmq.logsetup import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, FORMATS, LogSpec, configure, parse_levels

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cometmq: a RocketMQ-compatible message broker written in Python.")

# -- the logging options (cometmq.logsetup applies them) --------------------------------------------------------------
def _check_levels(value: str) -> str:
    try:
        parse_levels(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _check_format(value: str) -> str:
    if value.strip().lower() not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(FORMATS)}")
    return value.strip().lower()


_OPTIONS: dict[str, tuple[Any, Any]] = {
    "log_level": (Annotated[str, typer.Option(
        help="logging level, then per-logger levels: 'INFO,cometmq.broker.ha=DEBUG'", callback=_check_levels,
        envvar="COMETMQ_LOG_LEVEL", rich_help_panel="Logging")], "INFO"),
    "log_format": (Annotated[str, typer.Option(
        help="text, or json (one object per line: time, level, logger, message, exc)", callback=_check_format,
        envvar="COMETMQ_LOG_FORMAT", rich_help_panel="Logging")], "text"),
    "log_file": (Annotated[Path | None, typer.Option(
        help="write the log to this file (rotated) instead of stderr", show_default=False,
        rich_help_panel="Logging")], None),
    "log_max_bytes": (Annotated[int, typer.Option(
        min=1, help="rotate --log-file when it reaches this size", rich_help_panel="Logging")], DEFAULT_MAX_BYTES),
    "log_backups": (Annotated[int, typer.Option(
        min=0, help="rotated files of --log-file to keep (FILE.1 … FILE.N)", rich_help_panel="Logging")],
        DEFAULT_BACKUPS),
}

F = TypeVar("F", bound=Callable[..., Any])


def log_options(fn: F) -> F:
    """Add the logging options to a typer command and configure logging before it runs. A command that wants
    what was asked (``cometmq cluster`` hands the level to its children) declares a ``log_spec`` parameter."""
    sig = inspect.signature(fn, eval_str=True)
    wants_spec = "log_spec" in sig.parameters
    params = [p for p in sig.parameters.values() if p.name != "log_spec"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
               for name, (annotation, default) in _OPTIONS.items()]

    @functools.wraps(fn)
    def command(*args: Any, log_level: str, log_format: str, log_file: Path | None, log_max_bytes: int,
                log_backups: int, **kwargs: Any) -> Any:
        level, overrides = parse_levels(log_level)
        spec = LogSpec(level, overrides, log_format, log_file, log_max_bytes, log_backups, log_level)
        try:
            configure(spec)
        except (ValueError, OSError) as exc:  # the file cannot be opened
            raise typer.BadParameter(f"{log_file}: {exc.__cause__ or exc}", param_hint="--log-file") from None
        if wants_spec:
            kwargs["log_spec"] = spec
        return fn(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {**{p.name: p.annotation for p in params}, "return": sig.return_annotation}
    return command  # type: ignore[return-value]


#: False: the long-running commands run in this process, for launchers that patch it first (bench/trace_latency.py
#: wraps the broker's classes; the chaos harness's srcbind.py binds outgoing connections): set it, or set
#: COMETMQ_SERVER_EXEC=0 in the environment
EXEC_SERVERS = os.environ.get("COMETMQ_SERVER_EXEC", "1") != "0"


def server_command(fn: F) -> F:
    """A long-running command: typer parses and checks the options of ``fn``'s signature and the logging options,
    then the process becomes ``python -m cometmq.server_main`` running the command of ``fn``'s name (``fn``'s
    body is not run) with them; see :func:`_exec_server`."""
    sig = inspect.signature(fn, eval_str=True)
    params = [*sig.parameters.values()]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
               for name, (annotation, default) in _OPTIONS.items()]
    params.append(inspect.Parameter("typer_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

    @functools.wraps(fn)
    def command(*, typer_context: typer.Context, log_level: str, log_format: str, log_file: Path | None,
                log_max_bytes: int, log_backups: int, **kwargs: Any) -> None:
        level, overrides = parse_levels(log_level)
        spec = {"level": level, "overrides": overrides, "format": log_format, "file": log_file,
                "max_bytes": log_max_bytes, "backups": log_backups, "level_text": log_level}
        _exec_server(fn.__name__, typer_context.command_path, kwargs, spec)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {**{p.name: p.annotation for p in params}, "return": sig.return_annotation}
    return command  # type: ignore[return-value]


#: glibc's malloc in a server process, unless the environment sets it (other C libraries ignore it): one arena. The
#: threads allocate under the GIL, so per-thread arenas only held pages (0.3 MiB of an idle broker). Its mmap and
#: trim thresholds are fixed once the server is up (cometmq.common.gc_tuning.fix_malloc_thresholds).
SERVER_MALLOC = {"MALLOC_ARENA_MAX": "1"}


def _exec_server(command: str, prog: str, args: dict[str, Any], log_spec: dict[str, Any]) -> None:
    """Replace this process with ``python -m cometmq.server_main COMMAND …``: the same PID (operators and tests
    signal it), stdout and stderr, and this interpreter's -X/-W/-O/… flags. The options travel as JSON in
    $COMETMQ_SERVER_ARGS, not on the command line (they may hold secrets given by environment variables); the
    command line shows the words this one was given. glibc's malloc settings, unless the environment sets them
    (:data:`SERVER_MALLOC`)."""
    payload = {"command": command, "prog": prog, "args": args, "log": log_spec}
    if not EXEC_SERVERS:
        from cometmq.server_main import run

        run(payload)
        return
    env = {**SERVER_MALLOC, **os.environ, "COMETMQ_SERVER_ARGS": json.dumps(payload, default=str)}
    words = sys.argv[1:] if sys.argv[1:2] == [command] else [command]
    argv = [sys.executable, *_interpreter_flags(), "-m", "cometmq.server_main", *words]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def _interpreter_flags() -> list[str]:
    """The options this interpreter was started with that the server process should have too."""
    flags = [f"-X{name}" if value is True else f"-X{name}={value}" for name, value in sys._xoptions.items()]
    flags += [f"-W{option}" for option in sys.warnoptions]
    flags += ["-" + "O" * sys.flags.optimize] if sys.flags.optimize else []
    isolated = bool(sys.flags.isolated)
    for letter, on in (("I", isolated), ("E", sys.flags.ignore_environment and not isolated),
                       ("s", sys.flags.no_user_site and not isolated), ("P", sys.flags.safe_path and not isolated),
                       ("B", sys.flags.dont_write_bytecode)):
        if on:
            flags.append(f"-{letter}")
    return flags


def _check_port(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 65535:
        raise typer.BadParameter(f"{value} is not a port (0..65535; 0: any free one)")
    return value


_GRPC_PORT_HELP = "gRPC (RocketMQ 5) endpoint port; 0 = off [default: 8081, skipped with a warning if busy]"
_ACCESS_KEYS_HELP = "turn gRPC authentication on with these 'accessKey:secretKey,...' pairs"
_BROKER_IP_HELP = ("address given to nameservers and clients (brokerIP1) [default: --host; with --host 0.0.0.0, "
                   "this machine's address on its default route]")


TlsModeOption = Annotated[str | None, typer.Option(
    "--tls-mode", envvar="COMETMQ_TLS_MODE", show_default=False,
    help="TLS of the remoting and gRPC ports: disabled, permissive (TLS and plaintext on one port) or enforcing "
         "(tls.server.mode) [default: disabled]")]
TlsCertOption = Annotated[Path | None, typer.Option(
    "--tls-cert", envvar="COMETMQ_TLS_CERT", show_default=False,
    help="PEM certificate chain (tls.server.certPath); reloaded when it changes")]
TlsKeyOption = Annotated[Path | None, typer.Option(
    "--tls-key", envvar="COMETMQ_TLS_KEY", show_default=False, help="PEM private key (tls.server.keyPath)")]


_DASHBOARD_PORT_HELP = "serve the web dashboard (docs/dashboard.md) on this port of the metrics host; 0 = off"


GrpcConfigOption = Annotated[Path | None, typer.Option(
    "--grpc-config", envvar="COMETMQ_GRPC_CONFIG", show_default=False,
    help="a RocketMQ 5 proxy's rmq-proxy.json: the gRPC endpoint's limits on what clients send (userPropertyMaxNum, "
         "maxUserPropertySize, maxMessageGroupSize, maxDelayTimeMills, minInvisibleTimeMillsForRecv, ...; "
         "docs/configuration.md)")]
InnerCredentialsOption = Annotated[str | None, typer.Option(
    "--inner-credentials", envvar="COMETMQ_INNER_CREDENTIALS", show_default=False,
    help="accessKey:secretKey (or RocketMQ's JSON form) this process signs its own requests with: an admin account "
         "of the brokers' ACL (innerClientAuthenticationCredentials); prefer the environment variable")]


@app.command()
@server_command
def namesrv(
    config: Annotated[Path | None, typer.Option(
        "-c", "--config", help="a RocketMQ-style namesrv.properties (listenPort, bindAddress, aclEnable, tls.*, …)")
    ] = None,
    port: Annotated[int | None, typer.Option(callback=_check_port,
                                             help="port to listen on (listenPort) [default: 9876]",
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


@app.command()
@server_command
def controller(
    data: Annotated[Path, typer.Option(help="folder of the controller's log (controller.log; with --peers, its "
                                            "etcd member's data and log)")],
    port: Annotated[int | None, typer.Option(callback=_check_port,
                                             help="port to listen on (listenPort) [default: 9878]",
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


@app.command()
@server_command
def broker(
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    data: Annotated[Path | None, typer.Option(help="data folder (storePathRootDir)")] = None,
    port: Annotated[int | None, typer.Option(callback=_check_port, help="remoting port (listenPort)")] = None,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    namesrv: Annotated[str | None, typer.Option(help="nameservers, 'host:port;host:port'")] = None,
    broker_ip: Annotated[str | None, typer.Option(help=_BROKER_IP_HELP, show_default=False,
                                                  envvar="COMETMQ_BROKER_IP")] = None,
    grpc_port: Annotated[int | None, typer.Option(callback=_check_port, help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
    grpc_config: GrpcConfigOption = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    dashboard_port: Annotated[int | None, typer.Option(callback=_check_port,
                                                       help=_DASHBOARD_PORT_HELP, show_default=False,
                                                       envvar="COMETMQ_DASHBOARD_PORT")] = None,
) -> None:
    """Run a broker that registers with the given nameservers."""


@app.command()
@server_command
def serve(
    data: Annotated[Path | None, typer.Option(help="data folder")] = None,
    namesrv_port: Annotated[int, typer.Option(callback=_check_port, help="nameserver port")] = 9876,
    broker_port: Annotated[int, typer.Option(callback=_check_port, help="broker remoting port")] = 10911,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    config: Annotated[Path | None, typer.Option("-c", "--config", help="a RocketMQ-style broker.conf")] = None,
    broker_ip: Annotated[str | None, typer.Option(help=_BROKER_IP_HELP, show_default=False,
                                                  envvar="COMETMQ_BROKER_IP")] = None,
    grpc_port: Annotated[int | None, typer.Option(callback=_check_port, help=_GRPC_PORT_HELP, show_default=False,
                                                  envvar="COMETMQ_GRPC_PORT")] = None,
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP, envvar="COMETMQ_ACCESS_KEYS")] = None,
    grpc_config: GrpcConfigOption = None,
    tls_mode: TlsModeOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    dashboard_port: Annotated[int | None, typer.Option(callback=_check_port,
                                                       help=_DASHBOARD_PORT_HELP, show_default=False,
                                                       envvar="COMETMQ_DASHBOARD_PORT")] = None,
) -> None:
    """Run a nameserver and a broker in one process (development, tests, single machine). TLS settings apply to
    the nameserver's, the broker's and the gRPC ports alike."""


@app.command()
@server_command
def proxy(
    namesrv: Annotated[str, typer.Option(help="nameservers, 'host:port;host:port'")] = "127.0.0.1:9876",
    grpc_port: Annotated[int, typer.Option(min=1, max=65535, help="gRPC port to listen on")] = 8081,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    access_keys: Annotated[str | None, typer.Option(help=_ACCESS_KEYS_HELP)] = None,
    grpc_config: GrpcConfigOption = None,
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


@app.command()
@server_command
def dashboard(
    namesrv: Annotated[str, typer.Option(help="nameservers of the cluster, 'host:port;host:port'")] = "127.0.0.1:9876",
    port: Annotated[int, typer.Option(callback=_check_port, help="HTTP port to listen on (0: a free one)")] = 8080,
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
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", show_default=False,
        help="without a login: a host name the dashboard is reached by (repeatable; also "
             "$COMETMQ_DASHBOARD_ALLOWED_HOSTS, comma-separated). IP addresses, localhost and --host always are; "
             "other names are refused (DNS rebinding)")] = None,
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
