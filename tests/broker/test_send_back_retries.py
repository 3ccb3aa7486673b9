"""Send-backs and the delay levels they ride on: which messages wait, where their progress restarts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cometmq.broker.topics import SCHEDULE_TOPIC
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import make_request
from tests.kit import eventually

from .conftest import StartBroker, props, pull_request, send_request


async def test_a_committed_transaction_message_sent_back_waits_its_delay_level(start_broker: StartBroker,
                                                                              client: RemotingClient) -> None:
    """A committed transactional message keeps its COMMIT type in the sys flag; its retry copy skipped the delay
    level (the schedule hook passed over every transaction type), so it was in the retry topic at once and a
    failing message went through all its retries to the DLQ in moments. RocketMQ delays committed messages as
    plain ones (only prepared and rolled-back ones are not): the copy now waits on its level."""
    b = await start_broker()
    half = send_request("TxR", b"order", 0, props(UNIQ_KEY="TX1", TAGS="t", TRAN_MSG="true", PGROUP="txg"),
                        producerGroup="txg", sysFlag=4)
    sent = await client.invoke(b.addr, half)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    r = await client.invoke(b.addr, make_request(RequestCode.END_TRANSACTION, {
        "producerGroup": "txg", "tranStateTableOffset": sent.ext_fields["queueOffset"],
        "commitLogOffset": decode_offset_msg_id(sent.ext_fields["msgId"]).offset, "commitOrRollback": 8,
        "msgId": "TX1", "transactionId": "TX1", "fromTransactionCheck": "false"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, pull_request("TxR", 0, 0, sys_flag=4))
    [rec] = list(iter_records(r.body))
    assert rec.sys_flag & 0xC == 8  # TRANSACTION_COMMIT_TYPE
    t0 = time.monotonic()
    r = await client.invoke(b.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "offset": str(rec.physical_offset), "group": "cg", "delayLevel": "3", "originTopic": "TxR"}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.max_offset("%RETRY%cg", 0) == 0  # not there yet: parked on level 3 (900 ms here)
    assert b.store.max_offset(SCHEDULE_TOPIC, 2) == 1
    while b.store.max_offset("%RETRY%cg", 0) == 0:
        assert time.monotonic() - t0 < 5
        await asyncio.sleep(0.02)
    assert time.monotonic() - t0 >= 0.8
    r = await client.invoke(b.addr, pull_request("%RETRY%cg", 0, 0, sys_flag=4))
    [retry] = list(iter_records(r.body))
    assert (retry.body, retry.reconsume_times, retry.properties["UNIQ_KEY"]) == (b"order", 1, "TX1")
    assert retry.properties["RETRY_TOPIC"] == "TxR"
    for bookkeeping in ("DELAY", "REAL_TOPIC", "REAL_QID"):
        assert bookkeeping not in retry.properties


async def test_delay_progress_past_the_end_of_its_queue_is_taken_back_at_start(start_broker: StartBroker,
                                                                                client: RemotingClient,
                                                                                tmp_path: Path) -> None:
    """A level's saved progress can be ahead of its queue (a promoted replica took its master's progress before
    its own log caught up; a log cut back at recovery). The level then skipped every message stored below that
    offset and delivered nothing until its queue grew past it: delayed messages acknowledged to their producers
    were never delivered. As RocketMQ's correctDelayOffset, a start takes such progress back to the queue's end."""
    b = await start_broker(tmp_path / "d")
    r = await client.invoke(b.addr, send_request("Late", b"first", 0, props(DELAY="1", UNIQ_KEY="L0")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    await eventually(lambda: b.store.max_offset("Late", 0) == 1, what="the first delivery")
    await b.stop()
    progress = tmp_path / "d" / "config" / "delayOffset.json"
    assert json.loads(progress.read_text())["offsetTable"]["1"] == 1
    progress.write_text(json.dumps({"offsetTable": {"1": 7}}))
    b = await start_broker(tmp_path / "d")
    for i in (1, 2):
        r = await client.invoke(b.addr, send_request("Late", b"later", 0, props(DELAY="1", UNIQ_KEY=f"L{i}")))
        assert r.code == ResponseCode.SUCCESS, r.remark
    await eventually(lambda: b.store.max_offset("Late", 0) == 3, timeout=5, what="both later deliveries")
    r = await client.invoke(b.addr, pull_request("Late", 0, 0, sys_flag=4))
    assert [x.properties["UNIQ_KEY"] for x in iter_records(r.body)] == ["L0", "L1", "L2"]
    assert b.schedule.offsets[1] == 3
