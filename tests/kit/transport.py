"""An in-memory asyncio transport for feeding a RemotingConnection without a socket: it keeps (or only counts)
what is written, answers the peer and socket addresses it was given, and closes on close()/abort()."""

from __future__ import annotations

from typing import Any


class MemoryTransport:
    def __init__(self, peername: tuple[str, int] = ("127.0.0.1", 40000),
                 sockname: tuple[str, int] = ("127.0.0.1", 10911), *, keep: bool = True) -> None:
        self.extra = {"peername": peername, "sockname": sockname}
        self.keep = keep
        #: what was written, one entry per write (joined for writelines), when ``keep``
        self.written: list[bytes] = []
        #: how many writes
        self.writes = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.keep:
            self.written.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes += 1
        if self.keep:
            self.written.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return self.extra.get(key, default)

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True
