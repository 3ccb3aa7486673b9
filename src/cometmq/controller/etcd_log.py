"""``EtcdLog``: the controller's ``ReplicatedLog`` for 3 or 5 controller nodes, over an etcd cluster.

Every controller node is an etcd client (aetcd's generated gRPC stubs, the optional extra ``etcd``; imported only
when an ``EtcdLog`` is built). Keys, under ``{prefix}/{name}/``:

- ``leader``: the leader's remoting address, attached to its lease. Created by a transaction only if absent
  (``create_revision == 0``); the winner's term is identified by the key's create revision ``W``.
- ``log/{W:016x}-{n:08x}``: one key per entry, never overwritten nor deleted. An entry's index is the etcd revision
  of its put (increasing, not contiguous). Keys, not the history of one key: a compaction of etcd's history then
  loses nothing, a reader that fell behind a compaction re-reads the keys above its applied revision.

Leadership: each node keeps a lease alive (TTL ``lease_ttl_s``) and campaigns with it whenever the leader key is
absent and its own watch is up (a node that cannot follow the log must not take the lead). ``is_leader`` holds
only while (1) the local lease deadline has not passed: last keepalive *sent* + TTL - margin, so the node steps
down before etcd can have expired the lease, even if the keepalive task is stuck, (2) the watch has not seen the
leader key deleted or replaced since ``W``, and (3) this node has applied every event up to ``W``: a new leader
decides on the latest state. An append is a transaction *if the leader key's create revision
is still W, put the entry*: a deposed leader's append fails (``NotLeaderError``) whatever it believes, as etcd
deletes the key with the lease.

Subscribers: on ``start`` the log keys are range-read (sorted by revision, paged, at one pinned revision R) and
replayed, then one watch on the whole ``{prefix}/{name}/`` folder from R + 1 delivers log entries and leader
changes in revision order. A broken watch is resumed the same way from the last seen revision (range read, then
watch): a compaction costs a re-read, never an entry. Only an entry that vanished (a log key deleted, which the log
never does) or a subscriber that raises fails the log (``LogClosedError``).

Every etcd call has a deadline (``request_timeout_s``): with etcd down an append raises ``LogError`` and the lease
deadline takes ``is_leader`` down. A call that fails or times out moves the client to the next endpoint.
Requests carry etcd's ``hasleader`` metadata, so a member cut off from its cluster answers at once instead of
serving a stale watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .log import MAX_ENTRY_BYTES, Applier, LogClosedError, LogError, NotLeaderError

log = logging.getLogger(__name__)

_METADATA = (("hasleader", "true"),)
_PAGE = 500


class EtcdUnavailableError(LogError):
    """etcd did not answer in time, or refused (no leader, connection lost)."""


class _Compacted(LogError):
    pass


def _cancelled() -> bool:
    """The running task is being cancelled. A gRPC call whose channel another task closed raises CancelledError
    too; that one is a failed call, not a cancellation."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class _Etcd:
    """The gRPC channel to one endpoint at a time; a failed call moves to the next endpoint."""

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        self.rpc: Any = importlib.import_module("aetcd.rpc")
        self.eof: Any = importlib.import_module("grpc.aio").EOF
        codes = self.rpc.StatusCode
        self._switch_on = {codes.UNAVAILABLE, codes.DEADLINE_EXCEEDED, codes.UNKNOWN, codes.INTERNAL,
                           codes.CANCELLED}
        self.endpoints = endpoints
        self.timeout = timeout
        self._next = 0
        self.channel: Any = None
        self.kv: Any = None
        self.lease: Any = None
        self.watch: Any = None
        self._open()

    def _open(self) -> None:
        target = self.endpoints[self._next % len(self.endpoints)]
        self._next += 1
        self.channel = self.rpc.insecure_channel(target, options=[
            ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.max_receive_message_length", 64 << 20),
        ])
        self.kv = self.rpc.KVStub(self.channel)
        self.lease = self.rpc.LeaseStub(self.channel)
        self.watch = self.rpc.WatchStub(self.channel)

    async def rotate(self, failed: Any) -> None:
        """After a failure on channel ``failed``: if it is still the current one, close it and use the next."""
        if failed is not self.channel or self.channel is None:
            return
        old = self.channel
        self._open()
        log.info("etcd: switching to %s", self.endpoints[(self._next - 1) % len(self.endpoints)])
        await old.close(None)

    async def close(self) -> None:
        if self.channel is not None:
            channel, self.channel = self.channel, None
            await channel.close(None)

    def should_switch(self, exc: BaseException) -> bool:
        """The endpoint may be down or cut off: try the next."""
        return not isinstance(exc, self.rpc.AioRpcError) or exc.code() in self._switch_on

    def error(self, exc: BaseException) -> LogError:
        if isinstance(exc, self.rpc.AioRpcError):
            details = exc.details() or ""
            if exc.code() == self.rpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
                return _Compacted(details)
            return EtcdUnavailableError(f"etcd: {exc.code().name} {details}")
        return EtcdUnavailableError(f"etcd: {exc!r}")

    async def call(self, stub: str, method: str, request: Any, timeout: float | None = None) -> Any:
        """One unary call with a deadline; errors become ``LogError``s (and move to the next endpoint)."""
        channel = self.channel
        if channel is None:
            raise LogClosedError("etcd client closed")
        try:
            return await getattr(getattr(self, stub), method)(request, timeout=timeout or self.timeout,
                                                             metadata=_METADATA)
        except asyncio.CancelledError:
            if _cancelled():
                raise
            raise EtcdUnavailableError(f"etcd call {method} cut: its channel was closed") from None
        except LogError:
            raise
        except Exception as exc:
            if self.should_switch(exc):
                await self.rotate(channel)
            raise self.error(exc) from None


class EtcdLog:
    """A ``ReplicatedLog`` over etcd; see the module docstring. ``node_address`` may be a callable (the server's
    port is known after bind): the node does not campaign while it raises or names port 0."""

    def __init__(self, endpoints: list[str], name: str, node_address: str | Callable[[], str], *,
                 prefix: str = "/cometmq/controller", lease_ttl_s: int = 3, request_timeout_s: float = 2.0,
                 append_timeout_s: float = 10.0, start_timeout_s: float = 30.0, retry_interval_s: float = 0.2) -> None:
        if not endpoints:
            raise ValueError("EtcdLog needs at least one etcd endpoint")
        if lease_ttl_s < 2:
            raise ValueError("lease_ttl_s must be at least 2 (etcd's minimum lease TTL)")
        self.endpoints = list(endpoints)
        self.name = name
        self._address: Callable[[], str] = node_address if callable(node_address) else (lambda: node_address)
        base = f"{prefix.rstrip('/')}/{name}/".encode()
        self._base = base
        self._leader_key = base + b"leader"
        self._log_prefix = base + b"log/"
        self.lease_ttl_s = lease_ttl_s
        #: the local deadline is this much earlier than the earliest time etcd may expire the lease
        self.lease_margin_s = max(0.5, lease_ttl_s / 6)
        self.request_timeout_s = request_timeout_s
        self.append_timeout_s = append_timeout_s
        self.start_timeout_s = start_timeout_s
        self.retry_interval_s = retry_interval_s

        self._subscribers: list[Applier] = []
        self._state = "new"  # new -> open -> stopping -> stopped; open -> failed
        self._failure: BaseException | None = None
        self._etcd: _Etcd | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._counter = itertools.count()

        self._applied = 0  # revision of the last entry delivered
        self._synced = 0  # every event of the folder up to this revision is applied
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []

        self._lease_id: int | None = None
        self._lease_deadline = 0.0
        self._won: int | None = None  # create revision of the leader key this node created (its term)
        self._leader_addr: str | None = None  # the leader key as last seen (value, create revision, seen at)
        self._leader_rev: int | None = None
        self._leader_seen = 0
        self._lost_rev: int | None = None  # a term this node gave up; its key, if still seen, names no leader
        self._watching = False  # the watch stream is up: only then does this node campaign
        self._wake = asyncio.Event()
        self._appending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- ReplicatedLog ----------------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return (self._state == "open" and self._won is not None and self._lease_valid()
                and self._synced >= self._won and self._leader_rev == self._won)

    @property
    def leader_address(self) -> str | None:
        if self.is_leader:
            return self._leader_addr
        if self._leader_rev is None or self._leader_rev == self._lost_rev:
            return None
        return self._leader_addr

    @property
    def applied_index(self) -> int:
        return self._applied

    def subscribe(self, apply: Applier) -> None:
        if self._state != "new":
            raise LogError("subscribe before start: a later subscriber would miss the entries replayed")
        self._subscribers.append(apply)

    async def start(self) -> None:
        if self._state != "new":
            raise LogError(f"cannot start a log that is {self._state}")
        self._etcd = _Etcd(self.endpoints, self.request_timeout_s)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                await self._catch_up()
                break
            except (EtcdUnavailableError, _Compacted) as exc:
                if time.monotonic() > deadline:
                    await self._etcd.close()
                    self._state = "failed"
                    raise LogError(f"etcd unreachable at {', '.join(self.endpoints)}: {exc}") from None
                await asyncio.sleep(self.retry_interval_s)
            except BaseException:
                await self._etcd.close()
                self._state = "failed"
                raise
        self._state = "open"
        self._tasks = [loop.create_task(self._watch_loop(), name=f"etcd-log-watch-{self.name}"),
                       loop.create_task(self._lease_loop(), name=f"etcd-log-lease-{self.name}"),
                       loop.create_task(self._campaign_loop(), name=f"etcd-log-campaign-{self.name}")]

    async def stop(self) -> None:
        if self._state in ("new", "stopped"):
            self._state = "stopped"
            return
        was_open = self._state == "open"
        self._state = "stopping"
        if was_open:  # let the appends in flight see their entry applied
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.request_timeout_s):
                    await self._idle.wait()
        watch, others = self._tasks[:1], self._tasks[1:]  # the watch last: appends wait on it
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._release()
        for task in [*watch, *self._background]:
            task.cancel()
        await asyncio.gather(*watch, *self._background, return_exceptions=True)
        self._tasks = []
        self._fail_waiters(LogClosedError("controller log stopped"))
        if self._etcd is not None:
            await self._etcd.close()
        self._state = "stopped"

    async def append(self, entry: bytes) -> int:
        if self._state != "open":
            raise LogClosedError(f"controller log is {self._state}") from self._failure
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {len(entry)} bytes exceeds {MAX_ENTRY_BYTES}")
        won = self._won
        if won is None or not self.is_leader:
            raise NotLeaderError(self.leader_address)
        etcd = self._etcd
        assert etcd is not None
        rpc = etcd.rpc
        key = self._log_prefix + f"{won:016x}-{next(self._counter):08x}".encode()
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=self._leader_key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                 create_revision=won)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=entry))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=self._leader_key))])
        self._appending += 1
        self._idle.clear()
        try:
            reply = await etcd.call("kv", "Txn", request)
            if not reply.succeeded:
                kvs = reply.responses[0].response_range.kvs
                self._observe_leader(kvs[0] if kvs else None, reply.header.revision)
                if self._won == won:  # the key is gone or another's: this term is over
                    self._step_down("the leader key is no longer ours")
                raise NotLeaderError(self.leader_address)
            revision = int(reply.header.revision)
            await self._wait_applied(revision)
            return revision
        finally:
            self._appending -= 1
            if not self._appending:
                self._idle.set()

    # -- leadership ---------------------------------------------------------------------------------------------
    def _lease_valid(self) -> bool:
        return self._lease_id is not None and time.monotonic() < self._lease_deadline

    def _step_down(self, why: str) -> None:
        if self._won is not None:
            log.warning("controller %s: no longer the leader (%s)", self.name, why)
            self._lost_rev = self._won
            self._won = None
        self._wake.set()

    def _lose_lease(self, why: str) -> None:
        lease, self._lease_id = self._lease_id, None
        self._step_down(why)
        if lease is not None and self._state == "open":  # it may still live in etcd: end it, to free the key sooner
            self._spawn(self._revoke(lease, retry_s=2 * self.lease_ttl_s + 10))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _revoke(self, lease: int, retry_s: float = 0) -> None:
        """Best effort; retried for ``retry_s`` (etcd may be back after a lease is lost and still hold it)."""
        assert self._etcd is not None
        deadline = time.monotonic() + retry_s
        while True:
            try:
                await self._etcd.call("lease", "LeaseRevoke", self._etcd.rpc.LeaseRevokeRequest(ID=lease),
                                      timeout=min(1.0, self.request_timeout_s))
                return
            except EtcdUnavailableError as exc:
                if "lease not found" in str(exc) or time.monotonic() > deadline:
                    return
            except LogError:
                return
            await asyncio.sleep(self.retry_interval_s)

    async def _release(self) -> None:
        """On stop: give up leadership at once (the next node need not wait for the TTL)."""
        lease, self._lease_id = self._lease_id, None
        self._step_down("stopping")
        if lease is not None and self._etcd is not None:
            await self._revoke(lease)

    async def _grant(self) -> None:
        assert self._etcd is not None
        sent = time.monotonic()
        reply = await self._etcd.call("lease", "LeaseGrant", self._etcd.rpc.LeaseGrantRequest(TTL=self.lease_ttl_s))
        if reply.error:
            raise EtcdUnavailableError(f"etcd refused a lease: {reply.error}")
        self._lease_deadline = sent + min(int(reply.TTL), self.lease_ttl_s) - self.lease_margin_s
        self._lease_id = int(reply.ID)
        self._wake.set()

    async def _lease_loop(self) -> None:
        """Holds a lease: grants one, refreshes it every TTL/3 over a keepalive stream, drops it (stepping down) when
        etcd says it expired or the local deadline passes without a successful refresh."""
        assert self._etcd is not None
        etcd = self._etcd
        interval = self.lease_ttl_s / 3
        stream: Any = None
        stream_channel: Any = None
        while self._state == "open":
            in_stream = False
            try:
                if self._lease_id is None:
                    await self._grant()
                    await asyncio.sleep(interval)
                    continue
                if time.monotonic() >= self._lease_deadline:
                    self._lose_lease("lease not renewed in time")
                    continue
                in_stream = True
                if stream is None:
                    stream_channel = etcd.channel
                    stream = etcd.lease.LeaseKeepAlive(metadata=_METADATA)
                sent = time.monotonic()
                lease = self._lease_id
                async with asyncio.timeout(min(self.request_timeout_s, max(0.1, self._lease_deadline - sent))):
                    await stream.write(etcd.rpc.LeaseKeepAliveRequest(ID=lease))
                    reply = await stream.read()
                if reply is etcd.eof:
                    raise EtcdUnavailableError("lease keepalive stream ended")
                in_stream = False
                if self._lease_id != lease:
                    continue
                if reply.TTL <= 0:
                    self._lose_lease("lease expired or revoked in etcd")
                    continue
                self._lease_deadline = sent + min(int(reply.TTL), self.lease_ttl_s) - self.lease_margin_s
                await asyncio.sleep(interval)
            except (Exception, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and _cancelled():
                    if stream is not None:
                        stream.cancel()
                    raise
                log.info("controller %s: lease keepalive failed: %s", self.name,
                         exc if isinstance(exc, LogError) else etcd.error(exc))
                if in_stream:
                    if stream is not None:
                        stream.cancel()
                        stream = None
                    await etcd.rotate(stream_channel)
                if self._lease_id is not None and time.monotonic() >= self._lease_deadline:
                    self._lose_lease("lease not renewed in time")
                await asyncio.sleep(self.retry_interval_s)

    def _my_address(self) -> str | None:
        try:
            address = self._address()
        except Exception:
            return None
        return None if not address or address.endswith(":0") else address

    async def _campaign_loop(self) -> None:
        """Whenever the leader key is absent and this node holds a lease, try to create it."""
        assert self._etcd is not None
        etcd, rpc = self._etcd, self._etcd.rpc
        while self._state == "open":
            self._wake.clear()
            address = self._my_address()
            lease = self._lease_id
            if (self._won is None and lease is not None and self._lease_valid() and address is not None
                    and self._watching):
                request = rpc.TxnRequest(
                    compare=[rpc.Compare(key=self._leader_key, target=rpc.Compare.CREATE,
                                         result=rpc.Compare.EQUAL, create_revision=0)],
                    success=[rpc.RequestOp(request_put=rpc.PutRequest(key=self._leader_key, value=address.encode(),
                                                                      lease=lease))],
                    failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=self._leader_key))])
                try:
                    reply = await etcd.call("kv", "Txn", request)
                except LogError as exc:
                    log.debug("controller %s: campaign failed: %s", self.name, exc)
                    await asyncio.sleep(self.retry_interval_s)
                    continue
                revision = int(reply.header.revision)
                if reply.succeeded:
                    if self._lease_id == lease:
                        self._won = revision
                        log.info("controller %s: %s won the leadership at revision %d", self.name, address, revision)
                        # the watch may already have seen the key deleted after it was created
                        if self._leader_seen > revision and self._leader_rev != revision:
                            self._step_down("the leader key was deleted after it was created")
                else:
                    kvs = reply.responses[0].response_range.kvs
                    self._observe_leader(kvs[0] if kvs else None, revision)
            # wait for a change of leader or lease; check again now and then in case the watch is down
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0 if address is not None else 0.1):
                    await self._wake.wait()

    def _observe_leader(self, kv: Any, seen_at: int) -> None:
        """The leader key as it was at revision ``seen_at`` (``kv`` None: absent)."""
        if seen_at < self._leader_seen:
            return
        self._leader_seen = seen_at
        if kv is None:
            self._leader_addr, self._leader_rev = None, None
        else:
            self._leader_addr, self._leader_rev = kv.value.decode(), int(kv.create_revision)
        if self._won is not None and seen_at >= self._won and self._leader_rev != self._won:
            self._step_down("the leader key was deleted or replaced")
        self._wake.set()

    # -- entries --------------------------------------------------------------------------------------------------
    async def _catch_up(self) -> None:
        """Range-read the log keys above the synced revision at one revision R, deliver them, read the leader key
        at R; then everything up to R is synced."""
        assert self._etcd is not None
        etcd, rpc = self._etcd, self._etcd.rpc
        pinned = 0
        after = self._synced
        while True:
            reply = await etcd.call("kv", "Range", rpc.RangeRequest(
                key=self._log_prefix, range_end=_prefix_end(self._log_prefix), revision=pinned, limit=_PAGE,
                sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.MOD, min_mod_revision=after + 1))
            pinned = pinned or int(reply.header.revision)
            for kv in reply.kvs:
                self._deliver(int(kv.mod_revision), kv.value)
                after = int(kv.mod_revision)
            if not reply.more:
                break
        reply = await etcd.call("kv", "Range", rpc.RangeRequest(key=self._leader_key, revision=pinned))
        self._observe_leader(reply.kvs[0] if reply.kvs else None, pinned)
        self._synced = max(self._synced, pinned)
        self._resolve_waiters()

    async def _watch_loop(self) -> None:
        assert self._etcd is not None
        etcd = self._etcd
        caught_up = True  # start() just did
        while self._state == "open":
            channel = etcd.channel
            try:
                if not caught_up:
                    await self._catch_up()
                caught_up = False
                await self._watch(channel)
            except asyncio.CancelledError:
                if _cancelled():
                    raise
                log.info("controller %s: watch cut (channel closed); resuming from revision %d", self.name,
                         self._synced + 1)
            except _Compacted as exc:
                log.info("controller %s: watch behind a compaction (%s): reading the log keys again", self.name, exc)
            except LogClosedError as exc:
                self._fail(exc)
                return
            except Exception as exc:
                err = exc if isinstance(exc, LogError) else etcd.error(exc)
                if isinstance(err, _Compacted):
                    continue
                log.info("controller %s: watch broken (%s); resuming from revision %d", self.name, err,
                         self._synced + 1)
                if isinstance(exc, EtcdUnavailableError) or (not isinstance(exc, LogError)
                                                             and etcd.should_switch(exc)):
                    await etcd.rotate(channel)
                await asyncio.sleep(self.retry_interval_s)

    async def _watch(self, channel: Any) -> None:
        """One watch stream on the folder from the synced revision + 1, until it breaks."""
        assert self._etcd is not None
        etcd, rpc = self._etcd, self._etcd.rpc
        call = rpc.WatchStub(channel).Watch(metadata=_METADATA)
        start = self._synced
        try:
            await call.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                key=self._base, range_end=_prefix_end(self._base), start_revision=self._synced + 1,
                progress_notify=True)))
            while True:
                reply = await call.read()
                if reply is etcd.eof:
                    raise EtcdUnavailableError("watch stream ended")
                if reply.compact_revision:
                    raise _Compacted(f"compacted at revision {reply.compact_revision}")
                if reply.created and not reply.canceled:
                    self._watching = True
                    self._wake.set()
                if reply.canceled:
                    raise EtcdUnavailableError(f"watch canceled: {reply.cancel_reason}")
                for event in reply.events:
                    self._on_event(event, start)
                self._resolve_waiters()
        finally:
            self._watching = False
            call.cancel()

    def _on_event(self, event: Any, start: int) -> None:
        kv = event.kv
        revision = int(kv.mod_revision)
        if revision <= start:
            return  # seen already
        deleted = event.type == 1  # DELETE
        if kv.key == self._leader_key:
            self._observe_leader(None if deleted else kv, revision)
        elif kv.key.startswith(self._log_prefix):
            if deleted:
                raise LogClosedError(f"log entry {kv.key!r} deleted at revision {revision}: the log is damaged")
            self._deliver(revision, kv.value)
        self._synced = revision

    def _deliver(self, revision: int, entry: bytes) -> None:
        if revision <= self._applied:
            return
        try:
            for apply in self._subscribers:
                apply(revision, entry)
        except Exception as exc:  # a failed apply leaves the state unknown: stop here, never skip an entry
            raise LogClosedError(f"applying entry {revision} failed: {exc!r}") from exc
        self._applied = revision

    async def _wait_applied(self, revision: int) -> None:
        if self._synced >= revision:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (revision, id(future), future))
        try:
            async with asyncio.timeout(self.append_timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            raise LogError(f"entry {revision} committed but not applied here within {self.append_timeout_s}s") \
                from None

    def _resolve_waiters(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._synced:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _fail_waiters(self, exc: LogError) -> None:
        for _, _, future in self._waiters:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: a waiter that timed out must not warn
        self._waiters.clear()

    def _fail(self, exc: LogError) -> None:
        log.error("controller %s: log failed: %s", self.name, exc)
        self._failure = exc
        if self._state == "open":
            self._state = "failed"
        self._fail_waiters(LogClosedError(f"controller log failed: {exc}"))
        lease, self._lease_id = self._lease_id, None
        self._step_down("the log failed")
        if lease is not None:
            self._spawn(self._revoke(lease))
