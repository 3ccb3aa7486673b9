"""Pull answers sent from the commit-log file (sendfile): the head written to the socket, the body from the
file, what the socket does not take written by the transport after it; on uvloop and on asyncio's loop."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cometmq.net.connection import RemotingConnection
from cometmq.net.loop import run
from cometmq.net.server import RemotingServer
from cometmq.protocol.remoting import RemotingCommand, decode, encode, make_request, make_response
from cometmq.store.mapped_file import FileRegion, MappedFile

pytestmark = pytest.mark.timeout(60)

SEGMENT = 4 << 20
PULL = 1000


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[MappedFile]:
    mf = MappedFile(tmp_path / f"{0:020d}", SEGMENT)
    mf.append(os.urandom(SEGMENT))
    yield mf
    mf.close()


def test_send_to_sends_the_file_bytes_and_gives_up_quietly(segment: MappedFile) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        sent = FileRegion(segment, 12345, 1000).send_to(a.fileno())
        assert sent == 1000
        assert b.recv(2000) == segment.view(12345, 1000)
        # a full socket takes nothing: 0, no exception (the caller writes it from memory)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        total = 0
        while (n := segment.send_to(a.fileno(), 0, 1 << 20)) > 0:
            total += n
        assert 0 < total < 1 << 20
        # the segment's lock held (warm or close running): 0 at once, nothing sent
        with segment._warm_lock:
            assert segment.send_to(a.fileno(), 0, 10) == 0
    closed = MappedFile(segment.path.with_name(f"{SEGMENT:020d}"), 4096)
    closed.close()
    c, d = socket.socketpair()
    with c, d:
        assert closed.send_to(c.fileno(), 0, 10) == 0


@pytest.mark.parametrize("uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_answers_from_the_file_arrive_whole_and_in_order(segment: MappedFile, uvloop: bool) -> None:
    if uvloop:
        pytest.importorskip("uvloop")
    regions: list[tuple[FileRegion, int]] = []  # (region, bytes the socket took from the file)

    class Counting(FileRegion):
        def send_to(self, sock_fd: int) -> int:
            n = super().send_to(sock_fd)
            regions.append((self, n))
            return n

    async def pull(conn: RemotingConnection, cmd: RemotingCommand) -> None:
        pos, size = int(cmd.ext_fields["pos"]), int(cmd.ext_fields["size"])
        if cmd.ext_fields.get("small_buffer"):  # answers pile up: some go out partly, some wait their turn
            conn._transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        answer = make_response(cmd, 0, None, {"pos": pos}, bytes(segment.view(pos, size)))
        conn.send_response(answer, file_region=Counting(segment, pos, size))

    requests = [make_request(PULL, {"pos": (i * 97_331) % (SEGMENT - 300_000), "size": 70_000 + i * 5_000,
                                    **({"small_buffer": "1"} if i == 0 else {})}) for i in range(40)]

    def read_frames(sock: socket.socket, n: int) -> list[RemotingCommand]:
        time.sleep(0.3)  # nothing read yet: the answers fill the sockets and queue in the transport
        out = []
        for _ in range(n):
            head = sock.recv(4, socket.MSG_WAITALL)
            (length,) = struct.unpack(">I", head)
            out.append(decode(head + sock.recv(length, socket.MSG_WAITALL)))
        return out

    async def scenario() -> list[RemotingCommand]:
        async with RemotingServer("127.0.0.1", 0, {PULL: pull}) as srv:
            loop = asyncio.get_running_loop()
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            with sock:
                sock.sendall(b"".join(encode(r) for r in requests))
                return await loop.run_in_executor(None, read_frames, sock, len(requests))

    answers = run(scenario(), use_uvloop=uvloop)
    for req, got in zip(requests, answers, strict=True):
        pos, size = int(req.ext_fields["pos"]), int(req.ext_fields["size"])
        assert got.opaque == req.opaque and got.ext_fields["pos"] == str(pos)
        assert got.body == segment.view(pos, size)
    from_file = sum(n for _, n in regions)
    assert from_file > 0, "no answer was sent from the file"
    assert len(regions) < len(requests) or any(n < r.size for r, n in regions), \
        "every answer went out whole from the file: the partial and queued paths were not exercised"
