"""BrokerController: builds the broker from its config, wires the processors, starts and stops it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from cometmq.broker.admin import AdminProcessor
from cometmq.broker.append_batcher import AppendBatcher
from cometmq.broker.clients import ConsumerManager, ProducerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.flush_waiter import FlushWaiter
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.locks import RebalanceLockManager
from cometmq.broker.long_polling import PullRequestHoldService
from cometmq.broker.offsets import ConsumerOffsetManager
from cometmq.broker.pop.processor import PopProcessor
from cometmq.broker.pop.service import PopService
from cometmq.broker.pull import PullProcessor
from cometmq.broker.schedule import ScheduleMessageService
from cometmq.broker.send import SendProcessor
from cometmq.broker.timer_bridge import TimerBridge
from cometmq.broker.topics import RETRY_GROUP_TOPIC_PREFIX, TopicConfigManager, check_topic_name
from cometmq.broker.transaction import TransactionalMessageService
from cometmq.common.tasks import cancel_and_wait
from cometmq.net.client import RemotingClient
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.route import TopicConfig
from cometmq.store.message import MessageInner
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult, PutStatus

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerController:
    def __init__(self, config: BrokerConfig, *, clock: Callable[[], int] = _wall_ms) -> None:
        self.config = config
        self.clock = clock
        store_cfg = config.store
        self.store = MessageStore(store_cfg, store_host=(config.broker_ip or config.listen_host, config.listen_port),
                                  clock=clock)
        cfg_dir = store_cfg.config_dir
        self.topics = TopicConfigManager(cfg_dir / "topics.json", default_queue_nums=config.default_topic_queue_nums,
                                         broker_perm=config.broker_permission, on_change=self._topics_changed)
        self.groups = SubscriptionGroupManager(cfg_dir / "subscriptionGroup.json",
                                               auto_create=config.auto_create_subscription_group,
                                               default_retry_max=config.max_reconsume_times)
        self.offsets = ConsumerOffsetManager(cfg_dir / "consumerOffset.json")
        self.consumers = ConsumerManager(clock, config.channel_expired_ms)
        self.producers = ProducerManager(clock, config.channel_expired_ms)
        self.locks = RebalanceLockManager(clock, config.lock_max_live_time_ms)
        self.schedule = ScheduleMessageService(self, cfg_dir / "delayOffset.json", clock)
        self.timer = TimerBridge(self)
        self.send_processor = SendProcessor(self)
        self.pull_processor = PullProcessor(self)
        self.admin = AdminProcessor(self)
        self.pop = PopService(self)
        self.pop_processor = PopProcessor(self, self.pop)
        self.transactions = TransactionalMessageService(self)
        self.hold = PullRequestHoldService(self.store.max_offset, self.pull_processor.replay,
                                           check_interval_s=config.hold_check_interval_ms / 1000)
        self.dispatcher: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: self.send_processor.send,
            RequestCode.SEND_MESSAGE_V2: self.send_processor.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send_processor.send,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_processor.send_back,
            RequestCode.PULL_MESSAGE: self.pull_processor.pull,
            **self.admin.handlers(),
            **self.timer.handlers(),
            **self.pop_processor.handlers(),
            **self.transactions.handlers(),
        }
        self.server: RemotingServer | None = None
        self.client: RemotingClient | None = None
        self.registrar: object | None = None
        self.flush_waiter: FlushWaiter | None = None
        self.appender: AppendBatcher | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Store recovery reads files and may scan a lot: keep the loop free while it runs.
        await asyncio.to_thread(self.store.start)
        self.topics.load()
        if not self.config.auto_create_topic_enable:
            # As RocketMQ: without auto-creation there is no TBW102 route for clients to fall back on.
            self.topics.topics.pop("TBW102", None)
        self.topics.persist()
        self.groups.load()
        self.offsets.load()
        self.schedule.load()
        self.flush_waiter = FlushWaiter(loop, self.store.flushed_offset)
        self.store.add_flush_listener(self.flush_waiter.on_flushed)
        waiter, timeout_s = self.flush_waiter, self.config.store.sync_flush_timeout_ms / 1000
        store = self.store
        if store.sync_flush:
            # The batcher commits each batch itself (store.commit), so appends do not wake the flush thread.
            self.appender = AppendBatcher(loop, functools.partial(store.put_messages, request_flush=False),
                                          wait_flushed=lambda end: waiter.wait(end, timeout_s), commit=store.commit)
        else:
            self.appender = AppendBatcher(loop, store.put_messages)
        self.store.add_arrival_batch_listener(self.hold.on_arrivals)
        self.store.add_arrival_batch_listener(self.schedule.on_arrivals)
        self.store.add_arrival_batch_listener(self.timer.on_arrivals)
        self.store.add_arrival_batch_listener(self.pop.on_arrivals)
        self.pop.load()
        self.transactions.load()
        await self.hold.start()
        await self.schedule.start()
        await self.timer.start()
        await self.pop.start()
        await self.transactions.start()
        self.server = RemotingServer(self.config.listen_host, self.config.listen_port, self.dispatcher)
        self.server.add_close_callback(self._connection_closed)
        await self.server.start()
        if self.config.listen_port == 0:
            # Port 0 (tests): the real port is known only now; messages must carry it as their store host.
            self.config = self.config.replace(listen_port=self.server.port)
            self.store.commitlog.store_host = _packed_host(self.config)
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="broker-housekeeping"))
        if self.config.namesrv_addrs:
            from cometmq.broker.registration import NamesrvRegistrar

            self.client = RemotingClient()
            registrar = NamesrvRegistrar(self.client, self.config.namesrv_addrs, self.config.broker_cluster_name,
                                         self.config.broker_name, self.config.broker_id, self.addr, self.addr,
                                         self.topics.all, self.config.register_interval_ms / 1000)
            self.registrar = registrar
            await registrar.start()
        self.started = True
        log.info("broker %s listening on %s (data in %s)", self.config.broker_name, self.addr,
                 self.config.store.store_path)

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        if self.registrar is not None:
            await self.registrar.stop()  # type: ignore[attr-defined]
        await cancel_and_wait(self._tasks)
        await self.transactions.stop()
        await self.pop.stop()
        await self.timer.stop()
        await self.schedule.stop()
        await self.hold.stop()
        if self.server is not None:
            await self.server.stop()
        if self.client is not None:
            await self.client.close()
        if self.flush_waiter is not None:
            self.flush_waiter.close()
        self.offsets.persist()
        await asyncio.to_thread(self.store.shutdown)

    @property
    def addr(self) -> str:
        return self.config.advertised_addr

    async def _housekeeping(self) -> None:
        interval = self.config.consumer_offset_persist_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.offsets.persist_if_dirty()
                self.consumers.scan_expired()
                self.producers.scan_expired()
            except Exception:
                log.exception("broker housekeeping failed")

    def _connection_closed(self, conn: RemotingConnection) -> None:
        self.consumers.connection_closed(conn)
        self.producers.connection_closed(conn)
        client_id = conn.attributes.get("client_id")
        if client_id and not any(ch.client_id == client_id for info in self.consumers.groups.values()
                                 for ch in info.channels.values()):
            # The client is gone (closed or killed): free its queue locks now, so the orderly consumers that
            # take over its queues need not wait for the lock lifetime (60 s) to pass.
            released = self.locks.unlock_client(client_id)
            if released:
                log.info("released %d queue locks of departed client %s", released, client_id)

    def _topics_changed(self) -> None:
        registrar = self.registrar
        if registrar is not None:
            task = asyncio.ensure_future(registrar.register_now())  # type: ignore[attr-defined]
            self._tasks.append(task)
            task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    # -- shared helpers -----------------------------------------------------------------------------------
    def topic_for_send(self, topic: str, default_topic: str, queue_nums: int, remote: str) -> TopicConfig:
        check_topic_name(topic)
        cfg = self.topics.get(topic)
        if cfg is not None:
            return cfg
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self.topics.create_system_topic(topic, 1)
        created = self.topics.create_in_send(topic, default_topic or "TBW102", queue_nums)
        if created is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST,
                                f"topic {topic} does not exist and may not be auto-created (from {remote})")
        log.info("auto-created topic %s with %d queues for %s", topic, created.write_queue_nums, remote)
        return created

    async def put_messages(self, msgs: list[MessageInner]) -> PutResult:
        """Store messages; under SYNC_FLUSH the answer waits for the group commit that covers them. Concurrent
        requests' appends are coalesced into one batch per event-loop turn (broker/append_batcher.py)."""
        if self.appender is not None:
            return await self.appender.put(msgs)
        result = self.store.put_messages(msgs)
        if result.ok and self.store.sync_flush and self.flush_waiter is not None:
            flushed = await self.flush_waiter.wait(result.end_offset, self.config.store.sync_flush_timeout_ms / 1000)
            if not flushed:
                result.status = PutStatus.FLUSH_DISK_TIMEOUT
        return result


def _packed_host(config: BrokerConfig) -> bytes:
    from cometmq.protocol.message import pack_host

    return pack_host(config.broker_ip or config.listen_host, config.listen_port)
