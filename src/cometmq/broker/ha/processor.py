"""The broker's replication requests: role changes (NOTIFY_BROKER_ROLE_CHANGED 1008 — what RocketMQ's controller
sends after an election, and what ``cometmq admin promote/demote`` sends), the HA status (GET_BROKER_HA_STATUS
907, as JSON) and the epoch list (GET_BROKER_EPOCH_CACHE 1007)."""

from __future__ import annotations

import json

from cometmq.broker.ha.role import role_info
from cometmq.broker.ha.service import FencedError, ReplicationService
from cometmq.broker.ha.sync_state import MASTER_ID
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_response


def _int_field(cmd: RemotingCommand, name: str, default: int | None = None) -> int:
    raw = cmd.ext_fields.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} is missing")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} is not an integer: {raw!r}") from None


class HAProcessor:
    def __init__(self, replication: ReplicationService, *, cluster: str, broker_name: str) -> None:
        self.replication = replication
        self.cluster = cluster
        self.broker_name = broker_name

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED: self.role_changed,
            RequestCode.GET_BROKER_HA_STATUS: self.ha_status,
            RequestCode.GET_BROKER_EPOCH_CACHE: self.epoch_cache,
        }

    async def role_changed(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        """``toThisBroker=true``: this broker becomes the master at masterEpoch. Otherwise it follows the master at
        masterAddress / masterHaAddress (the nameservers' master when they are absent) as replica ``brokerId``.

        A controller's notification (RocketMQ's fields: masterBrokerId, masterAddress, masterEpoch,
        syncStateSetEpoch, the SyncStateSet body; no ``toThisBroker``) names the master by its broker id: this
        broker becomes the master when the id is its own, else follows it, and a master takes the set; all only at
        a master epoch above the last one it acted on."""
        epoch = _int_field(cmd, "masterEpoch")
        fields = cmd.ext_fields
        if "toThisBroker" not in fields and fields.get("masterBrokerId") not in (None, ""):
            done = await self.replication.apply_role(role_info(fields, cmd.body))
            if done == "ignored":
                raise RemotingError(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                                    f"master epoch {epoch} is not above this broker's "
                                    f"{max(self.replication.acted_epoch, self.replication.epoch)}")
            return make_response(cmd, ResponseCode.SUCCESS, done, {"brokerId": str(self.replication.broker_id),
                                                                   "masterEpoch": str(self.replication.epoch)})
        promote = fields.get("toThisBroker", "").lower() == "true"
        try:
            if promote:
                await self.replication.promote(epoch)
            else:
                ha_addr = fields.get("masterHaAddress") or None
                replica_id = _int_field(cmd, "brokerId", self.replication.replica_id)
                if replica_id == MASTER_ID:
                    raise RemotingError(ResponseCode.SYSTEM_ERROR, "a replica's brokerId is 1 or more")
                await self.replication.demote(epoch, ha_addr, replica_id, fields.get("masterAddress") or None)
        except FencedError as exc:
            raise RemotingError(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, str(exc)) from None
        except ValueError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        return make_response(cmd, ResponseCode.SUCCESS, None, {"brokerId": str(self.replication.broker_id),
                                                               "masterEpoch": str(self.replication.epoch)})

    async def ha_status(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        body = json.dumps(self.replication.status()).encode()
        return make_response(cmd, ResponseCode.SUCCESS, None, {}, body)

    async def epoch_cache(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        r = self.replication
        entries = r.epochs.entries
        max_offset = r.store.commitlog.max_offset
        epoch_list = [{"epoch": e.epoch, "startOffset": e.start_offset,
                       "endOffset": entries[i + 1].start_offset if i + 1 < len(entries) else max_offset}
                      for i, e in enumerate(entries)]
        body = {"clusterName": self.cluster, "brokerName": self.broker_name, "brokerId": r.broker_id,
                "epochList": epoch_list, "maxOffset": max_offset}
        return make_response(cmd, ResponseCode.SUCCESS, None, {}, json.dumps(body).encode())
