"""The replica's side of the HA link: connect to the master, truncate to the last common epoch point, append what
the master streams, report the log end.

The truncation is durable before the epoch file says so (``MessageStore.truncate`` syncs the zeroed tail; then
``EpochFile.truncate_suffix``), so a crash in between leaves nothing stale (RocketMQ #10666). A frame that does
not start at the replica's log end, an epoch older than the last one, or garbage closes the link; the replica
reconnects after a pause and handshakes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cometmq.broker.appender import Appender
from cometmq.common import failpoints
from cometmq.net.client import split_address
from cometmq.protocol import ha
from cometmq.store.epoch_file import EpochFile
from cometmq.store.message_store import MessageStore

if TYPE_CHECKING:
    from cometmq.broker.ha.service import HAConfig

log = logging.getLogger(__name__)

_READ_SIZE = 4 << 20
_RETRY_S = (0.2, 0.5, 1.0, 2.0)


class HAReplica:
    def __init__(self, config: HAConfig, store: MessageStore, appender: Appender, epochs: EpochFile,
                 replica_id: int, master_addr: Callable[[], str | None], *,
                 on_truncated: Callable[[], None] | None = None,
                 on_cut: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.store = store
        self.appender = appender
        self.epochs = epochs
        self.replica_id = replica_id
        self._master_addr = master_addr
        self._on_truncated = on_truncated
        self._on_cut = on_cut
        self.master_addr: str | None = None
        self.connected = False
        self._task: asyncio.Task[None] | None = None
        #: frames applied (for tests and status)
        self.frames = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"ha-replica-{self.replica_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.connected = False

    async def _run(self) -> None:
        failures = 0
        while True:
            addr = self._master_addr()
            if addr:
                self.master_addr = addr
                try:
                    await self._link(addr)
                    failures = 0
                except (ha.HAProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    log.warning("HA link to master %s: %s; reconnecting", addr, exc)
                finally:
                    self.connected = False
            await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
            failures += 1

    async def _link(self, addr: str) -> None:
        host, port = split_address(addr)
        silence_s = 4 * self.config.heartbeat_interval_ms / 1000
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow stop()'s cancellation (gh-86296; see
        # master.py), and the link would outlive the role it was started for
        async with asyncio.timeout(silence_s):
            reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(ha.encode_slave_handshake(self.replica_id))
            await writer.drain()
            decoder = ha.MasterFrameDecoder(max_body=max(self.config.transfer_batch_size, 4 << 20))
            frames: list[ha.MasterFrame] = []
            while not frames:
                async with asyncio.timeout(silence_s):
                    data = await reader.read(_READ_SIZE)
                if not data:
                    raise ConnectionError("the master closed the link during the handshake")
                frames = decoder.feed(data)
            hello = frames.pop(0)
            if not isinstance(hello, ha.MasterHandshake):
                raise ha.HAProtocolError(f"expected the master's handshake, got {hello}")
            mine = self.epochs.last_epoch()
            if hello.last_epoch < mine:
                # A stale master (an old one cut off, named by a stale address): its common point with this log is
                # before the newer epochs, whose messages a newer master acknowledged with this replica's acks.
                raise ha.HAProtocolError(f"the master at {addr} is at epoch {hello.last_epoch}, older than this "
                                         f"replica's epoch {mine}: not following it (the log is kept)")
            self._truncate_to_common_point(hello)
            self._learn_epochs(hello.entries)
            writer.write(ha.encode_slave_report(self.store.commitlog.max_offset))
            await writer.drain()
            self.connected = True
            log.info("HA link to master %s up; log end %d", addr, self.store.commitlog.max_offset)
            while True:
                confirm = -1
                for frame in frames:
                    confirm = self._apply(frame)
                if frames:
                    end = self.store.commitlog.max_offset
                    # Ack first: the master waits for it; the dispatch of what the master confirmed can follow.
                    writer.write(ha.encode_slave_report(end))
                    self.store.set_confirm_offset(min(confirm, end))
                async with asyncio.timeout(silence_s):
                    data = await reader.read(_READ_SIZE)
                if not data:
                    raise ConnectionError("the master closed the link")
                frames = decoder.feed(data)
        finally:
            writer.close()

    def _truncate_to_common_point(self, hello: ha.MasterHandshake) -> None:
        """Cut the local log back to where it agrees with the master's epochs (nothing when it is empty)."""
        local_end = self.store.commitlog.max_offset
        if not self.epochs.entries:
            if local_end > 0 and local_end > hello.master_max_offset:
                raise ha.HAProtocolError(f"this replica's log ends at {local_end}, past the master's end "
                                         f"{hello.master_max_offset}, and has no epochs to compare")
            return
        point = self.epochs.find_consistent_point(hello.entries, local_end, hello.master_max_offset)
        if point is None:
            raise ha.HAProtocolError("no epoch in common with the master: an operator must decide (the replica "
                                     "keeps its log)")
        if point < local_end:
            log.warning("truncating the log from %d to %d, the last point in common with the master", local_end,
                        point)
            if self._on_cut is not None:
                self._on_cut(point)
            self.store.truncate(point)  # durable on return
            failpoints.hit("ha.truncate.log_cut")
            if self._on_truncated is not None:
                self._on_truncated()
        self.epochs.truncate_suffix(point)

    def _learn_epochs(self, entries: tuple[ha.EpochEntry, ...] | list[ha.EpochEntry]) -> None:
        """Take the master's epochs that start within this log (after the truncation its history agrees with
        the master's up to its end), so the replica knows the current epoch before any new byte arrives."""
        end = self.store.commitlog.max_offset
        for epoch, start in entries:
            if epoch > self.epochs.last_epoch() and start <= end:
                self.epochs.append(epoch, start)

    def _apply(self, frame: ha.MasterFrame) -> int:
        """Append a transfer frame's bytes; returns the master's confirm offset it carried."""
        if not isinstance(frame, ha.Transfer):
            raise ha.HAProtocolError(f"unexpected {frame} after the handshake")
        store = self.store
        end = store.commitlog.max_offset
        # (a heartbeat may come before the master knows where the transfer starts: offset -1, as Java's do; an
        # empty log takes the master's first bytes wherever its log starts, §1.2 step 5)
        empty = end == 0 and store.commitlog.files.last is None
        if frame.start_offset != end and not empty and \
                not (not frame.body and (end == 0 or frame.start_offset == -1)):
            raise ha.HAProtocolError(f"the master sent offset {frame.start_offset}; this log ends at {end}")
        last = self.epochs.last_epoch()
        if frame.body and frame.epoch < last:
            raise ha.HAProtocolError(f"the master sent epoch {frame.epoch}, older than this log's {last}")
        if frame.epoch > last and frame.epoch_start_offset <= end:
            self.epochs.append(frame.epoch, frame.epoch_start_offset)
        if frame.body:
            if not self.appender.append_replicated(frame.start_offset, frame.body):
                raise ha.HAProtocolError(f"cannot append {len(frame.body)} bytes at {frame.start_offset}")
            self.frames += 1
        return frame.confirm_offset
