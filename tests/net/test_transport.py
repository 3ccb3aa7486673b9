from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator

import pytest

from cometmq.net.client import RemotingClient, split_address
from cometmq.net.connection import (
    ConnectionClosedError,
    Handler,
    RemotingConnectError,
    RemotingConnection,
    RequestTimeoutError,
    eager_start,
)
from cometmq.net.loop import run
from cometmq.net.server import RemotingServer
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.remoting import RemotingCommand, encode, make_request, make_response

pytestmark = pytest.mark.timeout(30)

ECHO = 1000
HOLD = 1001
FAIL = 1002
REJECT = 1003
NOTE = 1004  # oneway
ASK_BACK = 1005
NEVER = 1006
EAGER = 1007  # eager_start: answers at once
EAGER_WAIT = 1008  # eager_start: suspends on a future, then answers
EAGER_FAIL = 1009  # eager_start: raises in its first step


class Broker:
    """A tiny dispatcher whose handlers record what they saw, so tests can wait on events, not sleeps."""

    def __init__(self) -> None:
        self.held: dict[str, asyncio.Future[None]] = {}
        self.held_arrived = asyncio.Event()
        self.expected_held = 0
        self.notes: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.never_arrived = asyncio.Event()
        self.dispatcher: dict[int, Handler] = {
            ECHO: self.echo,
            HOLD: self.hold,
            FAIL: self.fail,
            REJECT: self.reject,
            NOTE: self.note,
            ASK_BACK: self.ask_back,
            NEVER: self.never,
            EAGER: self.eager,
            EAGER_WAIT: self.eager_wait,
            EAGER_FAIL: self.eager_fail,
        }
        #: (asyncio.current_task() at entry, after the first suspension) per eager call
        self.eager_tasks: list[tuple[object, object]] = []
        self.eager_release: asyncio.Future[str] | None = None
        self.eager_waiting = asyncio.Event()
        self.eager_cancelled = asyncio.Event()

    async def echo(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, ResponseCode.SUCCESS, None, cmd.ext_fields, cmd.body)

    async def hold(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        key = cmd.ext_fields["key"]
        release = self.held[key] = asyncio.get_running_loop().create_future()
        if len(self.held) == self.expected_held:
            self.held_arrived.set()
        await release
        return make_response(cmd, ResponseCode.SUCCESS, None, {"key": key})

    async def fail(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        raise KeyError("boom")

    async def reject(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, "no such topic")

    async def note(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        await self.notes.put(cmd)
        return make_response(cmd)  # must not be sent: the request was oneway

    async def ask_back(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # Server -> client request over the connection the client opened, as GET_CONSUMER_RUNNING_INFO does.
        question = make_request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g"})
        answer = await conn.request(question, timeout=5)
        return make_response(cmd, answer.code, answer.remark, answer.ext_fields, answer.body)

    async def never(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        self.never_arrived.set()
        return None  # "will reply later" -- and never does


    @eager_start
    async def eager(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        self.eager_tasks.append((asyncio.current_task(), None))
        return make_response(cmd, ResponseCode.SUCCESS, None, {"eager": "yes"})

    @eager_start
    async def eager_wait(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        first = asyncio.current_task()
        self.eager_release = asyncio.get_running_loop().create_future()
        self.eager_waiting.set()
        try:
            value = await self.eager_release
        except asyncio.CancelledError:
            self.eager_cancelled.set()
            raise
        await asyncio.sleep(0)  # a bare yield goes through the driver as well
        self.eager_tasks.append((first, asyncio.current_task()))
        return make_response(cmd, ResponseCode.SUCCESS, None, {"value": value})

    @eager_start
    async def eager_fail(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, "no such topic, eagerly")


@pytest.fixture
async def broker() -> Broker:
    return Broker()


@pytest.fixture
async def server(broker: Broker) -> AsyncIterator[RemotingServer]:
    srv = RemotingServer("127.0.0.1", 0, broker.dispatcher)
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


async def test_request_response(server: RemotingServer, client: RemotingClient) -> None:
    assert server.port > 0
    cmd = make_request(ECHO, {"a": 1, "b": "x"}, b"payload")
    reply = await client.invoke(addr(server), cmd, timeout=5)
    assert reply.is_response and reply.opaque == cmd.opaque
    assert reply.code == ResponseCode.SUCCESS
    assert reply.ext_fields == {"a": "1", "b": "x"}
    assert reply.body == b"payload"
    assert list(client.connections) == [addr(server)]


async def test_large_body(server: RemotingServer, client: RemotingClient) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: exercises partial frames and the vectored write path
    reply = await client.invoke(addr(server), make_request(ECHO, body=body), timeout=10)
    assert reply.body == body


async def test_concurrent_requests_matched_by_opaque(
    server: RemotingServer, client: RemotingClient, broker: Broker
) -> None:
    n = 20
    broker.expected_held = n
    calls = [
        asyncio.create_task(client.invoke(addr(server), make_request(HOLD, {"key": str(i)}), timeout=10))
        for i in range(n)
    ]
    # All n are being handled at once on one connection: a held request does not block the next ones.
    await broker.held_arrived.wait()
    for i in reversed(range(n)):  # answer in the opposite order
        broker.held[str(i)].set_result(None)
    replies = await asyncio.gather(*calls)
    assert [r.ext_fields["key"] for r in replies] == [str(i) for i in range(n)]
    assert len(server.connections) == 1


async def test_oneway(
    server: RemotingServer, client: RemotingClient, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cometmq.net")
    await client.invoke_oneway(addr(server), make_request(NOTE, {"n": 1}))
    await client.invoke_oneway(addr(server), make_request(9999, oneway=True))  # unknown: no reply either
    got = await asyncio.wait_for(broker.notes.get(), 5)
    assert got.is_oneway and got.ext_fields == {"n": "1"}
    # A request after them still works, and no stray reply to the oneways reached the client.
    await client.invoke(addr(server), make_request(ECHO), timeout=5)
    assert not [r for r in caplog.records if "has no waiter" in r.getMessage()]


async def test_timeout_raises(server: RemotingServer, client: RemotingClient) -> None:
    with pytest.raises(RequestTimeoutError) as info:
        await client.invoke(addr(server), make_request(NEVER), timeout=0.1)
    assert isinstance(info.value, TimeoutError)
    conn = client.connections[addr(server)]
    assert conn.pending_requests == 0
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0


async def test_server_to_client_request(server: RemotingServer) -> None:
    async def running_info(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, ResponseCode.SUCCESS, None, {"group": cmd.ext_fields["consumerGroup"]}, b"{}")

    async with RemotingClient({RequestCode.GET_CONSUMER_RUNNING_INFO: running_info}) as cli:
        reply = await cli.invoke(addr(server), make_request(ASK_BACK), timeout=5)
    assert reply.code == ResponseCode.SUCCESS
    assert reply.ext_fields == {"group": "g"} and reply.body == b"{}"


async def test_server_to_client_unknown_code(server: RemotingServer, client: RemotingClient) -> None:
    reply = await client.invoke(addr(server), make_request(ASK_BACK), timeout=5)
    assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_unknown_code(server: RemotingServer, client: RemotingClient) -> None:
    reply = await client.invoke(addr(server), make_request(4321), timeout=5)
    assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert reply.remark is not None and "4321" in reply.remark


async def test_handler_exception(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="cometmq.net")
    reply = await client.invoke(addr(server), make_request(FAIL), timeout=5)
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert reply.remark is not None and "boom" in reply.remark
    assert any("failed" in r.getMessage() for r in caplog.records)
    # The connection stays open.
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0
    assert len(server.connections) == 1


async def test_remoting_error_becomes_reply(server: RemotingServer, client: RemotingClient) -> None:
    reply = await client.invoke(addr(server), make_request(REJECT), timeout=5)
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "no such topic")


async def test_malformed_frame_closes_only_that_connection(
    server: RemotingServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cometmq.net")
    closed: list[RemotingConnection] = []
    server.add_close_callback(closed.append)
    await client.invoke(addr(server), make_request(ECHO), timeout=5)

    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    good = encode(make_request(ECHO, {"k": "v"}))
    writer.write(good + struct.pack(">II", 10, 0xFF) + b"{}garbage")
    await writer.drain()
    # The good frame before the garbage may or may not be answered; after that the server hangs up.
    assert await asyncio.wait_for(_read_until_eof(reader), 5)
    writer.close()
    await writer.wait_closed()

    assert len([r for r in caplog.records if "malformed frame" in r.getMessage()]) == 1
    assert len(closed) == 1
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0
    assert len(server.connections) == 1


async def _read_until_eof(reader: asyncio.StreamReader) -> bool:
    while await reader.read(65536):
        pass
    return True


async def test_pending_requests_fail_on_close(server: RemotingServer, client: RemotingClient, broker: Broker) -> None:
    call = asyncio.create_task(client.invoke(addr(server), make_request(NEVER), timeout=30))
    await broker.never_arrived.wait()
    client.connections[addr(server)].close()
    with pytest.raises(ConnectionClosedError):
        await call
    assert addr(server) not in client.connections
    # The next invoke reconnects.
    assert (await client.invoke(addr(server), make_request(ECHO), timeout=5)).code == 0


async def test_pending_requests_fail_when_server_stops(broker: Broker) -> None:
    srv = RemotingServer("127.0.0.1", 0, broker.dispatcher)
    await srv.start()
    async with RemotingClient() as cli:
        call = asyncio.create_task(cli.invoke(addr(srv), make_request(NEVER), timeout=30))
        await broker.never_arrived.wait()
        await srv.stop()
        with pytest.raises(ConnectionClosedError):
            await call


async def test_connect_refused() -> None:
    srv = RemotingServer("127.0.0.1", 0, {})
    await srv.start()
    dead = addr(srv)
    await srv.stop()
    async with RemotingClient() as cli:
        with pytest.raises(RemotingConnectError):
            await cli.invoke(dead, make_request(ECHO), timeout=5)


async def test_concurrent_callers_share_one_connection(server: RemotingServer, client: RemotingClient) -> None:
    conns = await asyncio.gather(*(client.get_connection(addr(server)) for _ in range(10)))
    assert len({id(c) for c in conns}) == 1


async def test_drain_waits_for_a_slow_reader(client: RemotingClient) -> None:
    may_read = asyncio.Event()
    received = 0

    finished = asyncio.Event()

    async def slow_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        try:
            await may_read.wait()
            while data := await reader.read(1 << 20):
                received += len(data)
        finally:
            writer.close()
            await writer.wait_closed()
            finished.set()

    raw = await asyncio.start_server(slow_peer, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    try:
        conn = await client.get_connection(f"127.0.0.1:{port}")
        big = make_request(NOTE, body=b"x" * (64 << 20), oneway=True)  # far beyond the socket buffers
        conn.send_oneway(big)
        drained = asyncio.create_task(conn.drain())
        await asyncio.sleep(0.05)  # bounded: only to show drain() is still blocked
        assert not drained.done()
        may_read.set()
        await asyncio.wait_for(drained, 20)
    finally:
        await client.close()
        # The server's handler must finish closing its side before the loop ends (or its socket leaks).
        await asyncio.wait_for(finished.wait(), 10)
        raw.close()
        await raw.wait_closed()


def test_split_address() -> None:
    assert split_address("127.0.0.1:10911") == ("127.0.0.1", 10911)
    assert split_address("[::1]:9876") == ("::1", 9876)
    with pytest.raises(ValueError):
        split_address("nohost")


def test_runs_on_uvloop() -> None:
    pytest.importorskip("uvloop")

    async def running_info(conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        return make_response(cmd, body=b"info")

    async def scenario() -> tuple[str, list[bytes | int]]:
        client = RemotingClient({RequestCode.GET_CONSUMER_RUNNING_INFO: running_info})
        async with RemotingServer("127.0.0.1", 0, Broker().dispatcher) as srv, client as cli:
            echo = await cli.invoke(addr(srv), make_request(ECHO, body=b"uv"), timeout=5)
            asked = await cli.invoke(addr(srv), make_request(ASK_BACK), timeout=5)
            bad = await cli.invoke(addr(srv), make_request(4321), timeout=5)
            return type(asyncio.get_running_loop()).__module__, [echo.body, asked.body, bad.code]

    module, results = run(scenario(), use_uvloop=True)
    assert module.startswith("uvloop")
    assert results == [b"uv", b"info", ResponseCode.REQUEST_CODE_NOT_SUPPORTED]


async def test_eager_handler_answers_without_a_task(server: RemotingServer, client: RemotingClient,
                                                    broker: Broker) -> None:
    reply = await client.invoke(addr(server), make_request(EAGER), timeout=5)
    assert reply.code == ResponseCode.SUCCESS and reply.ext_fields == {"eager": "yes"}
    assert broker.eager_tasks == [(None, None)]  # ran inside data_received, outside any task
    reply = await client.invoke(addr(server), make_request(EAGER_FAIL), timeout=5)
    assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST, "no such topic, eagerly")


async def test_eager_handler_that_suspends_goes_on_in_a_task(server: RemotingServer, client: RemotingClient,
                                                             broker: Broker) -> None:
    call = asyncio.create_task(client.invoke(addr(server), make_request(EAGER_WAIT), timeout=5))
    await broker.eager_waiting.wait()
    assert broker.eager_release is not None
    broker.eager_release.set_result("later")
    reply = await call
    assert reply.code == ResponseCode.SUCCESS and reply.ext_fields == {"value": "later"}
    (first, after), = broker.eager_tasks
    assert first is None and isinstance(after, asyncio.Task)  # a task took over after the suspension


async def test_eager_handler_is_cancelled_when_its_connection_closes(server: RemotingServer, client: RemotingClient,
                                                                     broker: Broker) -> None:
    call = asyncio.create_task(client.invoke(addr(server), make_request(EAGER_WAIT), timeout=30))
    await broker.eager_waiting.wait()
    (conn,) = server.connections
    await conn.cancel_handlers(timeout=5)
    await asyncio.wait_for(broker.eager_cancelled.wait(), 5)
    call.cancel()
