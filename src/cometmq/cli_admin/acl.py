"""ACL verbs (docs/security.md), RocketMQ's mqadmin names and letters: updateAclConfig, deleteAclConfig,
updateGlobalWhiteAddr, getAclConfig, clusterAclConfigVersion. They change the ACL file of every master of a cluster
(or one broker, -b) through its admin requests, so the caller needs an admin account
(``cometmq admin --access-key … --secret-key …``)."""

from __future__ import annotations

from typing import Annotated

import typer

from cometmq.cli_admin._common import (
    AsJson,
    Namesrv,
    Timeout,
    admin_app,
    broker_option,
    parse_bool,
    print_json,
    run,
    show,
    table,
)

_BROKER = Annotated[str | None, typer.Option("-b", "--brokerAddr", help="this broker only (address or name)",
                                             show_default=False, callback=broker_option)]
_CLUSTER = Annotated[str | None, typer.Option("-c", "--clusterName", help="the cluster (default: the only one)",
                                              show_default=False)]
_ACCESS_KEY = Annotated[str, typer.Option("-a", "--accessKey", help="the account's access key")]


def _target(broker: str | None, cluster: str | None) -> None:
    if broker is not None and cluster is not None:
        raise typer.BadParameter("give -b or -c, not both", param_hint="-b/-c")


def _list(value: str | None) -> list[str] | None:
    return None if value is None else [s.strip() for s in value.split(",") if s.strip()]


@admin_app.command("updateAclConfig")
def update_acl_config(
    access_key: _ACCESS_KEY,
    namesrv: Namesrv = "",
    secret_key: Annotated[str | None, typer.Option("-s", "--secretKey", help="its secret key",
                                                   show_default=False)] = None,
    white: Annotated[str | None, typer.Option("-w", "--whiteRemoteAddress", help="addresses allowed without a "
                                              "signature (192.168.0.*, a,b, 10.0.0.{1,2})", show_default=False)] = None,
    default_topic_perm: Annotated[str | None, typer.Option("-i", "--defaultTopicPerm", metavar="PUB|SUB|DENY",
                                                           help="permission on unnamed topics",
                                                           show_default=False)] = None,
    default_group_perm: Annotated[str | None, typer.Option("-u", "--defaultGroupPerm", metavar="PUB|SUB|DENY",
                                                           help="permission on unnamed groups",
                                                           show_default=False)] = None,
    topic_perms: Annotated[str | None, typer.Option("-t", "--topicPerms", metavar="topicA=PUB,topicB=PUB|SUB",
                                                    help="per-topic permissions (replace the account's list)",
                                                    show_default=False)] = None,
    group_perms: Annotated[str | None, typer.Option("-g", "--groupPerms", metavar="groupA=SUB",
                                                    help="per-group permissions (replace the account's list)",
                                                    show_default=False)] = None,
    admin: Annotated[str | None, typer.Option("-m", "--admin", metavar="true|false", help="admin rights",
                                              show_default=False)] = None,
    broker: _BROKER = None,
    cluster: _CLUSTER = None,
    as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Create an ACL account or change the fields given (UPDATE_AND_CREATE_ACL_CONFIG)."""
    _target(broker, cluster)
    is_admin = parse_bool(admin, "-m")
    done = run(namesrv, timeout, lambda a: a.update_acl_account(
        access_key, secret_key=secret_key, white_remote_address=white, admin=is_admin,
        default_topic_perm=default_topic_perm, default_group_perm=default_group_perm,
        topic_perms=_list(topic_perms), group_perms=_list(group_perms), cluster=cluster, broker=broker))
    if as_json:
        print_json({"accessKey": access_key, "brokers": done})
    else:
        typer.echo(f"updateAclConfig: {access_key} on {', '.join(done)}")


@admin_app.command("deleteAclConfig")
def delete_acl_config(access_key: _ACCESS_KEY, namesrv: Namesrv = "", broker: _BROKER = None,
                      cluster: _CLUSTER = None, as_json: AsJson = False, timeout: Timeout = 5.0) -> None:
    """Delete an ACL account (DELETE_ACL_CONFIG)."""
    _target(broker, cluster)
    done = run(namesrv, timeout, lambda a: a.delete_acl_account(access_key, cluster=cluster, broker=broker))
    if as_json:
        print_json({"accessKey": access_key, "brokers": done})
    else:
        typer.echo(f"deleteAclConfig: {access_key} on {', '.join(done)}")


@admin_app.command("updateGlobalWhiteAddr")
def update_global_white_addr(
    addresses: Annotated[str, typer.Option("-g", "--globalWhiteRemoteAddresses",
                                           help="comma-separated patterns allowed without credentials ('' clears)")],
    namesrv: Namesrv = "", broker: _BROKER = None, cluster: _CLUSTER = None, as_json: AsJson = False,
    timeout: Timeout = 5.0,
) -> None:
    """Replace the global address allow-list (UPDATE_GLOBAL_WHITE_ADDRS_CONFIG)."""
    _target(broker, cluster)
    patterns = _list(addresses) or []
    done = run(namesrv, timeout, lambda a: a.update_global_white_addrs(patterns, cluster=cluster, broker=broker))
    if as_json:
        print_json({"globalWhiteRemoteAddresses": patterns, "brokers": done})
    else:
        typer.echo(f"updateGlobalWhiteAddr: [{', '.join(patterns)}] on {', '.join(done)}")


@admin_app.command("getAclConfig")
def get_acl_config(namesrv: Namesrv = "", broker: _BROKER = None, cluster: _CLUSTER = None,
                   show_secrets: Annotated[bool, typer.Option("--show-secrets", help="print secret keys too")] = False,
                   as_json: AsJson = False, timeout: Timeout = 5.0) -> None:
    """Each broker's ACL: global allow-list and accounts (GET_BROKER_CLUSTER_ACL_CONFIG)."""
    _target(broker, cluster)
    configs = run(namesrv, timeout, lambda a: a.acl_config(cluster=cluster, broker=broker))
    if not show_secrets:
        for cfg in configs.values():
            for account in cfg.get("plainAccessConfigs") or ():
                if isinstance(account, dict) and account.get("secretKey"):
                    account["secretKey"] = "***"
    if as_json:
        print_json(configs)
        return
    for name, cfg in sorted(configs.items()):
        rows = [(a.get("accessKey"), a.get("secretKey"), a.get("admin"), a.get("whiteRemoteAddress") or "-",
                 a.get("defaultTopicPerm"), a.get("defaultGroupPerm"), ", ".join(a.get("topicPerms") or ()) or "-",
                 ", ".join(a.get("groupPerms") or ()) or "-") for a in cfg.get("plainAccessConfigs") or ()]
        show(table(f"{name}: ACL (global allow-list: {', '.join(cfg.get('globalWhiteAddrs') or ()) or 'none'})",
                   ("accessKey", "secretKey", "admin", "whiteRemoteAddress", "defaultTopicPerm", "defaultGroupPerm",
                    "topicPerms", "groupPerms"), rows))


@admin_app.command("clusterAclConfigVersion")
def cluster_acl_config_version(namesrv: Namesrv = "", broker: _BROKER = None, cluster: _CLUSTER = None,
                               as_json: AsJson = False, timeout: Timeout = 5.0) -> None:
    """Each broker's ACL file version (GET_BROKER_CLUSTER_ACL_INFO)."""
    _target(broker, cluster)
    versions = run(namesrv, timeout, lambda a: a.acl_versions(cluster=cluster, broker=broker))
    if as_json:
        print_json(versions)
        return
    rows = [(name, v.get("brokerAddr"), (v.get("version") or {}).get("counter"),
             (v.get("version") or {}).get("timestamp")) for name, v in sorted(versions.items())]
    show(table("ACL versions", ("broker", "address", "counter", "timestamp"), rows))
