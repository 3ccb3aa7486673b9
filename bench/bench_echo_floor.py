"""The machine's floor for a send -> receive hop between two processes (what no broker can beat).

    .venv/bin/python bench/bench_echo_floor.py [--count 1500] [--interval-ms 2]

This process writes 100 bytes to a relay process over loopback TCP (uvloop on both sides) and waits for them
to come back, once every ``interval`` ms, as the idle-push latency bench does with a broker in between.
Prints one JSON line: median and p99 round trip. Compare with ``cometmq bench latency``.

``--cpus C,R`` pins this process to processor C and the relay to R (Linux): ``0,0`` keeps both on one, ``0,1``
puts them on two, so that every hop wakes a process on the other processor. Unpinned, the scheduler here places a
woken process on its waker's processor (a synchronous socket wake-up): both then share one, and each hop costs
what ``0,0`` costs.

``--relay c`` relays with a small C program instead (epoll, read, write; built with the system's ``cc`` into a
temporary folder): a server's floor without an interpreter, as Redis's is, against Python's event loop's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cometmq.net.loop import run

#: the C relay: one connection, each read written back at once
C_RELAY = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
int main(void) {
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) { perror("relay"); return 1; }
    socklen_t len = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &len);
    printf("%d\n", ntohs(a.sin_port));
    fflush(stdout);
    int c = accept(s, NULL, NULL), ep = epoll_create1(0);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    static char buf[65536];
    for (;;) {
        if (epoll_wait(ep, &ev, 1, -1) < 1) continue;
        ssize_t n = read(c, buf, sizeof buf);
        if (n <= 0) return 0;
        if (write(c, buf, (size_t)n) != n) return 1;
    }
}
"""


def c_relay(folder: Path) -> list[str]:
    """The C relay's command, built in ``folder``."""
    (folder / "relay.c").write_text(C_RELAY)
    subprocess.run(["cc", "-O2", "-o", str(folder / "relay"), str(folder / "relay.c")], check=True)
    return [str(folder / "relay")]


async def relay() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def client(port: int, count: int, interval_s: float) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(count):
        await asyncio.sleep(interval_s)
        t0 = time.perf_counter()
        writer.write(b"x" * 100)
        await reader.readexactly(100)
        out.append(time.perf_counter() - t0)
    writer.close()
    return out


def main() -> None:
    if sys.argv[1:] == ["relay"]:
        run(relay())
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument("--cpus", default=None, metavar="C,R", help="pin this process to C and the relay to R")
    ap.add_argument("--relay", choices=("python", "c"), default="python",
                    help="the relay: Python on uvloop (default) or a C program")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="echo-floor-")
    command = c_relay(Path(tmp.name)) if args.relay == "c" else [sys.executable, __file__, "relay"]
    pins: tuple[int, int] | None = None
    if args.cpus:
        c, r = (int(x) for x in args.cpus.split(","))
        pins = (c, r)
        os.sched_setaffinity(0, {c})
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {pins[1]})) if pins else None)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        lat = sorted(run(client(port, args.count, args.interval_ms / 1000))[min(200, args.count // 10):])
    finally:
        proc.kill()
        proc.wait()
        tmp.cleanup()
    print(json.dumps({"bench": "echo_floor", "relay": args.relay, "round_trips": len(lat),
                      "interval_ms": args.interval_ms, "cpus": args.cpus or "unpinned",
                      "median_ms": round(lat[len(lat) // 2] * 1e3, 3),
                      "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3)}))


if __name__ == "__main__":
    main()
