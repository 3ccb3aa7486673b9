"""RocketMQ's ACL administration requests (mqadmin updateAclConfig, deleteAclConfig, updateGlobalWhiteAddr,
clusterAclConfigVersion, getAclConfig), served by a broker over its ACL file. All are admin codes (policy.py).

UPDATE_AND_CREATE_ACL_CONFIG (50) creates an account or changes the fields the request carries (the others keep
their values, as RocketMQ merges); DELETE_ACL_CONFIG (51) removes one; UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53) replaces
the global allow-list; GET_BROKER_CLUSTER_ACL_INFO (52) answers the file's dataVersion; GET_BROKER_CLUSTER_ACL_CONFIG
(54) the whole ACL as JSON. Every change is written to the file at once (atomically) and is in force for the next
request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from cometmq.acl.control import AccessControl
from cometmq.acl.model import AclConfigError, AddressPattern, account_from_yaml
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_response

#: RocketMQ's ResponseCode for failed ACL changes (numbers shared with POLLING_FULL & co. in RocketMQ itself)
UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
DELETE_ACL_CONFIG_FAILED = 210
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211

#: CreateAccessConfigRequestHeader's fields, as they are in plain_acl.yml
_ACCOUNT_FIELDS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                   "topicPerms", "groupPerms")


class AclAdminProcessor:
    def __init__(self, acl: AccessControl, *, broker_name: str = "", cluster_name: str = "",
                 broker_addr: Callable[[], str] = lambda: "") -> None:
        self.acl = acl
        self.broker_name = broker_name
        self.cluster_name = cluster_name
        self.broker_addr = broker_addr

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: self.update_account,
                RequestCode.DELETE_ACL_CONFIG: self.delete_account,
                RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: self.update_global_white,
                RequestCode.GET_BROKER_CLUSTER_ACL_INFO: self.version,
                RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: self.get_config}

    async def _reread(self) -> str | None:
        """Changes start from the file as it is now (an operator may have edited it since the last poll); the
        remark of a refusal when the file is still being written (a change then would overwrite it)."""
        try:
            await self.acl.reload_settled()
        except AclConfigError as exc:
            return str(exc)
        return None

    async def update_account(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        if (busy := await self._reread()) is not None:
            return make_response(cmd, UPDATE_AND_CREATE_ACL_CONFIG_FAILED, busy)
        config = self.acl.config
        key = ext.get("accessKey", "")
        old = config.accounts.get(key)
        raw: dict[str, object] = old.to_yaml() if old is not None else {}
        for name in _ACCOUNT_FIELDS:
            value = ext.get(name)
            if value is not None and (value != "" or name in ("whiteRemoteAddress", "topicPerms", "groupPerms")):
                raw[name] = value
        try:
            account = account_from_yaml(raw)
        except ValueError as exc:
            return make_response(cmd, UPDATE_AND_CREATE_ACL_CONFIG_FAILED, f"{getattr(exc, 'key', 'account')}: {exc}")
        accounts = dict(config.accounts)
        accounts[account.access_key] = account
        self.acl.save(replace(config, accounts=accounts))
        return make_response(cmd, ResponseCode.SUCCESS)

    async def delete_account(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        key = cmd.ext_fields.get("accessKey", "")
        if (busy := await self._reread()) is not None:
            return make_response(cmd, DELETE_ACL_CONFIG_FAILED, busy)
        config = self.acl.config
        if key not in config.accounts:
            return make_response(cmd, DELETE_ACL_CONFIG_FAILED, f"The accesskey:{key} is not configured in the ACL")
        accounts = {k: v for k, v in config.accounts.items() if k != key}
        self.acl.save(replace(config, accounts=accounts))
        return make_response(cmd, ResponseCode.SUCCESS)

    async def update_global_white(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        text = cmd.ext_fields.get("globalWhiteAddrs", "")
        try:
            patterns = tuple(p for p in (AddressPattern.parse(item) for item in text.split(",")) if p is not None)
        except (ValueError, AclConfigError) as exc:
            return make_response(cmd, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, str(exc))
        if (busy := await self._reread()) is not None:
            return make_response(cmd, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, busy)
        self.acl.save(replace(self.acl.config, global_white=patterns))
        return make_response(cmd, ResponseCode.SUCCESS)

    def _version(self) -> dict[str, object]:
        c = self.acl.config
        return {"counter": c.counter, "timestamp": c.timestamp, "stateVersion": 0}

    async def version(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        await self._reread()  # (still being written: the ACL in force answers)
        version = json.dumps(self._version())
        return make_response(cmd, ResponseCode.SUCCESS, ext_fields={
            "version": version, "allAclFileVersion": json.dumps({str(self.acl.path): self._version()}),
            "brokerName": self.broker_name, "brokerAddr": self.broker_addr(), "clusterName": self.cluster_name})

    async def get_config(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        await self._reread()
        c = self.acl.config
        body = {"globalWhiteAddrs": [p.text for p in c.global_white],
                "plainAccessConfigs": [a.to_yaml() for a in c.accounts.values()]}
        return make_response(cmd, ResponseCode.SUCCESS, body=json.dumps(body).encode())
