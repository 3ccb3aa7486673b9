"""Requests that must not get past the broker's ACL by naming one resource to the check and another to the
handler, or that must not hand a user what only the broker should know. A real broker with aclEnable=true on a
127.0.0.1 port; the requests are signed on a plain remoting socket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.acl import AccessControl, parse_acl
from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.client_bodies import LockBatchBody, MessageQueue
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import SendMessageRequestHeader, send_header_to_v2
from cometmq.protocol.message import iter_records
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.transaction_batch import EndEntry, decode_end_outcomes, encode_end_entries
from tests.broker.conftest import broker_config, pull_request, send_request
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


async def _pull_all(addr: str, topic: str, group: str, creds: tuple[str, str]) -> tuple[int, bytes]:
    r = await _call(addr, pull_request(topic, 0, group=group, suspend_ms=0), creds)
    return r.code, bytes(r.body or b"")


@pytest.mark.parametrize("origin", ["allowed", None])
async def test_a_send_back_cannot_copy_a_denied_topics_message_into_the_users_retry_topic(
        broker: BrokerController, origin: str | None) -> None:
    secret = b"the payload of a topic the user may not read"
    r = await _call(broker.addr, send_request("denied", secret), ADMIN)
    assert r.code == ResponseCode.SUCCESS, r.remark
    offset = decode_offset_msg_id(r.ext_fields["msgId"]).offset
    code, body = await _pull_all(broker.addr, "denied", "G", USER)
    assert code == ResponseCode.NO_PERMISSION and secret not in body
    # the user names the message's commit-log offset in a send-back of its own group (which it may consume as),
    # with a topic it may read as the origin, or none at all
    ext: dict[str, object] = {"group": "G", "offset": offset, "delayLevel": 0}
    if origin is not None:
        ext["originTopic"] = origin
    r = await _call(broker.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, ext), USER)
    assert r.code != ResponseCode.SUCCESS, "the broker copied a message of a denied topic for the user"
    await asyncio.sleep(1.5)  # (the retry delay of the test broker's level 3: 900 ms)
    code, body = await _pull_all(broker.addr, "%RETRY%G", "G", USER)
    assert secret not in body


async def test_a_send_back_of_a_message_the_user_consumed_still_works(broker: BrokerController) -> None:
    r = await _call(broker.addr, send_request("allowed", b"retry me"), USER)
    offset = decode_offset_msg_id(r.ext_fields["msgId"]).offset
    r = await _call(broker.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": "G", "offset": offset, "delayLevel": 0, "originTopic": "allowed"}), USER)
    assert r.code == ResponseCode.SUCCESS, r.remark
    await asyncio.sleep(1.5)
    code, body = await _pull_all(broker.addr, "%RETRY%G", "G", USER)
    assert code == ResponseCode.SUCCESS and b"retry me" in body
    # ... and again from the retry topic, whose record names the origin in RETRY_TOPIC
    retry = next(iter_records(body))
    r = await _call(broker.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": "G", "offset": retry.physical_offset, "delayLevel": 0, "originTopic": "allowed"}), USER)
    assert r.code == ResponseCode.SUCCESS, r.remark


async def test_the_cpp_clients_send_back_without_origin_topic_is_checked_on_the_messages_topic(
        broker: BrokerController) -> None:
    """The 4.x C++ client's CONSUMER_SEND_MSG_BACK carries only group, delayLevel and offset (no originTopic).
    RocketMQ asks SUB on the group's retry topic for it; it was refused here (no originTopic), so a C++ consumer
    under ACL never got a failed message again. It is now checked on the topic of the message at the offset."""
    r = await _call(broker.addr, send_request("allowed", b"retry me"), USER)
    offset = decode_offset_msg_id(r.ext_fields["msgId"]).offset

    def cpp_send_back(at: int) -> RemotingCommand:  # the C++ client's header: every value a string
        return make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G", "delayLevel": "0", "offset": str(at)})

    r = await _call(broker.addr, cpp_send_back(offset), USER)
    assert r.code == ResponseCode.SUCCESS, r.remark
    await asyncio.sleep(1.5)
    code, body = await _pull_all(broker.addr, "%RETRY%G", "G", USER)
    assert code == ResponseCode.SUCCESS and b"retry me" in body
    # again from the retry topic (its record's topic is the group's retry topic: SUB on the group)
    r = await _call(broker.addr, cpp_send_back(next(iter_records(body)).physical_offset), USER)
    assert r.code == ResponseCode.SUCCESS, r.remark
    # an offset where no message starts: refused, naming it
    r = await _call(broker.addr, cpp_send_back(offset + 1), USER)
    assert r.code == ResponseCode.NO_PERMISSION and f"no message at commit-log offset {offset + 1}" in (r.remark or "")


async def test_a_message_is_read_by_its_offset_only_with_the_right_to_its_topic(broker: BrokerController) -> None:
    """VIEW_MESSAGE_BY_ID names a commit-log offset, any message of the log: it was open to every account."""
    offsets = {}
    for topic in ("allowed", "denied"):
        r = await _call(broker.addr, send_request(topic, f"in {topic}".encode()), ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        offsets[topic] = decode_offset_msg_id(r.ext_fields["msgId"]).offset

    async def view(offset: int, creds: tuple[str, str], topic: str | None = None) -> RemotingCommand:
        ext: dict[str, object] = {"offset": offset} if topic is None else {"offset": offset, "topic": topic}
        return await _call(broker.addr, make_request(RequestCode.VIEW_MESSAGE_BY_ID, ext), creds)

    refused = [await view(offsets["denied"], USER),  # no topic named: an admin's request
               await view(offsets["denied"], USER, "denied"),  # the ACL denies the topic
               await view(offsets["denied"], USER, "allowed")]  # the offset is another topic's message
    assert [r.code for r in refused] == [ResponseCode.NO_PERMISSION] * 3, [(r.code, r.remark) for r in refused]
    assert "admin" in (refused[0].remark or "") and "not one of topic allowed" in (refused[2].remark or "")
    mine = await view(offsets["allowed"], USER, "allowed")
    assert mine.code == ResponseCode.SUCCESS, mine.remark
    assert [m.body for m in iter_records(mine.body or b"")] == [b"in allowed"]
    admin = await view(offsets["denied"], ADMIN)
    assert admin.code == ResponseCode.SUCCESS and [m.body for m in iter_records(admin.body or b"")] == [b"in denied"]


async def test_a_batched_end_decides_only_halves_of_a_topic_the_account_may_publish_to(
        broker: BrokerController) -> None:
    """END_TRANSACTION_BATCH named no topic to the ACL: any account could commit or roll back any group's halves."""
    halves = []
    for n, topic in enumerate(("denied", "allowed", "allowed")):  # back to back in the half queue: 0, 1, 2
        r = await _call(broker.addr, send_request(topic, f"half {n}".encode(), 0,
                                                  f"UNIQ_KEY\x01H{n}\x02TRAN_MSG\x01true\x02PGROUP\x01adm\x02",
                                                  producerGroup="adm", sysFlag=4), ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        halves.append(EndEntry(decode_offset_msg_id(r.ext_fields["msgId"]).offset, int(r.ext_fields["queueOffset"]),
                               8, f"H{n}"))
    assert [h.tran_state_table_offset for h in halves] == [0, 1, 2]

    async def end(entries: list[EndEntry], creds: tuple[str, str], topic: str | None) -> RemotingCommand:
        ext = {"producerGroup": "adm"} if topic is None else {"producerGroup": "adm", "topic": topic}
        return await _call(broker.addr, make_request(RequestCode.END_TRANSACTION_BATCH, ext,
                                                     encode_end_entries(entries)), creds)

    refused = [await end(halves, USER, None),  # no topic named: an admin's request
               await end(halves, USER, "denied")]  # the ACL denies the topic
    assert [r.code for r in refused] == [ResponseCode.NO_PERMISSION] * 2, [(r.code, r.remark) for r in refused]
    assert "admin" in (refused[0].remark or "")
    assert len(broker.transactions.table) == 3
    # A topic the user may publish to: only that topic's halves are decided, one by one or as a range.
    r = await end([halves[0], halves[1]], USER, "allowed")
    assert r.code == ResponseCode.SUCCESS, r.remark
    first, second = decode_end_outcomes(r.body or b"")
    assert first.code == ResponseCode.NO_PERMISSION and "not of topic allowed" in first.remark, first
    assert second.ok, second
    r = await end([EndEntry(halves[0].commit_log_offset, 0, 8, "H0", 3)], USER, "allowed")
    [ranged] = decode_end_outcomes(r.body or b"")
    assert ranged.code == ResponseCode.NO_PERMISSION and "1 of 3 halves not decided" in ranged.remark, ranged
    assert ranged.already == 1  # (half 1, decided above; half 2 now)
    assert _max_offset(broker, "denied") == 0 and _max_offset(broker, "allowed") == 2
    assert list(broker.transactions.table.pending) == [0]
    # An admin account may name no topic: any half of the group.
    r = await end([halves[0]], ADMIN, None)
    assert r.code == ResponseCode.SUCCESS and decode_end_outcomes(r.body or b"")[0].ok
    assert _max_offset(broker, "denied") == 1 and len(broker.transactions.table) == 0


async def test_leaving_the_users_group_does_not_release_another_groups_queue_locks(tmp_path: Path) -> None:
    """UNREGISTER_CLIENT is allowed for the group it names (SUB on it) but released the queue locks of the client id
    it names in every group: a user allowed only its own group freed the locks of another group's orderly
    consumer (client ids are in GET_CONSUMER_CONNECTION_LIST's answer), which a second member could then take
    while the first still consumed in order."""
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(admin_and_user(ADMIN, USER, default_group="DENY") + "    groupPerms:\n      - mine=SUB\n")
    b = BrokerController(broker_config(tmp_path / "broker", acl_enable=True, acl_file=str(acl_path)))
    await b.start()
    try:
        mq = MessageQueue("T", b.config.broker_name, 0)
        r = await _call(b.addr, make_request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": "T", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}), ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        for group in ("mine", "theirs"):
            r = await _call(b.addr, make_request(RequestCode.LOCK_BATCH_MQ, {}, LockBatchBody(
                group, "victim", frozenset({mq})).encode()), ADMIN)
            assert r.code == ResponseCode.SUCCESS, r.remark
        r = await _call(b.addr, make_request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": "victim", "consumerGroup": "theirs", "producerGroup": ""}), USER)
        assert r.code == ResponseCode.NO_PERMISSION and "group=theirs" in (r.remark or "")
        r = await _call(b.addr, make_request(RequestCode.UNREGISTER_CLIENT, {
            "clientID": "victim", "consumerGroup": "mine", "producerGroup": ""}), USER)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert b.locks.owner("mine", mq) is None and b.locks.owner("theirs", mq) == "victim"
    finally:
        await b.stop()


async def test_an_acl_change_keeps_the_files_secrets_private(broker: BrokerController, tmp_path: Path) -> None:
    """The ACL file holds every account's secret key. An admin change rewrote it (a new file renamed over it) with
    mode 0644 whatever it had: an operator's 0600 file became readable by every local user, admin secrets
    included, after the first mqadmin updateAclConfig. The file keeps its mode now, and one the broker creates is
    0600."""
    assert broker.acl is not None
    acl_path = broker.acl.path
    acl_path.chmod(0o600)
    for cmd in (make_request(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {"accessKey": "userBravo1",
                                                                         "secretKey": "bravoSecret1"}),
                make_request(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": "10.9.9.9"}),
                make_request(RequestCode.DELETE_ACL_CONFIG, {"accessKey": "userBravo1"})):
        r = await _call(broker.addr, cmd, ADMIN)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert acl_path.stat().st_mode & 0o777 == 0o600, (cmd.code, oct(acl_path.stat().st_mode))
    acl_path.chmod(0o640)  # whatever the operator chose (a group the broker's user is in, say)
    r = await _call(broker.addr, make_request(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, {"globalWhiteAddrs": ""}),
                    ADMIN)
    assert r.code == ResponseCode.SUCCESS and acl_path.stat().st_mode & 0o777 == 0o640
    # no file yet (the broker's data folder default): the first change creates one only its owner reads
    text = acl_path.read_text()
    acl_path.unlink()
    new = AccessControl(tmp_path / "fresh" / "plain_acl.yml")
    new.save(parse_acl(text))
    assert (tmp_path / "fresh" / "plain_acl.yml").stat().st_mode & 0o777 == 0o600
    assert not [p for p in (tmp_path / "fresh").iterdir() if p.name != "plain_acl.yml"]


async def test_refusals_of_made_up_access_keys_hold_no_memory_and_log_short_lines(
        broker: BrokerController, caplog: pytest.LogCaptureFixture) -> None:
    """A refusal's remark names the access key the request carried, which is the caller's to choose, unsigned and
    as long as a frame; the refusal log kept each (host, remark) for its once-a-minute limit, up to 10,000 of them,
    and logged the remark whole: a peer without any account made the broker hold 10,000 keys of up to 16 MiB
    each, and write them to its log. What is kept and logged of a remark is now bounded."""
    assert broker.acl is not None
    with caplog.at_level(logging.WARNING, "cometmq.acl"):
        for i in range(20):
            made_up = f"{i:04d}" + "k" * (256 * 1024)
            r = await _call(broker.addr, send_request("allowed", b"x"), (made_up, "anySecret1"))
            assert r.code == ResponseCode.NO_PERMISSION and (r.remark or "").startswith("No acl config for 0")
    held = sum(len(host) + len(reason) for host, reason in broker.acl._logged)
    assert held < 20 * 1024, held
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "cometmq.acl"]
    assert lines and max(len(line) for line in lines) < 1024
    assert sum(len(line) for line in lines) < 16 * 1024


async def test_an_offset_inside_a_message_body_is_no_message(broker: BrokerController) -> None:
    """VIEW_MESSAGE_BY_ID and CONSUMER_SEND_MSG_BACK read the record at a client-named commit-log offset and check
    its topic. A user may publish a body that holds a made-up record header (topic 'allowed', a body length that
    runs over the next records) and name the offset of that header: the record read there then held another
    topic's message, which the broker handed out (or copied into the user's retry topic). A record is now read at
    such an offset only if its body CRC holds, which a made-up header cannot give over bytes it does not know."""
    from cometmq.protocol.message import encode_parts

    async def send(topic: str, body: bytes, creds: tuple[str, str]) -> int:
        r = await _call(broker.addr, send_request(topic, body), creds)
        assert r.code == ResponseCode.SUCCESS, r.remark
        return decode_offset_msg_id(r.ext_fields["msgId"]).offset

    head = len(encode_parts(topic=b"", body=b"", properties=b"")) - 3  # a record's bytes before its body
    tail = b"\x07allowed\x00\x00"  # the made-up record's topic and (no) properties, in a later message's body
    secret = b"the payload of a topic the user may not read"
    # the sizes the records will have (a dry run of the same lengths)
    a0 = await send("allowed", b"x" * head, USER)
    v0 = await send("denied", b"y" * len(secret), ADMIN)
    c0 = await send("allowed", tail, USER)
    size_a, size_v = v0 - a0, c0 - v0
    # the header, at the start of the user's message A's body; its body runs to message C's body, past V
    a = broker.store.commitlog.max_offset
    fake_at = a + head
    body_len = (a + size_a + size_v + head) - (fake_at + head)
    fake = encode_parts(topic=b"allowed", body=b"\0" * body_len, properties=b"")[:head]
    assert await send("allowed", fake, USER) == a
    v = await send("denied", secret, ADMIN)
    c = await send("allowed", tail, USER)
    assert (v, c) == (a + size_a, a + size_a + size_v)

    r = await _call(broker.addr, make_request(RequestCode.VIEW_MESSAGE_BY_ID,
                                              {"offset": fake_at, "topic": "allowed"}), USER)
    assert r.code != ResponseCode.SUCCESS and secret not in bytes(r.body or b""), "read another topic's message"
    for ext in ({"originTopic": "allowed"}, {}):
        r = await _call(broker.addr, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "group": "G", "offset": fake_at, "delayLevel": 0, **ext}), USER)
        assert r.code != ResponseCode.SUCCESS, (ext, "copied another topic's message into the user's retry topic")
    await asyncio.sleep(1.5)
    _, body = await _pull_all(broker.addr, "%RETRY%G", "G", USER)
    assert secret not in body
