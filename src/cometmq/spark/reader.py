"""Reading topics into Spark: the batch reader, the streaming reader, and what a task does.

Planning (on the driver) turns the options into offset ranges per queue and cuts them into
:class:`QueueSlice` partitions. A slice carries everything its task needs: the broker's address, the
range, the filter, the consumer-group name for the pull requests; so a task talks to that broker only.

A task pulls its range with PULL_MESSAGE (no long polling, the subscription in the request) over a plain
blocking socket of its own (:class:`_Wire`: no event loop, each answer's records received straight into a
buffer of their own), asks for the next chunks before it decodes the ones it has, and yields Arrow record
batches of about 4 MiB of records (:func:`cometmq.spark.decode.decode_answers`). Offsets below the queue's
first offset, or missing in the middle of an unfiltered range, are data loss: an error with ``failOnDataLoss``
(the default), else skipped with a warning.
"""

from __future__ import annotations

import collections
import logging
import re
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from cometmq.client.errors import BrokerError, ClientConnectionError, ClientTimeoutError, NoRouteError
from cometmq.client.message import MessageQueue
from cometmq.net.client import split_address
from cometmq.protocol.acl import Credentials, sign_request
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    RESPONSE_FLAG,
    RemotingCommand,
    encode,
    encode_parts,
    make_request,
    next_opaque,
)
from cometmq.protocol.remoting import decode as decode_frame
from cometmq.spark.decode import decode_answers
from cometmq.spark.link import Link
from cometmq.spark.options import OptionError, ReadOptions, queue_key
from cometmq.spark.planning import QueueRange, from_json, limit_rows, should_wait, split_ranges, to_json
from cometmq.spark.resolve import DataLossError, check_data_loss, discover, resolve_bound, selects
from cometmq.spark.schema import arrow_schema

try:
    import orjson
except ImportError:  # the remoting codec runs without it too
    orjson = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

__all__ = ["CometBatchReader", "CometStreamReader", "QueueSlice", "read_slice"]

#: records joined into one Arrow batch (bytes as pulled)
BATCH_BYTES = 4 << 20
#: records asked for per pull; the broker caps it (maxTransferCountOnMessageInMemory / ...Bytes...)
PULL_BATCH = 1024
#: pulls on the wire at once per task when the range is unfiltered (the next offsets are then known)
PULL_DEPTH = 3
_FLAG_SUBSCRIPTION = 0x4
_CONNECT_RETRIES = 3


class QueueSlice(InputPartition):
    """Offsets ``[start, end)`` of one queue, and how to read them."""

    def __init__(self, queue: MessageQueue, start: int, end: int, addr: str, opts: ReadOptions) -> None:
        super().__init__(None)
        self.topic = queue.topic
        self.broker_name = queue.broker_name
        self.queue_id = queue.queue_id
        self.start = start
        self.end = end
        self.addr = addr
        self.namesrv = opts.namesrv
        self.group = opts.group
        self.expression = opts.expression
        self.expression_type = opts.expression_type
        self.filtered = opts.filtered
        self.fail_on_data_loss = opts.fail_on_data_loss
        self.timeout = opts.timeout
        self.credentials = opts.credentials
        self.tls = opts.tls

    @property
    def label(self) -> str:
        return f"{self.topic} {queue_key(self.broker_name, self.queue_id)}"

    def __repr__(self) -> str:
        return f"QueueSlice({self.label} [{self.start}, {self.end}) at {self.addr})"


def _slices(link: Link, ranges: list[QueueRange], opts: ReadOptions) -> list[QueueSlice]:
    out = []
    for r in split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition):
        addr = link.instance.master_addr(r.queue.broker_name)
        if addr is None:
            link.queues([r.queue.topic], missing_ok=True)
            addr = link.broker_addr(r.queue.broker_name)
        out.append(QueueSlice(r.queue, r.start, r.end, addr, opts))
    return out


# -- a task's read --------------------------------------------------------------------------------------------
def read_slice(part: QueueSlice, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of ``part`` as record batches of ``schema``."""
    if part.end <= part.start:
        return
    reader = _SliceReader(part, schema)
    try:
        yield from reader.batches()
    finally:
        reader.close()


_FRAME_HEAD = struct.Struct(">II")  # frame length, then serialize type << 24 | header length


class _Answer(NamedTuple):
    """What a task reads of a pull answer's header."""

    code: int
    opaque: int
    flag: int
    remark: str | None
    ext_fields: dict[str, Any]


def _parse_answer(word: int, header: bytearray) -> _Answer:
    """An answer's header (``word``: the frame's serialize type and header length). A plain JSON header is read
    with orjson straight into the few fields a task uses; anything else (the binary header, JSON orjson will not
    take, fields of unexpected types) goes through the remoting codec, which decodes it or raises ProtocolError."""
    if word >> 24 == 0 and orjson is not None:
        try:
            h = orjson.loads(header)
        except ValueError:
            h = None
        if type(h) is dict:
            code, opaque, flag = h.get("code"), h.get("opaque"), h.get("flag", 0)
            remark, ext = h.get("remark"), h.get("extFields") or {}
            if (type(code) is int and type(opaque) is int and type(flag) is int and type(ext) is dict
                    and (remark is None or type(remark) is str)):
                return _Answer(code, opaque, flag, remark, ext)
    frame = bytearray(_FRAME_HEAD.size + len(header))
    _FRAME_HEAD.pack_into(frame, 0, 4 + len(header), word)
    frame[_FRAME_HEAD.size:] = header
    cmd = decode_frame(frame)
    return _Answer(cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields)


class _PullFrames:
    """The PULL_MESSAGE frames of one slice.

    From one pull to the next only the opaque, the offset and the count change, so the header is encoded once
    by the remoting codec with stand-in numbers, which become ``%d`` in a template: a frame then costs one
    formatting instead of a command and a JSON encoding, and its bytes are those the codec would give. When a
    stand-in is not found exactly once in the header (a name that happens to contain it), every frame is
    encoded by the codec."""

    _STAND_INS = (1_357_913_579, 8_642_086_420_864_208, 7_531_975)  # opaque, offset, count

    def __init__(self, fields: dict[str, str], credentials: tuple[str, str] | None = None) -> None:
        self.fields = fields
        #: a signed pull (ACL) has a signature that changes with the offset: no template then
        self.credentials = Credentials(*credentials) if credentials else None
        opaque, offset, count = self._STAND_INS
        head, _ = encode_parts(self._command(opaque, offset, count))
        header = head[_FRAME_HEAD.size:]
        found = [(header.find(b"%d" % n), b"%d" % n) for n in self._STAND_INS]
        self.template: bytes | None = None
        if self.credentials is None and _FRAME_HEAD.unpack_from(head)[1] >> 24 == 0 and all(
                header.count(t) == 1 for _, t in found):
            # the stand-ins' order in the header: the opaque comes before extFields, the rest in field order
            self.order = [self._STAND_INS.index(int(t)) for _, t in sorted(found)]
            self.template = re.sub(b"|".join(t for _, t in found), b"%d", header.replace(b"%", b"%%"))

    def _command(self, opaque: int, offset: int, count: int) -> RemotingCommand:
        cmd = make_request(RequestCode.PULL_MESSAGE, {**self.fields, "queueOffset": str(offset),
                                                      "maxMsgNums": str(count)}, opaque=opaque)
        return cmd if self.credentials is None else sign_request(cmd, self.credentials)

    def frame(self, offset: int, count: int) -> tuple[int, bytes]:
        """(opaque, the whole frame) of a pull of ``count`` messages from ``offset``."""
        opaque = next_opaque()
        if self.template is None:
            return opaque, encode(self._command(opaque, offset, count))
        values = (opaque, offset, count)
        header = self.template % tuple(values[i] for i in self.order)
        return opaque, _FRAME_HEAD.pack(4 + len(header), len(header)) + header


class _Wire:
    """A task's connection to the broker it reads from: a plain blocking socket (TLS-wrapped with ``tls``), no
    event loop.

    A pull answer is a remoting frame whose body is the records; the body is received straight into a buffer
    of its own (the only copy before decoding), and only the small header goes through the remoting codec.
    Requests are written as they are made, so several pulls can be on the wire; answers are read in the order
    they arrive and matched by opaque. ``forget`` drops a pull whose answer is no longer wanted (it is skipped
    when it comes). Any OSError (timeouts included) or ProtocolError leaves the connection unusable."""

    def __init__(self, addr: str, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        host, port = split_address(addr)
        self.addr = addr
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except OSError:
                sock.close()
                raise
        self.sock = sock
        self._head = bytearray(_FRAME_HEAD.size)
        self._early: dict[int, tuple[_Answer, bytearray]] = {}
        self._live: set[int] = set()

    def send(self, opaque: int, frame: bytes) -> None:
        """Write the request ``frame`` whose opaque is ``opaque``."""
        self._live.add(opaque)
        self.sock.sendall(frame)

    def forget(self, opaque: int) -> None:
        self._live.discard(opaque)
        self._early.pop(opaque, None)

    def _fill(self, view: memoryview) -> None:
        recv = self.sock.recv_into
        got, want = 0, len(view)
        while got < want:
            n = recv(view[got:])
            if not n:
                raise ConnectionResetError(f"{self.addr} closed the connection")
            got += n

    def receive(self, opaque: int) -> tuple[_Answer, bytearray]:
        """The answer to the request ``opaque`` (its header, and its body in a buffer of its own)."""
        while True:
            early = self._early.pop(opaque, None)
            if early is not None:
                self._live.discard(opaque)
                return early
            head = self._head
            with memoryview(head) as view:
                self._fill(view)
            length, word = _FRAME_HEAD.unpack_from(head)
            header_len = word & 0xFFFFFF
            if length > DEFAULT_MAX_FRAME_SIZE or header_len > length - 4:
                raise ProtocolError(f"bad frame from {self.addr}: length {length}, header {header_len}")
            header = bytearray(header_len)
            with memoryview(header) as view:
                self._fill(view)
            cmd = _parse_answer(word, header)
            body = bytearray(length - 4 - header_len)
            if body:
                with memoryview(body) as view:
                    self._fill(view)
            if not cmd.flag & RESPONSE_FLAG or cmd.opaque not in self._live:
                continue  # a request from the broker (this client serves none), or an answer no longer wanted
            if cmd.opaque == opaque:
                self._live.discard(opaque)
                return cmd, body
            self._early[cmd.opaque] = (cmd, body)

    def close(self) -> None:
        self.sock.close()


class _SliceReader:
    def __init__(self, part: QueueSlice, schema: pa.Schema) -> None:
        self.part = part
        self.schema = schema
        self.addr = part.addr
        self._wire: _Wire | None = None
        #: why the last connect or send failed (named in the error when the retries run out)
        self._wire_error: OSError | None = None
        self._tls = part.tls.context() if part.tls is not None else None
        self._link: Link | None = None  # the nameserver, only when the broker stops answering
        # the subscription rides in each request (no heartbeat: the group need not be known to the broker)
        self._frames = _PullFrames({
            "consumerGroup": part.group, "topic": part.topic, "queueId": str(part.queue_id),
            "sysFlag": str(_FLAG_SUBSCRIPTION), "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": part.expression, "subVersion": "0", "expressionType": part.expression_type},
            part.credentials)

    def close(self) -> None:
        self._drop_wire()
        if self._link is not None:
            self._link.close()
            self._link = None

    def _drop_wire(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    def _send(self, offset: int, count: int) -> tuple[int, int, int]:
        """Put a pull on the wire: (offset, count, opaque). A failure to connect or send only drops the
        connection: the next receive fails, and the pulls on the wire are made again."""
        opaque, frame = self._frames.frame(offset, count)
        try:
            if self._wire is None:
                self._wire = _Wire(self.addr, self.part.timeout, self._tls)
                self._wire_error = None
            self._wire.send(opaque, frame)
        except OSError as exc:
            log.debug("pull of %s from %s: %s", self.part.label, self.addr, exc)
            self._wire_error = exc
            self._drop_wire()
        return offset, count, opaque

    def _receive(self, opaque: int) -> tuple[_Answer, bytearray]:
        if self._wire is None:
            why = f": {self._wire_error}" if self._wire_error is not None else ""
            raise ConnectionResetError(f"no connection to {self.addr}{why}")
        return self._wire.receive(opaque)

    def _broken(self, exc: Exception, failures: int) -> None:
        """The connection failed for the ``failures``-th time in a row: give up after _CONNECT_RETRIES, else
        wait a little and ask the nameserver where the broker is now (it may have moved)."""
        self._drop_wire()
        p = self.part
        if failures >= _CONNECT_RETRIES:
            if isinstance(exc, TimeoutError):
                raise ClientTimeoutError(f"no answer from {self.addr} in time (pull of {p.label})") from exc
            raise ClientConnectionError(f"cannot talk to {self.addr} (pull of {p.label}): {exc}") from exc
        time.sleep(0.5 * failures)
        try:
            if self._link is None:
                self._link = Link(p.namesrv, timeout=p.timeout, credentials=p.credentials, tls=p.tls)
            link = self._link
            link.run(link.instance.route(p.topic, refresh=True))
            self.addr = link.instance.master_addr(p.broker_name) or self.addr
        except (ClientConnectionError, ClientTimeoutError, NoRouteError, BrokerError):
            pass

    def _lost(self, first: int, upto: int, why: str) -> None:
        msg = (f"{self.part.label}: offsets {first}..{upto - 1} {why}. "
               "Set failOnDataLoss=false to skip them.")
        if self.part.fail_on_data_loss:
            raise DataLossError(msg)
        log.warning("skipping lost messages: %s", msg)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Pull the range and yield it as record batches.

        An unfiltered range has one message per offset, so the next pulls' offsets are known before the
        answers: up to PULL_DEPTH pulls are on the wire, each for the next ``count`` offsets. An answer that
        stops short (the broker's per-answer byte or count cap) gets a pull for the rest of its offsets
        before the later ones are used, and ``count`` becomes a little less (15/16) than what the broker gave,
        so that the next answers come whole (set from the last full-size pull that was cut, it follows the
        record sizes up and down; it does not shrink again at each cut, which took it to two thirds of what an
        answer holds, 1.4 times the pulls). Any other surprise
        (offset moved, nothing found, ...) drops the pulls ahead and goes on from where the broker says, as
        a filtered range always does (one pull at a time, each from the previous answer's next offset).
        When the connection fails, the pulls that were on it are made again on a new one (at most
        _CONNECT_RETRIES failures in a row)."""
        p = self.part
        depth = 1 if p.filtered else PULL_DEPTH
        count = PULL_BATCH
        ahead: collections.deque[tuple[int, int, int]] = collections.deque()  # (offset, count, opaque)
        follow: int | None = p.start  # the offset the next pull starts at, when known
        chunks: list[bytearray] = []
        size = 0
        expect = p.start  # the offset the next decoded record should have (unfiltered reads)
        failures = 0

        def fill() -> None:
            nonlocal follow
            while follow is not None and follow < p.end and len(ahead) < depth:
                n = PULL_BATCH if p.filtered else min(count, p.end - follow)
                ahead.append(self._send(follow, n))
                follow = follow + n if not p.filtered else None

        def drop_ahead() -> None:
            while ahead:
                _, _, opaque = ahead.pop()
                if self._wire is not None:
                    self._wire.forget(opaque)

        fill()
        while ahead:
            offset, asked, opaque = ahead[0]
            try:
                response, body = self._receive(opaque)
            except (OSError, ProtocolError) as exc:
                failures += 1
                self._broken(exc, failures)
                again = [(off, n) for off, n, _ in ahead]
                ahead.clear()
                ahead.extend(self._send(off, n) for off, n in again)
                continue
            failures = 0
            ahead.popleft()
            code = response.code
            ext = response.ext_fields
            try:
                nxt = int(ext["nextBeginOffset"])
            except (KeyError, ValueError):
                raise BrokerError(ResponseCode.SYSTEM_ERROR, "pull answer without nextBeginOffset",
                                  addr=self.addr, context=p.label) from None
            if code != ResponseCode.SUCCESS:
                body = bytearray()
                if code == ResponseCode.PULL_OFFSET_MOVED or (
                        code == ResponseCode.PULL_RETRY_IMMEDIATELY and response.remark == "MESSAGE_WAS_REMOVING"):
                    if nxt <= offset:  # the queue ends below the offset now (the broker says: start again)
                        self._lost(offset, p.end, f"are past the queue's end ({ext.get('maxOffset', '?')}): it "
                                   "went back (its topic deleted and made again, or messages the broker lost)")
                        nxt = p.end
                    else:
                        self._lost(offset, min(nxt, p.end), "were deleted before they were read (retention?)")
                elif code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                    pass  # nothing matched the filter in the part scanned
                elif code == ResponseCode.PULL_NOT_FOUND:
                    self._lost(offset, p.end, f"are not in the queue (it ends at {ext.get('maxOffset', '?')})")
                    nxt = p.end
                else:
                    raise BrokerError(code, response.remark or "", addr=self.addr, context=f"pull of {p.label}")
            if nxt <= offset and not body:
                raise BrokerError(code, f"pull made no progress at offset {offset}", addr=self.addr,
                                  context=p.label)
            if not body and code != ResponseCode.SUCCESS:
                if chunks and not p.filtered:  # the answers before the skip follow the offsets before it
                    batch = self._decode(chunks, expect)
                    chunks, size = [], 0
                    if batch.num_rows:
                        yield batch
                expect = nxt  # what was skipped was reported above
            if p.filtered:
                follow = nxt
            elif code == ResponseCode.SUCCESS and offset < nxt <= offset + asked:
                if nxt < offset + asked:  # capped by the broker: fetch the rest first
                    ahead.appendleft(self._send(nxt, offset + asked - nxt))
                    if asked >= count:  # a full-size pull (not a rest) tells how many fit in an answer
                        count = max(1, (nxt - offset) * 15 // 16)
            else:  # the pulls ahead started at offsets that no longer follow
                drop_ahead()
                follow = nxt
            fill()  # the next pulls go on the wire before this answer is decoded
            if body:
                chunks.append(body)
                size += len(body)
            if chunks and (size >= BATCH_BYTES or not ahead):
                batch = self._decode(chunks, expect)
                chunks, size = [], 0
                if batch.num_rows:
                    expect = int(batch.column("queueOffset")[-1].as_py()) + 1
                    yield batch

    def _decode(self, chunks: list[bytearray], expect: int) -> pa.RecordBatch:
        p = self.part
        batch = decode_answers(chunks, p.topic, p.broker_name, self.schema)
        offsets = batch.column("queueOffset").to_numpy()
        if len(offsets) and offsets[-1] >= p.end:
            keep = offsets < p.end
            batch = batch.filter(pa.array(keep))
            offsets = offsets[keep]
        if not p.filtered and len(offsets):
            wanted = np.arange(expect, expect + len(offsets), dtype=np.int64)
            if not np.array_equal(offsets, wanted):
                bad = int(np.flatnonzero(offsets != wanted)[0])
                self._lost(int(wanted[bad]), int(offsets[bad]),
                           "are missing from the broker's answer (deleted while being read?)")
        return batch


# -- batch ------------------------------------------------------------------------------------------------------
class CometBatchReader(DataSourceReader):
    """``spark.read.format("cometmq")``: the offsets between the starting and ending bounds, fixed at planning."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)

    def partitions(self) -> list[QueueSlice]:
        opts = self.opts
        with Link(opts.namesrv, timeout=opts.timeout, credentials=opts.credentials, tls=opts.tls) as link:
            queues = discover(link, opts, streaming=False)
            starts = resolve_bound(link, opts.starting, queues, missing=-2, strategy=opts.timestamp_strategy)
            ends = resolve_bound(link, opts.ending, queues, missing=-1, strategy="latest")
            backwards = [q for q in queues if starts[q] > ends[q]]
            if backwards:
                q = backwards[0]
                raise ValueError(f"{q.topic} {queue_key(q.broker_name, q.queue_id)}: the starting offset "
                                 f"{starts[q]} is past the ending offset {ends[q]} "
                                 f"(startingOffsets {opts.starting.describe()}, "
                                 f"endingOffsets {opts.ending.describe()})")
            starts = check_data_loss(starts, link.min_offsets(queues), fail=opts.fail_on_data_loss)
            ranges = [QueueRange(q, starts[q], ends[q]) for q in queues]
            return _slices(link, ranges, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when there is nothing to read
            return iter(())
        return read_slice(partition, self.arrow)


# -- streaming ----------------------------------------------------------------------------------------------------
class CometStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("cometmq")``.

    Offsets are ``{topic: {"broker:queueId": next offset}}``. Queues that appear later (new topics matching
    the pattern, queues added to a topic) start at offset 0. A queue of the offsets that the route no longer lists
    (its broker left the cluster, or the topic was deleted on it) keeps its offset, unread, until the route lists it
    again: reading then goes on from there. Spark writes each micro-batch's (start, end) to its checkpoint before
    running it, and :meth:`partitions` depends on nothing but that pair, so a restarted query reads exactly the
    ranges it had planned: no message twice, none skipped.
    """

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)
        self._link: Link | None = None
        self._target: dict[MessageQueue, int] | None = None
        #: when the last micro-batch was let through (minOffsetsPerTrigger / maxTriggerDelay); 0: never
        self._last_trigger = 0.0
        #: queues of the offsets that the route no longer lists (each warned of once), as of the last trigger
        self._away: set[MessageQueue] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_link"] = None
        return state

    @property
    def link(self) -> Link:
        if self._link is None or self._link.closed:
            self._link = Link(self.opts.namesrv, timeout=self.opts.timeout, credentials=self.opts.credentials,
                              tls=self.opts.tls)
        return self._link

    def initialOffset(self) -> dict[str, Any]:
        queues = discover(self.link, self.opts, streaming=True)
        start = resolve_bound(self.link, self.opts.starting, queues, missing=-1,
                              strategy=self.opts.timestamp_strategy)
        if self.opts.starting.kind == "offsets":  # (the other kinds resolve to offsets the queues have)
            ends = self.link.max_offsets(queues)
            past = [q for q in queues if start[q] > ends[q]]
            if past:
                q = past[0]
                raise OptionError(f"option startingOffsets: offset {start[q]} of {q.topic} "
                                  f"{queue_key(q.broker_name, q.queue_id)} is past the queue's end ({ends[q]})")
        return to_json(start)

    def _latest(self, known: dict[MessageQueue, int]) -> tuple[dict[MessageQueue, int], dict[MessageQueue, int]]:
        """(start with new queues at 0, each queue's end now). A queue of ``known`` the route no longer lists ends
        where it starts: :meth:`_note_away`."""
        queues = discover(self.link, self.opts, streaming=True)
        start = dict(known)
        for q in queues:
            start.setdefault(q, 0)
        self._note_away(known, set(queues))
        ends = self.link.max_offsets(sorted(set(start) - self._away, key=lambda q: (q.topic, q.broker_name,
                                                                                     q.queue_id)))
        return start, {**ends, **{q: start[q] for q in self._away}}

    def _note_away(self, known: dict[MessageQueue, int], routed: set[MessageQueue]) -> None:
        """The queues of ``known`` that the route no longer lists become :attr:`_away`: their broker left the
        cluster (stopped, its topic deleted on it; or the whole topic is gone). Asking it for offsets would fail
        every trigger, and dropping the queue would read it again from 0 if it came back; so its offset is kept
        and nothing is read from it. Being away is not data loss: when the route lists the queue again, reading
        goes on from the kept offset, under the usual data-loss rules (its end or first offset may have moved
        past it). One warning per queue each time it leaves. (A queue the options no longer select, after a
        restart with other options, is not away: it is read as before.)"""
        away = {q for q in known if q not in routed and selects(self.opts, q)}
        for q in sorted(away - self._away, key=lambda q: (q.topic, q.broker_name, q.queue_id)):
            log.warning("%s %s is no longer in the topic's route (broker %s left the cluster, or the topic was "
                        "deleted on it): keeping its offset %d and reading nothing from it; reading resumes from "
                        "there if the route lists it again", q.topic, queue_key(q.broker_name, q.queue_id),
                        q.broker_name, known[q])
        for q in sorted(self._away - away, key=lambda q: (q.topic, q.broker_name, q.queue_id)):
            if q in known:
                log.info("%s %s is in the topic's route again: reading resumes from offset %d", q.topic,
                         queue_key(q.broker_name, q.queue_id), known[q])
        self._away = away

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch. Spark passes back the read limit :meth:`getDefaultReadLimit` gave
        (PySpark has no composite limit, so the options' minOffsetsPerTrigger and maxOffsetsPerTrigger are both
        applied whenever the limit is not ReadAllAvailable), or ReadAllAvailable, which overrides them."""
        begin, latest = self._latest(from_json(start, "the checkpointed start offset"))
        if self._target is not None:
            latest = {q: min(off, self._target.get(q, begin[q])) for q, off in latest.items()}
        back = self._went_back(begin, latest)
        latest = {q: max(off, begin[q]) for q, off in latest.items()}
        if isinstance(limit, ReadAllAvailable):
            return to_json({**latest, **back})
        if not isinstance(limit, ReadMaxRows | ReadMinRows):
            log.warning("cometmq ignores the read limit %r", limit)
            return to_json({**latest, **back})
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else self.opts.min_offsets_per_trigger
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.opts.max_offsets_per_trigger
        # minOffsetsPerTrigger does not hold back an availableNow run: it would end it with data left unread
        # (Spark ends such a run when the source returns its start offset).
        if min_rows is not None and self._target is None and not back:
            now = time.time()
            if should_wait(begin, latest, min_rows, self.opts.max_trigger_delay, self._last_trigger, now):
                log.debug("fewer than minOffsetsPerTrigger=%d offsets waiting: no micro-batch yet", min_rows)
                return start
            self._last_trigger = now
        if max_rows is not None:
            latest = limit_rows(begin, latest, max_rows)
        return to_json({**latest, **back})

    def _went_back(self, begin: dict[MessageQueue, int], latest: dict[MessageQueue, int]) -> dict[MessageQueue, int]:
        """The queues whose end is now below the offset the stream has read up to: the topic was deleted and made
        again (its queues start at 0 again), or the broker lost messages. Waiting for such a queue to come back to
        the old offset would skip every message until then, unreported. That is data loss: an error with
        failOnDataLoss, else a warning, and those queues go on from their new ends (returned)."""
        back = {q: off for q, off in latest.items() if off < begin[q]}
        if not back:
            return back
        what = "; ".join(f"{q.topic} {queue_key(q.broker_name, q.queue_id)} from {begin[q]} to {off}"
                         for q, off in sorted(back.items(), key=lambda kv: (kv[0].topic, kv[0].broker_name,
                                                                             kv[0].queue_id)))
        msg = f"the end of queues went back (a topic deleted and created again, or messages the broker lost): {what}"
        if self.opts.fail_on_data_loss:
            raise DataLossError(f"{msg}. Set failOnDataLoss=false to go on from the queues' new ends.")
        log.warning("%s; going on from the queues' new ends", msg)
        return back

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)  # latestOffset applies the minimum too
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            queues = discover(self.link, self.opts, streaming=True)
            return to_json(self.link.max_offsets(queues))
        except Exception as exc:  # reporting only
            log.debug("latest offset for the progress report: %s", exc)
            return None

    def prepareForTriggerAvailableNow(self) -> None:
        queues = discover(self.link, self.opts, streaming=True)
        self._target = self.link.max_offsets(queues)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[QueueSlice]:
        begin = from_json(start, "the micro-batch's start offset")
        stop = from_json(end, "the micro-batch's end offset")
        moving = {q: begin.get(q, 0) for q, off in stop.items() if off > begin.get(q, 0)}
        if not moving:
            return []
        link = self.link
        queues = sorted(moving, key=lambda q: (q.topic, q.broker_name, q.queue_id))
        moving = check_data_loss(moving, link.min_offsets(queues), fail=self.opts.fail_on_data_loss)
        return _slices(link, [QueueRange(q, moving[q], stop[q]) for q in queues], self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueSlice):  # Spark's stand-in when there is nothing to read
            return iter(())
        return read_slice(partition, self.arrow)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.commit_to_group
        if group is None:
            return
        offsets = {q: off for q, off in from_json(end, "the committed offset").items() if q not in self._away}
        try:
            self.link.commit(group, offsets)
        except Exception as exc:  # reporting only: Spark's checkpoint holds the real progress
            log.warning("could not report offsets to group %s: %s", group, exc)

    def stop(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None

