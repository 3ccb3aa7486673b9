"""The broker's Prometheus endpoint: ``GET /metrics`` on metricsPrometheusHost:metricsPrometheusPort.

A small HTTP/1.0-style server on the broker's own event loop (one request per connection). A scrape reads the
broker's state on the loop, between two of its steps, never while a handler is half way through a change, into plain
data (collector.py's ``snapshot_async``, in slices of a few milliseconds with the loop running in between); the
text is then written in a thread (metrics/text.py). On a broker with 10,000 consumer groups the whole exposition,
read and written on the loop in one go, held it ~1 s at every scrape, every client's requests waiting.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from cometmq.metrics.collector import snapshot, snapshot_async
from cometmq.metrics.text import exposition, exposition_pieces

if TYPE_CHECKING:
    from cometmq.broker.controller import BrokerController

log = logging.getLogger(__name__)

_MAX_HEAD = 16 * 1024
_READ_TIMEOUT_S = 10.0
#: a scraper has this long to read the answer: past it the connection is cut (a client that never reads would hold
#: the answer, megabytes on a large broker, for good)
WRITE_TIMEOUT_S = 30.0
#: answers written at once: each is held in memory until its scraper has read it (megabytes on a large broker), so
#: clients that ask on many connections and do not read hold this many, not one per connection. A scrape waits
#: for its turn (Prometheus servers and dashboards scrape a few at a time), a 503 past the read time limit.
MAX_ANSWERS = 4


class MetricsExporter:
    def __init__(self, broker: BrokerController, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self._requested_port = port
        self.port = port
        self._server: asyncio.Server | None = None
        self.write_timeout = WRITE_TIMEOUT_S
        self._turns = asyncio.Semaphore(MAX_ANSWERS)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self._requested_port, reuse_address=True)
        sockets = self._server.sockets
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("metrics: Prometheus endpoint on http://%s/metrics", self.addr)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def render(self) -> bytes:
        """The exposition text of every metric now, all of it on the caller's thread (call on the broker's loop)."""
        return exposition(snapshot(self.broker))

    async def render_pieces(self) -> list[bytes]:
        """The same in pieces of about a megabyte, the numbers read on the loop in slices and the text written in a
        thread."""
        return await asyncio.to_thread(exposition_pieces, await snapshot_async(self.broker))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        turn = False
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            if len(head) > _MAX_HEAD:
                raise ValueError("request head too large")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", [b"GET /metrics\n"]
            elif path in ("/metrics", "/"):
                try:
                    await asyncio.wait_for(self._turns.acquire(), _READ_TIMEOUT_S)
                    turn = True
                except TimeoutError:
                    pass
                if turn:
                    status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, await self.render_pieces()
                else:
                    status, ctype, body = ("503 Service Unavailable", "text/plain",
                                           [f"more than {MAX_ANSWERS} scrapes at once: try again\n".encode()])
            else:
                status, ctype, body = "404 Not Found", "text/plain", [b"GET /metrics\n"]
            length = sum(map(len, body))
            writer.write((f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n"
                          "Connection: close\r\n\r\n").encode("latin-1"))
            try:
                async with asyncio.timeout(self.write_timeout):
                    # piece by piece, each sent (or buffered) before the next: the loop never copies the whole
                    # answer in one go, and a slow reader holds the answer's pieces, not copies of them as well
                    for piece in body if method != "HEAD" else []:
                        writer.write(piece)
                        await writer.drain()
                    await writer.drain()
            except TimeoutError:
                writer.transport.abort()  # it does not read: the rest of the answer is not kept for it
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                ConnectionError):
            pass  # a client that went away or sent no HTTP: nothing to answer
        except Exception:
            log.exception("metrics: answering a scrape failed")
        finally:
            if turn:
                self._turns.release()
            writer.close()


async def start_exporter(broker: BrokerController, host: str, port: int) -> MetricsExporter:
    """Serve ``/metrics`` for ``broker`` on ``host:port`` (0: a free port; read ``.port``)."""
    exporter = MetricsExporter(broker, host, port)
    await exporter.start()
    return exporter
