"""client/errors.py: the one place the SDK maps a reply it cannot read (a remote protocol error) to BrokerError."""

from __future__ import annotations

import pytest

from cometmq.client.errors import BrokerError, reading_reply
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.errors import LocalProtocolError, ProtocolError
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
