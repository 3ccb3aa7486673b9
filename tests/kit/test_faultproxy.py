"""The fault proxy with real loopback sockets: each fault, one direction at a time, per source address, switched
at run time on existing and new connections, and the proxy as a separate process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.kit.faultproxy import Direction, FaultProxy, FaultProxyProcess, _rst
from tests.kit.wait import eventually

pytestmark = pytest.mark.timeout(15)

T = 2.0  # the bound on anything that should happen
QUIET = 0.3  # how long "nothing arrives" is watched


class Server:
    """A loopback server that hands each accepted connection to the test (or echoes, when ``echo``)."""

    def __init__(self, echo: bool) -> None:
        self.echo = echo
        self.accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self.peers: list[str] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.address = ("", 0)

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.address = ("127.0.0.1", int(self._server.sockets[0].getsockname()[1]))
        return self.address

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peers.append(writer.get_extra_info("peername")[0])
        self._writers.append(writer)
        if not self.echo:
            await self.accepted.put((reader, writer))
            return
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def next(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(self.accepted.get(), T)

    async def stop(self) -> None:
        for w in self._writers:
            w.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    server = Server(echo=True)
    yield await server.start()
    await server.stop()


@pytest.fixture
async def peer() -> AsyncIterator[Server]:
    server = Server(echo=False)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy(echo: tuple[str, int]) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(echo) as p:
        yield p


@pytest.fixture
async def peer_proxy(peer: Server) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(peer.address) as p:
        yield p


async def connect(addr: tuple[str, int], src: str | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        asyncio.open_connection(*addr, local_addr=(src, 0) if src else None), T)


async def roundtrip(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> bytes:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), T)


async def silent(reader: asyncio.StreamReader) -> bool:
    """Nothing arrives within QUIET, and the connection is not closed either."""
    try:
        data = await asyncio.wait_for(reader.read(1), QUIET)
    except TimeoutError:
        return True
    raise AssertionError(f"expected silence, got {data!r}")


def close(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    conn[1].transport.abort()


# -- pass -----------------------------------------------------------------------------------------------------------
async def test_passes_bytes_both_ways(proxy: FaultProxy) -> None:
    conn = await connect(proxy.address)
    assert await roundtrip(conn, b"ping") == b"ping"
    big = bytes(range(256)) * 8192  # 2 MiB: order and backpressure
    reader, writer = conn
    writer.write(big)
    got = await asyncio.wait_for(reader.readexactly(len(big)), 10)
    assert got == big
    assert len(proxy.links) == 1
    close(conn)


async def test_eof_passes_through(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    sreader, swriter = await peer.next()
    writer.write(b"last")
    writer.write_eof()
    assert await asyncio.wait_for(sreader.read(), T) == b"last"  # read() to EOF
    swriter.write(b"reply")
    swriter.close()
    assert await asyncio.wait_for(reader.read(), T) == b"reply"
    writer.close()


# -- blackhole ------------------------------------------------------------------------------------------------------
async def test_blackhole_drops_silently_and_heal_restores(proxy: FaultProxy) -> None:
    conn = await connect(proxy.address)
    assert await roundtrip(conn, b"one") == b"one"
    proxy.blackhole()
    reader, writer = conn
    writer.write(b"lost")
    await writer.drain()
    assert await silent(reader)
    assert not writer.is_closing() and not reader.at_eof()  # the connection stays open
    proxy.heal()
    assert await roundtrip(conn, b"two") == b"two"  # "lost" is gone for good
    assert await silent(reader)
    close(conn)


async def test_blackhole_applies_to_new_connections(proxy: FaultProxy) -> None:
    proxy.blackhole()
    conn = await connect(proxy.address)
    conn[1].write(b"x")
    assert await silent(conn[0])
    proxy.heal()
    assert await roundtrip(conn, b"y") == b"y"
    close(conn)


async def test_blackhole_up_only(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    sreader, swriter = await peer.next()
    peer_proxy.blackhole(Direction.UP)
    writer.write(b"to server")
    assert await silent(sreader)
    swriter.write(b"to client")
    assert await asyncio.wait_for(reader.readexactly(9), T) == b"to client"
    writer.transport.abort()


async def test_blackhole_down_only(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    sreader, swriter = await peer.next()
    peer_proxy.blackhole(Direction.DOWN)
    swriter.write(b"to client")
    assert await silent(reader)
    writer.write(b"to server")
    assert await asyncio.wait_for(sreader.readexactly(9), T) == b"to server"
    writer.transport.abort()


async def test_blackhole_holds_the_fin_back(peer: Server, peer_proxy: FaultProxy) -> None:
    _, writer = await connect(peer_proxy.address)
    sreader, _ = await peer.next()
    peer_proxy.blackhole(Direction.UP)
    writer.write_eof()
    assert await silent(sreader)
    peer_proxy.heal()
    assert await asyncio.wait_for(sreader.read(), T) == b""  # the FIN arrives after the heal
    writer.transport.abort()


# -- delay ----------------------------------------------------------------------------------------------------------
async def test_delay_adds_latency_in_order(proxy: FaultProxy) -> None:
    conn = await connect(proxy.address)
    assert await roundtrip(conn, b"warm") == b"warm"
    proxy.delay(0.2, Direction.UP)
    start = time.monotonic()
    conn[1].write(b"a")
    conn[1].write(b"b")
    assert await asyncio.wait_for(conn[0].readexactly(2), T) == b"ab"
    assert 0.19 <= time.monotonic() - start < T
    proxy.delay(0.15)  # both ways: at least twice that per round trip
    start = time.monotonic()
    assert await roundtrip(conn, b"c") == b"c"
    assert 0.29 <= time.monotonic() - start < T
    proxy.heal()
    start = time.monotonic()
    assert await roundtrip(conn, b"d") == b"d"
    assert time.monotonic() - start < 0.15
    close(conn)


# -- reset ----------------------------------------------------------------------------------------------------------
async def test_reset_existing_and_new_connections(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    sreader, _ = await peer.next()
    peer_proxy.reset()
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), T)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(sreader.read(1), T)  # the server side is reset too
    # while the fault stands, new connections are reset at once
    reader2, _ = await connect(peer_proxy.address)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader2.read(1), T)
    peer_proxy.heal()
    reader3, writer3 = await connect(peer_proxy.address)
    _, swriter3 = await peer.next()
    swriter3.write(b"back")
    assert await asyncio.wait_for(reader3.readexactly(4), T) == b"back"
    for w in (writer, writer3):
        w.transport.abort()


async def test_a_reset_from_the_server_reaches_the_client(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    _, swriter = await peer.next()
    _rst(swriter)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), T)
    writer.transport.abort()


# -- cut ------------------------------------------------------------------------------------------------------------
async def test_cut_closes_one_direction(peer: Server, peer_proxy: FaultProxy) -> None:
    reader, writer = await connect(peer_proxy.address)
    sreader, swriter = await peer.next()
    peer_proxy.cut(Direction.UP)
    assert await asyncio.wait_for(sreader.read(), T) == b""  # the server reads EOF
    writer.write(b"dropped")
    swriter.write(b"still flows")  # the other direction is untouched
    assert await asyncio.wait_for(reader.readexactly(11), T) == b"still flows"
    peer_proxy.heal()  # a cut link stays cut
    writer.write(b"dropped too")
    assert await asyncio.wait_for(sreader.read(), T) == b""
    writer.transport.abort()


async def test_cut_down_on_new_connections(peer: Server, peer_proxy: FaultProxy) -> None:
    peer_proxy.cut(Direction.DOWN)
    reader, writer = await connect(peer_proxy.address)
    sreader, _ = await peer.next()
    assert await asyncio.wait_for(reader.read(), T) == b""  # the client reads EOF
    writer.write(b"up works")
    assert await asyncio.wait_for(sreader.readexactly(8), T) == b"up works"
    writer.transport.abort()


# -- per source address ---------------------------------------------------------------------------------------------
async def test_faults_per_source_address(proxy: FaultProxy) -> None:
    a = await connect(proxy.address, src="127.0.0.2")
    b = await connect(proxy.address, src="127.0.0.3")
    await eventually(lambda: {link.src for link in proxy.links} == {"127.0.0.2", "127.0.0.3"}, T,
                     what="both links up")
    proxy.blackhole(src="127.0.0.2")
    a[1].write(b"a")
    assert await silent(a[0])
    assert await roundtrip(b, b"b") == b"b"
    proxy.blackhole()  # every source, but the rule for 127.0.0.2 comes first
    proxy.delay(0.0, src="127.0.0.2")
    assert await roundtrip(a, b"a2") == b"a2"
    b[1].write(b"b2")
    assert await silent(b[0])
    proxy.heal(src="127.0.0.2")  # only that source's rules go
    a[1].write(b"a3")
    assert await silent(a[0])
    proxy.heal()
    assert await roundtrip(a, b"a4") == b"a4"
    close(a)
    close(b)


async def test_bind_source_shows_the_client_address_to_the_server(peer: Server) -> None:
    async with FaultProxy(peer.address, bind_source=True) as proxy:
        conn = await connect(proxy.address, src="127.0.0.4")
        await peer.next()
        assert peer.peers[-1] == "127.0.0.4"
        close(conn)


# -- control --------------------------------------------------------------------------------------------------------
async def test_control_lines(proxy: FaultProxy) -> None:
    assert proxy.command("blackhole up src=127.0.0.2") == "ok"
    assert proxy.command("delay 0.5 down") == "ok"
    assert proxy.command("reset src=127.0.0.9") == "ok"
    status = proxy.command("status")
    assert status.startswith("ok links=0")
    assert "127.0.0.2/up=blackhole" in status and "*/down=delay:0.5" in status and "127.0.0.9/reset" in status
    assert proxy.command("heal") == "ok"
    assert proxy.command("status") == "ok links=0"
    for bad in ["", "blackhole sideways", "delay", "delay -1", "cut", "jump", "heal now"]:
        assert proxy.command(bad).startswith("error"), bad


async def test_control_port(proxy: FaultProxy) -> None:
    control = await proxy.serve_control()
    reader, writer = await connect(control.sockets[0].getsockname()[:2])
    writer.write(b"blackhole\nstatus\n")
    assert await asyncio.wait_for(reader.readline(), T) == b"ok\n"
    assert (await asyncio.wait_for(reader.readline(), T)).startswith(b"ok links=0 */down=blackhole")
    writer.close()
    control.close()
    await control.wait_closed()


# -- process mode ---------------------------------------------------------------------------------------------------
async def test_as_a_separate_process(echo: tuple[str, int]) -> None:
    proc = FaultProxyProcess(f"{echo[0]}:{echo[1]}")
    await asyncio.to_thread(proc.start)
    try:
        host, _, port = proc.addr.rpartition(":")
        conn = await connect((host, int(port)))
        assert await roundtrip(conn, b"hello") == b"hello"
        assert (await asyncio.to_thread(proc.command, "blackhole")) == "ok"
        conn[1].write(b"lost")
        assert await silent(conn[0])
        await asyncio.to_thread(proc.command, "heal")
        assert await roundtrip(conn, b"again") == b"again"
        with pytest.raises(RuntimeError, match="error"):
            await asyncio.to_thread(proc.command, "bogus")
        close(conn)
    finally:
        await asyncio.to_thread(proc.stop)
    assert proc.proc is None
