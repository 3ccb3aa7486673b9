"""Where a push consumer keeps its consume offsets.

- :class:`RemoteBrokerOffsetStore` (clustering): offsets live on the broker that holds the queue; the
  consumer reads them when it takes a queue (QUERY_CONSUMER_OFFSET) and commits them every few seconds,
  when it gives a queue up, and when it closes (UPDATE_CONSUMER_OFFSET).
- :class:`LocalFileOffsetStore` (broadcasting): every consumer reads every queue at its own pace, so the
  offsets are its own, kept in a JSON file written atomically.

An offset is always "the next message to consume" (last consumed + 1), as RocketMQ stores it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from cometmq.client.errors import BrokerError, NoRouteError
from cometmq.client.instance import ClientInstance
from cometmq.common.atomic_file import read_optional, write_atomic
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.headers import QueryConsumerOffsetRequestHeader, UpdateConsumerOffsetRequestHeader
from cometmq.protocol.remoting import make_request

log = logging.getLogger(__name__)

__all__ = ["LocalFileOffsetStore", "OffsetStore", "RemoteBrokerOffsetStore"]


class OffsetStore(Protocol):
    async def load(self) -> None:
        """Read what is kept locally (nothing for the broker store)."""

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record an offset in memory; with ``increase_only`` a smaller one than known is ignored."""

    def read(self, mq: MessageQueue) -> int:
        """The offset in memory, or -1."""

    async def read_stored(self, mq: MessageQueue) -> int:
        """The stored (committed) offset, or -1 when there is none; raises when the store cannot answer."""

    async def persist(self, mqs: Iterable[MessageQueue]) -> None:
        """Store the offsets in memory of these queues (failures are logged, and retried next time)."""

    def remove(self, mq: MessageQueue) -> None:
        """Forget a queue (after it was given up)."""

    def offsets(self) -> dict[MessageQueue, int]:
        """A copy of the offsets in memory."""


class _MemoryTable:
    def __init__(self) -> None:
        self._table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        if offset < 0:
            return
        old = self._table.get(mq)
        if old is None or not increase_only or offset > old:
            self._table[mq] = offset

    def read(self, mq: MessageQueue) -> int:
        return self._table.get(mq, -1)

    def remove(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)

    def offsets(self) -> dict[MessageQueue, int]:
        return dict(self._table)


class RemoteBrokerOffsetStore(_MemoryTable):
    """Offsets committed to the master broker of each queue."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group
        #: what the broker last acknowledged, so unchanged offsets are not sent again
        self._persisted: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        return None

    def remove(self, mq: MessageQueue) -> None:
        super().remove(mq)
        self._persisted.pop(mq, None)

    async def _addr(self, mq: MessageQueue) -> str:
        addr = self.instance.broker_addr(mq.broker_name)
        if addr is None:
            await self.instance.route(mq.topic, refresh=True)
            addr = self.instance.broker_addr(mq.broker_name)
        if addr is None:
            raise NoRouteError(f"no address for broker {mq.broker_name} (queue {mq.topic}/{mq.queue_id})")
        return addr

    async def read_stored(self, mq: MessageQueue) -> int:
        addr = await self._addr(mq)
        # setZeroIfNotFound=false: "never committed" must read as such, so that consume-from decides.
        header = QueryConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, set_zero_if_not_found=False)
        response = await self.instance.invoke(addr, make_request(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext()),
                                              context=f"offset of {self.group} in {mq.topic}/{mq.queue_id}")
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if response.code != ResponseCode.SUCCESS:
            raise BrokerError(response.code, response.remark or "", addr=addr,
                              context=f"offset of {self.group} in {mq.topic}/{mq.queue_id}")
        try:
            offset = int(response.ext_fields.get("offset", "-1"))
        except ValueError:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"bad offset {response.ext_fields.get('offset')!r}",
                              addr=addr) from None
        if offset >= 0:
            self._persisted[mq] = offset
        return offset

    async def persist(self, mqs: Iterable[MessageQueue]) -> None:
        todo = [(mq, off) for mq in set(mqs) if (off := self.read(mq)) >= 0 and self._persisted.get(mq) != off]
        if todo:
            await asyncio.gather(*(self._commit(mq, off) for mq, off in todo))

    async def _commit(self, mq: MessageQueue, offset: int) -> None:
        try:
            addr = await self._addr(mq)
            header = UpdateConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, offset)
            await self.instance.invoke_ok(addr, make_request(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext()),
                                          context=f"commit {mq.topic}/{mq.queue_id}@{offset} for {self.group}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("committing offset %d of %s/%s/%d for %s failed: %s", offset, mq.topic, mq.broker_name,
                        mq.queue_id, self.group, exc)
            return
        self._persisted[mq] = offset


class LocalFileOffsetStore(_MemoryTable):
    """Offsets of a broadcasting consumer, in ``<directory>/<group>/offsets.json``.

    Two broadcasting consumers of one group on one machine need different directories.
    """

    def __init__(self, directory: str | Path, group: str) -> None:
        super().__init__()
        self.path = Path(directory).expanduser() / group / "offsets.json"
        self._stored: dict[MessageQueue, int] = {}
        self._dirty = False
        #: one persist at a time: two at once (the periodic one and a dropped queue's) each wrote the file from a
        #: thread, and the older snapshot could land last, the newer offsets then not written again until a change
        self._writing = asyncio.Lock()

    async def load(self) -> None:
        raw = await asyncio.to_thread(read_optional, self.path)
        if not raw:
            return
        try:
            items = json.loads(raw)["offsets"]
            stored = {MessageQueue(str(i["topic"]), str(i["brokerName"]), int(i["queueId"])): int(i["offset"])
                      for i in items}
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cannot read consumer offsets from %s (%s); starting without them", self.path, exc)
            return
        self._stored = stored

    async def read_stored(self, mq: MessageQueue) -> int:
        offset = self._stored.get(mq, -1)
        if offset >= 0:
            self.update(mq, offset, increase_only=False)
        return offset

    async def persist(self, mqs: Iterable[MessageQueue]) -> None:
        async with self._writing:
            await self._persist(mqs)

    async def _persist(self, mqs: Iterable[MessageQueue]) -> None:
        changed = self._dirty
        for mq in mqs:
            off = self.read(mq)
            if off >= 0 and self._stored.get(mq) != off:
                self._stored[mq] = off
                changed = True
        if not changed:
            return
        items = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                 for mq, off in sorted(self._stored.items())]
        data = json.dumps({"offsets": items}, indent=1).encode()
        try:
            await asyncio.to_thread(write_atomic, self.path, data)
        except OSError as exc:
            self._dirty = True
            log.warning("cannot write consumer offsets to %s: %s", self.path, exc)
        else:
            self._dirty = False
