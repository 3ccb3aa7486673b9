"""The broker's side of timer messages: the send-path rewrite, the recall handle in send responses,
RECALL_MESSAGE (370, RocketMQ 5) and GET_TIMER_METRICS (61), and the service built on first use (issue [16]: an idle
broker imports only what it uses).

The service (``timer.service`` and the nine modules behind it: 0.4 MiB of an idle broker) is built, loaded and
started when the first timer-topic record is dispatched (a timer message, a recall's delete marker, or a replica
copying its master's), at the first GET_TIMER_METRICS, or at load when the broker holds timer state (its files,
or timer-topic records). It runs on a master and on a replica alike (a replica indexes and delivers nothing), so
the broker loads and starts it with its own start, not with the master's services. The timer topic's consume queue
is the source of truth of what to index, so a service built after records arrived indexes them from there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cometmq.broker.appender import Appender
from cometmq.broker.config import BrokerConfig, timer_config_of
from cometmq.broker.first_use import BuiltOnFirstUse
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
from cometmq.timer.config import timer_files
from cometmq.timer.message import (
    TIMER_TOPIC,
    RecallHandle,
    Rewrite,
    delete_marker,
    queued_records_floor,
    recall_handle_for,
    requested_delivery,
    rewrite_for_timer,
    strip_timer_request,
)

if TYPE_CHECKING:
    from cometmq.timer.service import TimerMessageService

log = logging.getLogger(__name__)

#: seconds before a first build that failed is tried again: the first wait, doubled after each failure up to the last
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0


class TimerBridge(BuiltOnFirstUse["TimerMessageService"]):
    """The broker's timer messages; see the module docstring. Attributes it does not have are the service's (built
    then). ``service`` is the service when built, else None: a metrics scrape reads it without building anything."""

    #: as a send hook: producers' sends only (a send-back keeps the timer properties it was delivered with)
    kinds = frozenset({SendKind.SEND})

    def __init__(self, broker_config: BrokerConfig, store: MessageStore, appender: Appender,
                 topics: TopicConfigManager, clock: Callable[[], int]) -> None:
        super().__init__()
        self.broker_config = broker_config
        self.store = store
        self.topics = topics
        self.appender = appender
        self.clock = clock
        self.config = timer_config_of(broker_config)
        #: whether the service delivers (a master) or only indexes (a replica); handed to it when it is built
        self.deliver = True
        #: a first use asked for from an arrival (to run once the arrival's send is answered) or a retry, on this loop
        self._build_soon: asyncio.Handle | asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry_s = RETRY_FIRST_S
        if self.config.enable:
            # Until the service is built (it then answers for itself): every record of the timer topic is kept.
            store.cleaner.pin("timer", lambda: queued_records_floor(store))

    @property
    def service(self) -> TimerMessageService | None:
        return self._part

    # -- the service on first use (broker/first_use.py) -----------------------------------------------------------
    def _make(self) -> TimerMessageService:
        if not self.config.enable:
            raise RuntimeError("timer messages are disabled (timerWheelEnable=false)")
        from cometmq.timer.service import TimerMessageService

        return TimerMessageService(self.store, self.config, self.appender.put, clock=self.clock,
                                   deliver=self.deliver)

    def _holds_state(self) -> bool:
        if not self.config.enable:
            return False
        timerlog, wheel, checkpoint = timer_files(Path(self.store.config.store_path))
        return (checkpoint.exists() or wheel.exists() or timerlog.exists()
                or any(topic == TIMER_TOPIC for topic, _ in self.store.queues))

    def _start_part(self, part: TimerMessageService) -> None:
        part.start_tasks()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await super().start()

    async def stop(self) -> None:
        if self._build_soon is not None:
            self._build_soon.cancel()
            self._build_soon = None
        await super().stop()

    def _build_now(self) -> None:
        self._build_soon = None
        if not self._started or self._part is not None:
            return
        try:
            self._get()
        except Exception:  # (its messages wait in the timer topic, which it indexes once built)
            log.exception("the timer service could not be built; timer messages wait until it is (again in %g s)",
                          self._retry_s)
            if self._loop is not None:
                self._build_soon = self._loop.call_later(self._retry_s, self._build_now)
            self._retry_s = min(2 * self._retry_s, RETRY_MAX_S)
        else:
            self._retry_s = RETRY_FIRST_S

    # -- the store's arrivals, the role, the replicas' checkpoint ---------------------------------------------
    def on_arrivals(self, reqs: list[DispatchRequest]) -> None:
        """The store's batch arrival listener (every dispatched batch). Unbuilt, the first timer-topic record asks
        for the service, built once the loop turn is over (the record's send is answered first; the service then
        indexes it from the timer topic's queue)."""
        service = self._part
        if service is not None:
            service.on_arrivals(reqs)
        elif self._started and self._build_soon is None and self._loop is not None and self.config.enable:
            for req in reqs:
                if req.topic == TIMER_TOPIC:
                    self._build_soon = self._loop.call_soon_threadsafe(self._build_now)
                    return

    def set_deliver(self, on: bool) -> None:
        """Deliver (a master) or only index (a replica): the service's switch, once built."""
        self.deliver = on
        if self._part is not None:
            self._part.set_deliver(on)

    def on_log_truncated(self) -> None:
        """The HA hook: the commit log was cut back. An unbuilt service has nothing indexed to take back."""
        if self._part is not None:
            self._part.on_log_truncated()

    @property
    def loaded(self) -> bool:
        """Whether the service is built and loaded (a replica's metadata sync copies the checkpoint only then)."""
        return self._part is not None and self._part.loaded

    def checkpoint_info(self) -> dict[str, Any]:
        return self._get().checkpoint_info()

    def apply_master_checkpoint(self, info: Mapping[str, Any]) -> bool:
        return self._get().apply_master_checkpoint(info)

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.RECALL_MESSAGE: self.recall, RequestCode.GET_TIMER_METRICS: self.timer_metrics}

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
        if not self.config.enable:
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
        if not config.recall_message_enable or not self.config.enable:
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
        body = self._get().metrics() if self.config.enable else {"enabled": False}
        return make_response(cmd, ResponseCode.SUCCESS, None, {}, json.dumps(body).encode())
