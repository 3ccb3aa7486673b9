"""A TCP proxy that injects network faults on loopback, without root (reference/controller-ha.md §3).

Point a client at the proxy's address instead of the server's. Per direction, ``UP`` (client → server) and
``DOWN`` (server → client), and per client source address (each node dials from its own 127.0.0.N, so a
proxy in front of node B can fault A→B and leave C→B alone), the proxy can:

* pass bytes (the default);
* ``blackhole``: keep both sockets open and drop the bytes silently (a FIN is held back until healed);
* ``delay``: hold every chunk for a fixed time, order kept;
* ``cut``: close that direction (the receiving side reads EOF, later bytes are dropped); permanent for the link;
* ``reset``: close both sides of every link with an RST (SO_LINGER 0), and reset new connections at once.

Faults change at run time and apply to existing and new connections; ``heal()`` removes them (a cut or reset
link stays closed). A blackholed proxy still accepts connections and dials the target: the kernel completes a
loopback handshake, so "connect times out" is not simulated.

In-process::

    async with FaultProxy(("127.0.0.1", server_port)) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        proxy.blackhole(Direction.UP, src="127.0.0.2")
        proxy.heal()

As a process (survives SIGSTOP of the nodes it sits between), controlled by a line protocol on a second port
(``FaultProxyProcess`` drives it from synchronous test code)::

    python -m tests.kit.faultproxy --listen 127.0.0.1:0 --target 127.0.0.1:10911 [--control 127.0.0.1:0]
    -> prints "LISTEN 127.0.0.1:41234 CONTROL 127.0.0.1:41235"
    control lines: blackhole [up|down|both] [src=IP] | delay SECONDS [up|down|both] [src=IP]
                   | cut up|down|both [src=IP] | reset [src=IP] | heal [src=IP] | status  -> "ok ..." / "error ..."
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import selectors
import signal
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Self

_CHUNK = 64 * 1024
_QUEUE = 64  # chunks held per direction (delay) before the proxy stops reading: backpressure


class Direction(enum.Enum):
    UP = "up"  # client -> server
    DOWN = "down"  # server -> client
    BOTH = "both"

    def each(self) -> tuple[Direction, ...]:
        return (Direction.UP, Direction.DOWN) if self is Direction.BOTH else (self,)


class Mode(enum.Enum):
    PASS = "pass"
    BLACKHOLE = "blackhole"
    DELAY = "delay"
    CUT = "cut"


@dataclass(frozen=True)
class Fault:
    mode: Mode = Mode.PASS
    delay_s: float = 0.0


PASS = Fault()


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None and not writer.transport.is_closing():
        with contextlib.suppress(OSError, ValueError):  # ValueError: uvloop, a socket already closed
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    def __init__(self, src: str, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 server: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.src = src
        self.ends = {Direction.UP: (client[0], server[1]), Direction.DOWN: (server[0], client[1])}
        self.writers = (client[1], server[1])
        self.cut: set[Direction] = set()
        self.senders: dict[Direction, asyncio.Future[None]] = {}
        self.queues: dict[Direction, asyncio.Queue[tuple[float, bytes] | None]] = {}
        self.reset = False

    def abort(self) -> None:
        if self.reset:
            return
        self.reset = True
        for w in self.writers:
            _rst(w)

    def cut_direction(self, d: Direction) -> None:
        if d in self.cut:
            return
        self.cut.add(d)
        sender = self.senders.get(d)
        if sender is not None:
            sender.cancel()  # what is queued is dropped with the direction
        queue = self.queues.get(d)
        while queue is not None and not queue.empty():
            queue.get_nowait()  # frees a reader blocked on a full queue
        writer = self.ends[d][1]
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()


class FaultProxy:
    """One listening address forwarding to one target; see the module docstring."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0,
                 bind_source: bool = False) -> None:
        self.target = target
        self.host, self.port = host, port
        #: dial the target from the client's own loopback address, so the server sees who is calling
        self.bind_source = bind_source
        self._faults: dict[tuple[str | None, Direction], Fault] = {}
        self._resets: set[str | None] = set()
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.links: list[_Link] = []

    # -- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self.links):
            link.abort()
        self._wake()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=1.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    # -- faults -------------------------------------------------------------------------------------------------
    def fault(self, src: str, direction: Direction) -> Fault:
        """The fault in force for clients from ``src`` in ``direction``: the rule for that source, else the rule
        for every source."""
        return self._faults.get((src, direction)) or self._faults.get((None, direction)) or PASS

    def _resetting(self, src: str) -> bool:
        return src in self._resets or None in self._resets

    def _set(self, fault: Fault, direction: Direction, src: str | None) -> None:
        for d in direction.each():
            self._faults[(src, d)] = fault
        self._apply()

    def blackhole(self, direction: Direction = Direction.BOTH, *, src: str | None = None) -> None:
        self._set(Fault(Mode.BLACKHOLE), direction, src)

    def delay(self, seconds: float, direction: Direction = Direction.BOTH, *, src: str | None = None) -> None:
        if seconds < 0:
            raise ValueError(f"delay {seconds} is negative")
        self._set(Fault(Mode.DELAY, seconds), direction, src)

    def cut(self, direction: Direction, *, src: str | None = None) -> None:
        self._set(Fault(Mode.CUT), direction, src)

    def reset(self, *, src: str | None = None) -> None:
        self._resets.add(src)
        self._apply()

    def heal(self, *, src: str | None = None) -> None:
        """Remove the faults for ``src``, or all faults when None."""
        if src is None:
            self._faults.clear()
            self._resets.clear()
        else:
            self._faults = {k: v for k, v in self._faults.items() if k[0] != src}
            self._resets.discard(src)
        self._apply()

    def _apply(self) -> None:
        """Act on the existing links now (cut, reset) and wake the pumps holding back a FIN."""
        for link in list(self.links):
            if self._resetting(link.src):
                link.abort()
                continue
            for d in (Direction.UP, Direction.DOWN):
                if self.fault(link.src, d).mode is Mode.CUT:
                    link.cut_direction(d)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- forwarding ---------------------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        src = str(writer.get_extra_info("peername")[0])
        try:
            if self._resetting(src):
                _rst(writer)
                return
            local = (src, 0) if self.bind_source and src.startswith("127.") else None
            try:
                server = await asyncio.wait_for(asyncio.open_connection(*self.target, local_addr=local), 5.0)
            except (OSError, TimeoutError):
                _rst(writer)  # as a refused connection would look to the client
                return
            link = _Link(src, (reader, writer), server)
            self.links.append(link)
            try:
                await self._run(link)
            finally:
                self.links.remove(link)
        except asyncio.CancelledError:
            pass  # stop(): the handler ends quietly (asyncio 3.11 logs a cancelled client_connected_cb)
        finally:
            self._tasks.discard(task)

    async def _run(self, link: _Link) -> None:
        pumps = [asyncio.ensure_future(self._pump(link, d)) for d in (Direction.UP, Direction.DOWN)]
        for d in (Direction.UP, Direction.DOWN):
            if self.fault(link.src, d).mode is Mode.CUT:
                link.cut_direction(d)  # a new connection into a cut: that direction closes at once
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done) and not link.reset:
                link.abort()  # a reset on one side resets the other, as a router would pass it on
        finally:
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in link.writers:
                w.close()

    def _dropping(self, link: _Link, d: Direction) -> bool:
        return d in link.cut or self.fault(link.src, d).mode in (Mode.BLACKHOLE, Mode.CUT)

    async def _pump(self, link: _Link, d: Direction) -> None:
        """Read one direction; a reader task here, a sender task (``_send``) writing with the delay."""
        reader, writer = link.ends[d]
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE)
        link.queues[d] = queue
        loop = asyncio.get_running_loop()
        link.senders[d] = sender = asyncio.ensure_future(self._send(link, queue, writer))
        try:
            while data := await reader.read(_CHUNK):
                if self._dropping(link, d):
                    continue
                fault = self.fault(link.src, d)
                await queue.put((loop.time() + (fault.delay_s if fault.mode is Mode.DELAY else 0.0), data))
            while d not in link.cut and not link.reset and self._dropping(link, d):
                await self._changed.wait()  # a blackhole holds the FIN back too
            if d not in link.cut:
                await queue.put(None)
                await asyncio.wait([sender])
        finally:
            sender.cancel()

    @staticmethod
    async def _send(link: _Link, queue: asyncio.Queue[tuple[float, bytes] | None],
                    writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()
        except (OSError, RuntimeError):  # the receiver is gone (reset): tell the other side the same way
            link.abort()
            while not queue.empty():
                queue.get_nowait()  # frees the reader if it waits on a full queue

    # -- the control line protocol ------------------------------------------------------------------------------
    def command(self, line: str) -> str:
        """Apply one control line; the reply starts with "ok" or "error"."""
        words = line.split()
        if not words:
            return "error empty command"
        verb, args = words[0].lower(), words[1:]
        src = None
        rest: list[str] = []
        for a in args:
            if a.startswith("src="):
                src = a[4:] or None
            else:
                rest.append(a)
        try:
            if verb == "status":
                faults = " ".join(f"{s or '*'}/{d.value}={f.mode.value}" + (f":{f.delay_s:g}" if f.delay_s else "")
                                  for (s, d), f in sorted(self._faults.items(), key=str))
                resets = " ".join(f"{s or '*'}/reset" for s in sorted(self._resets, key=str))
                return f"ok links={len(self.links)} {faults} {resets}".rstrip()
            if verb == "heal" and not rest:
                self.heal(src=src)
            elif verb == "reset" and not rest:
                self.reset(src=src)
            elif verb == "blackhole" and len(rest) <= 1:
                self.blackhole(Direction(rest[0]) if rest else Direction.BOTH, src=src)
            elif verb == "cut" and len(rest) == 1:
                self.cut(Direction(rest[0]), src=src)
            elif verb == "delay" and 1 <= len(rest) <= 2:
                self.delay(float(rest[0]), Direction(rest[1]) if len(rest) == 2 else Direction.BOTH, src=src)
            else:
                return f"error cannot parse {line.strip()!r}"
        except ValueError as exc:
            return f"error {exc}"
        return "ok"

    async def serve_control(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while line := await reader.readline():
                    writer.write((self.command(line.decode(errors="replace")) + "\n").encode())
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        return await asyncio.start_server(handle, host, port)


# -- process mode ---------------------------------------------------------------------------------------------------
def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def _main(args: argparse.Namespace) -> None:
    host, port = _hostport(args.listen)
    proxy = await FaultProxy(_hostport(args.target), host=host, port=port, bind_source=args.bind_source).start()
    control = await proxy.serve_control(*_hostport(args.control))
    chost, cport = control.sockets[0].getsockname()[:2]
    print(f"LISTEN {proxy.addr} CONTROL {chost}:{cport}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    control.close()
    await proxy.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.kit.faultproxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept clients on")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--control", default="127.0.0.1:0", help="HOST:PORT of the control line protocol")
    parser.add_argument("--bind-source", action="store_true", help="dial the target from the client's 127.x")
    asyncio.run(_main(parser.parse_args(argv)))


class FaultProxyProcess:
    """The proxy as a child process, driven from synchronous code (a Jepsen-style harness)."""

    def __init__(self, target: str, *, listen: str = "127.0.0.1:0", bind_source: bool = False) -> None:
        self.args = ["--listen", listen, "--target", target] + (["--bind-source"] if bind_source else [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.addr = self.control_addr = ""

    def start(self, timeout: float = 10.0) -> Self:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.kit.faultproxy", *self.args], cwd=root,
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.stop()
                raise TimeoutError(f"the fault proxy did not start within {timeout}s")
        words = self.proc.stdout.readline().decode().split()
        if len(words) != 4 or words[0] != "LISTEN":
            self.stop()
            raise RuntimeError(f"the fault proxy printed {words!r}")
        self.addr, self.control_addr = words[1], words[3]
        return self

    def command(self, line: str, timeout: float = 5.0) -> str:
        with socket.create_connection(_hostport(self.control_addr), timeout=timeout) as sock:
            sock.sendall(line.encode() + b"\n")
            reply = sock.makefile("rb").readline().decode().strip()
        if not reply.startswith("ok"):
            raise RuntimeError(f"fault proxy: {line!r} -> {reply!r}")
        return reply

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
