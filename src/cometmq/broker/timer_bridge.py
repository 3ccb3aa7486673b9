"""The broker's side of timer messages: the send-path rewrite, the recall handle in send responses,
RECALL_MESSAGE (370, RocketMQ 5) and GET_TIMER_METRICS (61), and the service's lifecycle."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from cometmq.broker.appender import Appender
from cometmq.broker.config import BrokerConfig
from cometmq.broker.send import born_host_of
from cometmq.broker.send_hooks import SendContext, SendKind
from cometmq.broker.topics import SCHEDULE_TOPIC, TopicConfigManager
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_response
from cometmq.protocol.route import perm_writable
from cometmq.store.message import DispatchRequest, MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult
from cometmq.timer.config import TimerConfig
from cometmq.timer.message import (
    RecallHandle,
    Rewrite,
    delete_marker,
    recall_handle_for,
    requested_delivery,
    rewrite_for_timer,
    strip_timer_request,
)
from cometmq.timer.service import TimerMessageService

log = logging.getLogger(__name__)


def _no_timer(reqs: list[DispatchRequest]) -> None:
    pass


def timer_config_of(c: BrokerConfig) -> TimerConfig:
    return TimerConfig(enable=c.timer_wheel_enable, precision_ms=c.timer_precision_ms,
                       max_delay_sec=c.timer_max_delay_sec, roll_window_slot=c.timer_roll_window_slot,
                       timerlog_file_size=c.timer_log_file_size, flush_interval_ms=c.timer_flush_interval_ms,
                       preallocate=c.store.preallocate)


class TimerBridge:
    #: as a send hook: producers' sends only (a send-back keeps the timer properties it was delivered with)
    kinds = frozenset({SendKind.SEND})

    def __init__(self, broker_config: BrokerConfig, store: MessageStore, appender: Appender,
                 topics: TopicConfigManager, clock: Callable[[], int]) -> None:
        self.broker_config = broker_config
        self.topics = topics
        self.appender = appender
        self.clock = clock
        self.config = timer_config_of(broker_config)
        self.service: TimerMessageService | None = (
            TimerMessageService(store, self.config, appender.put, clock=clock) if self.config.enable else None
        )
        #: the store's arrival listener, called for every dispatched batch: bound straight to the service's
        self.on_arrivals: Callable[[list[DispatchRequest]], None] = (
            self.service.on_arrivals if self.service is not None else _no_timer)

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.RECALL_MESSAGE: self.recall, RequestCode.GET_TIMER_METRICS: self.timer_metrics}

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.service is not None:
            await asyncio.to_thread(self.service.load)
            await self.service.start()

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()

    # -- send path (a send hook, broker/send_hooks.py) ---------------------------------------------------
    def before_put(self, msgs: list[MessageInner], ctx: SendContext) -> bool:
        for m in msgs:
            self.rewrite_if_timer(m)
        return False

    def after_put(self, msgs: list[MessageInner], result: PutResult, ctx: SendContext) -> None:
        """A single timer message's send answer carries the handle that can cancel it."""
        if not ctx.batch and result.ok:
            handle = recall_handle_for(msgs[0], self.broker_config.broker_name)
            if handle is not None:
                ctx.response_ext["recallHandle"] = handle

    def rewrite_if_timer(self, msg: MessageInner) -> None:
        """Park a message with TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS under the timer topic."""
        if msg.topic == SCHEDULE_TOPIC:
            strip_timer_request(msg)  # a delay level wins over a timer request, as in RocketMQ
            return
        if self.service is None:
            try:
                wants = requested_delivery(msg.properties, self.clock()) is not None
            except ValueError:
                wants = True
            if wants:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "timer messages are disabled (timerWheelEnable)")
            return
        result = rewrite_for_timer(msg, self.clock(), self.config.max_delay_ms)
        if result.outcome is Rewrite.ILLEGAL:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, result.remark)

    # -- RECALL_MESSAGE ------------------------------------------------------------------------------
    async def recall(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        config = self.broker_config
        fields = cmd.ext_fields
        topic, raw_handle = fields.get("topic"), fields.get("recallHandle")
        if not topic or not raw_handle:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "RECALL_MESSAGE needs topic and recallHandle")
        if not config.recall_message_enable or self.service is None:
            raise RemotingError(ResponseCode.NO_PERMISSION, "recall failed, operation is forbidden")
        if not perm_writable(config.broker_permission):
            raise RemotingError(ResponseCode.SERVICE_NOT_AVAILABLE, "recall failed, broker service not available")
        if self.topics.get(topic) is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist")
        try:
            handle = RecallHandle.decode(raw_handle)
        except ValueError as exc:
            raise RemotingError(ResponseCode.ILLEGAL_OPERATION, str(exc)) from None
        if handle.topic != topic:
            raise RemotingError(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != config.broker_name:
            raise RemotingError(ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available")
        now = self.clock()
        try:
            deliver = int(handle.timestamp)
        except ValueError:
            deliver = -1
        left = deliver - now
        if left <= 0 or left >= self.config.max_delay_ms:
            raise RemotingError(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        marker = delete_marker(topic, handle.message_id, deliver, producer_group=fields.get("producerGroup"),
                               born_ms=now, born_host=born_host_of(conn))
        if rewrite_for_timer(marker, now, self.config.max_delay_ms).outcome is not Rewrite.SCHEDULED:
            raise RemotingError(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        result = await self.appender.put([marker])
        if not result.stored:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"recall failed, execute error: {result.status.value}")
        return make_response(cmd, ResponseCode.SUCCESS, None, {"msgId": handle.message_id})

    # -- GET_TIMER_METRICS ---------------------------------------------------------------------------
    async def timer_metrics(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """cometmq's timer metrics as a JSON body (not RocketMQ's per-topic TimerMetrics format)."""
        body = self.service.metrics() if self.service is not None else {"enabled": False}
        return make_response(cmd, ResponseCode.SUCCESS, None, {}, json.dumps(body).encode())
