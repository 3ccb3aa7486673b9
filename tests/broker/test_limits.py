"""Limits with clear answers (issue [15]) on a real broker: reserved topics refuse client sends (NO_PERMISSION, as
RocketMQ's TopicValidator.isNotAllowedSendTopic) while the broker's own writes to them still work; a batch is at
most maxMessageSize, inflated size included; body, properties and topic names are answered with a code and a
remark, nothing stored; configuration keys accepted but not acted on are reported."""

from __future__ import annotations

import logging
import zlib

import pytest

from cometmq.broker.config import BrokerConfig, broker_config_from_properties
from cometmq.broker.topics import NOT_ALLOWED_SEND_TOPICS
from cometmq.net.client import RemotingClient
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import SysFlag

from .conftest import StartBroker, props, send_request

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC",
                                   "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_wheel_timer", "SELF_TEST_TOPIC"])
async def test_reserved_topics_refuse_client_sends(start_broker: StartBroker, client: RemotingClient,
                                                   topic: str) -> None:
    b = await start_broker()
    before = b.store.commitlog.max_offset
    r = await client.invoke(b.addr, send_request(topic, b"x", 0))
    assert r.code == ResponseCode.NO_PERMISSION and "forbidden" in (r.remark or "")
    assert b.store.commitlog.max_offset == before
    assert topic in NOT_ALLOWED_SEND_TOPICS


async def test_the_brokers_own_writes_to_reserved_topics_still_work(start_broker: StartBroker,
                                                                    client: RemotingClient) -> None:
    b = await start_broker()
    # A delay level: the broker parks it under SCHEDULE_TOPIC_XXXX through its appender.
    r = await client.invoke(b.addr, send_request("LimT", b"later", 0, props(UNIQ_KEY="D1", DELAY="1")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.max_offset("SCHEDULE_TOPIC_XXXX", 0) == 1
    # A timer message goes to the timer's topic, a transaction's half to the half topic.
    r = await client.invoke(b.addr, send_request("LimT", b"timer", 0, props(UNIQ_KEY="T1", TIMER_DELAY_SEC="60")))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await client.invoke(b.addr, send_request("LimT", b"half", 0, props(UNIQ_KEY="H1", TRAN_MSG="true",
                                                                          PGROUP="pg"), sysFlag=4))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.commitlog.max_offset > 0
    # A client may still send to a retry topic, as RocketMQ allows (sendMessageBack's fallback).
    r = await client.invoke(b.addr, send_request("%RETRY%cg", b"again", 0, props(UNIQ_KEY="R1")))
    assert r.code == ResponseCode.SUCCESS, r.remark


async def test_body_properties_and_names_are_answered_and_nothing_stored(start_broker: StartBroker,
                                                                         client: RemotingClient) -> None:
    b = await start_broker()
    limit = b.config.store.max_message_size
    cases = [
        (send_request("LimB", b"x" * (limit + 1), 0), ResponseCode.MESSAGE_ILLEGAL, "exceeds"),
        (send_request("LimB", b"x", 0, props(K="v" * 40_000)), ResponseCode.MESSAGE_ILLEGAL, "at most 32767"),
        (send_request("T" * 128, b"x", 0), ResponseCode.MESSAGE_ILLEGAL, "longer than 127"),
        (send_request("a b", b"x", 0), ResponseCode.MESSAGE_ILLEGAL, "may only contain"),
    ]
    for request, code, remark in cases:
        r = await client.invoke(b.addr, request)
        assert r.code == code and remark in (r.remark or ""), r.remark
    assert b.store.commitlog.max_offset == 0


async def test_batch_is_at_most_max_message_size_inflated_too(start_broker: StartBroker,
                                                              client: RemotingClient) -> None:
    b = await start_broker()
    limit = b.config.store.max_message_size
    big = encode_batch([(b"y" * 1000, {"UNIQ_KEY": f"U{i}"}, 0) for i in range(limit // 1000 + 10)])
    r = await client.invoke(b.addr, send_request("LimBatch", big, 0, batch="1"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in (r.remark or ""), r.remark
    # A small compressed body that would inflate far past the limit (a zip bomb) is refused, not inflated.
    bomb = zlib.compress(encode_batch([(b"\x00" * 200_000, {"UNIQ_KEY": f"Z{i}"}, 0) for i in range(50)]), 9)
    assert len(bomb) < limit
    r = await client.invoke(b.addr, send_request("LimBatch", bomb, 0, batch="1", sysFlag=int(SysFlag.COMPRESSED)))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "inflates to more than" in (r.remark or ""), r.remark
    small = encode_batch([(b"ok", {"UNIQ_KEY": f"S{i}"}, 0) for i in range(10)])
    r = await client.invoke(b.addr, send_request("LimBatch", zlib.compress(small), 0, batch="1",
                                                 sysFlag=int(SysFlag.COMPRESSED)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b.store.max_offset("LimBatch", 0) == 10


def test_ignored_keys_are_reported_and_limits_are_read(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cometmq.broker.config"):
        cfg = broker_config_from_properties({"brokerRole": "ASYNC_MASTER", "sendMessageThreadPoolNums": "16",
                                             "serverChannelMaxIdleTimeSeconds": "60", "serverMaxConnections": "100",
                                             "diskSpaceWarningLevelRatio": "80", "cleanFileForciblyEnable": "false"})
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "brokerRole, sendMessageThreadPoolNums" in lines[0]
    assert cfg.connection_limits.idle_timeout_s == 60 and cfg.connection_limits.max_connections == 100
    assert cfg.store.disk_space_warning_level_ratio == 80 and not cfg.store.clean_file_forcibly_enable
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cometmq.broker.config"):
        broker_config_from_properties({"brokerName": "b"})
    assert not caplog.records
    assert BrokerConfig().connection_limits.idle_timeout_s == 120
