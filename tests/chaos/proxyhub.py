"""Many fault proxies (tests/kit/faultproxy.py) in one process, driven by one control port.

A chaos cluster needs a proxy in front of every server port (namesrv, controllers, each broker's remoting and
HA ports). One process holds them all, outside the processes it sits between (a SIGSTOP'd broker does not stop
the proxies) and outside the test's event loop (a busy workload does not delay forwarded bytes).

    python -m tests.chaos.proxyhub NAME=LISTEN_HOST:PORT=TARGET_HOST:PORT ...
    -> prints "CONTROL 127.0.0.1:PORT" once every proxy listens
    control lines: "NAME <faultproxy command>" (blackhole/delay/cut/reset/heal/status, with src=IP), or
                   "* heal" (every proxy). Reply "ok ..." / "error ...".
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from tests.kit.faultproxy import FaultProxy


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(specs: list[str]) -> None:
    proxies: dict[str, FaultProxy] = {}
    for spec in specs:
        name, listen, target = spec.split("=")
        host, port = _hostport(listen)
        proxies[name] = await FaultProxy(_hostport(target), host=host, port=port, bind_source=True).start()

    def command(line: str) -> str:
        name, _, rest = line.strip().partition(" ")
        if name == "*":
            replies = [p.command(rest) for p in proxies.values()]
            bad = [r for r in replies if not r.startswith("ok")]
            return bad[0] if bad else "ok"
        proxy = proxies.get(name)
        if proxy is None:
            return f"error no proxy {name!r}"
        return proxy.command(rest)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write((command(line.decode(errors="replace")) + "\n").encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    control = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"CONTROL 127.0.0.1:{control.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    control.close()
    await asyncio.gather(*(p.stop() for p in proxies.values()), return_exceptions=True)


class ProxyHub:
    """The hub as a child process; ``command`` is async (a short loopback exchange on the control port)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.specs: dict[str, tuple[str, str]] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.control = ""
        self.log: list[tuple[float, str, str]] = []

    def add(self, name: str, listen: str, target: str) -> str:
        self.specs[name] = (listen, target)
        return listen

    async def start(self, timeout: float = 15.0) -> None:
        root = Path(__file__).resolve().parents[2]
        args = [f"{n}={listen}={target}" for n, (listen, target) in self.specs.items()]
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "proxyhub.log", "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.chaos.proxyhub", *args], cwd=root,
                                         stdout=subprocess.PIPE, stderr=err)
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        line = await asyncio.wait_for(loop.run_in_executor(None, self.proc.stdout.readline), timeout)
        words = line.decode().split()
        if len(words) != 2 or words[0] != "CONTROL":
            self.kill()
            raise RuntimeError(f"proxyhub printed {line!r}; see {self.workdir / 'proxyhub.log'}")
        self.control = words[1]

    async def command(self, line: str, timeout: float = 5.0) -> str:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*_hostport(self.control)), timeout)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            reply = (await asyncio.wait_for(reader.readline(), timeout)).decode().strip()
        finally:
            writer.close()
        if not reply.startswith("ok"):
            raise RuntimeError(f"proxyhub: {line!r} -> {reply!r}")
        return reply

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
