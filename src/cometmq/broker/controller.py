"""BrokerController: builds the broker from its config, wires the processors, starts and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cometmq.broker.admin import AdminProcessor
from cometmq.broker.appender import Appender
from cometmq.broker.clients import ConsumerManager, ProducerManager
from cometmq.broker.config import BrokerConfig
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.ha.metadata import MetadataProcessor, SlaveMetadataSync
from cometmq.broker.ha.processor import HAProcessor
from cometmq.broker.ha.service import HAConfig, ReplicationService, Role
from cometmq.broker.locks import RebalanceLockManager
from cometmq.broker.offsets import ConsumerOffsetManager
from cometmq.broker.pop.front import Pop
from cometmq.broker.pull import PullProcessor
from cometmq.broker.pull_fast import PullFastPath
from cometmq.broker.registration import NamesrvRegistrar
from cometmq.broker.schedule import ScheduleMessageService
from cometmq.broker.send import SendProcessor
from cometmq.broker.send_fast import SendFastPath
from cometmq.broker.send_hooks import SendHooks
from cometmq.broker.stats import BrokerStats
from cometmq.broker.stats_log import StatsLog, Totals
from cometmq.broker.stats_windows import StatsWindows
from cometmq.broker.timer_bridge import TimerBridge
from cometmq.broker.topics import TopicConfigManager
from cometmq.broker.transaction import Transactions
from cometmq.common.periodic import Periodic
from cometmq.common.tasks import cancel_and_wait
from cometmq.net.client import RemotingClient
from cometmq.net.connection import Dispatcher, FastPath, Handler, RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.net.tls import ServerTls
from cometmq.protocol.acl import Credentials
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request
from cometmq.protocol.route import ClusterInfo, TopicConfig
from cometmq.store.dir_lock import lock_data_folder, unlock_data_folder
from cometmq.store.epoch_file import EpochFile
from cometmq.store.message_store import MessageStore

if TYPE_CHECKING:
    from cometmq.acl.control import AccessControl
    from cometmq.broker.ha.controller_client import ControllerClient, ControllerModeConfig

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def _quietly(step: Callable[[], object]) -> None:
    """Run one stop of a start that failed (awaited if it is a coroutine): an error there is logged, so the other
    stops still run and the start's own error is the one the caller sees."""
    try:
        result = step()
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("while stopping what a failed start had started")


class BrokerController:
    """Builds the broker's parts from its config, hands each the collaborators it uses, starts and stops them.
    Nothing imports this module back (tests/test_layers.py): the parts know each other, not the broker."""

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], int] = _wall_ms) -> None:
        self.config = config
        self.clock = clock
        store_cfg = config.store
        #: one broker per data folder (store/dir_lock.py): taken before anything reads or writes it
        self._folder_lock = lock_data_folder(store_cfg.store_path)
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
        self.consumers = ConsumerManager(clock, config.channel_expired_ms,
                                         notify_window_ms=config.notify_consumer_ids_changed_window_ms,
                                         notify_enable=config.notify_consumer_ids_changed_enable)
        self.producers = ProducerManager(clock, config.channel_expired_ms)
        self.locks = RebalanceLockManager(clock, config.lock_max_live_time_ms)
        #: the broker's counters, kept with metrics on or off (cometmq.metrics exports them; the windows rate them)
        self.stats = BrokerStats()
        self.stats_windows = StatsWindows(self.stats, config.broker_cluster_name)
        # Every write goes through the one appender; its completion means "durable as configured".
        self.appender = appender = Appender(store, sync_flush_timeout_s=store_cfg.sync_flush_timeout_ms / 1000)
        self.schedule = ScheduleMessageService(store, appender, config.message_delay_level,
                                               cfg_dir / "delayOffset.json", clock)
        self.timer = TimerBridge(config, store, appender, topics, clock)
        self.transactions = Transactions(config, store, appender, topics, self.producers, clock)
        self.pop = Pop(config, store, appender, offsets=offsets, groups=groups, topics=topics, clock=clock,
                       stats=self.stats)  # (its service built on first use)
        # The send path's rewrites, in the order they run: a half is neither delayed nor timed; a delay level
        # wins over a timer request.
        self.send_hooks = SendHooks()
        self.send_hooks.register(self.transactions)
        self.send_hooks.register(self.schedule)
        self.send_hooks.register(self.timer)
        self.send_processor = SendProcessor(config, topics, groups, appender, self.send_hooks,
                                            read_record=store.read_record,
                                            store_host=lambda: store.commitlog.store_host, stats=self.stats)
        self.pull_processor = PullProcessor(config, store, topics, groups, self.consumers, offsets, self.stats)
        self.hold = self.pull_processor.hold
        # A held pull woken by the one record it gets is answered from a template (broker/pull_fast.py).
        self.hold.fast_replay = PullFastPath(self.pull_processor)
        self.admin = AdminProcessor(config, store, topics=topics, groups=groups, offsets=offsets,
                                    consumers=self.consumers, producers=self.producers, locks=self.locks,
                                    held_pulls=lambda: self.hold.held_count, clock=clock, stats=self.stats,
                                    windows=self.stats_windows, forget_pop=self.pop.forget)
        # Controller mode (off by default): the controller names the id, the role and the SyncStateSet.
        self.controller_mode: ControllerModeConfig | None = None
        if config.enable_controller_mode:  # its client module is imported only in controller mode
            from cometmq.broker.ha.controller_client import ControllerModeConfig

            self.controller_mode = ControllerModeConfig(
                config.broker_cluster_name, config.broker_name, tuple(config.controller_addrs),
                heartbeat_interval_ms=config.broker_heartbeat_interval_ms,
                heartbeat_timeout_ms=config.controller_heartbeat_timeout_ms,
                sync_broker_metadata_period_ms=config.sync_broker_metadata_period_ms,
                sync_controller_metadata_period_ms=config.sync_controller_metadata_period_ms,
                election_priority=config.election_priority)
        self.controller_client: ControllerClient | None = None
        # Replication: the broker's role in its group, the HA link, and the gate the appender asks.
        self.replication = ReplicationService(
            # Port 0 (tests): the HA port is an ephemeral one too.
            HAConfig(config.listen_host, config.ha_port if config.listen_port else max(config.ha_listen_port, 0),
                     all_ack=config.all_ack_in_sync_state_set,
                     min_in_sync_replicas=config.min_in_sync_replicas,
                     max_not_catchup_ms=config.ha_max_time_slave_not_catchup_ms,
                     heartbeat_interval_ms=config.ha_send_heartbeat_interval_ms,
                     housekeeping_interval_ms=config.ha_housekeeping_interval_ms,
                     ack_timeout_ms=config.slave_ack_timeout_ms, transfer_batch_size=config.ha_transfer_batch_size),
            store, appender, EpochFile(Path(store_cfg.store_path) / "epochFileCheckpoint"),
            broker_id=config.broker_id,
            clock=clock, register=self._register_as, master_ha_addr=self._master_ha_addr,
            master_addr=lambda: self.registrar.master_addr if self.registrar is not None else None,
            on_truncated=self.timer.on_log_truncated,
            admit=self._is_group_member,
            start_master_services=self._start_master_services, stop_master_services=self._stop_master_services,
            controller_mode=self.controller_mode is not None,
            lease_ms=self.controller_mode.lease_ms if self.controller_mode is not None else 0,
            propose_sync_state_set=self._propose_sync_state_set)
        self.ha_processor = HAProcessor(self.replication, cluster=config.broker_cluster_name,
                                        broker_name=config.broker_name)
        self.metadata = MetadataProcessor(offsets=offsets, schedule=self.schedule, timer=self.timer)
        self.dispatcher: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: self.send_processor.send,
            RequestCode.SEND_MESSAGE_V2: self.send_processor.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send_processor.send,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_processor.send_back,
            RequestCode.PULL_MESSAGE: self.pull_processor.pull,
            **self.admin.handlers(),
            **self.timer.handlers(),
            **self.pop.handlers(),
            **self.transactions.handlers(),
            **self.ha_processor.handlers(),
            **self.metadata.handlers(),
        }
        # Access control (aclEnable): every request is checked at the server's handler table (acl/remoting.py)
        self.acl: AccessControl | None = None
        if config.acl_enable:  # the ACL modules are imported only when access control is on
            from cometmq.acl.admin import AclAdminProcessor
            from cometmq.acl.control import AccessControl

            self.acl = AccessControl(config.acl_path)
            self.dispatcher.update(AclAdminProcessor(self.acl, broker_name=config.broker_name,
                                                     cluster_name=config.broker_cluster_name,
                                                     broker_addr=lambda: self.addr).handlers())
        self.server: RemotingServer | None = None
        self.client: RemotingClient | None = None
        self.registrar: NamesrvRegistrar | None = None
        self.metadata_sync: SlaveMetadataSync | None = None
        self._master_asked_at = time.monotonic()
        self._housekeeping = Periodic("broker-housekeeping", config.consumer_offset_persist_interval_ms / 1000,
                                      self._housekeep, logger=log)
        self.stats_log = StatsLog(config.broker_name, config.stats_log_interval_s, self._stats_totals,
                                  self._stats_gauges)
        self._tasks: set[asyncio.Task[object]] = set()
        self.started = False

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the store, then the services over it, then the server and the registration. A step that fails
        stops what the steps before it started (the store shut down cleanly: no abort file, so the next start does
        not recover as after a crash), lets go of the data folder, and the error goes on to the caller."""
        async with contextlib.AsyncExitStack() as undo:
            undo.callback(unlock_data_folder, self._folder_lock)
            await self._start(undo)
            undo.pop_all()  # started: stop() stops it all from now on
        self.started = True
        log.info("broker %s listening on %s (data in %s)", self.config.broker_name, self.addr,
                 self.config.store.store_path)

    async def _start(self, undo: contextlib.AsyncExitStack) -> None:
        """The start's steps; each one that starts something pushes its stop onto ``undo`` (run, last first, when a
        later step fails: each logged and passed over if it fails in turn)."""
        def on_failure(step: Callable[[], object]) -> None:
            undo.push_async_callback(_quietly, step)

        if self.acl is not None:
            self.acl.load()  # a bad ACL file stops the start before anything runs, naming its line and key
        loop = asyncio.get_running_loop()
        # Store recovery reads files and may scan a lot: keep the loop free while it runs.
        await asyncio.to_thread(self.store.start)
        on_failure(lambda: asyncio.to_thread(self.store.shutdown))
        self.topics.load()
        if not self.config.auto_create_topic_enable:
            # As RocketMQ: without auto-creation there is no TBW102 route for clients to fall back on.
            self.topics.topics.pop("TBW102", None)
        self.topics.persist()
        self.groups.load()
        self.offsets.load()
        on_failure(self.groups.persist_if_dirty)  # (loaded: what clients changed once the server took requests)
        on_failure(self.offsets.persist)
        self.appender.start(loop)
        on_failure(self.appender.close)
        self.store.add_arrival_batch_listener(self.hold.on_arrivals)
        self.store.add_arrival_batch_listener(self.schedule.on_arrivals)
        self.store.add_arrival_batch_listener(self.timer.on_arrivals)
        self.store.add_arrival_batch_listener(self.pop.on_arrivals)
        await self.hold.start()
        on_failure(self.hold.stop)
        master = self.replication.role is Role.MASTER
        # A replica's timer indexes the master's timer records and delivers nothing (timer/replica.py); the service
        # is built at load only when the broker holds timer state (broker/timer_bridge.py).
        self.timer.deliver = master
        await asyncio.to_thread(self.timer.load)
        await self.timer.start()
        on_failure(self.timer.stop)
        if master:
            await self._start_master_services()
        on_failure(self._stop_master_services_if_master)  # (the role may change as replication starts)
        # The role and its gate are in force before the first request: a replica never takes a write.
        on_failure(self.replication.stop)  # (stops what a start that failed half-way started: the HA port's server)
        await self.replication.start()
        self.appender.set_replication(self.replication)
        inner = self.config.inner_credentials  # innerClientAuthenticationCredentials: sign our own requests
        if inner:
            from cometmq.acl.remoting import SigningRemotingClient  # imported only when the broker signs

            self.client = SigningRemotingClient(Credentials(*inner), ssl=self.config.tls.client_context())
        else:
            self.client = RemotingClient(ssl=self.config.tls.client_context())  # tls.enable: TLS to namesrv, peers
        on_failure(self.client.close)
        self.metadata_sync = SlaveMetadataSync(
            self.client, self.replication.master_broker_addr, topics=self.topics, groups=self.groups,
            offsets=self.offsets, schedule=self.schedule, timer=self.timer)  # (unbuilt or disabled: not loaded)
        self.metadata_sync.start()
        on_failure(self.metadata_sync.stop)
        if self.acl is not None:
            self.acl.start()  # reloads the file when it changes
            on_failure(self.acl.stop)
        table: Dispatcher = self.dispatcher
        # A lone single plain send is served without the dispatcher (broker/send_fast.py): with access control
        # off only, as every request then goes through the ACL check of the handler table.
        fast_path: FastPath | None = SendFastPath(self.send_processor, self.store.commitlog, self.dispatcher)
        if self.acl is not None:
            from cometmq.acl.policy import broker_policy
            from cometmq.acl.remoting import guard

            table = guard(self.dispatcher, self.acl, broker_policy(self.send_processor.record_topic))
            fast_path = None
        self.server = server = RemotingServer(
            self.config.listen_host, self.config.listen_port, table, fast_path=fast_path,
            observer=(self.stats.rpc_done if self.config.metrics_exporter_type != "DISABLE"
                      else None),  # RPC latency: with metrics on only
            tls=ServerTls(self.config.tls) if self.config.tls.enabled else None, limits=self.config.connection_limits)
        server.add_close_callback(self._connection_closed)
        on_failure(self.consumers.close)
        on_failure(lambda: cancel_and_wait(self._tasks))
        await server.start()
        on_failure(server.stop)
        if self.config.listen_port == 0:
            # Port 0 (tests): the real port is known only now; messages must carry it as their store host.
            self.config = self.config.replace(listen_port=server.port)
            self.store.commitlog.store_host = _packed_host(self.config)
        self._housekeeping.start()
        self.stats_windows.start()
        self.stats_log.start()
        on_failure(self._housekeeping.stop)
        on_failure(self.stats_windows.stop)
        on_failure(self.stats_log.stop)
        if self.controller_mode is not None:
            # No nameserver registration before the controller has named the role (_register_as starts it).
            from cometmq.broker.ha.controller_client import ControllerClient

            self.controller_client = ControllerClient(self.controller_mode, self.client, self.replication,
                                                      meta_dir=Path(self.config.store.store_path),
                                                      broker_addr=lambda: self.addr, clock=self.clock,
                                                      ha_addr=self._stated_ha_addr)
            on_failure(self.controller_client.stop)
            await self.controller_client.start()
        elif self.config.namesrv_addrs:
            on_failure(lambda: self.registrar.stop() if self.registrar is not None else None)
            await self._start_registrar(self.replication.broker_id, self.replication.epoch)

    async def _start_registrar(self, broker_id: int, state_version: int) -> None:
        assert self.client is not None
        cfg = self.config
        registrar = NamesrvRegistrar(self.client, cfg.namesrv_addrs, cfg.broker_cluster_name,
                                     cfg.broker_name, broker_id, self.addr, self.ha_addr, self.topics.all,
                                     cfg.register_interval_ms / 1000, state_version=state_version,
                                     compressed=cfg.compressed_register, force_register=cfg.force_register,
                                     split_registration=cfg.enable_split_registration,
                                     split_size=cfg.split_registration_size,
                                     single_topic_register=cfg.enable_single_topic_register,
                                     broker_perm=cfg.broker_permission)
        self.registrar = registrar
        await registrar.start()

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        if self.controller_client is not None:
            await self.controller_client.stop()
        if self.registrar is not None:
            await self.registrar.stop()
        await self._housekeeping.stop()
        await self.stats_log.stop()
        await self.stats_windows.stop()
        await cancel_and_wait(self._tasks)
        if self.metadata_sync is not None:
            await self.metadata_sync.stop()
        await self.replication.stop()
        if self.replication.role is Role.MASTER:
            await self._stop_master_services()
        await self.timer.stop()
        await self.hold.stop()
        self.consumers.close()
        if self.server is not None:
            await self.server.stop()
        if self.client is not None:
            await self.client.close()
        if self.acl is not None:
            await self.acl.stop()
        self.appender.close()
        self.offsets.persist()
        self.groups.persist_if_dirty()
        await asyncio.to_thread(self.store.shutdown)
        unlock_data_folder(self._folder_lock)

    @property
    def addr(self) -> str:
        return self.config.advertised_addr

    @property
    def ha_addr(self) -> str:
        """Where replicas reach this broker's HA port (the bound one, when it listens)."""
        master = self.replication.master
        port = master.port if master is not None else self.replication.config.port
        return f"{self.config.broker_ip or self.config.listen_host}:{port}"

    def _stated_ha_addr(self) -> str | None:
        """The HA address to tell the controller: None while it is not known (port 0 and no HA server bound)."""
        addr = self.ha_addr
        return None if addr.endswith(":0") else addr

    # -- the master's own services (a replica runs none: they write) ----------------------------------------
    async def _start_master_services(self) -> None:
        self.schedule.load()
        self.pop.load()
        self.transactions.load()
        await self.schedule.start()
        self.timer.set_deliver(True)
        await self.pop.start()
        await self.transactions.start()

    async def _stop_master_services_if_master(self) -> None:
        if self.replication.role is Role.MASTER:
            await self._stop_master_services()

    async def _stop_master_services(self) -> None:
        await self.transactions.stop()
        await self.pop.stop()
        self.timer.set_deliver(False)
        await self.schedule.stop()

    async def _register_as(self, broker_id: int, state_version: int) -> None:
        if self.metadata_sync is not None:
            self.metadata_sync.wakeup()
        if self.registrar is not None:
            await self.registrar.set_identity(broker_id, state_version, self.ha_addr)
        elif self.controller_mode is not None and self.config.namesrv_addrs and self.client is not None:
            await self._start_registrar(broker_id, state_version)

    def _propose_sync_state_set(self) -> None:
        if self.controller_client is not None:
            self.controller_client.propose()

    def _master_ha_addr(self) -> str | None:
        registrar = self.registrar
        if registrar is None:
            return None
        now = time.monotonic()
        if now - self._master_asked_at >= 2.0:
            # The replica is (re)connecting: the master may have changed or registered only now. Ask the
            # nameservers again (at most every 2 s); the next attempt uses their answer.
            self._master_asked_at = now
            task: asyncio.Task[object] = asyncio.ensure_future(registrar.register_now())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return registrar.master_ha_addr

    async def _is_group_member(self, replica_id: int, host: str) -> bool:
        """Whether some nameserver has broker ``replica_id`` of this group registered at ``host``: only such a
        peer may link to the HA port and count as an in-sync replica (RocketMQ #3015). With no nameserver
        there is nobody to ask; replicas then come only by an operator's demote command, and any id may link."""
        client = self.client
        if not self.config.namesrv_addrs or client is None:
            return True
        for addr in self.config.namesrv_addrs:
            try:
                reply = await client.invoke(addr, make_request(RequestCode.GET_BROKER_CLUSTER_INFO), 3)
                if reply.code != ResponseCode.SUCCESS:
                    continue
                group = ClusterInfo.decode(reply.body).broker_addr_table.get(self.config.broker_name)
            except Exception as exc:  # one nameserver down or odd: ask the next
                log.warning("cannot check HA peer %d with nameserver %s: %s", replica_id, addr, exc)
                continue
            registered = group.broker_addrs.get(replica_id) if group is not None else None
            if registered is not None and registered.rpartition(":")[0].strip("[]") == host:
                return True
        return False

    def _housekeep(self) -> None:
        self.offsets.persist_if_dirty()
        self.groups.persist_if_dirty()
        self.consumers.scan_expired()
        self.producers.scan_expired()
        self.locks.scan_expired()

    def _stats_totals(self) -> Totals:
        """For the stats line: the messages producers stored and consumers were handed (BrokerStats)."""
        stats = self.stats
        return Totals(stats.total_in()[0], stats.total_out()[0])

    def _stats_gauges(self) -> dict[str, object]:
        groups = list(self.consumers.groups.values())
        return {"topics": len(self.topics.topics), "consumerGroups": len(groups),
                "consumers": sum(len(info.channels) for info in groups),
                "producers": sum(len(channels) for channels in list(self.producers.groups.values())),
                "heldPulls": self.hold.held_count, "role": self.replication.role.name,
                "diskRatio": f"{self.store.disk_usage_ratio():.2f}"}

    def _connection_closed(self, conn: RemotingConnection) -> None:
        self.consumers.connection_closed(conn)
        self.producers.connection_closed(conn)
        client_id = conn.attributes.get("client_id")
        if client_id and not self.consumers.has_client(client_id):
            # The client is gone (closed or killed): free its queue locks now, so the orderly consumers that
            # take over its queues need not wait for the lock lifetime (60 s) to pass. Only those taken on this
            # connection: a client that reconnected may have locked again on its new one before heartbeating there.
            released = self.locks.unlock_client(client_id, conn=conn)
            if released:
                log.info("released %d queue locks of departed client %s", released, client_id)

    def _topics_changed(self, name: str, cfg: TopicConfig | None) -> asyncio.Future[None] | None:
        """A topic was created, updated or deleted: register just that change (the registrar batches changes
        that come while one is in flight); the admin's create waits for it (TopicConfigManager.routes_settled)."""
        registrar = self.registrar
        if registrar is None:
            return None
        return registrar.topics_changed(() if cfg is None else (cfg,), () if cfg is not None else (name,))


def _packed_host(config: BrokerConfig) -> bytes:
    from cometmq.protocol.message import pack_host

    return pack_host(config.broker_ip or config.listen_host, config.listen_port)
