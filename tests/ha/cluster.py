"""A broker group as real processes: a nameserver and N brokers of one group on free 127.0.0.1 ports.

Every broker has its own folder (``<workdir>/<name>/``: ``broker.conf``, ``data/``, one log per start), keeps its
ports across restarts, and can be started with another ``brokerId`` (a former master rejoining as a replica).
Processes are stopped only by the PID this harness started: ``kill()`` is SIGKILL (a crash), ``stop()`` SIGTERM
(a clean shutdown). ``Cluster.close()`` kills whatever is still running (tests call it from a fixture's
``finally``).

Requests to the brokers use cometmq's own remoting client: the HA status (GET_BROKER_HA_STATUS 907), role changes
(NOTIFY_BROKER_ROLE_CHANGED 1008: promote, or follow a master), raw pulls from one broker's address (a replica's
consume queues). ``read_log`` reads a stopped (or killed) broker's commit log and epoch file from its folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import BLANK_MAGIC_CODE, MAGIC_CODE, MessageRecord, decode_record, iter_records
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.store.epoch_file import EpochEntry, decode
from tests.broker.conftest import send_request
from tests.ha.frame_cutter import FrameCutter
from tests.interop.cometmq_server import free_port
from tests.kit import eventually
from tests.kit.faultproxy import FaultProxy

BROKER_NAME = "broker-ha"
CLUSTER_NAME = "HACluster"
SEGMENT_SIZE = 1 << 20

#: broker.conf for these tests: short HA timers, 1 MiB segments (a few hundred KiB of messages cross one).
DEFAULT_CONF: dict[str, str] = {
    "brokerClusterName": CLUSTER_NAME,
    "brokerName": BROKER_NAME,
    "flushDiskType": "ASYNC_FLUSH",
    "allAckInSyncStateSet": "true",
    "haMaxTimeSlaveNotCatchup": "3000",
    "haSendHeartbeatInterval": "1000",
    "haHousekeepingInterval": "500",
    "slaveTimeout": "3000",
    "mappedFileSizeCommitLog": str(SEGMENT_SIZE),
    "maxMessageSize": str(256 * 1024),
    "mappedFileSizeConsumeQueue": str(20 * 20_000),
    "maxHashSlotNum": "4096",
    "maxIndexNum": "16384",
    "flushConsumerOffsetInterval": "500",
}


class ProcessError(RuntimeError):
    pass


class _Proc:
    """One subprocess started by this harness, its output in a log file per start."""

    def __init__(self, name: str, workdir: Path, marker: str) -> None:
        self.name = name
        self.workdir = workdir
        self.marker = marker
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_path: Path | None = None
        #: extra environment of the next starts (e.g. COMETMQ_FAILPOINTS)
        self.env: dict[str, str] = {}
        workdir.mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self, timeout: float = 20.0) -> None:
        if self.running:
            raise ProcessError(f"{self.name} is already running")
        self.starts += 1
        self.log_path = self.workdir / f"{self.name}-{self.starts}.log"
        env = {**os.environ, "COMETMQ_GRPC_PORT": "0", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
               **self.env}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self._command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.marker in self.log_text():
                return
            if self.proc.poll() is not None:
                raise ProcessError(f"{self.name} exited with rc {self.proc.returncode}:\n{self.log_tail()}")
            await asyncio.sleep(0.05)
        self.kill()
        raise ProcessError(f"{self.name} did not print {self.marker!r} in {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL by PID and reap: no shutdown code runs."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM by PID (a clean shutdown); SIGKILL and raise if it does not exit in time."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise ProcessError(f"{self.name} ignored SIGTERM for {timeout}s:\n{self.log_tail()}")
            await asyncio.sleep(0.05)

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def all_logs(self) -> str:
        return "".join(p.read_text(encoding="utf-8", errors="replace")
                       for p in sorted(self.workdir.glob(f"{self.name}-*.log")))

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]


class Namesrv(_Proc):
    def __init__(self, workdir: Path) -> None:
        super().__init__("namesrv", workdir, "cometmq namesrv listening")
        self.port = free_port()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "cometmq.cli", "namesrv", "--port", str(self.port), "--log-level", "INFO"]


class Broker(_Proc):
    """One broker of the group. ``broker_id`` is what the next start writes to broker.conf."""

    def __init__(self, workdir: Path, name: str, broker_id: int, namesrv: str, conf: Mapping[str, str]) -> None:
        super().__init__(name, workdir, "cometmq broker")
        self.broker_id = broker_id
        self.namesrv = namesrv
        self.conf = dict(conf)
        self.port = free_port()
        self.ha_port = free_port()
        while self.ha_port == self.port:
            self.ha_port = free_port()
        self.data_dir = workdir / "data"
        self.conf_path = workdir / "broker.conf"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ha_addr(self) -> str:
        return f"127.0.0.1:{self.ha_port}"

    def _command(self) -> list[str]:
        conf = {**self.conf, "brokerId": str(self.broker_id), "listenPort": str(self.port),
                "haListenPort": str(self.ha_port), "storePathRootDir": str(self.data_dir),
                "namesrvAddr": self.namesrv}
        self.conf_path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()), encoding="utf-8")
        return [sys.executable, "-m", "cometmq.cli", "broker", "-c", str(self.conf_path), "--log-level", "INFO"]

    def log(self) -> BrokerLog:
        """The commit log and epoch file on disk (read it stopped or killed)."""
        return read_log(self.data_dir)


@dataclass
class BrokerLog:
    """A broker's commit log as read from its segment files, and its epoch file."""

    data: bytes  # the segments back to back, from offset 0 (a log whose first segment is gone is not supported)
    end: int  # where the records end (the first position that holds no record)
    records: list[MessageRecord]
    epochs: list[EpochEntry]
    segment_size: int

    def tail_is_zero(self) -> bool:
        """Nothing but zeros after the end in its segment (a cut log keeps no stale bytes there)."""
        seg_end = (self.end // self.segment_size + 1) * self.segment_size if self.segment_size else len(self.data)
        return not any(self.data[self.end:min(seg_end, len(self.data))])

    def per_queue(self, topic: str) -> dict[int, list[MessageRecord]]:
        out: dict[int, list[MessageRecord]] = {}
        for rec in self.records:
            if rec.topic == topic:
                out.setdefault(rec.queue_id, []).append(rec)
        return out


_SIZE_MAGIC = struct.Struct(">iI")


def read_log(data_dir: Path, *, check_crc: bool = True) -> BrokerLog:
    seg_dir = data_dir / "commitlog"
    files = sorted(p for p in seg_dir.iterdir() if p.name.isdigit()) if seg_dir.is_dir() else []
    chunks: list[bytes] = []
    size = 0
    for i, p in enumerate(files):
        if int(p.name) != sum(len(c) for c in chunks):
            raise AssertionError(f"segment {p.name} does not follow the previous ones in {seg_dir}")
        chunk = p.read_bytes()
        chunks.append(chunk)
        if i == 0:
            size = len(chunk)
    data = b"".join(chunks)
    records: list[MessageRecord] = []
    pos = 0
    while pos + 8 <= len(data):
        total, magic = _SIZE_MAGIC.unpack_from(data, pos)
        if magic == BLANK_MAGIC_CODE and size:
            pos = (pos // size + 1) * size
            continue
        if magic != MAGIC_CODE or total <= 0:
            break
        rec, n = decode_record(data, pos, check_crc=check_crc)
        records.append(rec)
        pos += n
    epoch_path = data_dir / "epochFileCheckpoint"
    epochs = decode(epoch_path.read_bytes()) if epoch_path.exists() else []
    return BrokerLog(data, pos, records, epochs, size)


@dataclass
class Pulled:
    records: list[MessageRecord] = field(default_factory=list)
    max_offset: int = 0


class Cluster:
    """A nameserver and the brokers of one group. Use ``async with Cluster(...)`` or call ``close()``."""

    def __init__(self, workdir: Path, conf: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.conf = {**DEFAULT_CONF, **(conf or {})}
        self.namesrv = Namesrv(workdir / "namesrv")
        self.brokers: list[Broker] = []
        self.client = RemotingClient()

    def add_broker(self, broker_id: int, conf: Mapping[str, str] | None = None) -> Broker:
        name = f"b{len(self.brokers)}"
        b = Broker(self.workdir / name, name, broker_id, self.namesrv.addr, {**self.conf, **(conf or {})})
        self.brokers.append(b)
        return b

    async def start(self, n: int, conf: Mapping[str, str] | None = None) -> list[Broker]:
        """The nameserver (if not running) and ``n`` new brokers: the first is the master (id 0), the others
        replicas with ids 1, 2, ..."""
        if not self.namesrv.running:
            await self.namesrv.start()
        new = [self.add_broker(i, conf) for i in range(n)]
        for b in new:
            await b.start()
        return new

    async def close(self) -> None:
        for p in [*self.brokers, self.namesrv]:
            p.kill()
        await self.client.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def logs(self) -> str:
        """Every process's log tail, for assertion messages."""
        return "\n".join(f"--- {p.name} (pid {p.pid}) ---\n{p.log_tail(3000)}" for p in [self.namesrv, *self.brokers])

    # -- requests -------------------------------------------------------------------------------------------
    async def request(self, addr: str, code: int, ext: Mapping[str, object] | None = None, body: bytes = b"",
                      timeout: float = 5.0) -> RemotingCommand:
        return await self.client.invoke(addr, make_request(code, dict(ext or {}), body), timeout)

    async def send(self, b: Broker, topic: str, body: bytes, queue_id: int = 0, timeout: float = 15.0) -> int:
        """One SEND_MESSAGE of ``body`` to ``topic``/``queue_id`` on ``b``; the answer's code."""
        cmd = send_request(topic, body, queue_id=queue_id)
        return (await self.request(b.addr, cmd.code, cmd.ext_fields, body, timeout=timeout)).code

    async def status(self, b: Broker) -> dict[str, Any]:
        reply = await self.request(b.addr, RequestCode.GET_BROKER_HA_STATUS)
        assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
        status: dict[str, Any] = json.loads(reply.body or b"{}")
        return status

    async def try_status(self, b: Broker) -> dict[str, Any] | None:
        try:
            return await self.status(b)
        except Exception:
            return None

    async def promote(self, b: Broker, epoch: int) -> RemotingCommand:
        return await self.request(b.addr, RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                  {"masterEpoch": str(epoch), "toThisBroker": "true"}, timeout=35)

    async def follow(self, b: Broker, master: Broker, epoch: int, replica_id: int,
                     ha_addr: str | None = None) -> RemotingCommand:
        """``b`` follows ``master`` as replica ``replica_id`` of ``epoch``; through ``ha_addr`` (a proxy in front of
        the master's HA port) when given."""
        return await self.request(b.addr, RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                  {"masterEpoch": str(epoch), "masterAddress": master.addr,
                                   "masterHaAddress": ha_addr or master.ha_addr, "brokerId": str(replica_id)})

    @contextlib.asynccontextmanager
    async def replica_behind_cutter(self, topic: str, first: bytes = b"shared"
                                    ) -> AsyncIterator[tuple[Broker, Broker, FrameCutter, int]]:
        """A master (id 0) with ``topic`` (one queue) and a replica (id 1) that follows it through a FrameCutter in
        front of its HA port, both in the SyncStateSet, and ``first`` sent and copied: ``(master, replica, cutter,
        the log's end)``. The cutter stops at the end; the brokers are the cluster's (tests kill and restart them)."""
        b0 = (await self.start(1))[0]
        b1 = self.add_broker(1)
        await self.create_topic(b0, topic, 1)
        cutter = await FrameCutter(("127.0.0.1", b0.ha_port)).start()
        try:
            await b1.start()
            assert (await self.follow(b1, b0, 1, 1, cutter.addr)).code == 0
            await self.wait_sync_set(b0, {0, 1})
            assert await self.send(b0, topic, first) == ResponseCode.SUCCESS
            yield b0, b1, cutter, await self.wait_caught_up(b1, b0)
        finally:
            await cutter.stop()

    @contextlib.asynccontextmanager
    async def replica_behind_proxy(self, topic: str) -> AsyncIterator[tuple[Broker, Broker, FaultProxy]]:
        """A master (id 0) with ``topic`` (one queue) and a replica (id 1) that follows it through a FaultProxy in
        front of its HA port, both in the SyncStateSet: ``(master, replica, proxy)``. Both are stopped at the end."""
        b0, b1 = await self.start(1) + [self.add_broker(1)]
        async with FaultProxy(("127.0.0.1", b0.ha_port)) as proxy:
            await self.create_topic(b0, topic, 1)
            await b1.start()
            assert (await self.follow(b1, b0, 1, 1, proxy.addr)).code == 0
            await self.wait_sync_set(b0, {0, 1})
            yield b0, b1, proxy
            await b1.stop()
        await b0.stop()

    async def create_topic(self, master: Broker, topic: str, queues: int = 4) -> None:
        reply = await self.request(master.addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                                   {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
        assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)

        async def routed() -> bool:
            r = await self.request(self.namesrv.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            return r.code == ResponseCode.SUCCESS and bool(r.body)

        await eventually(routed, 15, what=f"the route of {topic}", step=0.1)

    async def route(self, topic: str) -> dict[str, Any] | None:
        r = await self.request(self.namesrv.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if r.code != ResponseCode.SUCCESS or not r.body:
            return None
        route: dict[str, Any] = json.loads(r.body)
        return route

    # -- waits ----------------------------------------------------------------------------------------------
    async def wait_sync_set(self, master: Broker, members: set[int], timeout: float = 20.0) -> dict[str, Any]:
        last: dict[str, Any] = {}

        async def ok() -> bool:
            nonlocal last
            last = await self.try_status(master) or {}
            return set(last.get("syncStateSet", ())) == members

        try:
            await eventually(ok, timeout, what=f"SyncStateSet {sorted(members)}", step=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status {last}\n{self.logs()}") from None
        return last

    async def wait_caught_up(self, replica: Broker, master: Broker, timeout: float = 20.0) -> int:
        """Until the replica's log end equals the master's (and the master's stays put meanwhile)."""
        end = -1

        async def ok() -> bool:
            nonlocal end
            m, r = await self.try_status(master), await self.try_status(replica)
            if m is None or r is None:
                return False
            end = int(m["maxOffset"])
            return int(r["maxOffset"]) == end

        try:
            await eventually(ok, timeout, what=f"{replica.name} caught up with {master.name}", step=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None
        return end

    # -- reads ----------------------------------------------------------------------------------------------
    async def pull_queue(self, addr: str, topic: str, queue_id: int, group: str = "ha-check",
                         offset: int = 0) -> Pulled:
        """Every message of one queue from ``offset`` on the broker at ``addr`` (no long polling)."""
        out = Pulled()
        while True:
            ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": str(offset),
                   "maxMsgNums": 64, "sysFlag": 4, "commitOffset": "0", "subVersion": "0",
                   "suspendTimeoutMillis": "0", "subscription": "*"}
            reply = await self.request(addr, RequestCode.PULL_MESSAGE, ext)
            out.max_offset = int(reply.ext_fields.get("maxOffset", out.max_offset))
            if reply.code == ResponseCode.SUCCESS:
                recs = list(iter_records(reply.body or b"", check_crc=True))
                out.records += recs
                offset = int(reply.ext_fields["nextBeginOffset"])
                continue
            if reply.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                return out
            raise AssertionError(f"pull {topic}/{queue_id}@{offset} from {addr}: {reply.code} {reply.remark}")

    async def pull_topic(self, addr: str, topic: str, queues: int = 4) -> dict[int, Pulled]:
        return {q: await self.pull_queue(addr, topic, q) for q in range(queues)}

    async def consumer_offsets(self, addr: str, group: str, topic: str) -> dict[int, int]:
        """The group's committed offsets on one broker (GET_CONSUME_STATS); {} when it has none."""
        r = await self.request(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})
        if r.code != ResponseCode.SUCCESS or not r.body:
            return {}
        from cometmq.protocol.admin_bodies import ConsumeStats

        return {q.queue_id: w.consumer_offset for q, w in ConsumeStats.decode(r.body).offset_table.items()}
