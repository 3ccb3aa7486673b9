"""In-process remoting (cometmq.net.local): the same requests and replies as over TCP, without a socket.

A real RemotingServer (listening on a free port, so the TCP path can be compared) and a RemotingClient whose
``local`` option maps that server's address to an in-process connector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cometmq.net.client import RemotingClient
from cometmq.net.connection import (
    ConnectionClosedError,
    Handler,
    RemotingConnectError,
    RemotingConnection,
    RequestTimeoutError,
)
from cometmq.net.local import LocalConnection, local_connector, local_pair
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, make_request, make_response
from tests.net.test_transport import ASK_BACK, ECHO, FAIL, HOLD, NEVER, NOTE, REJECT, Broker

pytestmark = pytest.mark.timeout(30)

MUTATE = 1100  # the handler changes the request's ext_fields it was given
BAD_REPLY = 1101  # the handler answers with an ext field the wire cannot carry


@pytest.fixture
async def broker() -> Broker:
    b = Broker()

    async def mutate(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        cmd.ext_fields["seen"] = "yes"
        return make_response(cmd, ResponseCode.SUCCESS, None, dict(cmd.ext_fields))

    async def bad_reply(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return RemotingCommand(code=0, opaque=cmd.opaque, ext_fields={"nested": [1, 2]})  # type: ignore[dict-item]

    b.dispatcher[MUTATE] = mutate
    b.dispatcher[BAD_REPLY] = bad_reply
    return b


@pytest.fixture
async def server(broker: Broker) -> AsyncIterator[RemotingServer]:
    srv = RemotingServer("127.0.0.1", 0, broker.dispatcher)
    await srv.start()
    yield srv
    await srv.stop()


def addr(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
async def client(server: RemotingServer) -> AsyncIterator[RemotingClient]:
    cli = RemotingClient(local={addr(server): local_connector(server, addr(server))})
    yield cli
    await cli.close()


async def test_request_response_in_process(server: RemotingServer, client: RemotingClient) -> None:
    cmd = make_request(ECHO, {"a": 1, "b": "x"}, b"payload")
    reply = await client.invoke(addr(server), cmd, timeout=5)
    assert reply.is_response and reply.opaque == cmd.opaque and reply.code == ResponseCode.SUCCESS
    assert reply.ext_fields == {"a": "1", "b": "x"} and reply.body == b"payload"
    conn = client.connections[addr(server)]
    assert isinstance(conn, LocalConnection) and conn.remote_address == addr(server)
    # the server end is one of the server's connections, with an address the broker can parse as a born host
    (server_end,) = server.connections
    assert isinstance(server_end, LocalConnection)
    host, _, port = server_end.remote_address.rpartition(":")
    assert host == "127.0.0.1" and port.isdigit()


async def test_same_replies_as_tcp(server: RemotingServer, client: RemotingClient) -> None:
    requests = [make_request(ECHO, {"n": 7, "flag": True}, b"\x00\x01"), make_request(FAIL), make_request(REJECT),
                make_request(4321), make_request(BAD_REPLY), make_request(ASK_BACK)]
    async with RemotingClient() as tcp:
        for req in requests:
            over_tcp = await tcp.invoke(addr(server), req, timeout=5)
            in_process = await client.invoke(addr(server), req, timeout=5)
            assert (in_process.code, in_process.remark, in_process.ext_fields, in_process.body) == (
                over_tcp.code, over_tcp.remark, over_tcp.ext_fields, over_tcp.body), req.code
    assert in_process.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # ASK_BACK: the client serves no code


async def test_receiver_gets_its_own_string_fields(server: RemotingServer, client: RemotingClient) -> None:
    # built directly (not through make_request), with values a decoder would have turned into strings
    cmd = RemotingCommand(code=MUTATE, opaque=424242, ext_fields={"n": 5, "ok": False}, body=bytearray(b"ab"))  # type: ignore[dict-item, arg-type]
    reply = await client.invoke(addr(server), cmd, timeout=5)
    assert reply.ext_fields == {"n": "5", "ok": "false", "seen": "yes"}
    assert cmd.ext_fields == {"n": 5, "ok": False}  # type: ignore[comparison-overlap]  # the handler changed its copy, not the sender's


async def test_held_requests_answered_later_in_any_order(server: RemotingServer, client: RemotingClient,
                                                         broker: Broker) -> None:
    n = 10
    broker.expected_held = n
    calls = [asyncio.create_task(client.invoke(addr(server), make_request(HOLD, {"key": str(i)}), timeout=10))
             for i in range(n)]
    await broker.held_arrived.wait()
    for i in reversed(range(n)):
        broker.held[str(i)].set_result(None)
    replies = await asyncio.gather(*calls)
    assert [r.ext_fields["key"] for r in replies] == [str(i) for i in range(n)]
    assert len(server.connections) == 1


async def test_oneway_gets_no_reply(server: RemotingServer, client: RemotingClient, broker: Broker) -> None:
    await client.invoke_oneway(addr(server), make_request(NOTE, {"n": 1}))
    await client.invoke_oneway(addr(server), make_request(9999, oneway=True))
    got = await asyncio.wait_for(broker.notes.get(), 5)
    assert got.is_oneway and got.ext_fields == {"n": "1"}
    conn = client.connections[addr(server)]
    assert conn.pending_requests == 0
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0


async def test_server_to_client_requests_reach_the_client_dispatcher(server: RemotingServer) -> None:
    checks: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    async def running_info(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, ResponseCode.SUCCESS, None, {"group": cmd.ext_fields["consumerGroup"]}, b"{}")

    async def check(conn: RemotingConnection, cmd: RemotingCommand) -> None:
        await checks.put(cmd)

    dispatcher: dict[int, Handler] = {RequestCode.GET_CONSUMER_RUNNING_INFO: running_info,
                                      RequestCode.CHECK_TRANSACTION_STATE: check}
    async with RemotingClient(dispatcher, local={addr(server): local_connector(server, addr(server))}) as cli:
        reply = await cli.invoke(addr(server), make_request(ASK_BACK), timeout=5)
        assert reply.code == ResponseCode.SUCCESS and reply.ext_fields == {"group": "g"} and reply.body == b"{}"
        # a oneway the server sends on its own, as the broker's transaction check does
        (server_end,) = server.connections
        server_end.send_oneway(make_request(RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "m1"}, b"rec"))
        got = await asyncio.wait_for(checks.get(), 5)
        assert got.ext_fields == {"msgId": "m1"} and got.body == b"rec" and got.is_oneway


async def test_timeout_then_more_requests(server: RemotingServer, client: RemotingClient) -> None:
    with pytest.raises(RequestTimeoutError):
        await client.invoke(addr(server), make_request(NEVER), timeout=0.1)
    assert client.connections[addr(server)].pending_requests == 0
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0


async def test_client_close_fails_pending_and_runs_server_callbacks(server: RemotingServer, client: RemotingClient,
                                                                   broker: Broker) -> None:
    closed: list[RemotingConnection] = []
    server.add_close_callback(closed.append)
    call = asyncio.create_task(client.invoke(addr(server), make_request(NEVER), timeout=30))
    await broker.never_arrived.wait()
    (server_end,) = server.connections
    client.connections[addr(server)].close()
    with pytest.raises(ConnectionClosedError):
        await call
    await asyncio.wait_for(server_end.wait_closed(), 5)
    assert closed == [server_end] and server_end.closed and not server.connections
    assert not server_end.send_response(make_response(make_request(NEVER)))  # a late reply is dropped
    # the next invoke opens a new in-process connection
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0
    assert len(server.connections) == 1


async def test_server_stop_closes_local_connections(broker: Broker) -> None:
    srv = RemotingServer("127.0.0.1", 0, broker.dispatcher)
    await srv.start()
    a = addr(srv)
    async with RemotingClient(local={a: local_connector(srv, a)}) as cli:
        call = asyncio.create_task(cli.invoke(a, make_request(NEVER), timeout=30))
        await broker.never_arrived.wait()
        conn = cli.connections[a]
        await asyncio.wait_for(srv.stop(), 10)
        with pytest.raises(ConnectionClosedError):
            await call
        assert conn.closed
        with pytest.raises(RemotingConnectError, match="not running"):
            await cli.invoke(a, make_request(ECHO), timeout=5)


async def test_other_addresses_still_use_tcp(server: RemotingServer, broker: Broker) -> None:
    other = RemotingServer("127.0.0.1", 0, broker.dispatcher)
    await other.start()
    try:
        async with RemotingClient(local={addr(server): local_connector(server, addr(server))}) as cli:
            assert (await cli.invoke(addr(other), make_request(ECHO), timeout=5)).code == 0
            conn = cli.connections[addr(other)]
            assert not isinstance(conn, LocalConnection)
            (tcp_end,) = other.connections
            assert not isinstance(tcp_end, LocalConnection)
    finally:
        await other.stop()


async def test_pair_without_a_server() -> None:
    seen: list[str] = []

    async def echo(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(conn.remote_address)
        return make_response(cmd, ResponseCode.SUCCESS, None, cmd.ext_fields)

    client, server_end = local_pair({ECHO: echo}, None, server_address="srv:1", client_address="127.0.0.1:9")
    reply = await client.request(make_request(ECHO, {"k": "v"}), timeout=5)
    assert reply.ext_fields == {"k": "v"} and seen == ["127.0.0.1:9"]
    server_end.close()
    with pytest.raises(ConnectionClosedError):  # before the client end has heard of it, its writes fail
        await client.request(make_request(ECHO), timeout=5)
    await asyncio.wait_for(client.wait_closed(), 5)
    assert client.closed
    with pytest.raises(ConnectionClosedError):
        await client.request(make_request(ECHO), timeout=5)


def test_a_delivered_command_keeps_every_field() -> None:
    from cometmq.net.local import _as_received
    from cometmq.protocol.remoting import SerializeType

    cmd = RemotingCommand(code=7, language="JAVA", version=99, opaque=5, flag=3, remark="r", ext_fields={"k": "v"},
                          body=b"b", serialize_type=SerializeType.ROCKETMQ)
    got = _as_received(cmd)
    assert got == cmd and got.ext_fields is not cmd.ext_fields
