"""A proxy in front of a master's HA port that understands its frames (tests/ha)."""

from __future__ import annotations

import asyncio
import contextlib
import struct


class FrameCutter:
    """Forwards replica → master bytes as they come and master → replica frames until a data frame starts at or
    past ``cut_at``; from then on nothing more of that link reaches the replica (the sockets stay open)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut_at: int | None = None
        self.cut = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> FrameCutter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def addr(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for coro in (self._up(reader, up_writer), self._down(up_reader, writer)):
            task = asyncio.get_running_loop().create_task(coro)
            self._tasks.add(task)

    @staticmethod
    async def _up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cut = False  # (per link: a new link's handshake passes, its data from ``cut_at`` on does not)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            while True:
                head = await reader.readexactly(8)
                state, size = struct.unpack(">ii", head)
                rest = await reader.readexactly((12 if state == 1 else 28) + size)
                if state == 2 and size > 0 and self.cut_at is not None:
                    (start,) = struct.unpack_from(">q", rest, 0)
                    if start >= self.cut_at:
                        cut = self.cut = True
                if not cut:
                    writer.write(head + rest)
                    await writer.drain()
