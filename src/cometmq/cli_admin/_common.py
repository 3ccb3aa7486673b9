"""What every ``cometmq admin`` verb shares: the typer app, the mqadmin options (``-n/--namesrvAddr`` with
``$NAMESRV_ADDR``), running an SDK call with errors turned into ``error: …`` and an exit code, and output
(rich tables for people, ``--json`` for scripts)."""

from __future__ import annotations

import asyncio
import codecs
import datetime as _dt
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from cometmq.client.admin import Admin
    from cometmq.client.message import MessageExt

admin_app = typer.Typer(no_args_is_help=True, help="Operator commands against running brokers (RocketMQ's mqadmin "
                                                   "verbs and option letters; -n or $NAMESRV_ADDR names the "
                                                   "nameserver).")

T = TypeVar("T")


@admin_app.callback()
def _global_options(
    tls: Annotated[bool, typer.Option("--tls", envvar="COMETMQ_TLS", show_envvar=False,
                                      help="connect with TLS (also $COMETMQ_TLS=true)")] = False,
    tls_ca: Annotated[str | None, typer.Option("--tls-ca", envvar="COMETMQ_TLS_CA", show_envvar=False,
                                               help="CA file the servers' certificates are verified against "
                                                    "(default: the system's CAs)")] = None,
    tls_insecure: Annotated[bool, typer.Option("--tls-insecure", envvar="COMETMQ_TLS_INSECURE", show_envvar=False,
                                               help="accept any server certificate (self-signed, tests)")] = False,
    access_key: Annotated[str | None, typer.Option("--access-key", envvar="COMETMQ_ACCESS_KEY", show_envvar=False,
                                                   help="sign requests with this ACL account "
                                                        "(also $COMETMQ_ACCESS_KEY; docs/security.md)")] = None,
    secret_key: Annotated[str | None, typer.Option("--secret-key", envvar="COMETMQ_SECRET_KEY", show_envvar=False,
                                                   help="the account's secret key (also $COMETMQ_SECRET_KEY)")] = None,
) -> None:
    """Options before the verb apply to every connection it opens (the SDK reads them from the environment)."""
    import os

    if tls:
        os.environ["COMETMQ_TLS"] = "true"
        if tls_ca:
            os.environ["COMETMQ_TLS_CA"] = tls_ca
        if tls_insecure:
            os.environ["COMETMQ_TLS_INSECURE"] = "true"
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise typer.BadParameter("give both --access-key and --secret-key", param_hint="--access-key")
        os.environ["COMETMQ_ACCESS_KEY"], os.environ["COMETMQ_SECRET_KEY"] = access_key, secret_key

DEFAULT_NAMESRV = "127.0.0.1:9876"

#: the largest value of a Java long and int: offsets, timestamps and ids past them do not fit the wire's fields
I64_MAX = 2**63 - 1
I32_MAX = 2**31 - 1


def _option_name(param: typer.CallbackParam) -> str:
    return "/".join(param.opts) or str(param.name)


def check_addr(value: str, option: str) -> str:
    """``host:port`` (``[v6]:port``) with a port 1..65535, else a usage error naming ``option``."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"{value!r} is not host:port (a port 1-65535)", param_hint=option)
    return value.strip()


def addr_option(param: typer.CallbackParam, value: str | None) -> str | None:
    """Option callback: an address, ``host:port``."""
    return None if value is None else check_addr(value, _option_name(param))


def broker_option(param: typer.CallbackParam, value: str | None) -> str | None:
    """Option callback: a broker's name or address; a value with a ``:`` is an address, checked as one."""
    if value is not None and ":" in value:
        return check_addr(value, _option_name(param))
    return value


def _namesrv_option(param: typer.CallbackParam, value: str) -> str:
    """``-n``: one or more ``host:port`` separated by ``;`` (empty: the default)."""
    for part in value.replace(",", ";").split(";"):
        if part.strip():
            check_addr(part, "-n/--namesrvAddr")
    return value


Namesrv = Annotated[str, typer.Option("-n", "--namesrvAddr", envvar="NAMESRV_ADDR", callback=_namesrv_option,
                                      help="nameserver host:port[;host:port] (default: $NAMESRV_ADDR, else "
                                           f"{DEFAULT_NAMESRV})", show_default=False, show_envvar=False)]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of tables")]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="request timeout (seconds)")]

#: mqadmin's boolean option values
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr; return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def run(namesrv: str, timeout: float, call: Callable[[Admin], Awaitable[T]]) -> T:
    """``call(admin)`` with an admin client on ``namesrv``. A bad argument the SDK rejects is a usage error
    (exit 2); any other SDK error (a broker's error answer, no route, no connection, a timeout) exits 1; both
    print one ``error: …`` line on stderr."""
    import os

    from cometmq.client.admin import Admin
    from cometmq.client.errors import BrokerError, InvalidArgumentError, MQClientError
    from cometmq.protocol.codes import ResponseCode

    keys = os.environ.get("COMETMQ_ACCESS_KEY"), os.environ.get("COMETMQ_SECRET_KEY")
    credentials = (keys[0], keys[1]) if keys[0] and keys[1] else None

    async def main() -> T:
        async with Admin(namesrv=namesrv or DEFAULT_NAMESRV, timeout=timeout, credentials=credentials) as admin:
            return await call(admin)

    try:
        return asyncio.run(main())
    except InvalidArgumentError as exc:
        raise fail(str(exc), 2) from None
    except BrokerError as exc:
        hint = " (the server does not serve this request)" if exc.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED \
            else " (refused by the server's ACL: --access-key/--secret-key)" if exc.code == ResponseCode.NO_PERMISSION \
            else ""
        raise fail(f"{exc}{hint}") from None
    except MQClientError as exc:
        raise fail(str(exc)) from None


def parse_bool(value: str | None, option: str) -> bool | None:
    """mqadmin's ``true|false`` option values (None when the option is absent)."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise typer.BadParameter(f"{value!r} is not true or false", param_hint=option)


def parse_attributes(value: str, option: str) -> dict[str, str]:
    """RocketMQ's attribute change syntax (AttributeParser): ``+key=value`` adds or updates, ``-key`` deletes,
    comma separated; as the request carries it: ``{"+key": "value", "-key": ""}``."""
    out: dict[str, str] = {}
    for item in value.split(","):
        item = item.strip()
        key, sep, val = item.partition("=")
        key = key.strip()
        if sep and (not key.startswith("+") or len(key) < 2 or not val.strip()):
            raise typer.BadParameter(f"{item!r}: an attribute to add is +key=value", param_hint=option)
        if not sep and (not key.startswith("-") or len(key) < 2):
            raise typer.BadParameter(f"{item!r}: +key=value adds an attribute, -key deletes one", param_hint=option)
        if any(c in key[1:] for c in "+-"):
            raise typer.BadParameter(f"{item!r}: a key holds no + or -", param_hint=option)
        if key[1:] in {k[1:] for k in out}:
            raise typer.BadParameter(f"attribute {key[1:]!r} is given twice", param_hint=option)
        out[key] = val.strip()
    return out


def parse_time(value: str | None, option: str) -> int | None:
    """A timestamp as mqadmin takes it: ``now``, epoch milliseconds, ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time);
    ISO 8601 is accepted too. Epoch ms, or None when absent."""
    if value is None:
        return None
    v = value.strip()
    if v == "now":
        return int(_dt.datetime.now().timestamp() * 1000)
    if v.lstrip("-").isascii() and v.lstrip("-").isdigit():
        n = int(v)
        if n < 0:
            raise typer.BadParameter(f"{value!r} is negative", param_hint=option)
        if n > I64_MAX:
            raise typer.BadParameter(f"{value!r} is past the largest timestamp, {I64_MAX}", param_hint=option)
        return n
    when: _dt.datetime | None = None
    for fmt in ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S"):
        try:
            when = _dt.datetime.strptime(v, fmt)
            break
        except ValueError:
            pass
    if when is None:
        try:
            when = _dt.datetime.fromisoformat(v)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not now, epoch milliseconds or yyyy-MM-dd#HH:mm:ss:SSS",
                                     param_hint=option) from None
    try:
        ms = int(when.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):  # a time the platform cannot place (year 1, …)
        ms = -1
    if ms < 0:
        raise typer.BadParameter(f"{value!r} is before 1970-01-01 (epoch milliseconds are not negative)",
                                 param_hint=option)
    return ms


def parse_span(begin: str | None, end: str | None, begin_option: str, end_option: str
               ) -> tuple[int | None, int | None]:
    """A time range (:func:`parse_time` each); the begin not after the end."""
    b, e = parse_time(begin, begin_option), parse_time(end, end_option)
    if b is not None and e is not None and b > e:
        raise typer.BadParameter(f"{begin!r} is after {end_option} {end!r}", param_hint=begin_option)
    return b, e


def check_charset(charset: str, option: str) -> str:
    """A charset Python can decode with (a usage error before anything is asked)."""
    try:
        codecs.lookup(charset)
    except LookupError:
        raise typer.BadParameter(f"unknown charset {charset!r}", param_hint=option) from None
    return charset


def check_name(kind: str, value: str, option: str) -> str:
    """A topic or group name as RocketMQ takes it (the SDK's check), else a usage error naming ``option``."""
    from cometmq.client.admin import check_group, check_topic
    from cometmq.client.errors import InvalidArgumentError

    try:
        return check_topic(value) if kind == "topic" else check_group(value)
    except InvalidArgumentError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def console() -> Console:
    return Console(width=max(100, Console().width))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*("-" if v is None else str(v) for v in row))
    return t


def show(*tables: Table) -> None:
    out = console()
    for t in tables:
        out.print(t)


def ms_time(ms: object) -> str:
    """Epoch ms as local ISO time (mqadmin prints local time); ``-`` for none."""
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    try:
        return _dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")
    except (OverflowError, OSError, ValueError):  # past the year 9999: the number as it is
        return str(ms)


def message_json(m: MessageExt, charset: str = "utf-8", *, body: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": m.topic, "msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "brokerName": m.queue.broker_name,
        "queueId": m.queue.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commit_log_offset,
        "tags": m.tags, "keys": m.keys, "bornTimestamp": m.born_timestamp, "storeTimestamp": m.store_timestamp,
        "bornHost": m.born_host, "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times,
        "sysFlag": m.sys_flag, "properties": dict(m.properties), "bodyLength": len(m.body),
    }
    if body:
        out["body"] = decode_body(m.body, charset)
    return out


def decode_body(body: bytes, charset: str = "utf-8") -> str:
    try:
        return bytes(body).decode(charset, "replace")
    except LookupError:
        raise typer.BadParameter(f"unknown charset {charset!r}", param_hint="-c") from None


def message_table(m: MessageExt, charset: str = "utf-8") -> Table:
    """One message as mqadmin's queryMsgById prints it (a key/value block)."""
    rows = [("OffsetID", m.offset_msg_id), ("Topic", m.topic), ("Tags", m.tags or "-"),
            ("Keys", " ".join(m.keys) or "-"), ("Broker Name", m.queue.broker_name), ("Queue ID", m.queue.queue_id),
            ("Queue Offset", m.queue_offset), ("CommitLog Offset", m.commit_log_offset),
            ("Reconsume Times", m.reconsume_times), ("Born Timestamp", ms_time(m.born_timestamp)),
            ("Store Timestamp", ms_time(m.store_timestamp)), ("Born Host", m.born_host),
            ("Store Host", m.store_host), ("System Flag", m.sys_flag),
            ("Properties", ", ".join(f"{k}={v}" for k, v in sorted(m.properties.items())) or "-"),
            ("Message Body", decode_body(m.body, charset))]
    return table(f"message {m.msg_id}", ("", "value"), rows)
