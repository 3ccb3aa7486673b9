"""An admin's create or update of a topic is checked before anything changes (RocketMQ's AdminBrokerProcessor):
system topics, perm, the message type and unknown attributes are refused with a remark naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import make_request

from .conftest import StartBroker


def create(topic: str, **fields: object) -> dict[str, object]:
    return {"topic": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, **fields}


@pytest.mark.parametrize(("fields", "remark"), [
    (create("TBW102", perm=6), "The topic[TBW102] is conflict with system topic."),
    (create("SCHEDULE_TOPIC_XXXX"), "The topic[SCHEDULE_TOPIC_XXXX] is conflict with system topic."),
    (create("rmq_sys_mine"), "The topic[rmq_sys_mine] is conflict with system topic."),
    (create("T1", perm=8), "topic perm 8 is invalid"),
    (create("T1", perm=-1), "topic perm -1 is invalid"),
    (create("T1", attributes="+message.type=BOGUS"), "message.type 'BOGUS' is not one of"),
    (create("T1", attributes="+cleanup.policy=COMPACTION"), "unsupported topic attribute '+cleanup.policy=COMPACTION'"),
    (create("T1", readQueueNums=0), "queue numbers must be within 1..1024"),
])
async def test_a_refused_create_names_the_problem_and_changes_nothing(
        start_broker: StartBroker, client: RemotingClient, tmp_path: Path, fields: dict[str, object],
        remark: str) -> None:
    b = await start_broker(tmp_path / "b")
    before = dict(b.topics.topics)
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields))
    assert r.code == ResponseCode.SYSTEM_ERROR, r.remark
    assert remark in (r.remark or "")
    assert b.topics.topics == before  # (TBW102 keeps its perm: its inherit bit is what auto-creation reads)


async def test_the_message_type_is_set_and_reset(start_broker: StartBroker, client: RemotingClient,
                                                 tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                 create("T1", attributes="+message.type=fifo")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.topics.topics["T1"].message_type == "FIFO"
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                                 create("T1", attributes="-message.type")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.topics.topics["T1"].message_type == "NORMAL"


async def test_a_list_with_one_bad_topic_creates_none(start_broker: StartBroker, client: RemotingClient,
                                                      tmp_path: Path) -> None:
    b = await start_broker(tmp_path / "b")
    body = (b'{"topicConfigList":[{"topicName":"L1","readQueueNums":2,"writeQueueNums":2,"perm":6},'
            b'{"topicName":"TBW102","readQueueNums":5,"writeQueueNums":5,"perm":6}]}')
    r = await client.invoke(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC_LIST, {}, body))
    assert r.code == ResponseCode.SYSTEM_ERROR and "TBW102" in (r.remark or "")
    assert "L1" not in b.topics.topics and b.topics.topics["TBW102"].read_queue_nums != 5
