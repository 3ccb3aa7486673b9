"""``cometmq admin`` replication and controller verbs: ha-status, promote, demote (docs/replication.md);
controller-metadata, sync-state, clean-broker-data, elect-master (docs/controller.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cometmq.cli_admin._common import addr_option, admin_app


# -- replication (docs/replication.md) ------------------------------------------------------------------------
def _admin_call(addr: str, timeout: float, call: Any) -> Any:
    """Run ``call(admin)`` with an admin client that talks to broker addresses directly (no nameserver);
    an SDK error becomes ``error: …`` on stderr and exit code 1."""
    from cometmq.client.admin import Admin
    from cometmq.client.errors import MQClientError

    async def main() -> Any:
        # The client's nameserver list stays unused: every request here goes to a broker address.
        async with Admin(namesrv=addr, timeout=timeout) as admin:
            return await call(admin)

    try:
        return asyncio.run(main())
    except MQClientError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _ha_table(status: Any) -> Table:
    table = Table(title=f"replication of {status.addr}", title_justify="left")
    table.add_column("")
    table.add_column("value")
    table.add_row("role", "master" if status.is_master else "replica (slave)")
    table.add_row("broker id", str(status.broker_id))
    table.add_row("master epoch", str(status.epoch))
    table.add_row("epochs (epoch@start)", ", ".join(f"{e}@{o}" for e, o in status.epochs) or "-")
    table.add_row("log end (maxOffset)", str(status.max_offset))
    if status.is_master:
        table.add_row("SyncStateSet", "{" + ", ".join(str(i) for i in status.sync_state_set or ()) + "}")
        table.add_row("SyncStateSet epoch", str(status.sync_state_set_epoch))
        table.add_row("confirm offset", str(status.confirm_offset))
        for rid, ack in sorted(status.replica_acks.items()):
            state = "in sync" if rid in (status.sync_state_set or ()) else "not in sync"
            behind = "-" if ack < 0 else f"{max(0, status.max_offset - ack)} bytes behind"
            table.add_row(f"replica {rid} ack", f"{ack} ({behind}, {state})")
        if not status.replica_acks:
            table.add_row("replicas linked", "none")
    else:
        table.add_row("master (HA address)", status.master_ha_addr or "not known yet")
        table.add_row("link", "connected" if status.connected else "not connected")
    return table


_ADDR_HELP = "the broker's remoting address, host:port"
_TIMEOUT_HELP = "request timeout (seconds)"


@admin_app.command("ha-status")
def ha_status(
    broker: Annotated[str, typer.Option("-b", "--broker", help=_ADDR_HELP, callback=addr_option)],
    as_json: Annotated[bool, typer.Option("--json", help="print the broker's GET_BROKER_HA_STATUS JSON")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Replication state of one broker: role, id, master epoch, log end; a master's SyncStateSet, confirm
    offset and replica acks; a replica's master and link (GET_BROKER_HA_STATUS)."""
    status = _admin_call(broker, timeout, lambda admin: admin.ha_status(broker))
    if as_json:
        typer.echo(json.dumps(dict(status.raw), indent=2, sort_keys=True))
        return
    Console(width=max(100, Console().width)).print(_ha_table(status))


@admin_app.command()
def promote(
    broker: Annotated[str, typer.Option("-b", "--broker", help=_ADDR_HELP, callback=addr_option)],
    epoch: Annotated[int | None, typer.Option(min=1, help="the new master epoch (default: the broker's + 1)",
                                              show_default=False)] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Make a broker its group's master (NOTIFY_BROKER_ROLE_CHANGED). Kill or demote the old master first:
    a group with two masters takes writes on both."""
    change = _admin_call(broker, timeout, lambda admin: admin.promote(broker, epoch))
    typer.echo(f"{broker} is now the master (brokerId {change.broker_id}) at epoch {change.epoch}")


@admin_app.command()
def demote(
    broker: Annotated[str, typer.Option("-b", "--broker", help=_ADDR_HELP, callback=addr_option)],
    master: Annotated[str, typer.Option("--master", help="the master's remoting address, host:port",
                                                   callback=addr_option)],
    epoch: Annotated[int | None, typer.Option(min=1, help="the master's epoch (default: asked from the master)",
                                              show_default=False)] = None,
    broker_id: Annotated[int | None, typer.Option(min=1, help="this broker's replica id (default: the one it "
                                                              "has; 1 for a former master)",
                                                  show_default=False)] = None,
    master_ha: Annotated[str | None, typer.Option(help="the master's HA address (default: its host, port + 1)",
                                                  show_default=False, callback=addr_option)] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Make a broker follow a master as a replica (NOTIFY_BROKER_ROLE_CHANGED): it truncates what the master
    does not have and copies the rest."""
    change = _admin_call(broker, timeout, lambda admin: admin.demote(broker, master, epoch=epoch, broker_id=broker_id,
                                                             master_ha_addr=master_ha))
    typer.echo(f"{broker} now follows {master} as replica {change.broker_id} (its log's last epoch: {change.epoch})")


# -- the controller (docs/controller.md) ---------------------------------------------------------------------
_CONTROLLER_HELP = "a controller's address, host:port (a follower's answer is followed to the leader)"


def _replicas_text(replicas: Any) -> str:
    return ", ".join(f"{r.broker_id}@{r.address}{'' if r.alive else ' (dead)'}" for r in replicas) or "-"


@admin_app.command("controller-metadata")
def controller_metadata(
    controller: Annotated[str, typer.Option("-c", "--controller", help=_CONTROLLER_HELP, callback=addr_option)],
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """The controller group, its leader and peers (GET_METADATA_INFO; mqadmin getControllerMetaData)."""
    meta = _admin_call(controller, timeout, lambda admin: admin.get_controller_metadata(controller))
    typer.echo(f"#ControllerGroup\t{meta.group or '-'}\n#ControllerLeaderId\t{meta.leader_id or '-'}\n"
               f"#ControllerLeaderAddress\t{meta.leader_addr or '-'}\n#IsLeader\t{str(meta.is_leader).lower()}\n"
               f"#Peers\t{meta.peers or '-'}")


@admin_app.command("sync-state")
def sync_state(
    controller: Annotated[str, typer.Option("-c", "--controller", help=_CONTROLLER_HELP, callback=addr_option)],
    broker_names: Annotated[list[str], typer.Option("-b", "--broker-name", help="a broker group (repeatable)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the groups as JSON")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Each group's master, epochs and SyncStateSet as the controller has them (GET_SYNC_STATE_DATA;
    mqadmin getSyncStateSet)."""
    groups = _admin_call(controller, timeout, lambda admin: admin.get_sync_state_data(controller, broker_names))
    missing = [n for n in broker_names if n not in groups]
    if as_json:
        typer.echo(json.dumps({n: {"masterBrokerId": g.master_id, "masterAddress": g.master_addr,
                                   "masterEpoch": g.master_epoch, "syncStateSetEpoch": g.sync_state_set_epoch,
                                   "inSyncReplicas": [r.broker_id for r in g.in_sync],
                                   "notInSyncReplicas": [r.broker_id for r in g.not_in_sync]}
                               for n, g in groups.items()}, indent=2, sort_keys=True))
    else:
        table = Table(title=f"SyncStateSets at {controller}", title_justify="left")
        for col in ("broker name", "master", "master epoch", "set epoch", "in sync", "not in sync"):
            table.add_column(col)
        for name, g in sorted(groups.items()):
            master = "none" if g.master_id is None else f"{g.master_id}@{g.master_addr or '?'}"
            table.add_row(name, master, str(g.master_epoch), str(g.sync_state_set_epoch),
                          _replicas_text(g.in_sync), _replicas_text(g.not_in_sync))
        Console(width=max(100, Console().width)).print(table)
    if missing:
        typer.echo(f"not known to the controller: {', '.join(missing)}", err=True)
        raise typer.Exit(1)


@admin_app.command("clean-broker-data")
def clean_broker_data(
    controller: Annotated[str, typer.Option("-c", "--controller", help=_CONTROLLER_HELP, callback=addr_option)],
    cluster: Annotated[str, typer.Option("--cluster", help="the broker group's cluster")],
    broker_name: Annotated[str, typer.Option("--broker-name", help="the broker group")],
    broker_ids: Annotated[str | None, typer.Option("-b", "--broker-ids",
                                                   help="ids to forget, '1;2' (default: the whole group, once "
                                                        "its master is gone)", show_default=False)] = None,
    clean_living: Annotated[bool, typer.Option("--clean-living", help="forget them even if alive")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Forget brokers of a group at the controller (CLEAN_BROKER_DATA; mqadmin cleanBrokerMetadata)."""
    ids: list[int] | None = None
    if broker_ids is not None:
        try:
            ids = [int(p) for p in broker_ids.replace(",", ";").split(";") if p.strip()]
        except ValueError:
            raise typer.BadParameter(f"not a list of broker ids: {broker_ids!r}", param_hint="--broker-ids") from None
        if not ids:  # sent as an empty field, the controller would forget the whole group
            raise typer.BadParameter("names no broker id (leave the option out to forget the whole group)",
                                     param_hint="--broker-ids")
    _admin_call(controller, timeout, lambda admin: admin.clean_broker_data(controller, cluster, broker_name, ids,
                                                                          clean_living=clean_living))
    typer.echo(f"{broker_name}: {'brokers ' + ';'.join(map(str, ids)) if ids else 'the group'} forgotten")


@admin_app.command("elect-master")
def elect_master(
    controller: Annotated[str, typer.Option("-c", "--controller", help=_CONTROLLER_HELP, callback=addr_option)],
    cluster: Annotated[str, typer.Option("--cluster", help="the broker group's cluster")],
    broker_name: Annotated[str, typer.Option("--broker-name", help="the broker group")],
    broker_id: Annotated[int | None, typer.Option(min=1, help="the broker to make master (an alive member of the "
                                                              "SyncStateSet; default: the controller chooses)",
                                                  show_default=False)] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help=_TIMEOUT_HELP)] = 5.0,
) -> None:
    """Elect a master for a broker group (ELECT_MASTER; mqadmin electMaster)."""
    result = _admin_call(controller, timeout,
                         lambda admin: admin.elect_master(controller, cluster, broker_name, broker_id))
    master = "none" if result.master_id is None else f"{result.master_id} ({result.master_addr or '?'})"
    typer.echo(f"{broker_name}: master {master} at epoch {result.master_epoch}, SyncStateSet "
               f"{{{', '.join(str(i) for i in result.sync_state_set)}}} (epoch {result.sync_state_set_epoch})")
