"""A master and a replica in one process, linked over the HA port on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import decode_record
from cometmq.protocol.remoting import make_request
from cometmq.timer.message import TIMER_TOPIC
from tests.broker.conftest import StartBroker, props, send_request
from tests.kit import eventually


async def link(replica: BrokerController, master: BrokerController, replica_id: int = 1) -> None:
    await replica.replication.demote(master.replication.epoch, master.ha_addr, replica_id, master.addr)


async def test_a_replica_copies_the_log_and_sends_are_acked_by_both(start_broker: StartBroker,
                                                                    client: RemotingClient, tmp_path: Path) -> None:
    master = await start_broker(tmp_path / "m")
    for i in range(20):
        reply = await client.invoke(master.addr, send_request("T", f"before-{i}".encode()), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
    replica = await start_broker(tmp_path / "r", broker_id=1)
    await link(replica, master)
    await eventually(lambda: master.replication.sync.members == {0, 1}, 10, what="the replica in the set")
    for i in range(50):
        reply = await client.invoke(master.addr, send_request("T", f"after-{i}".encode()), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        # acknowledged: the replica has it
        assert replica.store.commitlog.max_offset >= master.store.commitlog.max_offset or \
            master.replication.sync.confirm_offset(master.store.commitlog.max_offset) <= \
            replica.store.commitlog.max_offset
    await eventually(lambda: replica.store.commitlog.max_offset == master.store.commitlog.max_offset, 10,
                     what="the replica caught up")
    m_end = master.store.commitlog.max_offset
    assert bytes(master.store.commitlog.read(0, m_end)) == bytes(replica.store.commitlog.read(0, m_end))
    await eventually(lambda: replica.store.max_offset("T", 0) == master.store.max_offset("T", 0), 10,
                     what="the replica's consume queue")
    refused = await client.invoke(replica.addr, send_request("T", b"x"), 5)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    await asyncio.sleep(0)


async def test_a_replica_builds_its_timer_from_the_first_replicated_timer_record(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """The timer service is built on first use (broker/timer_bridge.py): on a replica, the first timer record copied
    from the master builds it, indexing it and delivering nothing."""
    master = await start_broker(tmp_path / "m")
    replica = await start_broker(tmp_path / "r", broker_id=1)
    await link(replica, master)
    await eventually(lambda: master.replication.sync.members == {0, 1}, 10, what="the replica in the set")
    assert not master.timer.built and not replica.timer.built
    reply = await client.invoke(master.addr, send_request("TR", b"later", 0, props(UNIQ_KEY="R1",
                                                                                    TIMER_DELAY_MS="60000")), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    await eventually(lambda: replica.store.max_offset(TIMER_TOPIC, 0) == 1, 10, what="the timer record copied")
    await eventually(lambda: replica.timer.built and master.timer.built, 10, what="both timers built")
    service = replica.timer.service
    assert service is not None and not service.deliver
    await eventually(lambda: service.enqueue_offset == 1, 10, what="the replica's timer indexed the record")
    assert service.metrics()["scheduled"] == 1 and replica.store.max_offset("TR", 0) == 0


async def test_a_replica_timer_built_after_the_masters_copies_delivers_nothing_twice_once_promoted(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """A replica whose timer is built on first use after its catch-up copied both a timer record and the master's
    delivered copy of it: the build reads the copies from the log (no checkpoint to start from), so the replica
    follows past that message and, promoted, does not deliver it again."""
    master = await start_broker(tmp_path / "m")
    reply = await client.invoke(master.addr, send_request("TD", b"soon", 0, props(UNIQ_KEY="D1",
                                                                                   TIMER_DELAY_MS="200")), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    await eventually(lambda: master.store.max_offset("TD", 0) == 1, 10, what="the master delivered it")
    replica = await start_broker(tmp_path / "r", broker_id=1)
    await link(replica, master)
    await eventually(lambda: replica.store.max_offset("TD", 0) == 1, 10, what="the copy replicated")
    await eventually(lambda: replica.timer.built, 10, what="the replica's timer built")
    service = replica.timer.service
    assert service is not None
    await eventually(lambda: service.metrics()["scheduled"] == 0, 10, what="the replica followed past it")
    epoch = master.replication.epoch
    await master.stop()
    await replica.replication.promote(epoch + 1)
    await asyncio.sleep(0.5)  # (its due time is long past: a second delivery would come at once)
    assert replica.store.max_offset("TD", 0) == 1


async def test_a_replica_forgets_the_timer_records_its_master_put_once_past_them_retries_included(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path) -> None:
    """A replica notes the timer record each of its master's copies names (TIMER_SRC_PHY) and forgets it when it
    follows past that record's slot. A consumer's retry of a delivered timer message is no copy of the timer: it
    must not name the record again, or the replica would hold every retried timer message's offset for good."""
    master = await start_broker(tmp_path / "m")
    replica = await start_broker(tmp_path / "r", broker_id=1)
    await link(replica, master)
    await eventually(lambda: master.replication.sync.members == {0, 1}, 10, what="the replica in the set")
    n = 5
    for i in range(n):
        reply = await client.invoke(master.addr, send_request("TB", b"soon", 0, props(UNIQ_KEY=f"B{i}",
                                                                                       TIMER_DELAY_MS="200")), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
    await eventually(lambda: replica.store.max_offset("TB", 0) == n, 10, what="the delivered copies replicated")
    service = replica.timer.service
    assert service is not None
    await eventually(lambda: service.metrics()["scheduled"] == 0 and not service._recovered_src, 10,
                     what="the replica followed past them")
    got = master.store.get_messages("TB", 0, 0, n)
    for view in got.buffers:
        offset = decode_record(view)[0].physical_offset
        reply = await client.invoke(master.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(offset), "group": "cg", "delayLevel": "1"}), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
    await eventually(lambda: sum(replica.store.max_offset("%RETRY%cg", q) for q in range(8)) == n, 10,
                     what="the retries delivered to %RETRY%cg on the replica")
    await asyncio.sleep(0.2)
    assert not service._recovered_src
