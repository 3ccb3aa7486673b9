"""The ACL part of the admin client (docs/security.md): RocketMQ's ACL administration requests (mqadmin
updateAclConfig, deleteAclConfig, updateGlobalWhiteAddr, clusterAclConfigVersion, getAclConfig) sent to every master
of a cluster, or to one broker. ``Admin`` (client/admin.py) has these methods; the caller needs an admin account."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cometmq.client.errors import BrokerError
from cometmq.client.instance import ClientInstance
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.remoting import make_request


class AclAdmin:
    """Mixed into ``Admin``, whose ``_check`` gives the started client instance."""

    _check: Callable[[], ClientInstance]

    if TYPE_CHECKING:
        async def _masters(self, *, cluster: str | None, broker: str | None) -> dict[str, str]: ...

    async def _each(self, code: int, fields: dict[str, Any], what: str, *, cluster: str | None,
                    broker: str | None) -> dict[str, Any]:
        masters = await self._masters(cluster=cluster, broker=broker)
        inst = self._check()
        replies = await asyncio.gather(*(inst.invoke_ok(addr, make_request(code, fields), context=f"{what} on {name}")
                                         for name, addr in masters.items()))
        return dict(zip(masters, replies, strict=True))

    async def update_acl_account(self, access_key: str, *, secret_key: str | None = None,
                                 white_remote_address: str | None = None, admin: bool | None = None,
                                 default_topic_perm: str | None = None, default_group_perm: str | None = None,
                                 topic_perms: Iterable[str] | None = None, group_perms: Iterable[str] | None = None,
                                 cluster: str | None = None, broker: str | None = None) -> list[str]:
        """Create the account or change the fields given (UPDATE_AND_CREATE_ACL_CONFIG); the broker names done.
        ``topic_perms`` / ``group_perms``: ``["topicA=PUB", "topicB=PUB|SUB"]`` (replace the account's list)."""
        fields: dict[str, Any] = {"accessKey": access_key, "secretKey": secret_key,
                                  "whiteRemoteAddress": white_remote_address,
                                  "admin": None if admin is None else str(admin).lower(),
                                  "defaultTopicPerm": default_topic_perm, "defaultGroupPerm": default_group_perm,
                                  "topicPerms": None if topic_perms is None else ",".join(topic_perms),
                                  "groupPerms": None if group_perms is None else ",".join(group_perms)}
        fields = {k: v for k, v in fields.items() if v is not None}
        done = await self._each(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, fields, f"update ACL of {access_key}",
                                cluster=cluster, broker=broker)
        return sorted(done)

    async def delete_acl_account(self, access_key: str, *, cluster: str | None = None,
                                 broker: str | None = None) -> list[str]:
        done = await self._each(RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key},
                                f"delete ACL of {access_key}", cluster=cluster, broker=broker)
        return sorted(done)

    async def update_global_white_addrs(self, patterns: Iterable[str], *, cluster: str | None = None,
                                        broker: str | None = None) -> list[str]:
        done = await self._each(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": ",".join(patterns)},
                                "update global allow-list", cluster=cluster, broker=broker)
        return sorted(done)

    async def acl_config(self, *, cluster: str | None = None, broker: str | None = None) -> dict[str, Any]:
        """Each broker's ACL (GET_BROKER_CLUSTER_ACL_CONFIG): {broker name: {globalWhiteAddrs, plainAccessConfigs}}."""
        out: dict[str, Any] = {}
        for name, r in (await self._each(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {}, "ACL config",
                                         cluster=cluster, broker=broker)).items():
            try:
                out[name] = json.loads(r.body)
            except ValueError:
                raise BrokerError(r.code, "the broker's ACL config is not JSON", context=name) from None
        return out

    async def acl_versions(self, *, cluster: str | None = None, broker: str | None = None) -> dict[str, Any]:
        """Each broker's ACL file version (GET_BROKER_CLUSTER_ACL_INFO): {broker name: {brokerAddr, version}}."""
        out: dict[str, Any] = {}
        for name, r in (await self._each(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {}, "ACL version",
                                         cluster=cluster, broker=broker)).items():
            ext = r.ext_fields
            try:
                version = json.loads(ext.get("version") or "{}")
            except ValueError:
                version = ext.get("version")
            out[name] = {"brokerAddr": ext.get("brokerAddr"), "clusterName": ext.get("clusterName"),
                         "version": version}
        return out
