"""The broker's side of controller mode (RocketMQ 5's ``enableControllerMode``): identity, heartbeats, role, set.

- **Identity** (persistent unique broker id, RocketMQ's docs/en/controller/persistent_unique_broker_id.md): on
  the first start the broker asks the controller leader for the next id (GET_NEXT_BROKER_ID 1012), writes it with
  a register check code (``address;time``) to ``.broker.meta.temp``, applies it (APPLY_BROKER_ID 1013), then
  writes ``.broker.meta`` and removes the temp file. A start that finds the temp file applies that id again (the
  controller accepts the same id with the same code); one that finds the final file reuses its id.
- **Heartbeats**: oneway BROKER_HEARTBEAT (904) to every controller each ``heartbeat_interval_ms`` (#10812:
  followers too, whose liveness tables must know the broker when they become leader).
- **Leader**: GET_METADATA_INFO (1005) every ``sync_controller_metadata_period_ms``; a request answered
  CONTROLLER_NOT_LEADER (2007) asks again and is retried on the leader.
- **Role**: until the controller has named the broker's role it registers (REGISTER_BROKER 1003), asks for an
  election when the group has no master (ELECT_MASTER 1002), and hands the answer to
  ``ReplicationService.apply_role`` (fencing by master epoch is there). Then it polls GET_REPLICA_INFO (1004):
  a master every heartbeat interval (its lease renewal), a replica every ``sync_broker_metadata_period_ms`` (a
  lost NOTIFY_BROKER_ROLE_CHANGED is caught up with).
- **SyncStateSet**: the master's proposal (``SyncState.pending``) goes out as ALTER_SYNC_STATE_SET (1001). The
  answer's set is adopted; after a refusal the broker asks the controller's current set before dropping the
  proposal, and while the controller cannot be reached the proposal stays pending (acks keep counting against
  the union of old and new, so a lost answer never leaves the master acking with fewer brokers than the
  controller's set).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cometmq.broker.ha.role import RoleInfo, role_info, sync_state_set_body
from cometmq.broker.ha.service import ReplicationService, Role
from cometmq.common.atomic_file import fsync_dir, read_optional, write_atomic
from cometmq.common.periodic import Periodic
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request

log = logging.getLogger(__name__)

META_FILE = ".broker.meta"
TEMP_META_FILE = ".broker.meta.temp"


@dataclass(frozen=True)
class ControllerModeConfig:
    cluster: str
    broker_name: str
    controller_addrs: tuple[str, ...]
    heartbeat_interval_ms: int = 1000
    heartbeat_timeout_ms: int = 10_000
    sync_broker_metadata_period_ms: int = 5000
    sync_controller_metadata_period_ms: int = 5000
    election_priority: int = 2**31 - 1
    request_timeout_s: float = 3.0

    @property
    def lease_ms(self) -> int:
        """How long a master may go without hearing from the controller or a replica before it stops acking:
        the controller's heartbeat timeout less two heartbeat intervals, so that the master has stopped before
        the controller, counting from the last heartbeat it got, can declare it dead and elect another."""
        return max(self.heartbeat_timeout_ms - 2 * self.heartbeat_interval_ms, self.heartbeat_interval_ms)


class ControllerUnavailable(Exception):
    """No controller answered (or none is the leader)."""


class ControllerClient:
    def __init__(self, config: ControllerModeConfig, client: RemotingClient, replication: ReplicationService, *,
                 meta_dir: Path, broker_addr: Callable[[], str], clock: Callable[[], int],
                 ha_addr: Callable[[], str | None] | None = None) -> None:
        self.config = config
        self.client = client
        self.replication = replication
        self.meta_dir = meta_dir
        self._broker_addr = broker_addr
        #: this broker's HA address, sent in heartbeats (haServerAddr, a cometmq field RocketMQ's controller
        #: ignores) so the controller can name the master's HA address to its replicas
        self._ha_addr = ha_addr
        self.clock = clock
        self.leader: str | None = None
        self.broker_id: int | None = None
        interval_s = config.heartbeat_interval_ms / 1000
        self._heartbeats = Periodic("controller-heartbeat", interval_s, self._send_heartbeats, logger=log)
        self._sync = Periodic("controller-sync", interval_s, self._step, logger=log)
        self._alter_task: asyncio.Task[None] | None = None
        self._metadata_at: int | None = None
        self._replica_info_at = 0
        #: when the request of the leader's last answer was sent (ms): the lease it renews starts there
        self._asked_at: int | None = None

    async def start(self) -> None:
        self._heartbeats.start()
        self._sync.start()
        self._sync.wakeup()

    async def stop(self) -> None:
        await self._sync.stop()
        await self._heartbeats.stop()
        task, self._alter_task = self._alter_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the periodic step ------------------------------------------------------------------------------------
    async def _step(self) -> None:
        now = self.clock()
        if self._metadata_at is None or now - self._metadata_at >= self.config.sync_controller_metadata_period_ms:
            await self._refresh_leader()
        r = self.replication
        if self.broker_id is None:
            self.broker_id = await self._identity()
            r.set_broker_id(self.broker_id)
            log.info("broker id %d (from the controller, kept in %s)", self.broker_id, self.meta_dir / META_FILE)
            self._heartbeats.wakeup()
        if not r.confirmed:
            info = await self._register()
            if info.master_id is None:
                info = await self._elect()
            await self._take(info)
            return
        period = self.config.heartbeat_interval_ms if r.role is Role.MASTER \
            else self.config.sync_broker_metadata_period_ms
        if now - self._replica_info_at >= period:
            await self._take(await self._replica_info())
        if r.role is Role.MASTER and r.sync.pending is not None:
            self.propose()

    async def _take(self, info: RoleInfo) -> None:
        done = await self.replication.apply_role(info, asked_at=self._asked_at)
        if done not in ("unchanged", "set"):
            log.info("controller: master %s at epoch %d -> %s", info.master_id, info.master_epoch, done)
        if not self.replication.confirmed:
            self._sync.wakeup()  # (no master yet: register and ask for an election again soon)

    # -- requests ---------------------------------------------------------------------------------------------
    def _fields(self, **extra: object) -> dict[str, object]:
        return {"clusterName": self.config.cluster, "brokerName": self.config.broker_name, **extra}

    async def _invoke(self, code: int, fields: dict[str, object], body: bytes = b"") -> RemotingCommand:
        """The leader's answer to a request: tried on the known leader first, then on each controller; a
        CONTROLLER_NOT_LEADER answer makes it learn the leader and go there. Any leader's answer renews the
        lease, as of when the request was sent."""
        tried: set[str] = set()
        while True:
            candidates = ([self.leader] if self.leader else []) + list(self.config.controller_addrs)
            addr = next((a for a in candidates if a not in tried), None)
            if addr is None:
                raise ControllerUnavailable(f"no controller leader answered request {code} (tried {sorted(tried)})")
            tried.add(addr)
            sent = self.clock()
            try:
                reply = await self.client.invoke(addr, make_request(code, fields, body), self.config.request_timeout_s)
            except Exception as exc:  # down, unreachable, timed out: the next one
                log.debug("controller %s: request %d failed: %s", addr, code, exc)
                if addr == self.leader:
                    self.leader = None
                continue
            if reply.code == ResponseCode.CONTROLLER_NOT_LEADER:
                if addr == self.leader:
                    self.leader = None
                await self._refresh_leader()
                continue
            self.leader = addr
            self._asked_at = sent
            self.replication.controller_contact(sent)
            return reply

    async def _refresh_leader(self) -> None:
        self._metadata_at = self.clock()
        for addr in self.config.controller_addrs:
            sent = self.clock()
            try:
                reply = await self.client.invoke(addr, make_request(RequestCode.CONTROLLER_GET_METADATA_INFO),
                                                 self.config.request_timeout_s)
            except Exception as exc:
                log.debug("controller %s: metadata request failed: %s", addr, exc)
                continue
            if reply.code != ResponseCode.SUCCESS:
                continue
            fields = reply.ext_fields
            if fields.get("isLeader", "").lower() == "true":
                self.leader = addr
                self.replication.controller_contact(sent)
                return
            if fields.get("controllerLeaderAddress"):
                self.leader = fields["controllerLeaderAddress"]
                return

    def _role_reply(self, reply: RemotingCommand, what: str, *ok: int) -> RoleInfo:
        if reply.code not in (ResponseCode.SUCCESS, *ok):
            raise ControllerUnavailable(f"{what}: controller answered {reply.code} {reply.remark or ''}".strip())
        return role_info(reply.ext_fields, reply.body)

    async def _register(self) -> RoleInfo:
        reply = await self._invoke(RequestCode.CONTROLLER_REGISTER_BROKER, self._fields(
            brokerId=self.broker_id, brokerAddress=self._broker_addr(), invokeTime=self.clock()))
        return self._role_reply(reply, "register")

    async def _elect(self) -> RoleInfo:
        reply = await self._invoke(RequestCode.CONTROLLER_ELECT_MASTER, self._fields(
            brokerId=self.broker_id, designateElect="false", invokeTime=self.clock()))
        # MASTER_STILL_EXIST carries the current master: as good as an election
        return self._role_reply(reply, "elect", ResponseCode.CONTROLLER_MASTER_STILL_EXIST)

    async def _replica_info(self) -> RoleInfo:
        reply = await self._invoke(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                   {"brokerName": self.config.broker_name, "brokerId": self.broker_id})
        self._replica_info_at = self.clock()
        return self._role_reply(reply, "replica info")

    async def _send_heartbeats(self) -> None:
        if self.broker_id is None:
            return
        r = self.replication
        end = r.store.commitlog.max_offset
        confirm = r.sync.confirm_offset(end) if r.role is Role.MASTER else r.store.reput.reput_offset
        fields = self._fields(brokerAddr=self._broker_addr(), brokerId=self.broker_id, epoch=r.epoch,
                              maxOffset=end, confirmOffset=confirm,
                              heartbeatTimeoutMills=self.config.heartbeat_timeout_ms,
                              electionPriority=self.config.election_priority)
        ha_addr = self._ha_addr() if self._ha_addr is not None else None
        if ha_addr is not None:
            fields["haServerAddr"] = ha_addr

        async def one(addr: str) -> None:
            try:
                await self.client.invoke_oneway(addr, make_request(RequestCode.BROKER_HEARTBEAT, fields),
                                                self.config.request_timeout_s)
            except Exception as exc:
                log.debug("heartbeat to controller %s failed: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in self.config.controller_addrs))

    # -- the SyncStateSet -------------------------------------------------------------------------------------
    def propose(self) -> None:
        """Send the master's pending SyncStateSet to the controller (one request in flight at a time)."""
        if self._alter_task is None or self._alter_task.done():
            self._alter_task = asyncio.get_running_loop().create_task(self._alter(), name="alter-sync-state-set")

    async def _alter(self) -> None:
        r = self.replication
        proposed = r.sync.pending
        if proposed is None or r.role is not Role.MASTER or not r.confirmed:
            return
        body = sync_state_set_body(r.controller_ids(proposed), r.sync.epoch)
        fields = {"brokerName": self.config.broker_name, "masterBrokerId": r.replica_id,
                  "masterEpoch": r.acted_epoch, "invokeTime": self.clock()}
        try:
            reply = await self._invoke(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, fields, body)
        except ControllerUnavailable as exc:
            log.warning("SyncStateSet %s not sent (%s): it stays pending", sorted(proposed), exc)
            return
        if reply.code == ResponseCode.SUCCESS:
            answer = role_info({"syncStateSetEpoch": reply.ext_fields.get("newSyncStateSetEpoch", "")}, reply.body)
            members = answer.sync_state_set if answer.sync_state_set is not None else r.controller_ids(proposed)
            r.sync_altered(proposed, RoleInfo(r.replica_id, r.acted_epoch, sync_state_set=members,
                                              sync_state_set_epoch=answer.sync_state_set_epoch))
            return
        log.warning("the controller refused the SyncStateSet %s: %d %s", sorted(proposed), reply.code,
                    reply.remark or "")
        try:
            current: RoleInfo | None = await self._replica_info()
        except ControllerUnavailable:
            if reply.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH:
                return  # the controller's set is newer and unknown: keep counting the union
            current = None
        if current is not None and current.master_id != r.replica_id:
            await self._take(current)
            return
        r.sync_altered(proposed, current)

    # -- identity ---------------------------------------------------------------------------------------------
    def _read_meta(self, name: str) -> dict[str, object] | None:
        raw = read_optional(self.meta_dir / name)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            log.warning("%s is not JSON: ignored", self.meta_dir / name)
            return None
        if not isinstance(doc, dict) or doc.get("clusterName") != self.config.cluster \
                or doc.get("brokerName") != self.config.broker_name:
            log.warning("%s belongs to another broker group: ignored", self.meta_dir / name)
            return None
        return doc

    async def _identity(self) -> int:
        """This broker's persistent id: from ``.broker.meta``, or applied at the controller now."""
        meta = self._read_meta(META_FILE)
        if meta is not None:
            return int(str(meta["brokerId"]))
        temp_path = self.meta_dir / TEMP_META_FILE
        temp = self._read_meta(TEMP_META_FILE)
        if temp is not None:
            # Applied before the final file was written, or never: applying again with the same code tells.
            broker_id, code = int(str(temp["brokerId"])), str(temp["registerCheckCode"])
            if await self._apply(broker_id, code):
                return self._persist(broker_id, code)
            temp_path.unlink(missing_ok=True)
        reply = await self._invoke(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, self._fields())
        if reply.code != ResponseCode.SUCCESS:
            raise ControllerUnavailable(f"next broker id: controller answered {reply.code} {reply.remark or ''}")
        broker_id = int(reply.ext_fields["nextBrokerId"])
        code = f"{self._broker_addr()};{self.clock()}"
        write_atomic(temp_path, self._meta_doc(broker_id, code))
        if await self._apply(broker_id, code):
            return self._persist(broker_id, code)
        temp_path.unlink(missing_ok=True)
        raise ControllerUnavailable(f"broker id {broker_id} was taken meanwhile; asking again")

    async def _apply(self, broker_id: int, code: str) -> bool:
        reply = await self._invoke(RequestCode.CONTROLLER_APPLY_BROKER_ID, self._fields(
            appliedBrokerId=broker_id, registerCheckCode=code))
        if reply.code != ResponseCode.SUCCESS:
            log.warning("controller refused broker id %d: %d %s", broker_id, reply.code, reply.remark or "")
        return reply.code == ResponseCode.SUCCESS

    def _meta_doc(self, broker_id: int, code: str) -> bytes:
        return json.dumps({"clusterName": self.config.cluster, "brokerName": self.config.broker_name,
                           "brokerId": broker_id, "registerCheckCode": code}).encode()

    def _persist(self, broker_id: int, code: str) -> int:
        write_atomic(self.meta_dir / META_FILE, self._meta_doc(broker_id, code))
        (self.meta_dir / TEMP_META_FILE).unlink(missing_ok=True)
        fsync_dir(self.meta_dir)
        return broker_id
