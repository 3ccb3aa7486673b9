"""Message verbs: queryMsgById, queryMsgByKey, queryMsgByOffset, queryMsgByUniqueKey, printMsg, sendMessage,
consumeMessage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cometmq.cli_admin._common import (
    I64_MAX,
    AsJson,
    Namesrv,
    Timeout,
    admin_app,
    check_charset,
    check_name,
    decode_body,
    message_json,
    message_table,
    ms_time,
    parse_bool,
    parse_span,
    print_json,
    run,
    show,
    table,
)

if TYPE_CHECKING:
    from cometmq.client.admin import Admin
    from cometmq.client.message import MessageExt, MessageQueue

_TOPIC = Annotated[str, typer.Option("-t", "--topic", help="topic name")]
_CHARSET = "utf-8"


def _print_messages(msgs: list[MessageExt], as_json: bool, title: str, *, body: bool = True,
                    charset: str = _CHARSET) -> None:
    if as_json:
        print_json([message_json(m, charset, body=body) for m in msgs])
        return
    columns = ["#Broker Name", "#QID", "#Offset", "#Message ID", "#Tags", "#Keys", "#Store Time"]
    if body:
        columns.append("#Body")
    show(table(title, columns, (
        [m.queue.broker_name, m.queue.queue_id, m.queue_offset, m.msg_id, m.tags or "-", " ".join(m.keys) or "-",
         ms_time(m.store_timestamp)] + ([decode_body(m.body, charset)] if body else []) for m in msgs)))


def _print_one(m: MessageExt, as_json: bool) -> None:
    if as_json:
        print_json(message_json(m))
    else:
        show(message_table(m))


@admin_app.command("queryMsgById")
def query_msg_by_id(
    msg_id: Annotated[str, typer.Option("-i", "--msgId", help="the message id: the offset msgId a broker gives, "
                                                              "or with -t the unique key a producer gives; "
                                                              "several separated by commas")],
    namesrv: Namesrv = "",
    topic: Annotated[str | None, typer.Option("-t", "--topic", help="the topic (needed for a unique key)",
                                              show_default=False)] = None,
    group: Annotated[str | None, typer.Option("-g", "--consumerGroup", help="with -d: have this group's client "
                                                                           "consume the message",
                                              show_default=False)] = None,
    client_id: Annotated[str | None, typer.Option("-d", "--clientId", help="with -g: the push consumer's client id "
                                                                          "(consumerConnection lists them): it runs "
                                                                          "its listener on the message "
                                                                          "(CONSUME_MESSAGE_DIRECTLY through the "
                                                                          "broker); nothing is committed",
                                                  show_default=False)] = None,
    resend: Annotated[str | None, typer.Option("-s", "--sendMessage", metavar="true|false",
                                               help="true: send the message again to its topic (a new message "
                                                    "with the same body, tags, keys and properties, a new msgId)",
                                               show_default=False)] = None,
    unit_name: Annotated[str | None, typer.Option("-u", "--unitName", help="RocketMQ's unit name of the -s "
                                                                          "producer (unit deployment): accepted "
                                                                          "and ignored, cometmq has no units",
                                                  show_default=False)] = None,
    body_format: Annotated[str, typer.Option("-f", "--bodyFormat", metavar="CHARSET",
                                             help="decode the body with this charset")] = "UTF-8",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Look a message up by its id (VIEW_MESSAGE_BY_ID; with -t the unique key first, QUERY_MESSAGE); with -g
    and -d have a consumer consume it, with -s true send it again."""
    ids = [i.strip() for i in msg_id.split(",") if i.strip()]
    if not ids:
        raise typer.BadParameter("no message id", param_hint="-i")
    if (group is None) != (client_id is None):
        raise typer.BadParameter("-g and -d go together", param_hint="-g/-d")
    again = parse_bool(resend, "-s") is True
    check_charset(body_format, "-f")  # a usage error before anything is asked
    del unit_name  # RocketMQ's unit deployment: nothing to set here
    if group is not None and client_id is not None:
        _consume_directly(namesrv, timeout, group, client_id, ids, topic, as_json)
        return
    if resend is not None:
        if again:
            _resend(namesrv, timeout, ids, topic, as_json)
        return

    async def call(admin: Admin) -> list[MessageExt]:
        return [await (admin.query_message(topic, i) if topic else admin.view_message(i)) for i in ids]

    msgs = run(namesrv, timeout, call)
    if as_json:
        print_json([message_json(m, body_format) for m in msgs] if len(ids) > 1
                   else message_json(msgs[0], body_format))
        return
    show(*(message_table(m, body_format) for m in msgs))


def _consume_directly(namesrv: str, timeout: float, group: str, client_id: str, ids: list[str], topic: str | None,
                      as_json: bool) -> None:
    from cometmq.client.errors import InvalidArgumentError

    async def call(admin: Admin) -> list[dict[str, object]]:
        info = await admin.consumer_running_info(group, client_id)
        if not info.push:  # as mqadmin: only a push consumer consumes a message it is handed
            raise InvalidArgumentError(f"client {client_id} is not a push consumer: it cannot consume a message "
                                       "directly")
        out = []
        for i in ids:
            result = await admin.consume_message_directly(group, client_id, i, topic)
            out.append({"msgId": i, **result.to_json()})
        return out

    results = run(namesrv, timeout, call)
    if as_json:
        print_json(results if len(ids) > 1 else results[0])
        return
    show(*(table(f"consumed directly by {client_id}: {r['msgId']}", ("", "value"),
                 [(k, v) for k, v in r.items() if k != "msgId"]) for r in results))


def _resend(namesrv: str, timeout: float, ids: list[str], topic: str | None, as_json: bool) -> None:
    from cometmq.client.message import Message, SendResult
    from cometmq.client.producer import Producer

    async def call(admin: Admin) -> list[tuple[str, SendResult]]:
        msgs = [await (admin.query_message(topic, i) if topic else admin.view_message(i)) for i in ids]
        producer = Producer("ReSendMsgById", instance=admin.instance, send_timeout=timeout)
        await producer.start()
        try:
            out = []
            for i, m in zip(ids, msgs, strict=True):
                props = {k: v for k, v in m.properties.items() if k not in _NOT_RESENT}
                out.append((i, await producer.send(Message(m.topic, m.body, tags=m.tags, keys=m.keys or None,
                                                           properties=props))))
            return out
        finally:
            await producer.close()

    results = run(namesrv, timeout, call)
    rows = [{"originalMsgId": i, "topic": r.queue.topic, "brokerName": r.queue.broker_name,
             "queueId": r.queue.queue_id, "queueOffset": r.queue_offset, "sendStatus": r.status.name,
             "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id} for i, r in results]
    if as_json:
        print_json(rows if len(ids) > 1 else rows[0])
        return
    show(table("sent again", ("#Original MsgId", "#Broker Name", "#QID", "#Send Result", "#MsgId"),
               ((r["originalMsgId"], r["brokerName"], r["queueId"], r["sendStatus"], r["msgId"]) for r in rows)))


#: properties a message sent again does not carry over: the Message fields' own, and those the broker set
_NOT_RESENT = frozenset({"TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS",
                         "TIMER_DELAY_SEC", "MIN_OFFSET", "MAX_OFFSET", "CLUSTER", "REAL_TOPIC", "REAL_QID",
                         "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES"})


@admin_app.command("queryMsgByKey")
def query_msg_by_key(
    topic: _TOPIC,
    key: Annotated[str, typer.Option("-k", "--msgKey", help="the message key")],
    namesrv: Namesrv = "",
    begin: Annotated[str | None, typer.Option("-b", "--beginTimestamp", help="from (epoch ms or "
                                                                            "yyyy-MM-dd#HH:mm:ss:SSS; default 0)",
                                              show_default=False)] = None,
    end: Annotated[str | None, typer.Option("-e", "--endTimestamp", help="until (default: now)",
                                            show_default=False)] = None,
    max_num: Annotated[int, typer.Option("-m", "--maxNum", min=1, max=65536, help="at most this many")] = 64,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Messages of a topic whose keys hold a key (QUERY_MESSAGE on the topic's brokers), oldest first."""
    b0, e = parse_span(begin, end, "-b", "-e")
    b = b0 or 0
    msgs = run(namesrv, timeout, lambda admin: admin.query_messages_by_key(topic, key, max_num=max_num, begin=b,
                                                                           end=e))
    if as_json:
        print_json([message_json(m) for m in msgs])
        return
    show(table(f"messages of {topic} with key {key}", ("#Message ID", "#Broker Name", "#QID", "#Offset"),
               ((m.msg_id, m.queue.broker_name, m.queue.queue_id, m.queue_offset) for m in msgs)))


@admin_app.command("queryMsgByOffset")
def query_msg_by_offset(
    topic: _TOPIC,
    broker: Annotated[str, typer.Option("-b", "--brokerName", help="the broker name")],
    queue_id: Annotated[int, typer.Option("-i", "--queueId", min=0, help="the queue id")],
    offset: Annotated[int, typer.Option("-o", "--offset", min=0, max=I64_MAX, help="the queue offset")],
    namesrv: Namesrv = "",
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """The message at an offset of a queue (a pull of one message, nothing committed)."""
    from cometmq.client.message import MessageQueue

    m = run(namesrv, timeout, lambda admin: admin.query_message_by_offset(MessageQueue(topic, broker, queue_id),
                                                                          offset))
    _print_one(m, as_json)


@admin_app.command("queryMsgByUniqueKey")
def query_msg_by_unique_key(
    msg_id: Annotated[str, typer.Option("-i", "--msgId", help="the unique key (the msgId a producer gives)")],
    topic: _TOPIC,
    namesrv: Namesrv = "",
    show_all: Annotated[bool, typer.Option("-a", "--showAll", help="every copy stored (at most 32)")] = False,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """A message by its unique key (QUERY_MESSAGE on the unique-key index)."""
    if not show_all:
        _print_one(run(namesrv, timeout, lambda admin: admin.query_message_by_unique_key(topic, msg_id)), as_json)
        return
    msgs = run(namesrv, timeout, lambda admin: admin.query_messages_by_unique_key(topic, msg_id))
    if not msgs:
        typer.echo(f"error: no message with unique key {msg_id} in {topic}", err=True)
        raise typer.Exit(1)
    if as_json:
        print_json([message_json(m) for m in msgs])
    else:
        show(*(message_table(m) for m in msgs))


async def _ranges(admin: Admin, topic: str, begin: int | None, end: int | None,
                  queues: list[MessageQueue] | None = None) -> list[tuple[MessageQueue, int, int]]:
    """(queue, first offset, end offset) of each queue: stored at or after ``begin``, before ``end``."""
    out = []
    for q in queues or await admin.topic_queues(topic):
        lo = await admin.min_offset(q) if begin is None else await admin.search_offset(q, begin)
        hi = await admin.max_offset(q) if end is None else await admin.search_offset(q, end)
        out.append((q, lo, hi))
    return out


@admin_app.command("printMsg")
def print_msg(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    charset: Annotated[str, typer.Option("-c", "--charsetName", help="the bodies' charset")] = "UTF-8",
    expression: Annotated[str, typer.Option("-s", "--subExpression", help="tag expression, e.g. 'TagA || TagB'")]
    = "*",
    begin: Annotated[str | None, typer.Option("-b", "--beginTimestamp", metavar="MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
                                              help="from (default: each queue's start)", show_default=False)] = None,
    end: Annotated[str | None, typer.Option("-e", "--endTimestamp", metavar="MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
                                            help="until (default: each queue's end)", show_default=False)] = None,
    print_body: Annotated[str | None, typer.Option("-d", "--printBody", metavar="true|false",
                                                   help="print the bodies (true)", show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Every message of a topic (stored between -b and -e) that matches -s, queue by queue."""
    b, e = parse_span(begin, end, "-b", "-e")
    body = parse_bool(print_body, "-d") is not False
    check_charset(charset, "-c")  # a usage error before anything is read

    async def call(admin: Admin) -> list[MessageExt]:
        msgs: list[MessageExt] = []
        for q, lo, hi in await _ranges(admin, topic, b, e):
            msgs.extend(await admin.read_range(q, lo, hi, expression=expression))
        return msgs

    _print_messages(run(namesrv, timeout, call), as_json, f"messages of {topic}", body=body, charset=charset)


@admin_app.command("consumeMessage")
def consume_message(
    topic: _TOPIC,
    namesrv: Namesrv = "",
    broker: Annotated[str | None, typer.Option("-b", "--brokerName", help="this broker's queues only",
                                               show_default=False)] = None,
    queue_id: Annotated[int | None, typer.Option("-i", "--queueId", min=0, help="with -b: this queue only",
                                                 show_default=False)] = None,
    offset: Annotated[int | None, typer.Option("-o", "--offset", min=0, max=I64_MAX,
                                               help="with -b -i: from this offset",
                                               show_default=False)] = None,
    group: Annotated[str, typer.Option("-g", "--consumerGroup", help="the group to pull as (nothing is "
                                                                     "committed)")] = "TOOLS_CONSUMER",
    begin: Annotated[str | None, typer.Option("-s", "--beginTimestamp", metavar="MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
                                              help="from (default: each queue's start)", show_default=False)] = None,
    end: Annotated[str | None, typer.Option("-e", "--endTimestamp", metavar="MILLIS|yyyy-MM-dd#HH:mm:ss:SSS",
                                            help="until (default: each queue's end)", show_default=False)] = None,
    count: Annotated[int, typer.Option("-c", "--MessageNumber", min=1, help="at most this many messages")] = 128,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Read messages of a topic as a pull consumer would (nothing committed): from an offset of one queue
    (-b -i -o), or those stored between -s and -e."""
    from cometmq.client.errors import NoRouteError

    if queue_id is not None and broker is None:
        raise typer.BadParameter("-i needs -b", param_hint="-i")
    if offset is not None and queue_id is None:
        raise typer.BadParameter("-o needs -b and -i", param_hint="-o")
    b, e = parse_span(begin, end, "-s", "-e")
    check_name("group", group, "-g")

    async def call(admin: Admin) -> list[MessageExt]:
        queues = await admin.topic_queues(topic)
        if broker is not None:
            queues = [q for q in queues if q.broker_name == broker and (queue_id is None or q.queue_id == queue_id)]
            if not queues:
                raise NoRouteError(f"topic {topic} has no readable queue {broker}"
                                   + ("" if queue_id is None else f"/{queue_id}"))
        msgs: list[MessageExt] = []
        for q, lo, hi in await _ranges(admin, topic, b, e, queues):
            if len(msgs) >= count:
                break
            start = offset if offset is not None else lo
            msgs.extend(await admin.read_range(q, start, hi, limit=count - len(msgs), group=group))
        return msgs

    _print_messages(run(namesrv, timeout, call), as_json, f"messages of {topic}")


@admin_app.command("sendMessage")
def send_message(
    topic: _TOPIC,
    body: Annotated[str, typer.Option("-p", "--body", help="the body (UTF-8 text)")],
    namesrv: Namesrv = "",
    keys: Annotated[str | None, typer.Option("-k", "--key", help="message keys (space separated)",
                                             show_default=False)] = None,
    tags: Annotated[str | None, typer.Option("-c", "--tags", help="message tag", show_default=False)] = None,
    broker: Annotated[str | None, typer.Option("-b", "--broker", help="with -i: send to this broker",
                                               show_default=False)] = None,
    queue_id: Annotated[int | None, typer.Option("-i", "--qid", min=0, help="with -b: send to this queue",
                                                 show_default=False)] = None,
    group: Annotated[str, typer.Option("--group", help="the producer group")] = "TOOLS_PRODUCER",
    trace: Annotated[str | None, typer.Option("-m", "--msgTraceEnable", metavar="true|false",
                                              help="RocketMQ's message trace: accepted, but the cometmq SDK writes "
                                                   "no trace (nothing goes to RMQ_SYS_TRACE_TOPIC)",
                                              show_default=False)] = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Send one message (the SDK's Producer)."""
    parse_bool(trace, "-m")  # checked, then ignored: no trace is written
    from cometmq.client.message import Message, MessageQueue, SendResult
    from cometmq.client.producer import Producer

    if (broker is None) != (queue_id is None):
        raise typer.BadParameter("-b and -i go together", param_hint="-b/-i")
    check_name("group", group, "--group")

    async def call(admin: Admin) -> SendResult:
        producer = Producer(group, instance=admin.instance, send_timeout=timeout)
        await producer.start()
        try:
            msg = Message(topic, body.encode("utf-8"), tags=tags, keys=keys)
            queue = MessageQueue(topic, broker, queue_id) if broker is not None and queue_id is not None else None
            return await producer.send(msg, queue=queue)
        finally:
            await producer.close()

    r = run(namesrv, timeout, call)
    result = {"brokerName": r.queue.broker_name, "queueId": r.queue.queue_id, "queueOffset": r.queue_offset,
              "sendStatus": r.status.name, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id}
    if as_json:
        print_json(result)
        return
    show(table(f"sent to {topic}", ("#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetMsgId"),
               [(r.queue.broker_name, r.queue.queue_id, r.status.name, r.msg_id, r.offset_msg_id)]))
