"""The master's side of the HA link (RocketMQ 5's auto-switch protocol, ``protocol/ha.py``), one per replica.

A replica connects to the HA port and says who it is (handshake); the master answers with its epoch list; the
replica truncates to the last common epoch point and reports its log end; from there the master streams raw log
bytes, a frame never crossing the end of an epoch, each frame carrying the master's confirm offset, and a
heartbeat frame when idle. The replica acks with its log end; the acks move the SyncStateSet and the confirm
offset (``sync_state.py``).

Bad input (garbage, a second handshake, an id already linked, a report beyond the master's log, silence past
four heartbeats) closes that link with one log line and changes nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from cometmq.broker.ha.sync_state import MASTER_ID, SyncState
from cometmq.net.addr import bound_socket
from cometmq.protocol import ha
from cometmq.store.epoch_file import EpochFile
from cometmq.store.message_store import MessageStore

if TYPE_CHECKING:
    from cometmq.broker.ha.service import HAConfig

log = logging.getLogger(__name__)

_READ_SIZE = 64 * 1024
# Timeouts here are ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 ``wait_for`` swallows a
# cancellation that arrives in the loop turn its awaitable completes (gh-86296), and a link's send loop, woken by
# every append, then never ends: ``run`` waits for it forever and the replica's id stays linked (every new link
# from it refused as "already linked").
#: an idle link tells its replica of a new confirm offset after this long without new data to carry it
_CONFIRM_LINGER_S = 0.005


class HAMaster:
    def __init__(self, config: HAConfig, store: MessageStore, epochs: EpochFile, sync: SyncState, *,
                 clock: Callable[[], int], on_change: Callable[[], None],
                 admit: Callable[[int, str], Awaitable[bool]] | None = None) -> None:
        self.config = config
        self.store = store
        self.epochs = epochs
        self.sync = sync
        self.clock = clock
        self._on_change = on_change
        #: checks that a handshaking peer is a broker of this group (#3015); None: anyone with an id may link
        self._admit = admit
        self._server: asyncio.Server | None = None
        self.links: dict[int, _Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound HA port (the configured one while it is not bound)."""
        if self._server is None:
            return self.config.port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen on the HA port. A busy port does not stop the broker (it serves clients without replicas): it is
        logged, and tried again every few seconds until it can be bound."""
        if not await self._bind(report=True):
            self._tasks.add(asyncio.get_running_loop().create_task(self._bind_later(), name="ha-bind"))

    async def _bind(self, *, report: bool) -> bool:
        try:
            sock = bound_socket(self.config.host, self.config.port)  # an IP address: bound without a lookup
            if sock is None:
                self._server = await asyncio.start_server(self._accept, self.config.host, self.config.port,
                                                          reuse_address=True)
            else:
                try:
                    self._server = await asyncio.start_server(self._accept, sock=sock)
                except BaseException:
                    sock.close()
                    raise
        except OSError as exc:
            if report:
                log.error("cannot listen on the HA port %s:%d (%s): replicas cannot link until it is free",
                          self.config.host, self.config.port, exc)
            return False
        log.info("HA port listening on %s:%d", self.config.host, self.port)
        return True

    async def _bind_later(self) -> None:
        while not await self._bind(report=False):
            await asyncio.sleep(5.0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.links.clear()

    def appended(self) -> None:
        """The log grew, or the confirm offset moved: ship to idle links now, wake the others."""
        for link in self.links.values():
            link.ship_now()
            link.wake.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        link: _Link | None = None
        try:
            link = await self._handshake(reader, writer, peer)
            if link is not None:
                await link.run()
        except (ha.HAProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("HA link from %s closed: %s", peer, exc if str(exc) else type(exc).__name__)
        except asyncio.CancelledError:
            pass
        finally:
            if link is not None and self.links.get(link.replica_id) is link:
                del self.links[link.replica_id]
                self.sync.disconnected(link.replica_id)
            writer.close()
            self._tasks.discard(task)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: object) -> _Link | None:
        silence_s = 4 * self.config.heartbeat_interval_ms / 1000
        decoder = ha.SlaveFrameDecoder()
        frames: list[ha.SlaveFrame] = []
        while not frames:
            async with asyncio.timeout(silence_s):
                data = await reader.read(_READ_SIZE)
            if not data:
                return None
            frames = decoder.feed(data)
        hello = frames.pop(0)
        if not isinstance(hello, ha.SlaveHandshake):
            raise ha.HAProtocolError(f"expected a handshake first, got {hello}")
        rid = hello.slave_broker_id
        if rid <= MASTER_ID:
            raise ha.HAProtocolError(f"a replica's broker id is 1 or more, not {rid}")
        if rid in self.links:
            raise ha.HAProtocolError(f"replica {rid} is already linked from {self.links[rid].peer}")
        host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        if self._admit is not None and not await self._admit(rid, host):
            raise ha.HAProtocolError(f"no broker {rid} of this group is registered at {host}: not a replica")
        if rid in self.links:  # (linked meanwhile)
            raise ha.HAProtocolError(f"replica {rid} is already linked from {self.links[rid].peer}")
        writer.write(ha.encode_master_handshake(self.store.commitlog.max_offset, self.epochs.entries))
        await writer.drain()
        link = _Link(self, rid, peer, reader, writer, decoder, frames, hello.is_sync_from_last_file)
        self.links[rid] = link
        return link


class _Link:
    def __init__(self, master: HAMaster, replica_id: int, peer: object, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, decoder: ha.SlaveFrameDecoder, pending: list[ha.SlaveFrame],
                 from_last_file: bool) -> None:
        self.master = master
        self.replica_id = replica_id
        self.peer = peer
        self.reader = reader
        self.writer = writer
        self.decoder = decoder
        self.pending = pending
        self.from_last_file = from_last_file
        self.wake = asyncio.Event()
        #: where the next transfer frame starts; None until the replica's first report
        self.offset: int | None = None
        #: the confirm offset the replica was last told (an idle link tells it when it moves)
        self.told_confirm = -1
        #: the send loop is waiting for bytes to ship (not draining): an append may write the frame itself
        self.idle = False

    async def run(self) -> None:
        """Until either loop ends the link; its error is raised here (and logged by ``_accept``): a send loop that
        failed alone would leave the link open, silent, until the replica's silence timed it out."""
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._send_loop(), name=f"ha-send-{self.replica_id}")
        reader = loop.create_task(self._read_loop(), name=f"ha-read-{self.replica_id}")
        try:
            done, _ = await asyncio.wait((sender, reader), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            sender.cancel()
            reader.cancel()
            await asyncio.gather(sender, reader, return_exceptions=True)

    # -- acks -------------------------------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        m = self.master
        silence_s = 4 * m.config.heartbeat_interval_ms / 1000
        while True:
            for frame in self.pending:
                self._on_frame(frame)
            async with asyncio.timeout(silence_s):
                data = await self.reader.read(_READ_SIZE)
            if not data:
                raise ConnectionError("the replica closed the link")
            self.pending = self.decoder.feed(data)

    def _on_frame(self, frame: ha.SlaveFrame) -> None:
        m = self.master
        if not isinstance(frame, ha.SlaveReport):
            raise ha.HAProtocolError(f"unexpected {frame} after the handshake")
        end = m.store.commitlog.max_offset
        if frame.max_offset > end:
            raise ha.HAProtocolError(f"replica {self.replica_id} reports offset {frame.max_offset} beyond the "
                                     f"master's log end {end}")
        if self.offset is None:  # the first report: where the replica's log ends after its truncation
            start = frame.max_offset
            first = m.store.commitlog.min_offset
            if start == 0:
                start = first
            elif start < first:
                # What it lacks next is gone: it can never catch up over this link (RocketMQ's master idles on
                # it). Said once per link; the replica reconnects and is told again.
                raise ha.HAProtocolError(
                    f"replica {self.replica_id} cannot catch up: its log ends at {start}, before this master's log "
                    f"start {first} (retention deleted the bytes it needs next); empty its store for it to copy "
                    f"again from {first}")
            self.offset = start
            m.sync.connected(self.replica_id, m.clock())
            log.info("replica %d (%s) linked; transfer starts at %d", self.replica_id, self.peer, start)
            self.wake.set()
        rep = m.sync.replicas[self.replica_id]
        moved = frame.max_offset > rep.ack
        if m.sync.on_ack(self.replica_id, frame.max_offset, end, m.clock()):
            log.info("replica %d joined the SyncStateSet, now %s", self.replica_id, sorted(m.sync.members))
        elif not moved:
            return  # an ack of nothing new (after a heartbeat): it still counts as caught up; nothing moved
        m._on_change()

    # -- transfer ---------------------------------------------------------------------------------------------
    def ship_now(self) -> None:
        """Called by the append itself: an idle link writes the new bytes at once, a loop turn earlier than its
        send loop would (the loop still drains and ships the rest)."""
        m = self.master
        offset = self.offset
        if self.idle and offset is not None and not self.writer.is_closing() and \
                self.writer.transport.get_write_buffer_size() == 0:
            end = m.store.commitlog.max_offset
            if offset < end:
                try:
                    self._send_frame(offset, end, m.config.transfer_batch_size)
                except (OSError, RuntimeError, ha.HAProtocolError) as exc:
                    # The replica went away (a reset closes the transport before this link's loops see it): the
                    # send loop meets the same error and closes the link. Raising here would fail the append that
                    # called, after its messages were stored, and leave its senders without an answer.
                    log.debug("HA link %s: shipping at the append failed: %s", self.peer, exc)

    async def _send_loop(self) -> None:
        m = self.master
        heartbeat_s = m.config.heartbeat_interval_ms / 1000
        batch = m.config.transfer_batch_size
        while True:
            offset = self.offset
            end = m.store.commitlog.max_offset
            if offset is not None and offset < end:
                sent = self._send_frame(offset, end, batch)
                await self.writer.drain()
                if sent:
                    continue
            elif offset is not None and m.sync.confirm_offset(end) != self.told_confirm:
                # Nothing to ship, but the confirm offset moved: tell the replica soon, not at the next heartbeat,
                # so that its consumers see the confirmed messages. Under load the next data frame carries it.
                self.wake.clear()
                try:
                    async with asyncio.timeout(_CONFIRM_LINGER_S):
                        await self.wake.wait()
                except TimeoutError:
                    self._send_heartbeat()
                    await self.writer.drain()
                continue
            self.wake.clear()
            self.idle = True
            try:
                async with asyncio.timeout(heartbeat_s):
                    await self.wake.wait()
            except TimeoutError:
                if self.offset is not None:
                    self._send_heartbeat()
                    await self.writer.drain()
            finally:
                self.idle = False

    def _send_frame(self, offset: int, end: int, batch: int) -> int:
        """One frame of log bytes from ``offset``; the bytes sent (0 when none could be read)."""
        m = self.master
        entry = m.epochs.find_epoch(offset)
        if entry is None:
            raise ha.HAProtocolError(f"no epoch covers offset {offset} of the master's log")
        epoch, epoch_start, epoch_end = entry
        limit = min(end, epoch_end if epoch_end is not None else end)
        mf = m.store.commitlog.files.find(offset)
        if mf is None:
            raise ha.HAProtocolError(f"offset {offset} is no longer in the master's log")
        pos = offset - mf.file_from_offset
        n = min(batch, limit - offset, mf.wrote_position - pos)
        if n <= 0:
            return 0
        body = mf.view(pos, n)
        confirm = self.told_confirm = m.sync.confirm_offset(end)
        self.writer.write(ha.encode_transfer_header(offset, epoch, epoch_start, confirm, n))
        self.writer.write(body)
        self.offset = offset + n
        m.sync.sent(self.replica_id, end)
        return n

    def _send_heartbeat(self) -> None:
        m = self.master
        end = m.store.commitlog.max_offset
        assert self.offset is not None
        entry = m.epochs.find_epoch(max(self.offset - 1, 0)) or m.epochs.find_epoch(self.offset)
        epoch, epoch_start = (entry[0], entry[1]) if entry is not None else (m.epochs.last_epoch(), 0)
        confirm = self.told_confirm = m.sync.confirm_offset(end)
        self.writer.write(ha.encode_transfer_header(self.offset, epoch, epoch_start, confirm, 0))
        m.sync.sent(self.replica_id, self.offset)
