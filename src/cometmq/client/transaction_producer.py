"""TransactionProducer: send a half message, run a local transaction, commit or roll back; answer check-backs.

    async def local_tx(msg: Message, arg: Any) -> LocalTransactionState:
        await db.insert_order(arg)                     # the local transaction
        return LocalTransactionState.COMMIT

    def checker(msg: MessageExt) -> LocalTransactionState:   # the broker asks about an unresolved one
        return LocalTransactionState.COMMIT if db.has_order(msg.keys[0]) else LocalTransactionState.ROLLBACK

    async with TransactionProducer("tx-group", namesrv="127.0.0.1:9876", checker=checker) as producer:
        result = await producer.send_in_transaction(Message("Orders", b"...", keys="order-1"), local_tx, order)

The wire contract is RocketMQ's: the half is a SEND_MESSAGE with TRAN_MSG=true, PGROUP and the PREPARED sys flag;
the decision is an END_TRANSACTION naming the half by its commit-log offset (from the send's offset msgId) and
queue offset; the broker asks about undecided halves with a oneway CHECK_TRANSACTION_STATE on the connection
this producer's group heartbeats on, answered with END_TRANSACTION ``fromTransactionCheck=true``.

Batches (a cometmq extension, protocol/transaction_batch.py; a RocketMQ broker refuses both):
:meth:`TransactionProducer.send_half_batch` stores many halves of one topic in one request and one append
(:meth:`TransactionProducer.send_half_batch_body` sends such a request from a body encoded elsewhere: the
columnar Spark sink's), :meth:`TransactionProducer.send_packed_half` stores such a body as *one* half (a packed
half: one record however many messages it holds, each delivered on its commit; what exactly-once Spark writes
use), and
:meth:`TransactionProducer.end_transactions` decides many halves in one END_TRANSACTION_BATCH request per broker
(and per :data:`END_BATCH_ENTRIES`), each as END_TRANSACTION would, with one outcome per half. They cut the two
requests per message of a transaction to two per batch.

The check requests arrive on the producer's :class:`ClientInstance`, so a TransactionProducer runs on a
:class:`TransactionClientInstance` (it makes one unless given one); several transaction producers of different
groups may share it.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cometmq.client.errors import BrokerError, ClientStateError, InvalidArgumentError, MQClientError, NoRouteError
from cometmq.client.instance import ClientInstance, route_stale
from cometmq.client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from cometmq.client.producer import Producer, _now_ms, batch_chunks
from cometmq.net.client import RemotingClient
from cometmq.net.connection import RemotingConnection
from cometmq.protocol.acl import Credentials
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
    send_header_to_v2,
)
from cometmq.protocol.message import SysFlag, decode_record
from cometmq.protocol.msgid import decode_offset_msg_id
from cometmq.protocol.properties import PGROUP, TRAN_MSG, UNIQ_KEY, encode_properties
from cometmq.protocol.remoting import RemotingCommand, make_request
from cometmq.protocol.transaction_batch import (
    HALF_BATCH_FIELD,
    PACKED_HALF,
    PACKED_PROPERTY,
    EndEntry,
    EndOutcome,
    decode_end_outcomes,
    encode_end_entries,
)

log = logging.getLogger(__name__)

__all__ = ["END_BATCH_ENTRIES", "END_BATCH_HALVES", "EndEntry", "EndOutcome", "HalfBatchRange", "LocalTransactionState",
           "TransactionClientInstance", "TransactionProducer", "TransactionSendResult", "end_entry"]

#: entries per END_TRANSACTION_BATCH request: a request's decisions are one burst of the broker's loop
END_BATCH_ENTRIES = 2048
#: halves per END_TRANSACTION_BATCH request, range entries counted by their halves (a larger range goes alone)
END_BATCH_HALVES = 16_384


class LocalTransactionState(enum.Enum):
    """A local transaction's outcome; the values are END_TRANSACTION's ``commitOrRollback``."""

    COMMIT_MESSAGE = 8
    ROLLBACK_MESSAGE = 12
    UNKNOW = 0  # RocketMQ's spelling
    COMMIT = 8
    ROLLBACK = 12
    UNKNOWN = 0


StateOrAwaitable = LocalTransactionState | Awaitable[LocalTransactionState]
#: ``(message, arg) -> state``: runs the local transaction (sync or async)
LocalTransaction = Callable[[Message, Any], StateOrAwaitable]
#: ``(message) -> state``: tells the broker what became of an unresolved transaction (sync or async)
TransactionChecker = Callable[[MessageExt], StateOrAwaitable]


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        """The message id consumers see (the UNIQ_KEY); it is also the transaction id."""
        return self.send_result.msg_id

    @property
    def transaction_id(self) -> str:
        return self.send_result.msg_id

    @property
    def ok(self) -> bool:
        return self.send_result.ok


def checked_state(state: object, what: str) -> LocalTransactionState:
    """``state`` if it is a LocalTransactionState, else UNKNOW (logged): a wrong answer never commits."""
    if isinstance(state, LocalTransactionState):
        return state
    log.error("%s returned %r, not a LocalTransactionState; counted as UNKNOW", what, state)
    return LocalTransactionState.UNKNOW


def run_local_transaction(call: Callable[[], object], what: str) -> LocalTransactionState:
    """Run a blocking local transaction (the sync facade runs it in the caller's thread)."""
    try:
        return checked_state(call(), what)
    except Exception:
        log.exception("%s raised; counted as UNKNOW", what)
        return LocalTransactionState.UNKNOW


def end_entry(result: SendResult, state: LocalTransactionState) -> EndEntry:
    """The END_TRANSACTION_BATCH entry deciding the half ``result`` names (ProtocolError: a bad offset msgId)."""
    return EndEntry(decode_offset_msg_id(result.offset_msg_id).offset, result.queue_offset, state.value,
                    result.msg_id)


@dataclass(frozen=True, slots=True)
class HalfBatchRange:
    """A half batch as stored: ``count`` halves in one append, at the half-queue offsets from ``queue_offset`` on
    (the first one's ``offset_msg_id`` and ``msg_id``), for the real queue ``queue``; one status for all."""

    status: SendStatus
    queue: MessageQueue
    queue_offset: int
    offset_msg_id: str
    msg_id: str
    count: int

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


_A = TypeVar("_A")


def _end_parts(entries: Sequence[EndEntry]) -> Iterable[Sequence[EndEntry]]:
    """``entries`` cut into END_TRANSACTION_BATCH requests, in order."""
    if all(e.count == 1 for e in entries):
        for start in range(0, len(entries), END_BATCH_ENTRIES):
            yield entries[start:start + END_BATCH_ENTRIES]
        return
    part: list[EndEntry] = []
    halves = 0
    for e in entries:
        if part and (len(part) == END_BATCH_ENTRIES or halves + e.count > END_BATCH_HALVES):
            yield part
            part, halves = [], 0
        part.append(e)
        halves += e.count
    if part:
        yield part


class TransactionClientInstance(ClientInstance):
    """A :class:`ClientInstance` that also serves the brokers' CHECK_TRANSACTION_STATE requests."""

    def __init__(self, namesrv: str | Iterable[str], **kwargs: Any) -> None:
        super().__init__(namesrv, **kwargs)
        #: producer group -> the transaction producer that answers for it
        self.transaction_producers: dict[str, TransactionProducer] = {}
        # No connection exists yet: serve the parent's requests plus the check on a client of our own.
        self.remoting = RemotingClient({RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_ids_changed,
                                        RequestCode.CHECK_TRANSACTION_STATE: self._on_check_transaction},
                                       ssl=self.tls_context)

    async def _on_check_transaction(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        try:
            header = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
            rec = decode_record(cmd.body)[0]
        except ProtocolError as exc:
            log.warning("malformed CHECK_TRANSACTION_STATE from %s: %s", conn.remote_address, exc)
            return None
        group = rec.properties.get(PGROUP, "")
        producer = self.transaction_producers.get(group)
        if producer is None:
            log.warning("CHECK_TRANSACTION_STATE from %s for group %r, which has no transaction producer here",
                        conn.remote_address, group)
            return None
        await producer.answer_check(conn, header, MessageExt.from_record(rec, header.broker_name or ""))
        return None


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends transactional messages. ``checker`` answers the broker's check-backs
    of transactions left undecided (UNKNOW, or an END_TRANSACTION that never arrived)."""

    def __init__(self, group: str, *, namesrv: str | None = None, checker: TransactionChecker | None = None,
                 instance: TransactionClientInstance | None = None,
                 credentials: Credentials | tuple[str, str] | None = None, **kwargs: Any) -> None:
        if instance is not None and not isinstance(instance, TransactionClientInstance):
            raise InvalidArgumentError("a TransactionProducer needs a TransactionClientInstance (it serves checks)")
        if instance is None and namesrv is None:
            raise InvalidArgumentError("a producer needs namesrv='host:port' or a TransactionClientInstance")
        if checker is not None and not callable(checker):
            raise InvalidArgumentError("checker must be callable: (MessageExt) -> LocalTransactionState")
        tx_instance = instance or TransactionClientInstance(namesrv or "", credentials=credentials)
        super().__init__(group, instance=tx_instance, **kwargs)
        self._own_instance = instance is None
        self.tx_instance = tx_instance
        self.checker = checker
        #: check-backs answered, by state
        self.checks_answered: dict[LocalTransactionState, int] = {s: 0 for s in LocalTransactionState}
        #: broker address -> the connection our group was last announced on (a new one needs a heartbeat)
        self._announced: dict[str, RemotingConnection | None] = {}

    async def start(self) -> None:
        if self.started:
            return
        other = self.tx_instance.transaction_producers.get(self.group)
        if other is not None and other is not self:
            raise InvalidArgumentError(f"group {self.group} already has a transaction producer in this instance")
        self.tx_instance.transaction_producers[self.group] = self
        try:
            await super().start()
        except BaseException:
            self.tx_instance.transaction_producers.pop(self.group, None)
            raise
        # Register with the brokers now: a check-back can only reach a producer the broker knows.
        await self.instance.heartbeat()

    async def close(self) -> None:
        if not self.started:
            return
        await super().close()
        if self.tx_instance.transaction_producers.get(self.group) is self:
            del self.tx_instance.transaction_producers[self.group]

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    # -- sending ------------------------------------------------------------------------------------------------
    async def send_in_transaction(self, msg: Message, local_transaction: LocalTransaction, arg: Any = None, *,
                                  timeout: float | None = None) -> TransactionSendResult:
        """Send ``msg`` as a half, run ``local_transaction(msg, arg)`` and tell the broker its outcome.

        An exception from the local transaction counts as UNKNOW (the broker will ask the checker later). A half
        the broker did not store with SEND_OK is rolled back without running the local transaction."""
        if not callable(local_transaction):
            raise InvalidArgumentError("local_transaction must be callable: (Message, arg) -> LocalTransactionState")
        result = await self.send_half(msg, timeout=timeout)
        if not result.ok:
            state = LocalTransactionState.ROLLBACK
        else:
            state = await self._decide(lambda: local_transaction(msg, arg), f"local transaction of {result.msg_id}")
        await self.end_transaction(result, state)
        return TransactionSendResult(result, state)

    async def send_half(self, msg: Message, *, timeout: float | None = None,
                        queue: MessageQueue | None = None) -> SendResult:
        """Only the first step: store ``msg`` as a half (invisible until :meth:`end_transaction`); ``queue``: the
        real queue it is delivered to when committed (default: the producer picks one, retrying on others)."""
        self._check(msg)
        if msg.delay_level or msg.deliver_at is not None or msg.delay is not None:
            raise InvalidArgumentError("a transactional message cannot be delayed or scheduled")
        half = Message(msg.topic, msg.body, tags=msg.tags, keys=msg.keys,
                       properties={**msg.properties, **self.half_properties()}, flag=msg.flag)
        result = await self.send(half, timeout=timeout, queue=queue)
        await self._announce(result.queue)
        return result

    async def send_half_batch(self, msgs: Sequence[Message], *, queue: MessageQueue | None = None,
                              timeout: float | None = None) -> list[SendResult]:
        """Store ``msgs`` (one topic) as halves, in as few requests as ``max_batch_bytes`` allows, each stored in
        one append (a cometmq broker's half batch). ``queue``: the real queue they go to once committed (default:
        one the producer picks, and another one when a broker refuses the request; a request without an answer
        is not sent again, as its halves may be stored). Decide them with :meth:`end_transactions`."""
        if not msgs:
            return []
        self._check_batch(msgs)
        extra = self.half_properties()
        halves = [Message(m.topic, m.body, tags=m.tags, keys=m.keys, properties={**m.properties, **extra},
                          flag=m.flag) for m in msgs]
        results: list[SendResult] = []
        for chunk in batch_chunks(halves, self.max_batch_bytes):
            results += await self._send_half_chunk(chunk, queue, timeout)
        return results

    async def _send_half_chunk(self, msgs: list[Message], queue: MessageQueue | None,
                               timeout: float | None) -> list[SendResult]:
        async def attempt(q: MessageQueue) -> list[SendResult]:
            cmd, uniqs = self._batch_request(q, msgs)
            return await self._send_half_request(q, cmd, uniqs, timeout)

        if queue is not None:
            return await attempt(queue)
        queues = await self._queues(msgs[0].topic)
        for n in range(self.retries + 1):
            q = queues[next(self._next_queue) % len(queues)]
            try:
                return await attempt(q)
            except BrokerError as exc:  # answered: nothing was stored
                if not exc.retriable or n == self.retries:
                    raise
                log.info("half batch to %s refused (%s); retrying on another queue", q, exc)
        raise AssertionError("unreachable")

    def half_properties(self) -> dict[str, str]:
        """What makes a message of this producer a half (``TRAN_MSG=true``, ``PGROUP=<group>``), merged after
        the message's own properties (``{**msg.properties, **half_properties()}``)."""
        return {TRAN_MSG: "true", PGROUP: self.group}

    async def send_half_batch_body(self, queue: MessageQueue, body: bytes, msg_ids: Sequence[str], *,
                                   timeout: float | None = None) -> list[SendResult]:
        """Store a half batch the caller encoded (the columnar Spark sink's path, no Message per row): ``body`` has
        :func:`cometmq.protocol.batch.encode_batch_raw`'s layout, every item's properties hold
        :meth:`half_properties` before ``UNIQ_KEY\x01<id>\x02WAIT\x01true\x02``, its ids ``msg_ids`` (in item
        order; from :meth:`reserve_msg_ids`). The request is :meth:`send_half_batch`'s; one SendResult per item,
        as it gives. Sent once, to ``queue``: a refusal (BrokerError, nothing stored) may be sent again by the
        caller, a request without an answer must not be (its halves may be stored)."""
        if not self.started:
            raise ClientStateError("the producer is not started")
        self._check_topic(queue.topic)
        if not body or not msg_ids:
            raise InvalidArgumentError(f"the half batch for {queue.topic} is empty")
        return await self._send_half_request(queue, self._batch_body_request(queue, body), list(msg_ids), timeout)

    async def send_half_batch_range(self, queue: MessageQueue, body: bytes, first_id: str, count: int, *,
                                    timeout: float | None = None) -> HalfBatchRange:
        """:meth:`send_half_batch_body` answered as one :class:`HalfBatchRange` rather than a SendResult per item
        (a half batch is one append: its halves follow one another in the half queue, and one END_TRANSACTION_BATCH
        range entry decides them): ``first_id`` is the first item's id, ``count`` how many items ``body`` holds
        (the broker's answer must list as many)."""
        if not self.started:
            raise ClientStateError("the producer is not started")
        self._check_topic(queue.topic)
        if not body or count < 1:
            raise InvalidArgumentError(f"the half batch for {queue.topic} is empty")

        def answer(response: Any, addr: str) -> HalfBatchRange:
            status, real_q, first_offset = Producer._answer(response, queue, addr)
            ids = response.ext_fields.get("msgId", "")
            if ids.count(",") + 1 != count:
                raise MQClientError(f"the half batch answer from {addr} lists {ids.count(',') + 1} halves for "
                                    f"{count} items")
            return HalfBatchRange(status, real_q, first_offset, ids.split(",", 1)[0], first_id, count)

        return await self._half_request(queue, self._batch_body_request(queue, body), answer, timeout)

    async def send_packed_half(self, queue: MessageQueue, body: bytes, count: int, msg_id: str,
                               properties: dict[str, str] | None = None, *,
                               timeout: float | None = None) -> HalfBatchRange:
        """Store a batch body the caller encoded (:meth:`send_half_batch_body`'s layout, ``count`` items, no delay
        or timer item) as one *packed half* (protocol/transaction_batch.py): a single transactional message of
        ``queue`` with ``properties`` (they travel with the half, for the checker; each item keeps its own),
        :meth:`half_properties`, ``UNIQ_KEY=msg_id`` and the count. Its COMMIT delivers the ``count`` items.
        Answered as a :class:`HalfBatchRange` of one half. Sent once, to ``queue``, as
        :meth:`send_half_batch_body`; a broker without the extension refuses it (BrokerError)."""
        if not self.started:
            raise ClientStateError("the producer is not started")
        self._check_topic(queue.topic)
        if not body or count < 1:
            raise InvalidArgumentError(f"the packed half for {queue.topic} is empty")
        props = {**(properties or {}), **self.half_properties(), UNIQ_KEY: msg_id, PACKED_PROPERTY: str(count)}
        # A batch request (the half's properties in its header, the batch as its body): a broker without the
        # extension refuses it instead of storing a half whose commit would deliver the batch as one message.
        header = SendMessageRequestHeader(producer_group=self.group, topic=queue.topic, queue_id=queue.queue_id,
                                          sys_flag=int(SysFlag.TRANSACTION_PREPARED), born_timestamp=_now_ms(),
                                          properties=encode_properties(props).decode(), batch=True)
        cmd = make_request(RequestCode.SEND_BATCH_MESSAGE, send_header_to_v2(header), body)
        cmd.ext_fields[HALF_BATCH_FIELD] = PACKED_HALF

        def answer(response: Any, addr: str) -> HalfBatchRange:
            status, real_q, offset = Producer._answer(response, queue, addr)
            return HalfBatchRange(status, real_q, offset, response.ext_fields.get("msgId", ""), msg_id, 1)

        return await self._invoke_half(queue, cmd, answer, timeout, "packed half")

    async def _send_half_request(self, q: MessageQueue, cmd: RemotingCommand, uniqs: list[str],
                                 timeout: float | None) -> list[SendResult]:
        """A SEND_BATCH_MESSAGE of transactional items (``cmd``, ids ``uniqs``) sent as a half batch."""
        return await self._half_request(q, cmd, lambda response, addr: self._batch_result(response, q, uniqs, addr),
                                        timeout)

    async def _half_request(self, q: MessageQueue, cmd: RemotingCommand, answer: Callable[[Any, str], _A],
                            timeout: float | None) -> _A:
        ext = cmd.ext_fields
        ext["f"] = str(int(ext.get("f", "0")) | SysFlag.TRANSACTION_PREPARED)  # "f": sysFlag in V2
        ext[HALF_BATCH_FIELD] = "true"
        return await self._invoke_half(q, cmd, answer, timeout, "half batch")

    async def _invoke_half(self, q: MessageQueue, cmd: RemotingCommand, answer: Callable[[Any, str], _A],
                           timeout: float | None, what: str) -> _A:
        """Send a request of halves for ``q`` once (no retry: its halves may be stored) and read its answer."""
        try:
            addr = self.instance.master_addr(q.broker_name) or await self._addr(q)
            response = await self.instance.invoke(addr, cmd, self.send_timeout if timeout is None else timeout,
                                                  context=f"{what} to {q.topic}/{q.queue_id}")
            results = answer(response, addr)
        except MQClientError as exc:
            if route_stale(exc):  # not sent again here, but the next request finds the new master
                self.instance.refresh_route_soon(q.topic)
            raise
        await self._announce(q)
        return results

    async def end_transactions(self, decisions: Sequence[tuple[SendResult, LocalTransactionState]], *,
                               timeout: float | None = None) -> list[EndOutcome]:
        """Decide many halves (``(send result, state)`` pairs) with END_TRANSACTION_BATCH requests, one broker
        and topic at a time, the halves of each in the order given; one outcome per pair, in order. See
        :meth:`end_transaction_batch` for failures."""
        by_broker: dict[tuple[str, str], list[int]] = {}
        for i, (result, _) in enumerate(decisions):
            by_broker.setdefault((result.queue.broker_name, result.queue.topic), []).append(i)
        out: list[EndOutcome] = [EndOutcome(ResponseCode.SYSTEM_ERROR)] * len(decisions)
        for (broker, topic), idx in by_broker.items():
            got = await self.end_transaction_batch(
                broker, [end_entry(decisions[i][0], decisions[i][1]) for i in idx], topic=topic, timeout=timeout)
            for i, o in zip(idx, got, strict=True):
                out[i] = o
        return out

    async def end_transaction_batch(self, broker_name: str, entries: Sequence[EndEntry], *, topic: str | None = None,
                                    timeout: float | None = None) -> list[EndOutcome]:
        """Decide halves stored on ``broker_name``, in the order given, :data:`END_BATCH_ENTRIES` entries and
        :data:`END_BATCH_HALVES` halves (a range entry's ``count``) per request; one outcome per entry (``ok``:
        decided now or before, alike). ``topic``: the topic of every half (the broker refuses a half of another,
        NO_PERMISSION); with ACLs on, a request naming none needs an admin account. A request refused as a whole
        raises BrokerError (a broker without the extension: REQUEST_CODE_NOT_SUPPORTED), one without an answer
        MQClientError; the entries before it are decided, the rest are not (the broker checks back on them)."""
        addr = self.instance.master_addr(broker_name)
        if addr is None:  # known from the routes of the topics sent to
            raise NoRouteError(f"no master address known for broker {broker_name}")
        wait = self.send_timeout if timeout is None else timeout
        out: list[EndOutcome] = []
        for part in _end_parts(entries):
            fields = {"producerGroup": self.group} if topic is None else {"producerGroup": self.group, "topic": topic}
            cmd = make_request(RequestCode.END_TRANSACTION_BATCH, fields, encode_end_entries(part))
            response = await self.instance.invoke(addr, cmd, wait, context=f"end {len(part)} transactions")
            if response.code != ResponseCode.SUCCESS:
                raise BrokerError(response.code, response.remark or "", addr=addr,
                                  context=f"END_TRANSACTION_BATCH of {len(part)} halves")
            try:
                got = decode_end_outcomes(response.body)
            except ProtocolError as exc:
                raise MQClientError(f"END_TRANSACTION_BATCH answer from {addr} unreadable: {exc}") from None
            if len(got) != len(part):
                raise MQClientError(f"END_TRANSACTION_BATCH answer from {addr} has {len(got)} outcomes for "
                                    f"{len(part)} entries")
            out += got
        return out

    async def _announce(self, q: MessageQueue) -> None:
        """Heartbeat when the half went over a connection the broker has not seen our group on (a first send to
        that broker, or a reconnect after it restarted): its check-backs can only reach a registered producer."""
        addr = self.instance.master_addr(q.broker_name)
        if addr is None:
            return
        conn = self.instance.remoting.connections.get(addr)
        if conn is not None and self._announced.get(addr) is conn:
            return
        await self.instance.heartbeat()
        self._announced[addr] = conn

    async def end_transaction(self, result: SendResult, state: LocalTransactionState,
                              *, timeout: float | None = None) -> bool:
        """Tell the broker the outcome of the half ``result`` names; False (logged) if it could not be told —
        the broker then checks back, so this is never fatal."""
        try:
            offset = decode_offset_msg_id(result.offset_msg_id).offset
        except ProtocolError as exc:
            log.warning("cannot end transaction %s: bad offset msgId %r (%s)", result.msg_id, result.offset_msg_id,
                        exc)
            return False
        header = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=result.queue_offset, commit_log_offset=offset,
            commit_or_rollback=state.value, msg_id=result.msg_id, transaction_id=result.msg_id,
            from_transaction_check=False)
        try:
            addr = await self._addr(result.queue)
            response = await self.instance.invoke(addr, make_request(RequestCode.END_TRANSACTION, header.to_ext()),
                                                  self.send_timeout if timeout is None else timeout,
                                                  context=f"end transaction {result.msg_id}")
        except MQClientError as exc:
            log.warning("END_TRANSACTION %s (%s) not delivered: %s; the broker will check back", result.msg_id,
                        state.name, exc)
            return False
        if response.code != ResponseCode.SUCCESS:
            log.warning("END_TRANSACTION %s (%s) refused: code %d %s", result.msg_id, state.name, response.code,
                        response.remark)
            return False
        return True

    # -- check-back ------------------------------------------------------------------------------------------------
    async def answer_check(self, conn: RemotingConnection, header: CheckTransactionStateRequestHeader,
                           msg: MessageExt) -> None:
        """Ask the checker about ``msg`` and send the answer (oneway) on the connection the check came on."""
        checker = self.checker
        if checker is None:
            log.warning("transaction %s: the broker checks back but producer %s has no checker", msg.msg_id,
                        self.group)
            state = LocalTransactionState.UNKNOW
        else:
            state = await self._decide(lambda: checker(msg), f"check of transaction {msg.msg_id}")
        self.checks_answered[state] += 1
        end = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset, commit_or_rollback=state.value,
            msg_id=msg.properties.get(UNIQ_KEY) or header.msg_id, transaction_id=header.transaction_id,
            from_transaction_check=True)
        if conn.closed:
            log.info("transaction %s: the broker went away before the check was answered", msg.msg_id)
            return
        try:
            conn.send_oneway(self.instance.sign(make_request(RequestCode.END_TRANSACTION, end.to_ext(), oneway=True)))
        except ConnectionError as exc:
            log.info("transaction %s: answering the check failed: %s", msg.msg_id, exc)

    @staticmethod
    async def _decide(call: Callable[[], StateOrAwaitable], what: str) -> LocalTransactionState:
        try:
            state = call()
            if inspect.isawaitable(state):
                state = await state
        except Exception:
            log.exception("%s raised; counted as UNKNOW", what)
            return LocalTransactionState.UNKNOW
        return checked_state(state, what)

    # -- wire ------------------------------------------------------------------------------------------------------
    def _request(self, q: MessageQueue, msg: Message, *, oneway: bool = False, uniq: str | None = None
                 ) -> tuple[Any, str]:
        cmd, uniq = super()._request(q, msg, oneway=oneway, uniq=uniq)
        if msg.properties.get(TRAN_MSG) == "true":
            # RocketMQ's producers flag a half in the sys flag too ("f" is sysFlag in SEND_MESSAGE_V2).
            ext = cmd.ext_fields
            ext["f"] = str(int(ext.get("f", "0")) | SysFlag.TRANSACTION_PREPARED)
        return cmd, uniq
