"""The requests the tools send one consumer client through a broker, answered by the client instance as RocketMQ's
clients answer them (ClientRemotingProcessor):

- GET_CONSUMER_RUNNING_INFO: RocketMQ's ConsumerRunningInfo (properties with PROP_CONSUME_TYPE, the
  subscriptions, ``mqTable``: the queues the consumer holds), which ``consumerProgress -s`` reads the queues'
  clients from;
- CONSUME_MESSAGE_DIRECTLY: a push consumer runs its listener on the message the broker sends (``queryMsgById -g
  -d``) and answers a ConsumeMessageDirectlyResult; nothing is committed or sent back.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from cometmq.client.message import MessageExt
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.fastjson import bean, fastjson_dumps
from cometmq.protocol.message import iter_records
from cometmq.protocol.remoting import RemotingCommand, make_response

if TYPE_CHECKING:
    from cometmq.client.instance import ConsumerLike

log = logging.getLogger(__name__)

_STARTED_MS = int(time.time() * 1000)


def running_info(consumer: ConsumerLike, namesrv: str) -> bytes:
    """ConsumerRunningInfo of ``consumer`` (fastjson, as the Java client writes it)."""
    from cometmq import __version__

    data = consumer.consumer_data()
    queues = getattr(consumer, "queue_info", None)
    mq_table: dict[Any, Any] = {}
    if callable(queues):
        mq_table = {mq: bean(**{"commitOffset": 0, "cachedMsgMinOffset": 0, "cachedMsgMaxOffset": 0,
                                "cachedMsgCount": 0, "cachedMsgSizeInMiB": 0, "transactionMsgMinOffset": 0,
                                "transactionMsgMaxOffset": 0, "transactionMsgCount": 0, "locked": False,
                                "tryUnlockTimes": 0, "lastLockTimestamp": 0, "droped": False,
                                "lastPullTimestamp": 0, "lastConsumeTimestamp": 0, **info})
                    for mq, info in queues().items()}
    else:
        assignment = getattr(consumer, "assignment", None)
        held = assignment() if callable(assignment) else assignment
        if held:
            mq_table = {mq: bean(cachedMsgCount=0, droped=False, locked=False) for mq in sorted(held)}
    properties = {
        "PROP_CONSUME_TYPE": data.consume_type, "PROP_CONSUMEORDERLY": str(bool(getattr(consumer, "orderly_service",
                                                                                          None))).lower(),
        "PROP_NAMESERVER_ADDR": namesrv, "PROP_CLIENT_VERSION": f"cometmq {__version__}",
        "PROP_CONSUMER_START_TIMESTAMP": str(_STARTED_MS), "messageModel": data.message_model,
        "consumeFromWhere": data.consume_from_where,
    }
    subscriptions = [bean(classFilterMode=False, codeSet=[], expressionType=s.expression_type,
                          subString=s.sub_string, subVersion=s.sub_version, tagsSet=list(s.tags), topic=s.topic)
                     for s in sorted(data.subscriptions, key=lambda s: s.topic)]
    return fastjson_dumps(bean(jstack=None, mqPopTable={}, mqTable=mq_table, properties=properties, statusTable={},
                               subscriptionSet=subscriptions, userConsumerInfo={}))


async def answer_running_info(consumers: dict[str, ConsumerLike], namesrv: str,
                              cmd: RemotingCommand) -> RemotingCommand:
    group = cmd.ext_fields.get("consumerGroup", "")
    consumer = consumers.get(group)
    if consumer is None:
        return make_response(cmd, ResponseCode.SYSTEM_ERROR,
                             f"The Consumer Group <{group}> not exist in this consumer")
    return make_response(cmd, body=running_info(consumer, namesrv))


async def answer_consume_directly(consumers: dict[str, ConsumerLike], cmd: RemotingCommand) -> RemotingCommand:
    group = cmd.ext_fields.get("consumerGroup", "")
    consumer = consumers.get(group)
    consume = getattr(consumer, "consume_directly", None)
    if consumer is None or consume is None:
        return make_response(cmd, ResponseCode.SYSTEM_ERROR,
                             f"The Consumer Group <{group}> not exist in this consumer or is not a push consumer")
    broker_name = cmd.ext_fields.get("brokerName", "")
    try:
        msgs = [MessageExt.from_record(rec, broker_name) for rec in iter_records(cmd.body or b"")]
    except ProtocolError as exc:
        return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"bad message: {exc}")
    if len(msgs) != 1:
        return make_response(cmd, ResponseCode.SYSTEM_ERROR, f"expected one message, got {len(msgs)}")
    log.info("consuming %s of %s directly, as a tool asked", msgs[0].msg_id, group)
    result: dict[str, Any] = await consume(msgs[0])
    return make_response(cmd, body=fastjson_dumps(bean(**result)))
