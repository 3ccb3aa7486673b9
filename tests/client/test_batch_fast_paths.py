"""The producer's batch request and results, built without per-message dataclasses and dicts, are what the
per-message code builds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cometmq.client import message as message_module
from cometmq.client.errors import InvalidArgumentError
from cometmq.client.message import Message, MessageQueue, SendResult, SendStatus, send_results
from cometmq.client.producer import Producer
from cometmq.protocol.batch import decode_batch_raw
from cometmq.protocol.codes import RequestCode
from cometmq.protocol.headers import send_header_from_v2
from cometmq.protocol.properties import encode_properties
from cometmq.protocol.remoting import RemotingCommand


def _producer() -> Producer:
    p = Producer("pg", namesrv="127.0.0.1:1")  # never started on the network: only the encoding is used
    p.started = True
    return p


def test_batch_items_carry_the_wire_properties() -> None:
    p = _producer()
    msgs = [Message("T", b"plain"), Message("T", b"tagged", tags="a", keys=["k1", "k2"], flag=3),
            Message("T", bytearray(b"props"), properties={"x": "1", "y": "two"})]  # type: ignore[arg-type]
    cmd, uniqs = p._batch_request(MessageQueue("T", "b", 1), msgs)
    items = decode_batch_raw(cmd.body)
    assert [body for body, _, _ in items] == [b"plain", b"tagged", b"props"]
    assert [flag for _, _, flag in items] == [0, 3, 0]
    expected = [encode_properties(m.wire_properties(u)) for m, u in zip(msgs, uniqs, strict=True)]
    assert [props for _, props, _ in items] == expected
    assert len(set(uniqs)) == 3


def test_batch_checks_keep_their_errors() -> None:
    p = _producer()
    with pytest.raises(InvalidArgumentError, match="reserved"):
        p._batch_request(MessageQueue("T", "b", 0), [Message("T", b"x", properties={"UNIQ_KEY": "mine"})])
    with pytest.raises(InvalidArgumentError, match="one topic"):
        p._check_batch([Message("T", b"x"), Message("U", b"y")])
    with pytest.raises(InvalidArgumentError, match="not a valid topic"):
        p._check_batch([Message("T", b"x"), Message("bad topic", b"y")])
    with pytest.raises(InvalidArgumentError, match="empty"):
        p._check_batch([Message("T", b"x"), Message("T", b"")])
    with pytest.raises(InvalidArgumentError, match="scheduled"):
        p._check_batch([Message("T", b"x"), Message("T", b"y", delay_level=2)])


def test_batch_results_equal_one_by_one_results() -> None:
    q = MessageQueue("T", "b", 2)
    fast = send_results(SendStatus.SEND_OK, ["u0", "u1", "u2"], ["o0", "o1"], q, 10)
    slow = [SendResult(SendStatus.SEND_OK, f"u{i}", f"o{i}" if i < 2 else "", q, 10 + i, None) for i in range(3)]
    assert fast == slow and [hash(x) for x in fast] == [hash(x) for x in slow]
    with pytest.raises(AttributeError):
        fast[0].msg_id = "changed"  # type: ignore[misc]
    response = RemotingCommand(code=0, ext_fields={"msgId": "o0,o1,o2", "queueId": "2", "queueOffset": "10"})
    assert Producer._batch_result(response, q, ["u0", "u1", "u2"], "addr") == Producer._result(
        response, q, "u0,u1,u2", "addr")


@pytest.mark.parametrize("msg", [
    Message("T", b"plain"), Message("T", b"t", tags="a"), Message("T", b"k", keys="k1 k2"),
    Message("T", b"p", properties={"x": "1"}), Message("T", b"d", delay_level=3), Message("T", b"at", deliver_at=5),
    Message("T", b"in", delay=0.0), Message("T", b"f", flag=7),
], ids=lambda m: m.body.decode())
def test_single_send_header_carries_the_wire_properties(msg: Message) -> None:
    p = _producer()
    cmd, uniq = p._request(MessageQueue("T", "b", 2), msg)
    header = send_header_from_v2(cmd.ext_fields)
    expected = encode_properties(msg.wire_properties(uniq)).decode()
    if msg.delay is not None:  # wall-clock based: compare all but the due time
        assert header.properties.split("\x02")[:-2] == expected.split("\x02")[:-2]
    else:
        assert header.properties == expected
    assert (header.topic, header.queue_id, header.flag, header.producer_group) == ("T", 2, msg.flag, "pg")
    assert cmd.code == RequestCode.SEND_MESSAGE_V2 and cmd.body == msg.body and cmd.opaque > 0
    assert all(type(v) is str for v in cmd.ext_fields.values())


@pytest.mark.skipif(message_module._C_RESULTS is None, reason="C helper not built")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=40), st.lists(st.text(max_size=40), max_size=45),
       st.integers(-(2**63), 2**63 - 1), st.sampled_from(list(SendStatus)))
def test_c_batch_results_equal_the_reference(ids: list[str], offset_ids: list[str], first: int,
                                             status: SendStatus) -> None:
    """protocol/_batchenc.c's send_results against send_results_py (offsets past int64 go to the reference)."""
    q = MessageQueue("T", "b", 2)
    want = message_module.send_results_py(status, ids, offset_ids, q, first)
    got = message_module._send_results_c(status, ids, offset_ids, q, first)
    assert got == want and [hash(x) for x in got] == [hash(x) for x in want]
    assert all(type(r) is SendResult and r.recall_handle is None for r in got)
    assert message_module._send_results_c(status, tuple(ids), offset_ids, q, 0) == \
        message_module.send_results_py(status, ids, offset_ids, q, 0)
    for r in got:
        with pytest.raises(AttributeError):
            r.msg_id = "changed"  # type: ignore[misc]
