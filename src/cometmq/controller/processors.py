"""The controller's request processors over its state machine, heartbeat table and replicated log.

Writes (APPLY_BROKER_ID, REGISTER_BROKER, ELECT_MASTER, ALTER_SYNC_STATE_SET) are decided against the applied
state (``ControllerState.decide_*``), their events appended to the log, and answered from the *apply* outcome:
the event is checked again when applied, so a decision that lost a race (RocketMQ #5663) is answered with the
code that fenced it. Reads come from the applied state. On a follower every request but BROKER_HEARTBEAT and
GET_METADATA_INFO is answered CONTROLLER_NOT_LEADER (2007) naming the leader.

A scan (every ``scan_interval_s``, and at once when a broker's connection closes) elects a master for every group
whose master is not alive; after each applied election the leader sends NOTIFY_BROKER_ROLE_CHANGED (1008) to the
group's alive brokers. Time is the injected ``clock`` (milliseconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..acl.remoting import signing_client
from ..common import failpoints
from ..common.periodic import Periodic
from ..net.client import RemotingClient
from ..net.connection import Handler, RemotingConnection
from ..net.tls_settings import TlsConfig
from ..protocol.acl import Credentials
from ..protocol.codes import RemotingError, RequestCode, ResponseCode
from ..protocol.remoting import RemotingCommand, make_request, make_response
from . import wire
from .events import ElectMaster, decode_event, encode_event
from .heartbeats import DEFAULT_TIMEOUT_MS, BrokerIdentity, HeartbeatTable
from .log import LogError, NotLeaderError, ReplicatedLog
from .state import BrokerGroup, ControllerState, Decision, Outcome

log = logging.getLogger(__name__)

Clock = Callable[[], int]
#: how many apply outcomes are kept for the appenders still to read theirs
_OUTCOMES_KEPT = 4096
#: the connection attribute holding the brokers whose heartbeats came over it
_BROKERS_ATTR = "controller_brokers"
#: heartbeat records kept beyond one per registered broker id: anyone may send heartbeats with made-up names
#: (a broker heartbeats once it holds an id, so a registered broker always gets in)
_UNREGISTERED_KEPT = 1024


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _other_cluster(cmd: RemotingCommand, g: BrokerGroup | None, code: int) -> RemotingCommand | None:
    """The refusal of a request whose clusterName is not the group's (an operator's typo), else None."""
    cluster = cmd.ext_fields.get("clusterName")
    if g is None or not cluster or cluster == g.cluster:
        return None
    return make_response(cmd, code, f"{g.broker_name} belongs to cluster {g.cluster}, not {cluster}")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    host: str = "127.0.0.1"
    #: RocketMQ's standalone controller port
    port: int = 9878
    #: how often lost masters are looked for (RocketMQ's scanInactiveMasterInterval is 5 s; liveness is cheap here)
    scan_interval_s: float = 1.0
    #: a broker that states no heartbeatTimeoutMills is dead after this long without a heartbeat
    heartbeat_timeout_ms: int = DEFAULT_TIMEOUT_MS
    #: enableElectUncleanMaster: elect a replica outside the SyncStateSet when no member is alive (loses data)
    elect_unclean_master: bool = False
    #: the controller group's name and this node's id (GET_METADATA_INFO)
    group: str = "cometmq-controller"
    node_id: str = "n0"
    #: the group's nodes as NAME=HOST:PORT (GET_METADATA_INFO's peers; empty: this node alone)
    peers: tuple[str, ...] = ()
    #: the address brokers and other nodes reach this node at (None: host:port as bound)
    advertised_addr: str | None = None
    notify_timeout_s: float = 3.0
    #: after a start, how long a recorded master is presumed alive before its first heartbeat here (None: the
    #: heartbeat timeout): a restarted controller knows no one alive, and must not elect the first replica it hears
    startup_grace_ms: int | None = None
    #: innerClientAuthenticationCredentials: what the controller sends to brokers (NOTIFY_BROKER_ROLE_CHANGED) is
    #: signed with them, as brokers with aclEnable=true require (an admin account of their ACL); None: unsigned
    inner_credentials: Credentials | None = None
    #: TLS: the port's (tls.server.*; ControllerServer) and, with ``client_enable`` (tls.enable), the connections
    #: to brokers; None: plaintext
    tls: TlsConfig | None = None
    #: aclEnable / aclFile: the port checks requests against this plain_acl.yml (ControllerServer; an embedding
    #: nameserver checks with its own ACL instead): reads open, every change needs an admin account
    acl_enable: bool = False
    acl_file: str = "plain_acl.yml"


class ControllerProcessors:
    """One controller node: ``handlers()`` for a remoting server's dispatcher, ``start``/``stop`` for the log, the
    scan and the notifier, ``connection_closed`` for the server's close callback."""

    def __init__(self, config: ControllerConfig, log_: ReplicatedLog, clock: Clock = wall_ms, *,
                 address: Callable[[], str] | None = None) -> None:
        self.config = config
        self.log = log_
        self.clock = clock
        self.state = ControllerState()
        self.heartbeats = HeartbeatTable(config.heartbeat_timeout_ms)
        self._address = address or (lambda: f"{config.host}:{config.port}")
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()
        self._serving = False
        self._started_at = 0
        self._owner: dict[BrokerIdentity, RemotingConnection] = {}
        self._client: RemotingClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._scan = Periodic("controller-scan", config.scan_interval_s, self.scan_once, logger=log)
        self.log.subscribe(self._on_entry)

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.log.start()  # replays the committed events into the state
        tls = self.config.tls
        self._client = signing_client(self.config.inner_credentials,
                                      ssl=tls.client_context() if tls is not None else None)
        self._started_at = self.clock()
        self._serving = True
        self._scan.start()

    async def stop(self) -> None:
        self._serving = False
        await self._scan.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
        await self.log.stop()

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.BROKER_HEARTBEAT: self.heartbeat,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self.get_next_broker_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self.apply_broker_id,
            RequestCode.CONTROLLER_REGISTER_BROKER: self.register_broker,
            RequestCode.CONTROLLER_ELECT_MASTER: self.elect_master,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self.alter_sync_state_set,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self.get_replica_info,
            RequestCode.CONTROLLER_GET_METADATA_INFO: self.get_metadata_info,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self.get_sync_state_data,
            RequestCode.CLEAN_BROKER_DATA: self.clean_broker_data,
        }

    # -- the log ------------------------------------------------------------------------------------------
    def _on_entry(self, index: int, entry: bytes) -> None:
        event = decode_event(entry)  # a bad entry fails the log: never skip a decision
        outcome = self.state.apply(event)
        if self._serving:  # not while replaying at start: nobody waits for those
            self._outcomes[index] = outcome
            while len(self._outcomes) > _OUTCOMES_KEPT:
                self._outcomes.popitem(last=False)
            if isinstance(event, ElectMaster) and outcome.ok and event.new_master is not None and self.log.is_leader:
                failpoints.hit("controller.elect.committed")
                self._spawn(self.notify_role_changed(event.broker_name))
        if not outcome.ok:
            log.info("controller event %d refused on apply: %d %s", index, outcome.code, outcome.remark)

    async def _commit(self, decision: Decision) -> Outcome:
        """Append the decision's events; the answer is the first refusal at apply, else the decision's code."""
        for event in decision.events:
            try:
                index = await self.log.append(encode_event(event))
            except NotLeaderError as exc:
                raise RemotingError(ResponseCode.CONTROLLER_NOT_LEADER, str(exc)) from None
            except LogError as exc:
                raise RemotingError(ResponseCode.SYSTEM_ERROR, f"controller log: {exc}") from None
            outcome = self._outcomes.pop(index, None)
            if outcome is not None and not outcome.ok:
                return outcome
        return Outcome(decision.code, decision.remark)

    def _require_leader(self) -> None:
        if not self.log.is_leader:
            leader = self.log.leader_address
            raise RemotingError(ResponseCode.CONTROLLER_NOT_LEADER,
                                f"not the controller leader (leader: {leader or 'unknown'})")

    def _group(self, broker_name: str) -> BrokerGroup:
        g = self.state.group(broker_name)
        if g is None:
            raise RemotingError(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"{broker_name} is not registered")
        return g

    def _master_fields(self, g: BrokerGroup) -> dict[str, object]:
        """RocketMQ's master fields, plus masterHaAddress when the master's heartbeats stated it (a cometmq
        field: a replica that follows a new master connects to it at once instead of asking the nameservers,
        which may still name the old one)."""
        fields = wire.master_fields(g)
        if g.master is not None:
            ha = self.heartbeats.ha_address(BrokerIdentity(g.cluster, g.broker_name, g.master))
            if ha:
                fields["masterHaAddress"] = ha
        return fields

    def _alive(self, g: BrokerGroup, broker_id: int) -> bool:
        return self.heartbeats.is_alive(BrokerIdentity(g.cluster, g.broker_name, broker_id), self.clock())

    def _is_alive(self, cluster: str, broker_name: str, broker_id: int) -> bool:
        return self.heartbeats.is_alive(BrokerIdentity(cluster, broker_name, broker_id), self.clock())

    # -- liveness -----------------------------------------------------------------------------------------
    async def heartbeat(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        who = BrokerIdentity(wire.text(cmd, "clusterName"), wire.text(cmd, "brokerName"),
                             wire.integer(cmd, "brokerId"))
        if self.heartbeats.get(who) is None and not self.state.holds(who.cluster, who.broker_name, who.broker_id) \
                and len(self.heartbeats) >= self.state.replica_count() + _UNREGISTERED_KEPT:
            return None if cmd.is_oneway else make_response(
                cmd, ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                f"{who.broker_name}/{who.broker_id} has no broker id and the heartbeat table is full")
        self.heartbeats.on_heartbeat(
            who, wire.text(cmd, "brokerAddr"), self.clock(), epoch=wire.opt_int(cmd, "epoch"),
            max_offset=wire.opt_int(cmd, "maxOffset"), confirm_offset=wire.opt_int(cmd, "confirmOffset"),
            timeout_ms=wire.opt_int(cmd, "heartbeatTimeoutMills"), priority=wire.opt_int(cmd, "electionPriority"),
            ha_address=cmd.ext_fields.get("haServerAddr") or None)
        previous = self._owner.get(who)
        if previous is not conn:
            if previous is not None:
                previous.attributes.get(_BROKERS_ATTR, set()).discard(who)
            self._owner[who] = conn
            conn.attributes.setdefault(_BROKERS_ATTR, set()).add(who)
        return None if cmd.is_oneway else make_response(cmd)

    def connection_closed(self, conn: RemotingConnection) -> None:
        """A broker's connection closed: it is dead now (RocketMQ elects at once, not after the timeout)."""
        gone = [who for who in conn.attributes.get(_BROKERS_ATTR, ()) if self._owner.get(who) is conn]
        for who in gone:
            del self._owner[who]
            self.heartbeats.remove(who)
        if gone:
            log.info("brokers %s disconnected", ", ".join(f"{w.broker_name}/{w.broker_id}" for w in gone))
            self._scan.wakeup()

    async def scan_once(self) -> None:
        """Expire silent brokers; on the leader, elect a master for each group whose master is lost."""
        now = self.clock()
        for who in self.heartbeats.expire(now):
            conn = self._owner.pop(who, None)
            if conn is not None:
                conn.attributes.get(_BROKERS_ATTR, set()).discard(who)
        grace = self.config.startup_grace_ms
        if not self.log.is_leader or now - self._started_at < (self.config.heartbeat_timeout_ms if grace is None
                                                                else grace):
            return
        for name in self._groups_to_elect():
            g = self.state.group(name)
            if g is None:
                continue
            decision = self.state.decide_elect(name, None, now, self.heartbeats.group(g.cluster, name),
                                               unclean=self.config.elect_unclean_master)
            if not decision.events:
                continue
            outcome = await self._commit(decision)
            after = self.state.group(name)
            if outcome.ok:
                log.info("master of %s lost: elected %s at epoch %s", name, after and after.master,
                         after and after.master_epoch)
            else:
                log.info("master of %s lost: no election (%d %s)", name, outcome.code, outcome.remark)

    def _groups_to_elect(self) -> list[str]:
        """Groups whose master is lost, and groups left without one (every candidate was dead when it was lost)
        where a replica lives again: the policy decides whether that replica may be master."""
        lost = self.state.groups_needing_election(self._is_alive)
        for name in self.state.broker_names():
            g = self.state.group(name)
            if g is not None and g.master is None and not g.first_election and name not in lost \
                    and any(self._alive(g, i) for i in g.replicas):
                lost.append(name)
        return lost

    # -- identity and registration ------------------------------------------------------------------------
    async def get_next_broker_id(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        cluster, name = wire.text(cmd, "clusterName"), wire.text(cmd, "brokerName")
        return make_response(cmd, ext_fields={"clusterName": cluster, "brokerName": name,
                                              "nextBrokerId": self.state.next_broker_id(name)})

    async def apply_broker_id(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        cluster, name = wire.text(cmd, "clusterName"), wire.text(cmd, "brokerName")
        decision = self.state.decide_apply_broker_id(cluster, name, wire.integer(cmd, "appliedBrokerId"),
                                                     wire.text(cmd, "registerCheckCode"))
        outcome = await self._commit(decision)
        return make_response(cmd, outcome.code, outcome.remark or None, {"clusterName": cluster, "brokerName": name})

    async def register_broker(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        cluster, name = wire.text(cmd, "clusterName"), wire.text(cmd, "brokerName")
        broker_id = wire.integer(cmd, "brokerId")
        outcome = await self._commit(self.state.decide_register(cluster, name, broker_id,
                                                                wire.text(cmd, "brokerAddress")))
        if not outcome.ok:
            return make_response(cmd, outcome.code, outcome.remark or None)
        self.heartbeats.touch(BrokerIdentity(cluster, name, broker_id), self.clock())
        g = self._group(name)
        return make_response(cmd, ext_fields={"clusterName": cluster, "brokerName": name, **self._master_fields(g)},
                             body=wire.sync_state_set_body(g))

    # -- elections and the SyncStateSet -------------------------------------------------------------------
    async def elect_master(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """ELECT_MASTER; brokerId -1 (or none) is an election the controller (or an operator) triggers."""
        self._require_leader()
        name = wire.text(cmd, "brokerName")
        requester = wire.opt_int(cmd, "brokerId")
        if requester is not None and requester < 0:
            requester = None
        g = self.state.group(name)
        mismatch = _other_cluster(cmd, g, ResponseCode.CONTROLLER_INVALID_REQUEST)
        if mismatch is not None:
            return mismatch
        evidence = self.heartbeats.group(g.cluster, name) if g is not None else ()
        decision = self.state.decide_elect(name, requester, self.clock(), evidence,
                                           designate=wire.flag(cmd, "designateElect") and requester is not None,
                                           unclean=self.config.elect_unclean_master)
        outcome = await self._commit(decision)
        after = self.state.group(name)
        if after is None or outcome.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                                                 ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE):
            return make_response(cmd, outcome.code, outcome.remark or None)
        # MASTER_STILL_EXIST and MASTER_NOT_AVAILABLE carry the group too: brokers take the master from them
        return make_response(cmd, outcome.code, outcome.remark or None, self._master_fields(after),
                             wire.elect_body(after))

    async def alter_sync_state_set(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        name = wire.text(cmd, "brokerName")
        members, set_epoch = wire.sync_state_set_of(cmd)
        g = self.state.group(name)
        evidence = self.heartbeats.group(g.cluster, name) if g is not None else ()
        decision = self.state.decide_alter_sync_state_set(
            name, wire.integer(cmd, "masterBrokerId"), wire.integer(cmd, "masterEpoch"), set_epoch, members,
            self.clock(), evidence)
        outcome = await self._commit(decision)
        if not outcome.ok:
            return make_response(cmd, outcome.code, outcome.remark or None)
        after = self._group(name)
        return make_response(cmd, ext_fields={"newSyncStateSetEpoch": after.sync_state_set_epoch},
                             body=wire.sync_state_set_body(after))

    async def clean_broker_data(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """CLEAN_BROKER_DATA (mqadmin cleanBrokerMetadata): forget dead replicas (brokerControllerIdsToClean,
        "1;2"), or the whole group when no ids are named and its master is gone; isCleanLivingBroker skips the
        liveness check. Checked again when applied (state.py)."""
        self._require_leader()
        name = wire.text(cmd, "brokerName")
        g = self.state.group(name)
        mismatch = _other_cluster(cmd, g, ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA)
        if mismatch is not None:
            return mismatch
        evidence = self.heartbeats.group(g.cluster, name) if g is not None else ()
        outcome = await self._commit(self.state.decide_clean(
            name, wire.broker_ids_of(cmd, "brokerControllerIdsToClean"), self.clock(), evidence,
            clean_living=wire.flag(cmd, "isCleanLivingBroker")))
        return make_response(cmd, outcome.code, outcome.remark or None)

    async def notify_role_changed(self, broker_name: str) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED (oneway) to the group's alive brokers, with the applied master and set.

        RocketMQ's fields (the brokers' handler takes a notification without ``toThisBroker`` as the controller's,
        by masterBrokerId), plus ``masterHaAddress`` when the master stated one in its heartbeats.
        """
        g = self.state.group(broker_name)
        client = self._client
        if g is None or g.master is None or client is None:
            return
        fields = self._master_fields(g)
        body = wire.sync_state_set_body(g)
        now = self.clock()
        targets = sorted({info.address for info in self.heartbeats.group(g.cluster, broker_name)
                          if info.alive_at(now) and info.broker_id in g.replicas})

        async def one(addr: str) -> None:
            try:
                await client.invoke_oneway(addr, make_request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, fields, body),
                                           self.config.notify_timeout_s)
            except Exception as exc:  # the broker polls GET_REPLICA_INFO and catches up
                log.warning("cannot notify %s of the new master of %s: %s", addr, broker_name, exc)

        await asyncio.gather(*(one(a) for a in targets))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reads --------------------------------------------------------------------------------------------
    async def get_replica_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        g = self._group(wire.text(cmd, "brokerName"))
        return make_response(cmd, ext_fields=self._master_fields(g), body=wire.sync_state_set_body(g))

    async def get_metadata_info(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        leader = self.log.is_leader
        me = self._address()
        fields: dict[str, object] = {"group": self.config.group, "isLeader": leader,
                                     "peers": ";".join(self.config.peers) or me}
        leader_addr = me if leader else self.log.leader_address
        if leader:
            fields["controllerLeaderId"] = self.config.node_id
        if leader_addr:
            fields["controllerLeaderAddress"] = leader_addr
        return make_response(cmd, ext_fields=fields)

    async def get_sync_state_data(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self._require_leader()
        names = wire.broker_names_of(cmd) if cmd.body else self.state.broker_names()
        groups = [g for g in (self.state.group(n) for n in names) if g is not None]
        return make_response(cmd, body=wire.replicas_info_body(groups, self._alive))
