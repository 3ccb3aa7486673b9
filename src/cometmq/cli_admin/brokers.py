"""Cluster and broker verbs: clusterList, brokerStatus, getBrokerConfig, updateBrokerConfig, statsAll,
wipeWritePerm, addWritePerm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cometmq.cli_admin._common import (
    AsJson,
    Namesrv,
    Timeout,
    admin_app,
    broker_option,
    fail,
    print_json,
    run,
    show,
    table,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from cometmq.client.admin import Admin

_BROKER_ADDR = Annotated[str | None, typer.Option("-b", "--brokerAddr", help="this broker (address or name)",
                                                  show_default=False, callback=broker_option)]
_CLUSTER = Annotated[str | None, typer.Option("-c", "--clusterName", help="every master of this cluster "
                                                                         "(default: the only one)",
                                              show_default=False)]


def _one_of(broker: str | None, cluster: str | None) -> None:
    if broker is not None and cluster is not None:
        raise typer.BadParameter("give -b or -c, not both", param_hint="-b/-c")


@admin_app.command("clusterList")
def cluster_list(
    namesrv: Namesrv = "",
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="this cluster only",
                                                show_default=False)] = None,
    more: Annotated[bool, typer.Option("-m", "--moreStats", help="with each broker's in/out TPS and the messages "
                                                                "stored (in) and consumed (out) yesterday and "
                                                                "today")] = False,
    interval: Annotated[float | None, typer.Option("-i", "--interval", min=0.1, metavar="SECONDS",
                                                   help="print again every SECONDS, until Ctrl-C (exit 0) or "
                                                        "--times; with --json one line per round",
                                                   show_default=False)] = None,
    times: Annotated[int | None, typer.Option("--times", min=1, help="with -i: print this many times, then exit",
                                              show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """The clusters, their broker groups and each broker's address, version and figures
    (GET_BROKER_CLUSTER_INFO, GET_BROKER_RUNTIME_INFO)."""
    import asyncio

    from cometmq.client.errors import MQClientError, NoRouteError

    if times is not None and interval is None:
        raise typer.BadParameter("--times needs -i", param_hint="--times")

    async def rows_of(admin: Admin) -> list[dict[str, Any]]:
        info = await admin.cluster_info()
        if cluster is not None and cluster not in info.cluster_addr_table:
            raise NoRouteError(f"cluster {cluster} is unknown (known: {sorted(info.cluster_addr_table)})")
        rows = []
        for name_of_cluster, names in sorted(info.cluster_addr_table.items()):
            if cluster is not None and name_of_cluster != cluster:
                continue
            for name in sorted(names):
                bd = info.broker_addr_table.get(name)
                for bid, addr in sorted(bd.broker_addrs.items()) if bd else ():
                    try:
                        runtime: dict[str, str] | None = await admin.broker_runtime_info(addr)
                    except MQClientError:
                        runtime = None
                    row: dict[str, Any] = {"cluster": name_of_cluster, "brokerName": name, "brokerId": bid,
                                           "addr": addr, "runtime": runtime}
                    if more:
                        row["stats"] = _more_stats(runtime)
                    rows.append(row)
        return rows

    async def call(admin: Admin) -> None:
        rounds = 0
        while True:
            _print_clusters(await rows_of(admin), as_json, more, one_line=interval is not None)
            rounds += 1
            if interval is None or (times is not None and rounds >= times):
                return
            await asyncio.sleep(interval)

    try:
        run(namesrv, timeout, call)
    except KeyboardInterrupt:  # -i runs until Ctrl-C: a clean end
        raise typer.Exit(0) from None


def _number(text: str | None, *, first: bool = False) -> float | None:
    """A runtime-info value as a number (``first``: the first of RocketMQ's "10s 1min 10min" TPS triples)."""
    if not text:
        return None
    try:
        return float(text.split()[0] if first else text)
    except (ValueError, IndexError):
        return None


def _more_stats(runtime: dict[str, str] | None) -> dict[str, float | int | None]:
    """clusterList -m's figures, as mqadmin reads them from GET_BROKER_RUNTIME_INFO: in/out TPS (putTps,
    getTransferredTps), and messages in/out yesterday and today from the morning and now totals."""
    rt = runtime or {}
    n = {k: _number(rt.get(k)) for k in ("msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning",
                                           "msgPutTotalTodayNow", "msgGetTotalYesterdayMorning",
                                           "msgGetTotalTodayMorning", "msgGetTotalTodayNow")}

    def diff(later: str, earlier: str) -> int | None:
        a, b = n[later], n[earlier]
        return None if a is None or b is None else int(a - b)

    return {"inTps": _number(rt.get("putTps"), first=True),
            "outTps": _number(rt.get("getTransferredTps") or rt.get("getTransferedTps"), first=True),
            "inTotalYest": diff("msgPutTotalTodayMorning", "msgPutTotalYesterdayMorning"),
            "outTotalYest": diff("msgGetTotalTodayMorning", "msgGetTotalYesterdayMorning"),
            "inTotalToday": diff("msgPutTotalTodayNow", "msgPutTotalTodayMorning"),
            "outTotalToday": diff("msgGetTotalTodayNow", "msgGetTotalTodayMorning")}


def _print_clusters(rows: list[dict[str, Any]], as_json: bool, more: bool, *, one_line: bool) -> None:
    import json

    if as_json:
        if one_line:
            typer.echo(json.dumps(rows, sort_keys=True, default=str))
        else:
            print_json(rows)
        return

    def get(r: dict[str, Any], key: str) -> str:
        return "-" if r["runtime"] is None else r["runtime"].get(key, "-")

    columns = ["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#Topics", "#CommitLog Max Offset",
               "#Online Groups"]
    if more:
        columns += ["#InTPS", "#OutTPS", "#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"]

    def cells(r: dict[str, Any]) -> list[object]:
        out: list[object] = [r["cluster"], r["brokerName"], r["brokerId"], r["addr"],
                             get(r, "brokerVersionDesc") if r["runtime"] is not None else "(no answer)",
                             get(r, "topicCount"), get(r, "commitLogMaxOffset"), get(r, "consumerGroupsOnline")]
        if more:
            st = r["stats"]
            out += [None if st["inTps"] is None else f"{st['inTps']:.2f}",
                    None if st["outTps"] is None else f"{st['outTps']:.2f}",
                    st["inTotalYest"], st["outTotalYest"], st["inTotalToday"], st["outTotalToday"]]
        return out

    show(table("clusters", columns, (cells(r) for r in rows)))


@admin_app.command("brokerStatus")
def broker_status(
    namesrv: Namesrv = "",
    broker: _BROKER_ADDR = None,
    cluster: _CLUSTER = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """A broker's runtime figures (GET_BROKER_RUNTIME_INFO), or those of every master of a cluster."""
    _per_broker_kv(namesrv, broker, cluster, as_json, timeout, "status", lambda admin, addr:
                   admin.broker_runtime_info(addr))


@admin_app.command("getBrokerConfig")
def get_broker_config(
    namesrv: Namesrv = "",
    broker: _BROKER_ADDR = None,
    cluster: _CLUSTER = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """A broker's config as it runs (GET_BROKER_CONFIG), or that of every master of a cluster."""
    _per_broker_kv(namesrv, broker, cluster, as_json, timeout, "config", lambda admin, addr:
                   admin.broker_config(addr))


def _per_broker_kv(namesrv: str, broker: str | None, cluster: str | None, as_json: bool, timeout: float,
                   what: str, fetch: Callable[[Admin, str], Awaitable[dict[str, str]]]) -> None:
    """``fetch`` (key -> value) of ``broker``, or of every master of ``cluster``: a table each, or JSON."""
    _one_of(broker, cluster)

    async def call(admin: Admin) -> dict[str, dict[str, str]]:
        addrs = await admin.broker_addrs(cluster=cluster, broker=broker)
        return {addr: await fetch(admin, addr) for addr in sorted(addrs.values())}

    result = run(namesrv, timeout, call)
    if as_json:
        print_json(result)
        return
    show(*(table(f"{what} of {addr}", ("#Key", "#Value"), sorted(kv.items())) for addr, kv in result.items()))


@admin_app.command("updateBrokerConfig")
def update_broker_config(
    key: Annotated[str, typer.Option("-k", "--key", help="the config key")],
    value: Annotated[str, typer.Option("-v", "--value", help="its new value")],
    namesrv: Namesrv = "",
    broker: _BROKER_ADDR = None,
    cluster: _CLUSTER = None,
    all_brokers: Annotated[str | None, typer.Option("-a", "--updateAllBroker", metavar="true|false",
                                                    help="with -c: replicas too, not only masters (false)",
                                                    show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Change one config key of running brokers (UPDATE_BROKER_CONFIG); the broker refuses keys it cannot
    change at runtime."""
    from cometmq.cli_admin._common import parse_bool

    _one_of(broker, cluster)
    replicas_too = parse_bool(all_brokers, "-a") is True

    async def call(admin: Admin) -> list[str]:
        addrs = await admin.broker_addrs(cluster=cluster, broker=broker, masters_only=not replicas_too)
        for addr in sorted(addrs.values()):
            await admin.update_broker_config(addr, {key: value})
        return sorted(addrs.values())

    addrs = run(namesrv, timeout, call)
    if as_json:
        print_json({"key": key, "value": value, "brokers": addrs})
        return
    for addr in addrs:
        typer.echo(f"update broker config success, {addr}: {key}={value}")


@admin_app.command("statsAll")
def stats_all(
    namesrv: Namesrv = "",
    active: Annotated[bool, typer.Option("-a", "--activeTopic", help="topics holding messages only")] = False,
    topic: Annotated[str | None, typer.Option("-t", "--topic", help="this topic only", show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Per topic and consumer group, as mqadmin's: the group's accumulation (lag), messages in and out per second
    over the last minute and in the last 24 hours (each master's VIEW_BROKER_STATS_DATA: TOPIC_PUT_NUMS by topic,
    GROUP_GET_NUMS by topic@group; the day's sum, else the hour's, else the minute's, as mqadmin counts), and the
    messages the topic's queues hold."""
    async def call(admin: Admin) -> list[dict[str, Any]]:
        topics = [topic] if topic is not None else await admin.list_topics()
        rows = []
        masters: list[str] = []

        async def rate(name: str, key: str) -> tuple[float, int]:
            tps, day = 0.0, 0
            for addr in masters:
                data = await admin.broker_stats(addr, name, key)
                if data is not None:
                    tps += data.stats_minute.tps
                    day += data.stats_day.sum or data.stats_hour.sum or data.stats_minute.sum
            return tps, day

        for t in topics:
            if t.startswith(("%RETRY%", "%DLQ%")):
                continue
            stats = await admin.topic_stats(t)
            stored = sum(o.messages for o in stats.values())
            if active and stored == 0:
                continue
            route = await admin.topic_route(t)
            masters = [a for bd in route.broker_datas if (a := bd.master_addr) is not None]
            in_tps, in_day = await rate("TOPIC_PUT_NUMS", t)
            groups = await admin.topic_consumer_groups(t)
            choices: list[str | None] = [*groups] or [None]
            for g in choices:
                lag = None if g is None else (await admin.consumer_progress(g, t)).total_lag
                out_tps, out_day = (0.0, 0) if g is None else await rate("GROUP_GET_NUMS", f"{t}@{g}")
                rows.append({"topic": t, "consumerGroup": g, "accumulation": lag, "inTps": round(in_tps, 2),
                             "outTps": round(out_tps, 2), "inMsg24Hour": in_day, "outMsg24Hour": out_day,
                             "messages": stored})
        return rows

    rows = run(namesrv, timeout, call)
    if as_json:
        print_json(rows)
        return
    show(table("stats", ("#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour",
                         "#OutMsg24Hour", "#Messages Stored"),
               ((r["topic"], r["consumerGroup"] or "", r["accumulation"] if r["accumulation"] is not None else "",
                 f"{r['inTps']:.2f}", f"{r['outTps']:.2f}", r["inMsg24Hour"], r["outMsg24Hour"], r["messages"])
                for r in rows)))


def _write_perm(verb: str, broker_name: str, namesrv: str, timeout: float, as_json: bool) -> None:
    result = run(namesrv, timeout, lambda admin: admin.wipe_write_perm(broker_name) if verb == "wipe"
                 else admin.add_write_perm(broker_name))
    if as_json:
        print_json(result)
        return
    if not result:
        raise fail("no nameserver answered")
    if not any(result.values()):  # a registered broker has topics (its system topics at least): a wrong name
        raise fail(f"no nameserver has a topic of broker {broker_name!r} (-b names a broker, as clusterList "
                   "shows them); nothing changed")
    for addr, count in sorted(result.items()):
        typer.echo(f"{verb} write perm of broker[{broker_name}] in name server[{addr}] OK, {count}")


@admin_app.command("wipeWritePerm")
def wipe_write_perm(
    broker_name: Annotated[str, typer.Option("-b", "--brokerName", help="the broker name")],
    namesrv: Namesrv = "",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Take write permission away from a broker's topics at every nameserver (WIPE_WRITE_PERM_OF_BROKER):
    producers stop sending there, consumers go on reading."""
    _write_perm("wipe", broker_name, namesrv, timeout, as_json)


@admin_app.command("addWritePerm")
def add_write_perm(
    broker_name: Annotated[str, typer.Option("-b", "--brokerName", help="the broker name")],
    namesrv: Namesrv = "",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Give write permission back to a broker's topics at every nameserver (ADD_WRITE_PERM_OF_BROKER)."""
    _write_perm("add", broker_name, namesrv, timeout, as_json)
