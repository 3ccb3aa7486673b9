"""Requests that must not get past the broker's ACL by naming one resource to the check and another to the
handler, or that must not hand a user what only the broker should know. A real broker with aclEnable=true on a
127.0.0.1 port; the requests are signed on a plain remoting socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2
from cometmq.protocol.remoting import RemotingCommand, make_request
from tests.broker.conftest import broker_config
from tests.kit.acl import admin_and_user

pytestmark = pytest.mark.timeout(60)

ADMIN = ("adminUser1", "adminSecret1")
USER = ("userAlpha1", "userSecret1")
ACL = admin_and_user(ADMIN, USER, topic_perms={"allowed": "PUB|SUB", "denied": "DENY"})


async def _call(addr: str, cmd: RemotingCommand, creds: tuple[str, str]) -> RemotingCommand:
    async with RemotingClient() as client:
        return await client.invoke(addr, sign_request(cmd, Credentials(*creds)))


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[BrokerController]:
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL)
    b = BrokerController(broker_config(tmp_path / "broker", acl_enable=True, acl_file=str(acl_path),
                                       inner_credentials=ADMIN, auto_create_topic_enable=False))
    await b.start()
    try:
        for topic in ("allowed", "denied"):
            r = await _call(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}), ADMIN)
            assert r.code == ResponseCode.SUCCESS, r.remark
        yield b
    finally:
        await b.stop()


def _max_offset(b: BrokerController, topic: str) -> int:
    cq = b.store.queues.get((topic, 0))
    return 0 if cq is None else cq.bounds()[1]


async def test_a_v2_send_cannot_name_one_topic_to_the_check_and_another_to_the_handler(
        broker: BrokerController) -> None:
    header = SendMessageRequestHeader(producer_group="pg", topic="denied", default_topic="TBW102",
                                      default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                                      properties="", reconsume_times=0)
    ext: dict[str, object] = dict(send_header_to_v2(header))
    # a V2 send whose letter field b (what the send handler reads) names the denied topic, with a long-form
    # ``topic`` field naming one the user may publish to
    ext["topic"] = "allowed"
    r = await _call(broker.addr, make_request(RequestCode.SEND_MESSAGE_V2, ext, b"smuggled"), USER)
    assert r.code == ResponseCode.NO_PERMISSION, (r.code, r.remark)
    assert _max_offset(broker, "denied") == 0
    # the plain V2 send to the denied topic is refused as before, the one to the allowed topic served
    del ext["topic"]
    r = await _call(broker.addr, make_request(RequestCode.SEND_MESSAGE_V2, ext, b"x"), USER)
    assert r.code == ResponseCode.NO_PERMISSION
    ext["b"] = "allowed"
    r = await _call(broker.addr, make_request(RequestCode.SEND_MESSAGE_V2, ext, b"x"), USER)
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert _max_offset(broker, "allowed") == 1 and _max_offset(broker, "denied") == 0


async def test_the_broker_config_does_not_hand_out_the_brokers_own_secret(broker: BrokerController) -> None:
    # GET_BROKER_CONFIG is open to any account that signs (mqadmin getBrokerConfig); the broker signs its own
    # requests with an admin account's keys, which must not be in the answer
    for creds in (USER, ADMIN):
        r = await _call(broker.addr, make_request(RequestCode.GET_BROKER_CONFIG, {}), creds)
        assert r.code == ResponseCode.SUCCESS, r.remark
        text = r.body.decode()
        assert ADMIN[1] not in text, text
    assert "aclEnable=true\n" in text
