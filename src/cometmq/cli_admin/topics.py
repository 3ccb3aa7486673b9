"""Topic verbs: updateTopic, deleteTopic, topicList, topicRoute, topicStatus."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cometmq.cli_admin._common import (
    AsJson,
    Namesrv,
    Timeout,
    admin_app,
    broker_option,
    ms_time,
    parse_bool,
    print_json,
    run,
    show,
    table,
)

if TYPE_CHECKING:
    from cometmq.client.admin import Admin

_TOPIC = Annotated[str, typer.Option("-t", "--topic", help="topic name")]
_CLUSTER = Annotated[str | None, typer.Option("-c", "--clusterName", help="the cluster (default: the only one)",
                                              show_default=False)]


def _attributes(value: str | None) -> str | None:
    """``-a +message.type=FIFO``: the message type (the only topic attribute cometmq keeps)."""
    if value is None:
        return None
    message_type = None
    for item in value.replace(";", ",").split(","):
        key, sep, val = item.strip().partition("=")
        if key.lstrip("+") == "message.type" and sep and val.strip():
            message_type = val.strip().upper()
        elif item.strip():
            raise typer.BadParameter(f"unsupported attribute {item.strip()!r} (only +message.type=NORMAL|FIFO|"
                                     "DELAY|TRANSACTION)", param_hint="-a")
    return message_type


@admin_app.command("updateTopic")
def update_topic(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    broker: Annotated[str | None, typer.Option("-b", "--brokerAddr", help="create on this broker only (address "
                                                                         "or name)",
                                               show_default=False, callback=broker_option)] = None,
    cluster: _CLUSTER = None,
    read_queues: Annotated[int, typer.Option("-r", "--readQueueNums", help="read queue count")] = 8,
    write_queues: Annotated[int, typer.Option("-w", "--writeQueueNums", help="write queue count")] = 8,
    perm: Annotated[int, typer.Option("-p", "--perm", help="permission: 2 write, 4 read, 6 read+write")] = 6,
    order: Annotated[str | None, typer.Option("-o", "--order", metavar="true|false",
                                              help="an ordered topic; true also writes its order conf "
                                                   "(brokerName:writeQueueNums) to the nameservers' KV namespace "
                                                   "ORDER_TOPIC_CONFIG, which routes carry as orderTopicConf: "
                                                   "with -b merged into the topic's conf, else the cluster's "
                                                   "brokers replace it", show_default=False)] = None,
    unit: Annotated[str | None, typer.Option("-u", "--unit", metavar="true|false",
                                             help="a unit topic: topicSysFlag bit 1 (RocketMQ's unit "
                                                  "deployment; the nameserver lists it in GET_UNIT_TOPIC_LIST)",
                                             show_default=False)] = None,
    unit_sub: Annotated[str | None, typer.Option("-s", "--hasUnitSub", metavar="true|false",
                                                 help="has unit subscriptions: topicSysFlag bit 2",
                                                 show_default=False)] = None,
    attributes: Annotated[str | None, typer.Option("-a", "--attributes", metavar="+message.type=FIFO",
                                                   help="topic attributes (message.type only)",
                                                   show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Create or update a topic on every master of a cluster, or on one broker (UPDATE_AND_CREATE_TOPIC); waits
    until the nameserver routes it."""
    is_order = bool(parse_bool(order, "-o"))
    sys_flag = (1 if parse_bool(unit, "-u") else 0) | (2 if parse_bool(unit_sub, "-s") else 0)
    message_type = _attributes(attributes)
    if broker is not None and cluster is not None:
        raise typer.BadParameter("give -b or -c, not both", param_hint="-b/-c")

    async def call(admin: Admin) -> tuple[list[str], str | None]:
        brokers = await admin.create_topic(topic, read_queues=read_queues, write_queues=write_queues, perm=perm,
                                           order=is_order, message_type=message_type, cluster=cluster,
                                           broker=broker, topic_sys_flag=sys_flag)
        if not is_order:
            return brokers, None
        conf = ";".join(f"{name}:{write_queues}" for name in brokers)
        return brokers, await admin.update_order_conf(topic, conf, replace=broker is None)

    brokers, order_conf = run(namesrv, timeout, call)
    result = {"topic": topic, "brokers": brokers, "readQueueNums": read_queues, "writeQueueNums": write_queues,
              "perm": perm, "order": is_order, "messageType": message_type or "NORMAL", "topicSysFlag": sys_flag,
              "orderConf": order_conf}
    if as_json:
        print_json(result)
        return
    typer.echo(f"updateTopic: {topic} on {', '.join(brokers)} (readQueueNums {read_queues}, writeQueueNums "
               f"{write_queues}, perm {perm}, order {str(is_order).lower()}, message type {result['messageType']}, "
               f"topicSysFlag {sys_flag})" + (f"; orderConf [{order_conf}]" if order_conf else ""))


@admin_app.command("deleteTopic")
def delete_topic(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    cluster: Annotated[str | None, typer.Option("-c", "--clusterName", help="delete from every master of this "
                                                                           "cluster (default: the brokers that "
                                                                           "hold it)", show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Delete a topic from its brokers, then from every nameserver."""
    brokers = run(namesrv, timeout, lambda admin: admin.delete_topic(topic, cluster=cluster))
    if as_json:
        print_json({"topic": topic, "brokers": brokers})
        return
    typer.echo(f"deleteTopic: {topic} deleted from {', '.join(brokers) or 'no broker'} and the nameserver")


@admin_app.command("topicList")
def topic_list(
    namesrv: Namesrv = "",
    cluster_model: Annotated[bool, typer.Option("-c", "--clusterModel", help="with each topic's cluster and "
                                                                            "consumer groups")] = False,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Every topic the nameserver knows."""
    async def call(admin: Admin) -> Any:
        topics = await admin.list_topics()
        if not cluster_model:
            return topics
        rows = []
        for t in topics:
            route = await admin.topic_route(t)
            clusters = sorted({bd.cluster for bd in route.broker_datas})
            groups = [] if t.startswith(("%RETRY%", "%DLQ%")) else await admin.topic_consumer_groups(t)
            rows.append({"topic": t, "clusters": clusters, "consumerGroups": groups})
        return rows

    result = run(namesrv, timeout, call)
    if as_json:
        print_json(result)
    elif cluster_model:
        show(table("topics", ("#Cluster Name", "#Topic", "#Consumer Group"),
                   ((", ".join(r["clusters"]), r["topic"], ", ".join(r["consumerGroups"]) or "-") for r in result)))
    else:
        for t in result:
            typer.echo(t)


@admin_app.command("topicRoute")
def topic_route(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    as_list: Annotated[bool, typer.Option("-l", "--list", help="one row per broker with its queue counts")] = False,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """A topic's route as the nameserver has it: its brokers and queues."""
    route = run(namesrv, timeout, lambda admin: admin.topic_route(topic))
    if as_json:
        print_json(route.to_json())
        return
    queues = {qd.broker_name: qd for qd in route.queue_datas}
    if as_list:
        rows = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            qd = queues.get(bd.broker_name)
            rows.append((bd.cluster, bd.broker_name, bd.master_addr or "-", qd.read_queue_nums if qd else "-",
                         qd.write_queue_nums if qd else "-", qd.perm if qd else "-"))
        show(table(f"route of {topic}", ("#ClusterName", "#BrokerName", "#BrokerAddr", "#ReadQueue", "#WriteQueue",
                                         "#Perm"), rows))
        return
    show(table(f"brokers of {topic}", ("cluster", "broker name", "broker id", "address"),
               ((bd.cluster, bd.broker_name, i, a) for bd in sorted(route.broker_datas, key=lambda b: b.broker_name)
                for i, a in sorted(bd.broker_addrs.items()))),
         table(f"queues of {topic}", ("broker name", "read queues", "write queues", "perm", "topic sys flag"),
               ((qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm, qd.topic_sys_flag)
                for qd in sorted(route.queue_datas, key=lambda q: q.broker_name))))


@admin_app.command("topicStatus")
def topic_status(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Min and max offset and last write time of each queue of a topic (GET_TOPIC_STATS_INFO)."""
    stats = run(namesrv, timeout, lambda admin: admin.topic_stats(topic))
    rows = [{"brokerName": q.broker_name, "queueId": q.queue_id, "minOffset": o.min_offset,
             "maxOffset": o.max_offset, "lastUpdateTimestamp": o.last_update_timestamp} for q, o in stats.items()]
    if as_json:
        print_json(rows)
        return
    show(table(f"status of {topic}", ("#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"),
               ((r["brokerName"], r["queueId"], r["minOffset"], r["maxOffset"], ms_time(r["lastUpdateTimestamp"]))
                for r in rows)))
