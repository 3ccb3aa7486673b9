"""Transactional messages through the endpoint: half messages, EndTransaction, and the broker's check-back
delivered as recover_orphaned_transaction_command over the producer's Telemetry stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cometmq.grpc.handles import TransactionRef
from cometmq.grpc.v2 import definition_pb2 as pb
from cometmq.grpc.v2 import service_pb2 as spb
from tests.grpc.kit import TRANSPORTS, Endpoint, start_endpoint, stop_endpoint

pytest.importorskip("cometmq.broker.transaction", reason="the broker side of transactions is not in this tree")


@pytest.fixture(params=TRANSPORTS)
async def tx_endpoint(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Endpoint]:
    ep = await start_endpoint(tmp_path, broker_changes={"transaction_timeout_ms": 500,
                                                        "transaction_check_interval_ms": 500},
                              transport=request.param)
    yield ep
    await stop_endpoint(ep)


async def _end(ep: Endpoint, topic: str, entry: Any, resolution: int,
               source: int = pb.SOURCE_CLIENT) -> spb.EndTransactionResponse:
    r: spb.EndTransactionResponse = await ep.call("EndTransaction", spb.EndTransactionRequest(
        topic=pb.Resource(name=topic), message_id=entry.message_id, transaction_id=entry.transaction_id,
        resolution=resolution, source=source))  # type: ignore[arg-type]
    return r


async def test_commit_makes_the_half_visible_and_rollback_drops_it(tx_endpoint: Endpoint) -> None:
    ep = tx_endpoint
    await ep.create_topic("TxT", queues=1)
    committed = (await ep.send("TxT", b"commit-me", mtype=pb.TRANSACTION)).entries[0]
    rolled = (await ep.send("TxT", b"roll-me", mtype=pb.TRANSACTION)).entries[0]
    assert committed.status.code == pb.Code.OK and committed.transaction_id
    assert TransactionRef.decode(committed.transaction_id).producer_group == "CID_COMETMQ_GRPC_PROXY"
    code, _ = await ep.receive("TxT", "G")
    assert code == pb.Code.MESSAGE_NOT_FOUND  # halves are invisible
    assert (await _end(ep, "TxT", committed, pb.COMMIT)).status.code == pb.Code.OK
    assert (await _end(ep, "TxT", rolled, pb.ROLLBACK)).status.code == pb.Code.OK
    code, msgs = await ep.receive("TxT", "G", poll_ms=3000)
    assert code == pb.Code.OK and [m.body for m in msgs] == [b"commit-me"]
    assert msgs[0].system_properties.message_id == committed.message_id


async def test_unresolved_half_is_checked_through_telemetry(tx_endpoint: Endpoint) -> None:
    ep = tx_endpoint
    await ep.create_topic("TxCheck", queues=1)
    call = ep.stub.Telemetry(metadata=ep.metadata(), timeout=30)
    await call.write(spb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="TxCheck")]))))
    assert (await call.read()).status.code == pb.Code.OK
    sent = (await ep.send("TxCheck", b"decide-later", mtype=pb.TRANSACTION)).entries[0]
    command = await asyncio.wait_for(call.read(), 15)  # the broker's check, relayed by the endpoint
    rec = command.recover_orphaned_transaction_command
    assert rec.message.system_properties.message_id == sent.message_id
    assert rec.message.topic.name == "TxCheck" and rec.message.body == b"decide-later"
    answer = spb.SendResultEntry(message_id=sent.message_id, transaction_id=rec.transaction_id)
    assert (await _end(ep, "TxCheck", answer, pb.COMMIT, pb.SOURCE_SERVER_CHECK)).status.code == pb.Code.OK
    call.cancel()
    code, msgs = await ep.receive("TxCheck", "G", poll_ms=3000)
    assert code == pb.Code.OK and [m.body for m in msgs] == [b"decide-later"]


async def test_a_transaction_id_naming_another_address_reaches_nothing(tx_endpoint: Endpoint) -> None:
    """The id is plain base64 of the broker's address and the half's offsets, the client's to write: the endpoint
    sent the END, signed with its own keys when ACL is on, to whatever host and port it named."""
    ep = tx_endpoint
    await ep.create_topic("TxT", queues=1)
    half = (await ep.send("TxT", b"undecided", mtype=pb.TRANSACTION)).entries[0]
    ref = TransactionRef.decode(half.transaction_id)
    connected: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(str(writer.get_extra_info("peername")))
        writer.close()

    elsewhere = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        port = elsewhere.sockets[0].getsockname()[1]
        forged = TransactionRef(f"127.0.0.1:{port}", ref.commit_log_offset, ref.tran_state_table_offset,
                                ref.offset_msg_id, ref.broker_transaction_id, ref.producer_group)
        half.transaction_id = forged.encode()
        r = await _end(ep, "TxT", half, pb.COMMIT)
        assert r.status.code == pb.Code.INVALID_TRANSACTION_ID, r.status
        assert f"127.0.0.1:{port}" in r.status.message
        await asyncio.sleep(0.2)
        assert connected == []
    finally:
        elsewhere.close()
        await elsewhere.wait_closed()
    half.transaction_id = ref.encode()
    assert (await _end(ep, "TxT", half, pb.COMMIT)).status.code == pb.Code.OK  # the real id still ends it
