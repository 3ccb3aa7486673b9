"""The one error boundary of the request dispatch: a malformed header or body (RemoteProtocolError) is answered
with the code ``bad_request_code`` picks and the error as remark, on a connection that stays open; our own bug
(LocalProtocolError) is logged with a traceback and answered SYSTEM_ERROR; bytes that break framing close that
one connection and no other."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest

from cometmq.net.client import RemotingClient
from cometmq.net.connection import Handler, RemotingConnection
from cometmq.net.server import RemotingServer
from cometmq.protocol.client_bodies import HeartbeatData
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError
from cometmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from cometmq.protocol.pop import AckMessageRequestHeader, ExtraInfo
from cometmq.protocol.remoting import RemotingCommand, encode, make_request, make_response
from cometmq.protocol.route import RegisterBrokerBody

pytestmark = pytest.mark.timeout(30)

ECHO = 1000
OUR_BUG = 1001


async def _parse_header(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
    """Parse the request's header (or body) the way the broker's processors do, with no except block."""
    code = cmd.code
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE):
        SendMessageRequestHeader.from_ext(cmd.ext_fields)
    elif code == RequestCode.PULL_MESSAGE:
        PullMessageRequestHeader.from_ext(cmd.ext_fields)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
    elif code == RequestCode.END_TRANSACTION:
        EndTransactionRequestHeader.from_ext(cmd.ext_fields)
    elif code == RequestCode.ACK_MESSAGE:
        ExtraInfo.parse(AckMessageRequestHeader.from_ext(cmd.ext_fields).extra_info)
    elif code == RequestCode.HEART_BEAT:
        HeartbeatData.decode(cmd.body)
    elif code == RequestCode.REGISTER_BROKER:
        RegisterBrokerBody.decode(cmd.body)
    return make_response(cmd, ResponseCode.SUCCESS)


async def _echo(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
    return make_response(cmd, ResponseCode.SUCCESS, None, cmd.ext_fields, cmd.body)


async def _our_bug(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
    raise LocalProtocolError("reply field out of range")


DISPATCHER: dict[int, Handler] = {
    ECHO: _echo,
    OUR_BUG: _our_bug,
    **{code: _parse_header for code in (
        RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE, RequestCode.PULL_MESSAGE,
        RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION, RequestCode.ACK_MESSAGE,
        RequestCode.HEART_BEAT, RequestCode.REGISTER_BROKER)},
}


@pytest.fixture
async def server() -> AsyncIterator[RemotingServer]:
    srv = RemotingServer("127.0.0.1", 0, DISPATCHER)
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client() -> AsyncIterator[RemotingClient]:
    cli = RemotingClient()
    yield cli
    await cli.close()


def addr(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.port}"


# Today's answers, byte for byte: the codes the broker's and name server's processors gave before the boundary
# took over (tests/broker/test_send_pull.py, tests/pop/test_pop.py, tests/namesrv/test_namesrv_server.py).
BAD_REQUESTS = [
    (RequestCode.SEND_MESSAGE, {"producerGroup": "P", "topic": "T", "queueId": "zero"}, b"",
     ResponseCode.MESSAGE_ILLEGAL, "header field 'queueId' has a bad value 'zero'"),
    (RequestCode.SEND_BATCH_MESSAGE, {"topic": "T"}, b"",
     ResponseCode.MESSAGE_ILLEGAL, "header field 'producerGroup' is missing"),
    (RequestCode.PULL_MESSAGE, {"consumerGroup": "G", "topic": "T", "queueId": "0"}, b"",
     ResponseCode.SYSTEM_ERROR, "header field 'queueOffset' is missing"),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G", "offset": "x"}, b"",
     ResponseCode.SYSTEM_ERROR, "header field 'offset' has a bad value 'x'"),
    (RequestCode.END_TRANSACTION, {"producerGroup": "P"}, b"",
     ResponseCode.SYSTEM_ERROR, "header field 'tranStateTableOffset' is missing"),
    (RequestCode.ACK_MESSAGE, {"consumerGroup": "G", "topic": "T", "queueId": "0", "offset": "1",
                               "extraInfo": "garbage"}, b"",
     ResponseCode.MESSAGE_ILLEGAL, "extra info 'garbage' has 1 fields, expected 8"),
    (RequestCode.HEART_BEAT, {}, b"{not json", ResponseCode.SYSTEM_ERROR, "heartbeat body is not JSON"),
    (RequestCode.REGISTER_BROKER, {}, b"{not json", ResponseCode.INVALID_PARAMETER, "not valid JSON"),
]


@pytest.mark.parametrize(("code", "ext", "body", "answer", "remark"), BAD_REQUESTS,
                         ids=[RequestCode(c).name for c, *_ in BAD_REQUESTS])
async def test_malformed_request_is_answered_and_the_connection_kept(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture,
    code: RequestCode, ext: dict[str, str], body: bytes, answer: ResponseCode, remark: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="cometmq.net")
    closed: list[RemotingConnection] = []
    server.add_close_callback(closed.append)
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == ResponseCode.SUCCESS
    (conn,) = server.connections

    reply = await client.invoke(addr(server), make_request(code, ext, body), timeout=5)

    assert reply.code == answer
    assert reply.remark is not None and remark in reply.remark
    # the same connection goes on serving
    assert (await client.invoke(addr(server), make_request(ECHO, {"k": "v"}), timeout=5)).ext_fields == {"k": "v"}
    assert server.connections == frozenset({conn}) and not closed
    # one warning line for the peer's mistake, no traceback
    warnings = [r for r in caplog.records if "bad request" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None


async def test_malformed_oneway_request_gets_no_answer_and_keeps_the_connection(
    server: RemotingServer, client: RemotingClient
) -> None:
    await client.invoke(addr(server), make_request(ECHO), timeout=5)
    (conn,) = server.connections
    await client.invoke_oneway(addr(server), make_request(RequestCode.PULL_MESSAGE, {}, oneway=True))
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == ResponseCode.SUCCESS
    assert server.connections == frozenset({conn})


async def test_our_own_protocol_bug_is_logged_loudly_and_answered_system_error(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="cometmq.net")
    reply = await client.invoke(addr(server), make_request(OUR_BUG), timeout=5)
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert reply.remark == "LocalProtocolError: reply field out of range"
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.exc_info is not None and record.exc_info[0] is LocalProtocolError
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == ResponseCode.SUCCESS


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a length prefix past the frame limit
    struct.pack(">II", 10, 0xFF) + b"{}garbage",  # header length beyond the frame
    struct.pack(">II", 8, 4) + b"\xff\xfe{}",  # header bytes that are not JSON
    struct.pack(">I", 2) + b"xx",  # a frame too short for its header word
], ids=["http", "header-length", "undecodable-header", "short-length"])
async def test_garbage_closes_only_its_connection(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    caplog.set_level(logging.WARNING, logger="cometmq.net")
    closed: list[RemotingConnection] = []
    server.add_close_callback(closed.append)
    # a client connected before the garbage arrives, with a request in flight across it
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == ResponseCode.SUCCESS
    (kept,) = server.connections

    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode(make_request(ECHO, {"before": "garbage"})) + garbage)
    await writer.drain()
    assert await asyncio.wait_for(_read_until_eof(reader), 5)  # the server hangs up on this one
    writer.close()
    await writer.wait_closed()

    assert len(closed) == 1 and closed[0] is not kept
    assert len([r for r in caplog.records if "malformed frame" in r.getMessage()]) == 1
    # the other connection, and the server, go on answering
    assert (await client.invoke(addr(server), make_request(ECHO, {"k": "v"}), timeout=5)).ext_fields == {"k": "v"}
    assert server.connections == frozenset({kept})
    other = RemotingClient()
    try:
        assert (await other.invoke(addr(server), make_request(ECHO), timeout=5)).code == ResponseCode.SUCCESS
    finally:
        await other.close()


async def _read_until_eof(reader: asyncio.StreamReader) -> bool:
    while await reader.read(65536):
        pass
    return True


def test_a_remote_error_is_a_protocol_error_and_a_value_error() -> None:
    # existing ``except ProtocolError`` / ``except ValueError`` catches keep working through the transition
    from cometmq.protocol.errors import ProtocolError

    for cls in (LocalProtocolError, RemoteProtocolError):
        assert issubclass(cls, ProtocolError) and issubclass(cls, ValueError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)
