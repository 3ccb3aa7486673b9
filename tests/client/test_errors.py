"""client/errors.py: the one place the SDK maps a reply it cannot read (a remote protocol error) to BrokerError."""

from __future__ import annotations

import pytest

from cometmq.client.errors import BrokerError, raise_unreadable, reading_reply
from cometmq.client.message import MessageQueue
from cometmq.client.process_queue import ProcessQueue, PullRequest
from cometmq.client.push_consumer import PushConsumer
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.errors import LocalProtocolError, ProtocolError
from cometmq.protocol.message import MessageRecord, encode_record
from cometmq.protocol.remoting import RemotingCommand
from cometmq.protocol.route import TopicRouteData


def test_an_unreadable_reply_is_a_broker_error_with_system_error() -> None:
    with pytest.raises(BrokerError) as info, reading_reply("bad route body", addr="b:1", context="T"):
        TopicRouteData.decode(b"[]")
    err = info.value
    assert err.code == ResponseCode.SYSTEM_ERROR and err.retriable
    assert err.remark.startswith("bad route body: ") and (err.addr, err.context) == ("b:1", "T")


def test_an_unclassified_protocol_error_counts_as_the_servers() -> None:
    with pytest.raises(BrokerError, match="bad message body: truncated"), reading_reply("bad message body"):
        raise ProtocolError("truncated")  # the record codec's errors are not yet split


def test_our_own_bug_passes_through() -> None:
    with pytest.raises(LocalProtocolError), reading_reply("bad topic list"):
        raise LocalProtocolError("we built it wrong")


def test_nothing_happens_when_the_reply_reads() -> None:
    with reading_reply("fine"):
        value = 1
    assert value == 1


def test_raise_unreadable_is_what_the_block_raises() -> None:
    """``raise_unreadable`` (for a caller catching the error itself) maps as ``reading_reply`` does."""
    with pytest.raises(BrokerError) as info:
        raise_unreadable("undecodable pull body", ProtocolError("truncated"), addr="b:1", context="T/0")
    err = info.value
    assert err.code == ResponseCode.SYSTEM_ERROR and err.retriable
    assert (err.remark, err.addr, err.context) == ("undecodable pull body: truncated", "b:1", "T/0")
    with pytest.raises(LocalProtocolError, match="ours"):
        raise_unreadable("x", LocalProtocolError("ours"))


async def test_a_pull_answer_with_an_unreadable_body_is_the_brokers_error() -> None:
    """A SUCCESS pull answer whose records do not parse: a BrokerError naming the broker; nothing is queued and the
    pull position stays."""
    consumer = PushConsumer("g-unreadable", namesrv="127.0.0.1:1", listener=lambda msgs: None)
    consumer.subscribe("T")  # (an answer to a pull sent with a subscription no longer in force is dropped unread)
    mq = MessageQueue("T", "broker-a", 0)
    req = PullRequest(mq, ProcessQueue(5), 5)
    answer = RemotingCommand(ResponseCode.SUCCESS, flag=1, body=b"\x00\x00\x00\x10garbage",
                             ext_fields={"nextBeginOffset": "6", "minOffset": "0", "maxOffset": "6"})
    with pytest.raises(BrokerError, match="undecodable pull body: truncated") as info:
        await consumer._on_pull_answer(req, consumer.subscriptions["T"], answer, "10.0.0.1:10911")
    assert info.value.addr == "10.0.0.1:10911"
    assert req.next_offset == 5 and req.pq.count == 0


async def test_a_pull_answer_malformed_after_its_first_records_delivers_those_and_pulls_again_from_there() -> None:
    """A record the consumer cannot decode after others (a damaged record inside a run, which a broker may serve as
    stored: Apache RocketMQ's does): the records before it are taken and the next pull starts at it, where the broker
    sees it first and steps over it. The whole answer was an error, pulled again at the same offset for ever."""
    consumer = PushConsumer("g-unreadable", namesrv="127.0.0.1:1", listener=lambda msgs: None)
    consumer.subscribe("T")
    mq = MessageQueue("T", "broker-a", 0)
    req = PullRequest(mq, ProcessQueue(5), 5)
    good = b"".join(encode_record(MessageRecord("T", f"m{i}".encode(), queue_offset=i)) for i in (5, 6))
    answer = RemotingCommand(ResponseCode.SUCCESS, flag=1, body=good + b"\x00\x00\x01\x00garbage" + bytes(300),
                             ext_fields={"nextBeginOffset": "9", "minOffset": "0", "maxOffset": "9"})
    msgs = await consumer._on_pull_answer(req, consumer.subscriptions["T"], answer, "10.0.0.1:10911")
    assert [(m.queue_offset, m.body) for m in msgs] == [(5, b"m5"), (6, b"m6")]
    assert req.next_offset == 7
