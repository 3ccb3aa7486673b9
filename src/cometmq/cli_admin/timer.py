"""``cometmq admin timer-status``: timer messages of each broker (GET_TIMER_METRICS)."""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cometmq.cli_admin._common import admin_app, broker_option, check_addr

#: (label, key in GET_TIMER_METRICS) in the order they are shown
_TIMER_ROWS = (
    ("scheduled (pending)", "scheduled"),
    ("due but undelivered", "dueUndelivered"),
    ("enqueued", "enqueued"),
    ("delivered", "delivered"),
    ("rolled", "rolled"),
    ("cancelled (recalled)", "cancelled"),
    ("duplicates avoided", "duplicatesAvoided"),
    ("lost", "lost"),
    ("illegal", "illegal"),
    ("put failures", "putFailures"),
    ("enqueue offset", "enqueueOffset"),
    ("enqueue lag", "enqueueLag"),
    ("read slot", "readSlot"),
    ("prefetched", "prefetched"),
    ("precision (ms)", "precisionMs"),
    ("wheel slots", "wheelSlots"),
    ("roll window (slots)", "rollWindowSlots"),
    ("timer log position", "timerLogPosition"),
    ("timer log segments", "timerLogSegments"),
    ("recovered after a crash", "recoveredAbnormally"),
)


async def _timer_metrics(namesrv: str | None, broker: str | None, cluster: str | None, timeout: float
                         ) -> dict[str, dict[str, Any]]:
    from cometmq.client.admin import Admin

    if namesrv is None:
        if broker is None or ":" not in broker:
            raise typer.BadParameter("give --namesrv, or --broker host:port", param_hint="--namesrv/--broker")
        # No nameserver: the admin client only talks to the broker address (its namesrv list stays unused).
        async with Admin(namesrv=broker, timeout=timeout) as admin:
            return await admin.timer_metrics(addr=broker)
    async with Admin(namesrv=namesrv, timeout=timeout) as admin:
        return await admin.timer_metrics(cluster=cluster, broker=broker)


def _ms_time(ms: object) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).isoformat(timespec="milliseconds")


def _lateness_ms(value: object) -> str:
    if value is None:
        return "-"
    return "> 300000" if value == -1 else f"<= {value}"


def _timer_tables(metrics: dict[str, dict[str, Any]]) -> list[Table]:
    names = list(metrics)
    summary = Table(title="timer status", title_justify="left")
    summary.add_column("metric")
    for name in names:
        summary.add_column(name, justify="right")
    on = {n: m for n, m in metrics.items() if m.get("enabled", True) is not False}
    if len(on) < len(metrics):
        summary.add_row("timer messages", *("on" if n in on else "off (timerWheelEnable=false)" for n in names))

    def row(label: str, get: Any) -> None:
        summary.add_row(label, *(str(get(metrics[n])) if n in on else "-" for n in names))

    for label, key in _TIMER_ROWS:
        row(label, lambda m, k=key: m.get(k, "-"))
    row("read time (UTC)", lambda m: _ms_time(m.get("readTimeMs")))
    # how far the wheel's read position trails the clock while something due waits (idle, it trails harmlessly)
    row("delivery behind by (ms)", lambda m: max(0, int(m.get("nowMs", 0)) - int(m.get("readTimeMs", 0)))
        if m.get("dueUndelivered") else 0)
    row("lateness: delivered", lambda m: m["lateness"]["count"])
    row("lateness: p50 (ms)", lambda m: _lateness_ms(m["lateness"]["p50Ms"]))
    row("lateness: p99 (ms)", lambda m: _lateness_ms(m["lateness"]["p99Ms"]))
    row("lateness: max (ms)", lambda m: m["lateness"]["maxMs"])
    row("lateness: mean (ms)",
        lambda m: round(m["lateness"]["sumMs"] / m["lateness"]["count"], 1) if m["lateness"]["count"] else "-")
    tables = [summary]
    if on:
        hist = Table(title="delivery lateness histogram (messages per bucket)", title_justify="left")
        hist.add_column("lateness (ms)")
        for name in on:
            hist.add_column(name, justify="right")
        first = next(iter(on.values()))["lateness"]
        bounds = list(first["bucketsMs"])
        labels = [f"<= {b}" for b in bounds] + [f"> {bounds[-1]}"]
        for i, label in enumerate(labels):
            counts = [m["lateness"]["counts"][i] for m in on.values()]
            if any(counts):
                hist.add_row(label, *(str(c) for c in counts))
        tables.append(hist)
    return tables


def _namesrv(value: str | None) -> str | None:
    if value is not None:
        for part in value.replace(",", ";").split(";"):
            if part.strip() or not value.strip():
                check_addr(part, "--namesrv")
    return value


@admin_app.command("timer-status")
def timer_status(
    namesrv: Annotated[str | None, typer.Option(help="nameserver host:port (every master, or the one --broker "
                                                     "names)", callback=_namesrv)] = None,
    broker: Annotated[str | None, typer.Option(help="a broker name, or host:port (asked directly without "
                                                    "--namesrv)", callback=broker_option)] = None,
    cluster: Annotated[str | None, typer.Option(help="the cluster (when the nameserver knows several)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the brokers' metrics as JSON")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="request timeout (seconds)")] = 5.0,
) -> None:
    """Timer messages: scheduled and due-but-undelivered counts, lateness percentiles and histogram,
    enqueue and read positions (GET_TIMER_METRICS) of each broker."""
    from cometmq.client.errors import MQClientError

    try:
        metrics = asyncio.run(_timer_metrics(namesrv, broker, cluster, timeout))
    except MQClientError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(metrics, indent=2, sort_keys=True))
        return
    console = Console(width=max(100, Console().width))
    for table in _timer_tables(metrics):
        console.print(table)
