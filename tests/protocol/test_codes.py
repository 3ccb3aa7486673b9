from __future__ import annotations

import pytest

from cometmq.protocol.codes import (
    LanguageCode,
    RemotingError,
    RequestCode,
    ResponseCode,
    bad_request_code,
    response_code_name,
)


@pytest.mark.parametrize(
    ("code", "number"),
    [
        (RequestCode.SEND_MESSAGE, 10),
        (RequestCode.PULL_MESSAGE, 11),
        (RequestCode.HEART_BEAT, 34),
        (RequestCode.LOCK_BATCH_MQ, 41),
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, 105),
        (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, 206),
        (RequestCode.GET_TOPICS_BY_CLUSTER, 224),
        (RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, 300),
        (RequestCode.GET_CONSUMER_RUNNING_INFO, 307),
        (RequestCode.SEND_MESSAGE_V2, 310),
        (RequestCode.SEND_BATCH_MESSAGE, 320),
        (RequestCode.POP_MESSAGE, 200050),
        (RequestCode.NOTIFICATION, 200054),
        (RequestCode.BATCH_ACK_MESSAGE, 200151),
    ],
)
def test_request_code_numbers(code: RequestCode, number: int) -> None:
    assert code == number


@pytest.mark.parametrize(
    ("code", "number"),
    [
        (ResponseCode.SUCCESS, 0),
        (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 3),
        (ResponseCode.TOPIC_NOT_EXIST, 17),
        (ResponseCode.PULL_OFFSET_MOVED, 21),
        (ResponseCode.QUERY_NOT_FOUND, 22),
        (ResponseCode.CONSUMER_NOT_ONLINE, 206),
        (ResponseCode.NO_MESSAGE, 208),
        (ResponseCode.POLLING_FULL, 209),
        (ResponseCode.POLLING_TIMEOUT, 210),
    ],
)
def test_response_code_numbers(code: ResponseCode, number: int) -> None:
    assert code == number


def test_codes_are_unique() -> None:
    # IntEnum would silently turn a duplicated number into an alias; catch copy-paste slips.
    for enum in (RequestCode, ResponseCode, LanguageCode):
        assert len(enum.__members__) == len({m.value for m in enum}), enum


def test_language_bytes() -> None:
    assert (LanguageCode.JAVA, LanguageCode.CPP, LanguageCode.PYTHON, LanguageCode.GO) == (0, 1, 3, 9)


def test_remoting_error_carries_code_and_remark() -> None:
    err = RemotingError(ResponseCode.TOPIC_NOT_EXIST, "topic T not exist")
    assert err.code is ResponseCode.TOPIC_NOT_EXIST
    assert err.remark == "topic T not exist"
    assert str(err) == "TOPIC_NOT_EXIST(17): topic T not exist"
    assert err.retriable
    assert not RemotingError(ResponseCode.MESSAGE_ILLEGAL).retriable


def test_remoting_error_from_plain_int() -> None:
    assert RemotingError(16).code is ResponseCode.NO_PERMISSION
    unknown = RemotingError(4242, "newer peer")
    assert unknown.code == 4242
    assert "UNKNOWN(4242)" in str(unknown)
    assert response_code_name(4242) == "UNKNOWN(4242)"


def test_bad_request_codes_keep_the_answers_processors_gave() -> None:
    # One table decides what a malformed request is answered; these are the codes the broker's and name server's
    # except blocks used before the dispatch took the choice over (so the wire does not change).
    illegal = [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
               RequestCode.POP_MESSAGE, RequestCode.PEEK_MESSAGE, RequestCode.ACK_MESSAGE,
               RequestCode.BATCH_ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, RequestCode.NOTIFICATION]
    for code in illegal:
        assert bad_request_code(code) is ResponseCode.MESSAGE_ILLEGAL, code.name
    for code in (RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.PULL_MESSAGE, RequestCode.END_TRANSACTION,
                 RequestCode.HEART_BEAT, RequestCode.LOCK_BATCH_MQ, RequestCode.QUERY_CONSUMER_OFFSET,
                 RequestCode.UPDATE_AND_CREATE_TOPIC):
        assert bad_request_code(code) is ResponseCode.SYSTEM_ERROR, code.name
    assert bad_request_code(RequestCode.REGISTER_BROKER) is ResponseCode.INVALID_PARAMETER
    assert bad_request_code(123456) is ResponseCode.SYSTEM_ERROR  # a code we do not know
