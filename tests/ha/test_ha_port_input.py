"""Bad input on the master's HA port closes that one link and changes nothing else (in process).

A master and a real replica are linked; a raw TCP peer then sends garbage, a handshake with a broker id of 0 or
below, a second handshake, a report before any handshake, a report beyond the master's log, or a handshake
claiming the id the real replica holds. Each time the master closes the peer's connection, the real replica
stays linked and in the SyncStateSet, and the master keeps acknowledging sends (which the replica then has).
A peer that never completed a handshake cannot move the confirm offset (RocketMQ #3015).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient, split_address
from cometmq.protocol import ha
from cometmq.protocol.codes import ResponseCode
from tests.broker.conftest import StartBroker, send_request
from tests.kit import eventually

HA_CONF = {"ha_send_heartbeat_interval_ms": 250, "ha_housekeeping_interval_ms": 100,
           "ha_max_time_slave_not_catchup_ms": 60_000, "slave_ack_timeout_ms": 500}


def confirm_of(b: BrokerController) -> int:
    return b.replication.sync.confirm_offset(b.store.commitlog.max_offset)


async def linked(start_broker: StartBroker, tmp_path: Path, **conf: object) -> tuple[BrokerController,
                                                                                    BrokerController]:
    master = await start_broker(tmp_path / "m", **{**HA_CONF, **conf})
    replica = await start_broker(tmp_path / "r", broker_id=1, **{**HA_CONF, **conf})
    await replica.replication.demote(master.replication.epoch, master.ha_addr, 1, master.addr)
    await eventually(lambda: master.replication.sync.members == {0, 1}, 10, what="the replica in the set")
    return master, replica


async def send_ok(client: RemotingClient, master: BrokerController, body: bytes) -> None:
    reply = await client.invoke(master.addr, send_request("T", body), 5)
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)


async def closed_by_master(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Read until the master closes the connection; what it sent meanwhile."""
    got = bytearray()
    async with asyncio.timeout(timeout):
        while data := await reader.read(65536):
            got += data
    return bytes(got)


def handshake(broker_id: int) -> bytes:
    return struct.pack(">ihhq", ha.HAState.HANDSHAKE, 0, 0, broker_id)  # any id, even one the encoder refuses


BAD_INPUT: dict[str, Callable[[int], bytes]] = {
    "garbage": lambda end: bytes(range(256)) * 4,
    "unknown state": lambda end: struct.pack(">iq", 7, 0),
    "bad handshake flags": lambda end: struct.pack(">ihhq", ha.HAState.HANDSHAKE, 3, 0, 5),
    "broker id 0": lambda end: handshake(0),
    "negative broker id": lambda end: handshake(-1),
    "report before handshake": lambda end: ha.encode_slave_report(end),
    "second handshake": lambda end: handshake(5) + handshake(5),
    "report beyond the log": lambda end: handshake(5) + ha.encode_slave_report(end + 1),
    "negative report": lambda end: handshake(5) + struct.pack(">iq", ha.HAState.TRANSFER, -1),
    "id already linked": lambda end: handshake(1) + ha.encode_slave_report(end),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
async def test_bad_input_closes_only_that_link(start_broker: StartBroker, client: RemotingClient, tmp_path: Path,
                                               case: str) -> None:
    master, replica = await linked(start_broker, tmp_path)
    for i in range(5):
        await send_ok(client, master, f"before-{i}".encode())
    assert master.replication.master is not None
    real_link = master.replication.master.links[1]
    confirm = confirm_of(master)

    host, port = split_address(master.ha_addr)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(BAD_INPUT[case](master.store.commitlog.max_offset))
        await writer.drain()
        await closed_by_master(reader)
    finally:
        writer.close()

    assert master.replication.master.links == {1: real_link}
    assert master.replication.sync.members == {0, 1}
    assert confirm_of(master) == confirm
    assert set(master.replication.sync.replicas) <= {1, 5}
    for i in range(5):
        await send_ok(client, master, f"after-{i}".encode())  # acknowledged: so the replica has them
    assert replica.store.commitlog.max_offset == master.store.commitlog.max_offset
    assert replica.replication.replica is not None and replica.replication.replica.connected


async def test_a_silent_half_handshake_is_closed_after_four_heartbeats(start_broker: StartBroker,
                                                                       client: RemotingClient,
                                                                       tmp_path: Path) -> None:
    master, _ = await linked(start_broker, tmp_path)
    host, port = split_address(master.ha_addr)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(handshake(5)[:10])
        await writer.drain()
        loop = asyncio.get_running_loop()
        start = loop.time()
        await closed_by_master(reader, timeout=5)
        assert loop.time() - start >= 0.9  # 4 x 250 ms
    finally:
        writer.close()
    assert master.replication.master is not None and set(master.replication.master.links) == {1}
    await send_ok(client, master, b"still serving")


async def test_reports_of_a_peer_that_did_not_handshake_never_move_the_confirm_offset(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """#3015: the real replica is away (still in the set), so the confirm offset is held back; a peer that
    only reports the master's log end is closed and the confirm offset stays where the replica left it."""
    master, replica = await linked(start_broker, tmp_path)
    await send_ok(client, master, b"acked by both")
    assert replica.replication.replica is not None
    await replica.replication.replica.stop()  # the replica's link goes; it stays in the set (60 s)
    await eventually(lambda: not master.replication.master or 1 not in master.replication.master.links, 5,
                     what="the master noticing the link is gone")
    reply = await client.invoke(master.addr, send_request("T", b"not acked"), 5)
    assert reply.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (reply.code, reply.remark)
    held = confirm_of(master)
    assert held < master.store.commitlog.max_offset
    assert master.store.reput.reput_offset <= held  # consumers see nothing above it

    host, port = split_address(master.ha_addr)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(ha.encode_slave_report(master.store.commitlog.max_offset) * 3)
        await writer.drain()
        await closed_by_master(reader)
    finally:
        writer.close()
    assert confirm_of(master) == held
    assert master.store.reput.reput_offset <= held  # consumers see nothing above it
    assert set(master.replication.sync.replicas) == {1}


async def test_a_new_peer_that_acks_everything_does_not_lift_the_confirm_offset(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """A peer that handshakes under a fresh id and acks the master's end joins the count, but with all-ack the
    confirm offset is the lowest member's: it stays at what the absent real replica has."""
    master, replica = await linked(start_broker, tmp_path)
    assert replica.replication.replica is not None
    await replica.replication.replica.stop()
    await eventually(lambda: not master.replication.master or 1 not in master.replication.master.links, 5,
                     what="the master noticing the link is gone")
    reply = await client.invoke(master.addr, send_request("T", b"not acked"), 5)
    assert reply.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, (reply.code, reply.remark)
    held = confirm_of(master)

    host, port = split_address(master.ha_addr)
    _, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(handshake(9))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(ha.encode_slave_report(master.store.commitlog.max_offset))
        await writer.drain()
        await asyncio.sleep(0.3)
        assert confirm_of(master) == held
        assert master.store.reput.reput_offset <= held  # consumers see nothing above it
    finally:
        writer.close()


async def test_a_peer_under_an_unknown_id_cannot_stand_in_for_a_missing_replica(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path, namesrv: str) -> None:
    """minInSyncReplicas 2: the real replica is gone and has left the set, so sends are refused. A peer that
    handshakes under an id no broker of the group has, and acks whatever the master has, must not make the
    master acknowledge sends again (no broker but the master would have them)."""
    # The brokers register with a nameserver: the master admits to its HA port only the ids registered there
    # for its group (#3015).
    master, replica = await linked(start_broker, tmp_path, min_in_sync_replicas=2,
                                   ha_max_time_slave_not_catchup_ms=300, namesrv_addr=namesrv)
    await send_ok(client, master, b"acked by both")
    assert replica.replication.replica is not None
    await replica.replication.replica.stop()
    await eventually(lambda: master.replication.sync.members == {0}, 5, what="the replica leaving the set")
    refused = await client.invoke(master.addr, send_request("T", b"refused"), 5)
    assert refused.code != ResponseCode.SUCCESS

    host, port = split_address(master.ha_addr)
    _, writer = await asyncio.open_connection(host, port)

    async def ack_everything() -> None:
        while True:
            writer.write(ha.encode_slave_report(master.store.commitlog.max_offset))
            await asyncio.sleep(0.01)

    writer.write(handshake(9))
    acker = asyncio.create_task(ack_everything())
    try:
        await asyncio.sleep(0.3)
        reply = await client.invoke(master.addr, send_request("T", b"held only by the master"), 5)
        members = sorted(master.replication.sync.members)
        assert reply.code != ResponseCode.SUCCESS, f"acknowledged with the set {members}"
    finally:
        acker.cancel()
        await asyncio.gather(acker, return_exceptions=True)
        writer.close()


async def test_a_link_that_ends_as_an_append_wakes_it_is_torn_down(start_broker: StartBroker, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A link whose read side ends in the loop turn an append wakes its send loop is still removed, so its
    replica can link again. (Chaos run double-failover seed 1: on Python 3.11 ``asyncio.wait_for`` swallowed the
    send loop's cancellation, ``_Link.run`` waited for it forever and the replica was refused as "already
    linked" from then on.)"""
    from cometmq.broker.ha import master as ha_master

    read_loop = ha_master._Link._read_loop

    async def read_loop_then_wake(self: ha_master._Link) -> None:
        try:
            await read_loop(self)
        finally:
            self.wake.set()  # an append's wake-up, in the turn run() cancels the send loop

    monkeypatch.setattr(ha_master._Link, "_read_loop", read_loop_then_wake)
    master, _ = await linked(start_broker, tmp_path)
    links = master.replication.master.links if master.replication.master else {}
    host, port = split_address(master.ha_addr)
    _, writer = await asyncio.open_connection(host, port)
    writer.write(handshake(5))
    await writer.drain()
    await eventually(lambda: 5 in links, 5, what="peer 5 linked")
    writer.close()
    await eventually(lambda: 5 not in links, 5, what="the ended link removed")
    _, writer2 = await asyncio.open_connection(host, port)
    try:
        writer2.write(handshake(5))
        await writer2.drain()
        await eventually(lambda: 5 in links, 5, what="peer 5 linked again")
    finally:
        writer2.close()
