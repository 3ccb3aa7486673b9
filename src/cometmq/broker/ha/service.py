"""The broker's replication: its role in the group, the master epoch, the HA link and the write-path gate.

A master (brokerId 0) serves the HA port (``master.py``): replicas copy its log, their acks move the SyncStateSet
(``sync_state.py``) and the confirm offset, below which consumers see messages (the store holds dispatch back to
it) and above which no send is acknowledged (the appender waits, ``ReplicationGate``). A replica (brokerId ≥ 1)
copies the master's log (``replica.py``) and refuses writes.

Role changes come from ``promote`` and ``demote`` (the admin command now, the controller in [12]). Nothing acts
on an epoch lower than the one it has (fencing). A new master appends its epoch entry, waits until its log is
dispatched, starts the master-only services and registers as id 0 with the epoch as its state version; a
demoted master stops them, follows the new master (which truncates what the new master does not have) and
registers under a replica id.

In controller mode (``controller_mode``; ``controller_client.py`` talks to the controller) the broker starts
unconfirmed: it takes no writes until the controller has named its role (#6508), and it acts only on a master
epoch above the one it last acted on (``apply_role``). A master proposes SyncStateSet changes instead of making
them (``SyncState.propose``), and stops acknowledging writes once its lease is over (#7017): ``lease_ms`` after the
controller's last answer (counted from when the request went out) or, with allAckInSyncStateSet, after the
last report of a replica.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cometmq.broker.appender import Appender
from cometmq.broker.ha.master import HAMaster
from cometmq.broker.ha.role import RoleInfo
from cometmq.broker.ha.sync_state import MASTER_ID, SyncState
from cometmq.broker.offset_waiter import OffsetWaiter
from cometmq.common import failpoints
from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.common.periodic import Periodic
from cometmq.store.epoch_file import EpochFile
from cometmq.store.message_store import MessageStore
from cometmq.store.status import PutResult, PutStatus

if TYPE_CHECKING:
    from cometmq.broker.ha.replica import HAReplica

log = logging.getLogger(__name__)


class Role(enum.Enum):
    MASTER = "MASTER"
    SLAVE = "SLAVE"


class FencedError(Exception):
    """A role change at an epoch not higher than the broker's own."""


@dataclass(frozen=True)
class HAConfig:
    host: str
    port: int
    all_ack: bool = True
    min_in_sync_replicas: int = 1
    max_not_catchup_ms: int = 15_000
    heartbeat_interval_ms: int = 5_000
    housekeeping_interval_ms: int = 5_000
    ack_timeout_ms: int = 3_000
    transfer_batch_size: int = 256 * 1024


#: registers the broker with the nameservers under (broker id, state version)
Register = Callable[[int, int], Awaitable[None]]
#: an address of the group's master as the nameservers report it (replicas), or None
MasterAddr = Callable[[], str | None]
#: whether a peer on the HA port that says it is replica ``id`` from ``host`` is a broker of this group
Admit = Callable[[int, str], Awaitable[bool]]


class ReplicationService:
    """Implements ``ReplicationGate`` (broker/appender.py) for the appender."""

    def __init__(self, config: HAConfig, store: MessageStore, appender: Appender, epochs: EpochFile, *,
                 broker_id: int,
                 clock: Callable[[], int], register: Register, master_ha_addr: MasterAddr,
                 master_addr: MasterAddr, start_master_services: Callable[[], Awaitable[None]],
                 stop_master_services: Callable[[], Awaitable[None]],
                 on_truncated: Callable[[], None] | None = None, admit: Admit | None = None,
                 controller_mode: bool = False, lease_ms: int = 0,
                 propose_sync_state_set: Callable[[], None] | None = None) -> None:
        self.config = config
        self.store = store
        self.appender = appender
        self.epochs = epochs
        self.clock = clock
        #: the id this broker has as a replica (its configured id; 1 for a configured master that is demoted)
        self.replica_id = broker_id if broker_id != MASTER_ID else 1
        self.controller_mode = controller_mode
        # In controller mode every broker starts as a replica and waits for the controller's word.
        self.role = Role.MASTER if broker_id == MASTER_ID and not controller_mode else Role.SLAVE
        #: controller mode: whether the controller has named this broker's role since it started (#6508)
        self.confirmed = not controller_mode
        #: the master epoch of the last role taken at the controller's word (0: none yet)
        self.acted_epoch = 0
        #: controller mode: a master that heard neither from the controller nor from a replica for this long
        #: acknowledges nothing (0: no lease)
        self.lease_ms = lease_ms
        self._contact_ms = 0
        self._propose = propose_sync_state_set
        self._register = register
        self._master_ha_addr = master_ha_addr
        self._master_addr = master_addr
        self._on_truncated = on_truncated
        self._admit = admit
        #: the master named by the last demote (it wins over what the nameservers say)
        self._named_master: tuple[str | None, str | None] = (None, None)
        self._start_master_services = start_master_services
        self._stop_master_services = stop_master_services
        self.sync = SyncState(all_ack=config.all_ack, max_not_catchup_ms=config.max_not_catchup_ms,
                              propose=controller_mode)
        self.master: HAMaster | None = None
        self.replica: HAReplica | None = None
        self._acks: OffsetWaiter | None = None
        self._housekeeping = Periodic("ha-housekeeping", config.housekeeping_interval_ms / 1000,
                                      self._housekeep, logger=log)
        self._lock = asyncio.Lock()
        self._master_services_running = False
        #: below this offset every record was confirmed (dispatched) when it was saved: a broker restarted as a
        #: replica shows nothing above it until a master confirms more (its log may hold a tail that is cut later)
        self._dispatched_path = epochs.path.with_name("haDispatchedOffset")
        self._dispatched_saved = self._load_dispatched()

    @property
    def broker_id(self) -> int:
        return MASTER_ID if self.role is Role.MASTER else self.replica_id

    @property
    def epoch(self) -> int:
        return self.epochs.last_epoch()

    # -- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Take the configured role (the master services are started by the broker for a master)."""
        if self.role is Role.MASTER:
            if self.epochs.last_epoch() == 0:
                self.epochs.append(1, self.store.commitlog.min_offset)
            self._master_services_running = True
            await self._become_master()
        else:
            # Nothing is visible above what was confirmed before the restart until a master confirms it (in
            # controller mode no link until one is named). No record of it (a broker of an older version): the log.
            saved = self._dispatched_saved
            self._hold_back(self.store.commitlog.max_offset if saved is None else saved)
            if not self.controller_mode:
                self._become_replica()
        self._housekeeping.start()

    async def stop(self) -> None:
        await self._housekeeping.stop()
        await self._stop_link()
        self._save_dispatched(self.store.reput.reput_offset)
        if self._acks is not None:
            self._acks.close()

    async def _stop_link(self) -> None:
        if self.master is not None:
            await self.master.stop()
            self.master = None
        if self.replica is not None:
            await self.replica.stop()
            self.replica = None

    async def _become_master(self) -> None:
        # A new term's acks: the offsets confirmed in an earlier one (before this log was cut, maybe) count nothing.
        if self._acks is not None:
            self._acks.close()
        self._acks = OffsetWaiter(asyncio.get_running_loop(), 0, sweep_interval_s=0.05)
        self.sync = SyncState(all_ack=self.config.all_ack, max_not_catchup_ms=self.config.max_not_catchup_ms,
                              epoch_start=self.epochs.entries[-1].start_offset if self.epochs.entries else 0,
                              propose=self.controller_mode)
        self._publish_confirm()
        self.master = HAMaster(self.config, self.store, self.epochs, self.sync, clock=self.clock,
                               on_change=self._publish_confirm, admit=self._admit)
        await self.master.start()

    def _become_replica(self) -> None:
        # What is not dispatched yet (a former master's unconfirmed tail, which the new master may cut) and what
        # arrives from now on is visible only once the master's frames confirm it.
        self.store.set_confirm_offset(self.store.reput.reput_offset)
        from cometmq.broker.ha.replica import HAReplica  # (a master never loads the replica's side of the link)

        self.replica = HAReplica(self.config, self.store, self.appender, self.epochs, self.replica_id,
                                 self.master_ha_addr, on_truncated=self._on_truncated, on_cut=self._on_cut)
        self.replica.start()

    def _on_cut(self, offset: int) -> None:
        """The replica's log is about to be cut at ``offset``: nothing above it is confirmed, durably so first (a
        crash after the cut must not take the new master's later bytes there as confirmed)."""
        held = min(offset, self.store.reput.reput_offset)
        self._save_dispatched(held)
        self.store.set_confirm_offset(held)

    def _hold_back(self, offset: int) -> None:
        """Show nothing at or above ``offset`` until a master confirms it: the units the recovery dispatched there
        are dropped (the log is kept)."""
        store = self.store
        offset = min(offset, store.commitlog.max_offset)
        if store.reput.reput_offset > offset:
            log.warning("holding back the records from %d to %d until a master confirms them", offset,
                        store.commitlog.max_offset)
            store.truncate(offset, keep_log=True)
            if self._on_truncated is not None:
                self._on_truncated()
        store.set_confirm_offset(offset)

    def _load_dispatched(self) -> int | None:
        raw = read_optional(self._dispatched_path)
        try:
            return None if raw is None else max(0, int(raw))
        except ValueError:
            log.warning("%s does not hold an offset: ignored", self._dispatched_path)
            return None

    def _save_dispatched(self, offset: int) -> None:
        """Record durably that the records below ``offset`` are confirmed (a record boundary: the dispatch point)."""
        if offset != self._dispatched_saved:
            write_atomic(self._dispatched_path, str(offset).encode())
            self._dispatched_saved = offset

    def master_ha_addr(self) -> str | None:
        """Where this replica's HA link connects (None while this broker is the master)."""
        if self.role is Role.MASTER:
            return None
        return self._named_master[1] or self._master_ha_addr()

    def master_broker_addr(self) -> str | None:
        """The master's remoting address, for the metadata a replica copies (None while this broker is the
        master)."""
        if self.role is Role.MASTER:
            return None
        return self._named_master[0] or self._master_addr()

    # -- role changes -----------------------------------------------------------------------------------------
    async def promote(self, epoch: int, *, resume: bool = False) -> None:
        """Become the group's master at ``epoch`` (> the broker's own). ``resume``: at the broker's own epoch,
        with no new epoch entry (controller mode: a restarted master the controller still names at that epoch)."""
        async with self._lock:
            if resume and epoch != self.epoch:
                raise FencedError(f"cannot resume at epoch {epoch}: this broker's epoch is {self.epoch}")
            if not resume and epoch <= self.epoch:
                raise FencedError(f"epoch {epoch} is not above this broker's epoch {self.epoch}")
            await self._stop_link()
            end = self._cut_torn_tail()
            if not resume:
                self.epochs.append(epoch, end)
            failpoints.hit("ha.promote.epoch_written")
            self.role = Role.MASTER
            self.store.set_confirm_offset(None)
            await self._dispatched(end)
            await self._become_master()
            if not self._master_services_running:
                await self._start_master_services()
                self._master_services_running = True
            log.warning("promoted to master at epoch %d (log end %d)", epoch, end)
        await self._register(MASTER_ID, epoch)

    def _cut_torn_tail(self) -> int:
        """Cut a torn last record (a replica's log may end inside one: the master's frames need not end at record
        boundaries) before this broker writes as master (RocketMQ's truncateInvalidMsg); returns the log end.
        The dispatch never passes a torn record, so the whole records end at or after the reput offset."""
        store = self.store
        end = store.commitlog.max_offset
        valid_end = store.commitlog.recover_end(min(store.reput.reput_offset, end)).end_offset
        if valid_end < end:
            log.warning("cutting the log from %d to %d, the end of its last whole record, before taking writes",
                        end, valid_end)
            store.truncate(valid_end)  # durable on return
            if self._on_truncated is not None:
                self._on_truncated()
        return valid_end

    async def demote(self, epoch: int, master_ha_addr: str | None = None, replica_id: int | None = None,
                     master_addr: str | None = None) -> None:
        """Follow the master of ``epoch`` (≥ the broker's own) as a replica."""
        async with self._lock:
            if epoch < self.epoch or (epoch == self.epoch and self.role is Role.MASTER):
                raise FencedError(f"epoch {epoch} is not above this broker's epoch {self.epoch}")
            if replica_id is not None:
                if replica_id == MASTER_ID:
                    raise ValueError("a replica's id is 1 or more")
                self.replica_id = replica_id
            was_master = self.role is Role.MASTER
            self.role = Role.SLAVE
            if was_master:
                failpoints.hit("ha.demote.role_set")
            self._named_master = (master_addr, master_ha_addr)
            await self._stop_link()
            if was_master and self._master_services_running:
                await self._stop_master_services()
                self._master_services_running = False
            self._become_replica()
            log.warning("now a replica (id %d) following the master of epoch %d", self.replica_id, epoch)
        await self._register(self.replica_id, self.epoch)

    async def _dispatched(self, end: int, timeout_s: float = 30.0) -> None:
        """Wait until the dispatcher has caught up with the log end (a new master serves its whole log)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.store.reput.reput_offset < end and loop.time() < deadline:
            await asyncio.sleep(0.005)

    # -- controller mode --------------------------------------------------------------------------------------
    def set_broker_id(self, broker_id: int) -> None:
        """The id the controller assigned (controller mode, before the first role is taken)."""
        if broker_id == MASTER_ID:
            raise ValueError("a controller-assigned broker id is 1 or more")
        self.replica_id = broker_id

    async def apply_role(self, info: RoleInfo, *, asked_at: int | None = None) -> str:
        """Take the role the controller names, only at a master epoch above the last one acted on (the first
        answer after a start may also confirm the role at the broker's own epoch). Returns what was done.
        ``asked_at``: when the request this answers was sent (None: a notification, taken as of now)."""
        me, epoch = self.replica_id, info.master_epoch
        newer = epoch > self.acted_epoch or (not self.confirmed and epoch == self.acted_epoch)
        if not newer:
            if epoch == self.acted_epoch and info.master_id == me and self.role is Role.MASTER:
                return "set" if self._adopt(info) else "unchanged"
            return "ignored" if epoch < self.acted_epoch else "unchanged"
        try:
            if info.master_id is None:
                # The controller has no master at this epoch: one that was ours is over (fenced); take no
                # writes until an election names one.
                self.acted_epoch, self.confirmed = epoch, False
                if self.role is Role.MASTER:
                    await self.demote(max(epoch, self.epoch + 1))
                    self.confirmed = False
                return "no master"
            if info.master_id == me:
                if self.role is Role.MASTER and epoch == self.epoch:
                    pass  # (already the master at this epoch: confirm it)
                else:
                    await self.promote(epoch, resume=epoch == self.epoch and not self.confirmed)
                done = "promoted"
            else:
                await self.demote(epoch, info.master_ha_addr, me, info.master_addr)
                done = "demoted"
        except FencedError as exc:
            log.warning("ignoring the controller's role at master epoch %d: %s", epoch, exc)
            return "ignored"
        self.acted_epoch, self.confirmed = epoch, True
        self.controller_contact(asked_at)
        self._adopt(info)
        return done

    def _adopt(self, info: RoleInfo) -> bool:
        """Take the controller's SyncStateSet when this broker is the master and the set is newer."""
        members = info.sync_state_set
        if self.role is not Role.MASTER or members is None or info.master_id != self.replica_id:
            return False
        if info.sync_state_set_epoch <= self.sync.epoch and self.sync.epoch != 0:
            return False
        local = frozenset(MASTER_ID if i == self.replica_id else i for i in members)
        self.sync.adopt(local, info.sync_state_set_epoch, self.clock())
        log.info("SyncStateSet is now %s (set epoch %d)", sorted(members), info.sync_state_set_epoch)
        self._publish_confirm()
        return True

    def controller_ids(self, members: frozenset[int]) -> frozenset[int]:
        """A local set (the master as 0) in the controller's ids."""
        return frozenset(self.replica_id if i == MASTER_ID else i for i in members)

    def sync_altered(self, proposed: frozenset[int], info: RoleInfo | None) -> None:
        """The controller answered the proposal ``proposed`` (local ids): ``info`` holds the set now in force
        (the new one, or the controller's current one after a refusal); None: dropped with nothing learnt."""
        if self.sync.pending != proposed:
            return  # (the master changed, or another answer came first)
        if info is None or not self._adopt(info):
            self.sync.pending = None
            self._publish_confirm()

    def controller_contact(self, sent_at: int | None = None) -> None:
        """The controller leader answered a request sent at ``sent_at`` (ms; None: now), which renews the lease
        from then: an answer read late (the broker was stopped, or slow) proves nothing about the time between."""
        self._contact_ms = max(self._contact_ms, self.clock() if sent_at is None else sent_at)

    def lease_expired(self) -> bool:
        """A master in controller mode whose lease is over: a new master may have been elected meanwhile, so it
        acknowledges nothing (#7017). The controller's answers renew the lease; with allAckInSyncStateSet a
        replica's reports do too (every write needs the acks of the set, and a member elected elsewhere stops
        acking), without it they must not: the master acks writes alone, and its replica's reports, read after a
        pause or while the controller is cut off, would keep it taking writes beside the master elected meanwhile."""
        if not self.controller_mode or self.role is not Role.MASTER or self.lease_ms <= 0:
            return False
        heard = self._contact_ms
        if self.config.all_ack:
            heard = max(heard, self.sync.last_heard() or 0)
        return self.clock() - heard > self.lease_ms

    def _lease_remark(self) -> str:
        if self.config.all_ack:
            return f"this master heard neither from the controller nor from a replica for {self.lease_ms} ms: it " \
                   f"takes no writes until the controller answers"
        return f"this master has not heard from the controller for {self.lease_ms} ms (with allAckInSyncStateSet=" \
               f"false a replica's acks do not renew its lease): it takes no writes until the controller answers"

    # -- the gate the appender asks ---------------------------------------------------------------------------
    def refusal(self) -> PutResult | None:
        if not self.confirmed:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE,
                             remark="this broker's role is not confirmed by the controller yet")
        if self.controller_mode and self.lease_expired():
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=self._lease_remark())
        if self.role is not Role.MASTER:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE,
                             remark="this broker is a replica (slave) of its group: writes go to the master")
        if self.sync.in_sync() < self.config.min_in_sync_replicas:
            return PutResult(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                             remark=f"in-sync replicas not enough: {self.sync.in_sync()} of "
                                    f"{self.config.min_in_sync_replicas} needed")
        return None

    def appended(self, end: int) -> None:
        master = self.master
        if master is not None and master.links:  # (nobody to ship to: nothing to do)
            master.appended()

    def acked(self, end: int) -> bool:
        # Below minInSyncReplicas nothing is acknowledged, not even what was waiting when the set shrank: those
        # sends time out (FLUSH_SLAVE_TIMEOUT) rather than count as kept by too few brokers.
        return self.sync.in_sync() >= self.config.min_in_sync_replicas and \
            self.sync.confirm_offset(self.store.commitlog.max_offset) >= end and \
            not (self.controller_mode and self.lease_expired())

    def wait_acked(self, end: int) -> Awaitable[bool]:
        assert self._acks is not None
        return self._acks.wait(end, self.config.ack_timeout_ms / 1000)

    # -- confirm offset ---------------------------------------------------------------------------------------
    def _publish_confirm(self) -> None:
        """The set or an ack changed: move the store's confirm offset and release acknowledged sends."""
        if self.role is not Role.MASTER:
            return
        end = self.store.commitlog.max_offset
        confirm = self.sync.confirm_offset(end)
        # The master alone: everything written is confirmed (dispatch needs no hold-back).
        self.store.set_confirm_offset(None if self.sync.counted() == {MASTER_ID} else confirm)
        if self.sync.pending is not None and self._propose is not None:
            self._propose()
        if self._acks is not None and not self.lease_expired():
            if self.sync.in_sync() >= self.config.min_in_sync_replicas:
                self._acks.on_flushed(confirm)
            else:  # too few brokers keep them now: the waiting sends end FLUSH_SLAVE_TIMEOUT at once
                self._acks.fail_all()
        if self.master is not None:
            self.master.appended()

    def _housekeep(self) -> None:
        self._save_dispatched(self.store.reput.reput_offset)
        if self.role is Role.MASTER:
            gone = self.sync.shrink(self.clock())
            if gone and self.sync.propose:
                log.warning("replicas %s not caught up for %d ms: proposing the SyncStateSet %s to the controller",
                            sorted(gone), self.config.max_not_catchup_ms, sorted(self.sync.pending or ()))
                self._publish_confirm()
            elif gone:
                log.warning("replicas %s left the SyncStateSet (not caught up for %d ms); set is now %s",
                            sorted(gone), self.config.max_not_catchup_ms, sorted(self.sync.members))
                self._publish_confirm()

    def status(self) -> dict[str, object]:
        port = self.master.port if self.master is not None else self.config.port
        out: dict[str, object] = {"role": self.role.value, "brokerId": self.broker_id, "epoch": self.epoch,
                                  "haAddr": f"{self.config.host}:{port}",
                                  "epochs": [[e.epoch, e.start_offset] for e in self.epochs.entries],
                                  "maxOffset": self.store.commitlog.max_offset}
        if self.controller_mode:
            out.update(controllerMode=True, confirmed=self.confirmed, controllerId=self.replica_id,
                       leaseExpired=self.lease_expired())
        if self.role is Role.MASTER:
            out["syncStateSet"] = sorted(self.sync.members)
            out["syncStateSetEpoch"] = self.sync.epoch
            out["confirmOffset"] = self.sync.confirm_offset(self.store.commitlog.max_offset)
            out["replicas"] = {str(rid): rep.ack for rid, rep in sorted(self.sync.replicas.items())}
        elif self.replica is not None:
            out["masterAddr"] = self.replica.master_addr
            out["connected"] = self.replica.connected
        return out
