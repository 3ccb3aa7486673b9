"""BrokerController: builds the broker from its config, wires the processors, starts and stops it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cometmq.broker.admin import AdminProcessor
from cometmq.broker.appender import Appender
from cometmq.broker.clients import ConsumerManager, ProducerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.locks import RebalanceLockManager
from cometmq.broker.offsets import ConsumerOffsetManager
from cometmq.broker.pop.processor import PopProcessor
from cometmq.broker.pop.service import PopService
from cometmq.broker.pull import PullProcessor
from cometmq.broker.registration import NamesrvRegistrar
from cometmq.broker.schedule import ScheduleMessageService
from cometmq.broker.send import SendProcessor
from cometmq.broker.send_hooks import SendHooks
from cometmq.broker.timer_bridge import TimerBridge
from cometmq.broker.topics import TopicConfigManager
from cometmq.broker.transaction import TransactionalMessageService
from cometmq.common.periodic import Periodic
from cometmq.common.tasks import cancel_and_wait
from cometmq.net.client import RemotingClient
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RequestCode
from cometmq.store.message_store import MessageStore

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerController:
    """Builds the broker's parts from its config, hands each the collaborators it uses, starts and stops them.
    Nothing imports this module back (tests/test_layers.py): the parts know each other, not the broker."""

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], int] = _wall_ms) -> None:
        self.config = config
        self.clock = clock
        store_cfg = config.store
        self.store = store = MessageStore(store_cfg, store_host=(config.broker_ip or config.listen_host,
                                                                 config.listen_port), clock=clock)
        cfg_dir = store_cfg.config_dir
        self.topics = topics = TopicConfigManager(
            cfg_dir / "topics.json", default_queue_nums=config.default_topic_queue_nums,
            broker_perm=config.broker_permission, on_change=self._topics_changed)
        self.groups = groups = SubscriptionGroupManager(cfg_dir / "subscriptionGroup.json",
                                                        auto_create=config.auto_create_subscription_group,
                                                        default_retry_max=config.max_reconsume_times)
        self.offsets = offsets = ConsumerOffsetManager(cfg_dir / "consumerOffset.json")
        self.consumers = ConsumerManager(clock, config.channel_expired_ms)
        self.producers = ProducerManager(clock, config.channel_expired_ms)
        self.locks = RebalanceLockManager(clock, config.lock_max_live_time_ms)
        # Every write goes through the one appender; its completion means "durable as configured".
        self.appender = appender = Appender(store, sync_flush_timeout_s=store_cfg.sync_flush_timeout_ms / 1000)
        self.schedule = ScheduleMessageService(store, appender, config.message_delay_level,
                                               cfg_dir / "delayOffset.json", clock)
        self.timer = TimerBridge(config, store, appender, topics, clock)
        self.transactions = TransactionalMessageService(config, store, appender, topics, self.producers, clock)
        self.pop = PopService(config, store, appender, offsets=offsets, groups=groups, topics=topics, clock=clock)
        # The send path's rewrites, in the order they run: a half is neither delayed nor timed; a delay level
        # wins over a timer request.
        self.send_hooks = SendHooks()
        self.send_hooks.register(self.transactions)
        self.send_hooks.register(self.schedule)
        self.send_hooks.register(self.timer)
        self.send_processor = SendProcessor(config, topics, groups, appender, self.send_hooks,
                                            read_record=store.read_record,
                                            store_host=lambda: store.commitlog.store_host)
        self.pull_processor = PullProcessor(config, store, topics, groups, self.consumers, offsets)
        self.hold = self.pull_processor.hold
        self.admin = AdminProcessor(config, store, topics=topics, groups=groups, offsets=offsets,
                                    consumers=self.consumers, producers=self.producers, locks=self.locks,
                                    held_pulls=lambda: self.hold.held_count, clock=clock)
        self.pop_processor = PopProcessor(config, store, groups, topics, self.pop)
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
        self.registrar: NamesrvRegistrar | None = None
        self._housekeeping = Periodic("broker-housekeeping", config.consumer_offset_persist_interval_ms / 1000,
                                      self._housekeep, logger=log)
        self._tasks: set[asyncio.Task[object]] = set()
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
        self.appender.start(loop)
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
        self._housekeeping.start()
        if self.config.namesrv_addrs:
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
            await self.registrar.stop()
        await self._housekeeping.stop()
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
        self.appender.close()
        self.offsets.persist()
        await asyncio.to_thread(self.store.shutdown)

    @property
    def addr(self) -> str:
        return self.config.advertised_addr

    def _housekeep(self) -> None:
        self.offsets.persist_if_dirty()
        self.consumers.scan_expired()
        self.producers.scan_expired()

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
            task: asyncio.Task[object] = asyncio.ensure_future(registrar.register_now())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


def _packed_host(config: BrokerConfig) -> bytes:
    from cometmq.protocol.message import pack_host

    return pack_host(config.broker_ip or config.listen_host, config.listen_port)
