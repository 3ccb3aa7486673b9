"""Consumer and producer group verbs: updateSubGroup, deleteSubGroup, consumerProgress, consumerConnection,
producerConnection, resetOffsetByTime, skipAccumulatedMessage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cometmq.cli_admin._common import (
    I64_MAX,
    AsJson,
    Namesrv,
    Timeout,
    admin_app,
    broker_option,
    fail,
    ms_time,
    parse_attributes,
    parse_bool,
    parse_time,
    print_json,
    run,
    show,
    table,
)

if TYPE_CHECKING:
    from cometmq.client.admin import Admin, ConsumeStats
    from cometmq.client.admin_ops import ResetResult
    from cometmq.client.message import MessageQueue

_GROUP = Annotated[str, typer.Option("-g", "--groupName", help="consumer group name")]
_BOOL: dict[str, Any] = {"metavar": "true|false", "show_default": False}


@admin_app.command("updateSubGroup")
def update_sub_group(
    group: _GROUP,
    namesrv: Namesrv = "",
    broker: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="on this broker only (address or name)",
                                               show_default=False, callback=broker_option)] = None,
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="on every master of this cluster "
                                                                           "(default: the only one)",
                                                show_default=False)] = None,
    consume_enable: Annotated[str | None, typer.Option("-s", "--consumeEnable", help="consume enable (true)",
                                                       **_BOOL)] = None,
    from_min: Annotated[str | None, typer.Option("-m", "--consumeFromMinEnable", help="from min offset (true)",
                                                 **_BOOL)] = None,
    broadcast: Annotated[str | None, typer.Option("-d", "--consumeBroadcastEnable", help="broadcast (true)",
                                                  **_BOOL)] = None,
    orderly: Annotated[str | None, typer.Option("-o", "--consumeMessageOrderly",
                                                help="consume orderly: a 5.x (pop/gRPC) FIFO consumer needs this "
                                                     "(false)", **_BOOL)] = None,
    retry_queues: Annotated[int, typer.Option("-q", "--retryQueueNums", min=0, help="retry queue count")] = 1,
    retry_max: Annotated[int, typer.Option("-r", "--retryMaxTimes", min=-1, help="retries before the DLQ")] = 16,
    broker_id: Annotated[int | None, typer.Option("-i", "--brokerId", min=0, help="consume from this broker id (0)",
                                                  show_default=False)] = None,
    slow_broker: Annotated[int | None, typer.Option("-w", "--whichBrokerWhenConsumeSlowly", min=0,
                                                    help="broker id when consuming slowly (1)",
                                                    show_default=False)] = None,
    notify: Annotated[str | None, typer.Option("-a", "--notifyConsumerIdsChanged",
                                               help="tell consumers when the group changes (true)", **_BOOL)] = None,
    retry_policy: Annotated[str | None, typer.Option(
        "-p", "--groupRetryPolicy", metavar="JSON",
        help='the retry policy (RocketMQ 5), e.g. \'{"type":"EXPONENTIAL","exponentialRetryPolicy":{"initial":'
             '5000,"max":7200000,"multiplier":2}}\' or \'{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":'
             '[1000,5000,10000]}}\'; stored in the group\'s config and shown by its readers (cometmq\'s retry '
             'delays follow the delay levels)', show_default=False)] = None,
    attributes: Annotated[str | None, typer.Option(
        "--attributes", metavar="+k=v,-k", help="change the group's attributes: +key=value adds or updates, -key "
                                                "deletes (a new group takes +key only); others are kept",
        show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Create or update a subscription group on every master of a cluster, or on one broker
    (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP). Options not given take RocketMQ's defaults."""
    if broker is not None and cluster is not None:
        raise typer.BadParameter("give -b or -c, not both", param_hint="-b/-c")
    extra: dict[str, Any] = {}
    if retry_policy is not None:
        extra["groupRetryPolicy"] = _retry_policy(retry_policy)
    if attributes is not None:
        extra["attributes"] = parse_attributes(attributes, "--attributes")
    config: dict[str, Any] = {
        "consumeEnable": parse_bool(consume_enable, "-s") is not False,
        "consumeFromMinEnable": parse_bool(from_min, "-m") is not False,
        "consumeBroadcastEnable": parse_bool(broadcast, "-d") is not False,
        "consumeMessageOrderly": parse_bool(orderly, "-o") is True,
        "retryQueueNums": retry_queues, "retryMaxTimes": retry_max,
        "brokerId": 0 if broker_id is None else broker_id,
        "whichBrokerWhenConsumeSlowly": 1 if slow_broker is None else slow_broker,
        "notifyConsumerIdsChangedEnable": parse_bool(notify, "-a") is not False,
    }
    brokers = run(namesrv, timeout, lambda admin: admin.create_subscription_group(
        group, cluster=cluster, broker=broker, consume_enable=config["consumeEnable"],
        consume_broadcast_enable=config["consumeBroadcastEnable"],
        consume_from_min_enable=config["consumeFromMinEnable"], retry_queue_nums=retry_queues,
        retry_max_times=retry_max, consume_message_orderly=config["consumeMessageOrderly"],
        brokerId=config["brokerId"], whichBrokerWhenConsumeSlowly=config["whichBrokerWhenConsumeSlowly"],
        notifyConsumerIdsChangedEnable=config["notifyConsumerIdsChangedEnable"], **extra))
    if as_json:
        print_json({"groupName": group, "brokers": brokers, **config, **extra})
        return
    typer.echo(f"updateSubGroup: {group} on {', '.join(brokers)} ("
               + ", ".join(f"{k} {str(v).lower()}" for k, v in config.items()) + ")")


def _retry_policy(text: str) -> dict[str, Any]:
    """-p: RocketMQ 5's GroupRetryPolicy JSON, checked as the broker checks it."""
    import json

    from cometmq.protocol.group_policy import check_retry_policy

    try:
        return check_retry_policy(json.loads(text))
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise typer.BadParameter(f"not a retry policy: {exc}", param_hint="-p") from None


@admin_app.command("deleteSubGroup")
def delete_sub_group(
    group: _GROUP,
    namesrv: Namesrv = "",
    broker: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="from this broker only (address or "
                                                                         "name)",
                                               show_default=False, callback=broker_option)] = None,
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="from every master of this cluster "
                                                                           "(default: the only one), and its "
                                                                           "%RETRY% and %DLQ% topics",
                                                show_default=False)] = None,
    remove_offset: Annotated[str | None, typer.Option("-r", "--removeOffset", help="also remove the group's "
                                                                                  "committed offsets (false)",
                                                      **_BOOL)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Delete a subscription group (DELETE_SUBSCRIPTIONGROUP), with -r its consumer offsets too. From a cluster
    (-c, or no -b), the group's %RETRY% and %DLQ% topics are deleted as well, as mqadmin does."""
    from cometmq.client.errors import NoRouteError

    if broker is not None and cluster is not None:
        raise typer.BadParameter("give -b or -c, not both", param_hint="-b/-c")
    clean = parse_bool(remove_offset, "-r") is True

    async def call(admin: Admin) -> tuple[list[str], list[str]]:
        brokers = await admin.delete_subscription_group(group, cluster=cluster, broker=broker, clean_offset=clean)
        topics: list[str] = []
        if broker is None:
            for t in (f"%RETRY%{group}", f"%DLQ%{group}"):
                try:
                    await admin.topic_route(t)
                except NoRouteError:  # the group never had one
                    continue
                await admin.delete_topic(t, cluster=cluster)
                topics.append(t)
        return brokers, topics

    brokers, topics = run(namesrv, timeout, call)
    if as_json:
        print_json({"groupName": group, "brokers": brokers, "removeOffset": clean, "deletedTopics": topics})
        return
    typer.echo(f"deleteSubGroup: {group} deleted from {', '.join(brokers)}"
               + (" with its offsets" if clean else "") + (f"; topics {', '.join(topics)} deleted" if topics else ""))


@admin_app.command("consumerProgress")
def consumer_progress(
    namesrv: Namesrv = "",
    group: Annotated[str | None, typer.Option("-g", "--groupName", help="the group (default: every group, one "
                                                                       "row each)", show_default=False)] = None,
    topic: Annotated[str | None, typer.Option("-t", "--topicName", help="this topic only", show_default=False)] = None,
    show_ip: Annotated[str | None, typer.Option("-s", "--showClientIP", help="with -g: the IP of the client that "
                                                                           "holds each queue, as the online "
                                                                           "consumers say (false)",
                                                **_BOOL)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """A group's committed offsets against the brokers' max offsets per queue, and its lag (GET_CONSUME_STATS);
    without -g, every group's totals."""
    with_ip = parse_bool(show_ip, "-s") is True
    if group is None:
        if with_ip:
            raise typer.BadParameter("-s needs -g", param_hint="-s")
        _all_groups_progress(namesrv, timeout, as_json)
        return
    g = group

    async def call(admin: Admin) -> tuple[ConsumeStats, dict[MessageQueue, str]]:
        stats = await admin.consumer_progress(g, topic)
        return stats, (await _queue_clients(admin, g) if with_ip else {})

    stats, clients = run(namesrv, timeout, call)
    if not stats.offsets:
        raise fail(f"group {group} has no consume stats{' for ' + topic if topic else ''}: it has committed no "
                   "offset (it never consumed, or does not exist)")
    rows = [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id, "brokerOffset": w.broker_offset,
             "consumerOffset": w.consumer_offset, "diff": w.lag} for q, w in stats.offsets.items()]
    if with_ip:
        for q, r in zip(stats.offsets, rows, strict=True):
            r["clientIp"] = clients.get(q)
    if as_json:
        print_json({"group": group, "consumeTps": stats.consume_tps, "diffTotal": stats.total_lag, "offsets": rows})
        return
    columns = ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset"] + (
        ["#Client IP"] if with_ip else []) + ["#Diff"]
    show(table(f"progress of {group}", columns,
               ([r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"], r["consumerOffset"]]
                + ([r["clientIp"] or "N/A"] if with_ip else []) + [r["diff"]] for r in rows)))
    typer.echo(f"Consume TPS: {stats.consume_tps:.2f}\nConsume Diff Total: {stats.total_lag}")


async def _queue_clients(admin: Admin, group: str) -> dict[MessageQueue, str]:
    """Which client IP holds each queue of ``group``, as mqadmin finds it: each online consumer's running info
    (GET_CONSUMER_RUNNING_INFO through a broker), its queues; empty when none is online."""
    from cometmq.client.errors import BrokerError, MQClientError

    try:
        conn = await admin.consumer_connection(group)
    except BrokerError:
        return {}
    out: dict[MessageQueue, str] = {}
    for c in conn.connections:
        try:
            info = await admin.consumer_running_info(group, c.client_id)
        except MQClientError:  # a client that does not answer: its queues show no IP (mqadmin logs it)
            continue
        for q in info.queues:
            out[q] = c.client_id.split("@")[0]
    return out


def _all_groups_progress(namesrv: str, timeout: float, as_json: bool) -> None:
    from cometmq.client.errors import BrokerError

    async def call(admin: Admin) -> list[dict[str, Any]]:
        info = await admin.cluster_info()
        # the groups the brokers keep a config for, and those with a retry topic (mqadmin's way)
        names = {t.removeprefix("%RETRY%") for t in await admin.list_topics() if t.startswith("%RETRY%")}
        for broker_name, bd in info.broker_addr_table.items():
            if bd.master_addr is not None:
                names.update(await admin.subscription_groups(broker_name))
        rows = []
        for name in sorted(names):
            stats = await admin.consumer_progress(name)
            try:
                conn = await admin.consumer_connection(name)
                count, model = len(conn.connections), conn.message_model
            except BrokerError:
                count, model = 0, ""
            rows.append({"group": name, "count": count, "messageModel": model, "consumeTps": stats.consume_tps,
                         "diffTotal": stats.total_lag})
        return rows

    rows = run(namesrv, timeout, call)
    if as_json:
        print_json(rows)
        return
    show(table("consumer groups", ("#Group", "#Count", "#Model", "#TPS", "#Diff Total"),
               ((r["group"], r["count"], r["messageModel"] or "-", f"{r['consumeTps']:.2f}", r["diffTotal"])
                for r in rows)))


@admin_app.command("consumerConnection")
def consumer_connection(
    group: Annotated[str, typer.Option("-g", "--consumerGroup", help="consumer group name")],
    namesrv: Namesrv = "",
    broker: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="ask this broker (address or name)",
                                               show_default=False, callback=broker_option)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """The online consumers of a group: client id, address, language, version; and their subscriptions
    (GET_CONSUMER_CONNECTION_LIST)."""
    conn = run(namesrv, timeout, lambda admin: admin.consumer_connection(group, broker=broker))
    if as_json:
        print_json(conn.to_json())
        return
    show(table(f"connections of {group}", ("#", "#ClientId", "#ClientAddr", "#Language", "#Version"),
               ((i, c.client_id, c.client_addr or "-", c.language or "-", c.version or "-")
                for i, c in enumerate(conn.connections, 1))))
    if conn.full:
        show(table("subscriptions", ("#Topic", "#SubExpression"), sorted(conn.subscriptions.items())))
        typer.echo(f"ConsumeType: {conn.consume_type}\nMessageModel: {conn.message_model}\n"
                   f"ConsumeFromWhere: {conn.consume_from_where}")
    else:
        typer.echo("(this broker gives client ids only: GET_CONSUMER_LIST_BY_GROUP)")


@admin_app.command("producerConnection")
def producer_connection(
    group: Annotated[str, typer.Option("-g", "--producerGroup", help="producer group name")],
    topic: Annotated[str, typer.Option("-t", "--topic", help="a topic the group sends to (its broker is asked)")],
    namesrv: Namesrv = "",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """The online producers of a group (GET_PRODUCER_CONNECTION_LIST)."""
    conns = run(namesrv, timeout, lambda admin: admin.producer_connection(group, topic))
    if as_json:
        print_json([dict(c.to_bean()) for c in conns])
        return
    show(table(f"producers of {group}", ("#", "#ClientId", "#ClientAddr", "#Language", "#Version"),
               ((i, c.client_id, c.client_addr or "-", c.language or "-", c.version or "-")
                for i, c in enumerate(conns, 1))))


# -- offsets ----------------------------------------------------------------------------------------------------
def _print_reset(result: ResetResult, as_json: bool) -> None:
    rows = [{"brokerName": q.broker_name, "queueId": q.queue_id, "offset": o} for q, o in result.offsets.items()]
    if as_json:
        print_json({"group": result.group, "topic": result.topic, "timestamp": result.timestamp,
                    "online": result.online, "offsets": rows})
        return
    how = ("through the brokers; online consumers were told" if result.online
           else "by writing the committed offsets (no consumer online)")
    when = "the end of each queue" if result.timestamp == -1 else ms_time(result.timestamp)
    typer.echo(f"reset {result.group} on {result.topic} to {when} {how}")
    show(table("offsets", ("#brokerName", "#queueId", "#offset"),
               ((r["brokerName"], r["queueId"], r["offset"]) for r in rows)))


@admin_app.command("resetOffsetByTime")
def reset_offset_by_time(
    group: Annotated[str, typer.Option("-g", "--group", help="the consumer group")],
    topic: Annotated[str, typer.Option("-t", "--topic", help="the topic")],
    timestamp: Annotated[str, typer.Option("-s", "--timestamp", metavar="now|MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
                                           help="reset to the first message stored at or after this time")],
    namesrv: Namesrv = "",
    force: Annotated[str | None, typer.Option("-f", "--force", help="also move offsets forward (true)",
                                              **_BOOL)] = None,
    broker: Annotated[str | None, typer.Option("-b", "--broker", help="with -q: one queue of this broker "
                                                                     "(address or name)",
                                               show_default=False, callback=broker_option)] = None,
    queue: Annotated[int | None, typer.Option("-q", "--queue", min=0, help="with -b: this queue id",
                                              show_default=False)] = None,
    offset: Annotated[int | None, typer.Option("-o", "--offset", min=0, max=I64_MAX,
                                               help="with -b -q: this offset instead of "
                                                                            "the time's", show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Reset a group's offsets of a topic to a time, consumers online or not: the brokers reset and tell the
    online consumers (INVOKE_BROKER_TO_RESET_OFFSET); with no consumer online the committed offsets are
    written. With -b and -q, one queue's committed offset is written (to -o if given)."""
    ts = parse_time(timestamp, "-s")
    assert ts is not None
    is_force = parse_bool(force, "-f") is not False
    if (broker is None) != (queue is None):
        raise typer.BadParameter("-b and -q go together", param_hint="-b/-q")
    if offset is not None and queue is None:
        raise typer.BadParameter("-o needs -b and -q", param_hint="-o")
    if broker is not None and queue is not None:
        _reset_one_queue(namesrv, timeout, group, topic, broker, queue, ts, offset, as_json)
        return
    _print_reset(run(namesrv, timeout, lambda admin: admin.reset_offset(group, topic, ts, force=is_force)), as_json)


def _reset_one_queue(namesrv: str, timeout: float, group: str, topic: str, broker: str, queue_id: int, ts: int,
                     offset: int | None, as_json: bool) -> None:
    from cometmq.client.message import MessageQueue

    async def call(admin: Admin) -> tuple[MessageQueue, int]:
        [name] = await admin.broker_addrs(broker=broker)
        q = MessageQueue(topic, name, queue_id)
        target = offset if offset is not None else await admin.search_offset(q, ts)
        await admin.update_consumer_offset(group, q, target)
        return q, target

    q, target = run(namesrv, timeout, call)
    if as_json:
        print_json({"group": group, "topic": topic, "timestamp": ts, "online": False,
                    "offsets": [{"brokerName": q.broker_name, "queueId": q.queue_id, "offset": target}]})
        return
    typer.echo(f"reset {group} on {topic}/{q.broker_name}/{q.queue_id} to offset {target}")


@admin_app.command("skipAccumulatedMessage")
def skip_accumulated_message(
    group: Annotated[str, typer.Option("-g", "--group", help="the consumer group")],
    topic: Annotated[str, typer.Option("-t", "--topic", help="the topic")],
    namesrv: Namesrv = "",
    force: Annotated[str | None, typer.Option("-f", "--force", help="(true)", **_BOOL)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Skip every message the group has not consumed yet: its offsets go to the end of each queue (as
    resetOffsetByTime, online consumers told)."""
    is_force = parse_bool(force, "-f") is not False
    _print_reset(run(namesrv, timeout, lambda admin: admin.reset_offset(group, topic, -1, force=is_force)), as_json)
