"""The broker's fast path for the most common request: one plain message in one SEND_MESSAGE_V2 (or in one
SEND_MESSAGE, the C++ client's single send).

A lone producer's send used to go through the frame decoder (a RemotingCommand, its header dict), the dispatcher,
two coroutines (``_serve`` and ``SendProcessor.send``), the generated V2 header parser, the append batcher's
future, a reply RemotingCommand and its JSON encoding: about 180 Python calls. ``SendFastPath`` is offered each
chunk a server connection receives (``connection.FastPath``) and serves each send in one straight call: the frame
and its header read in one step (protocol/send_v2.py, C when built), the checks of ``SendProcessor.send`` on its
plain path, one ``Appender.put_now`` (the result itself when the write is durable at once: no future), the stats,
and the reply written as bytes from a template (the same for both codes). A chunk of several frames (concurrent
sends on one connection) is served frame by frame from its start while the path takes them; the rest goes to the
generic path.

It takes only what the generic path would serve the same way, and leaves everything else (a frame it leaves
is untouched) to it: any frame ``decode_send_v2`` does not take, a broker or topic that is not writable, a
topic that is not configured yet (auto-creation), reserved, a retry, DLQ, schedule or timer topic, a queue id out
of range, a transaction, delay or timer property (the send hooks), a property set that is not UTF-8. The server
offers chunks to it only with access control off (the ACL check wraps the handler table), and it serves them only
while the server's handler table holds the send handler it was made with. Once it has appended,
it answers whatever happens, as ``RemotingConnection._serve`` would: a refusal with its code and remark, a bug
with SYSTEM_ERROR. A write that must wait to be durable (SYNC_FLUSH, replicas) is answered from a task.
tests/broker/test_send_fast.py checks that both paths store the same records and answer the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from cometmq.broker.appender import answer_code
from cometmq.broker.send import _SPECIAL_MARKERS_STR, _SPECIAL_TOPICS, SendProcessor, born_host_of
from cometmq.broker.stats import FIFO, NORMAL, SHARDING_KEY_MARKER
from cometmq.broker.topics import NOT_ALLOWED_SEND_TOPICS, check_topic_name
from cometmq.common.memo import remember
from cometmq.net.connection import Dispatcher, RemotingConnection
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.message import TRANSACTION_MASK
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.properties import RawProperties
from cometmq.protocol.remoting import DEFAULT_VERSION, RESPONSE_FLAG, RemotingCommand, encode, take_frames
from cometmq.protocol.route import PERM_WRITE
from cometmq.protocol.send_v2 import decode_send_v2
from cometmq.store.commitlog import CommitLog
from cometmq.store.message import MessageInner
from cometmq.store.status import PutResult, PutStatus

log = logging.getLogger(__name__)

#: send.py's markers of a message the send hooks handle (unpacked: a fourth one must be added here too)
_DELAY, _TIMER, _TRAN = _SPECIAL_MARKERS_STR
_CODES = (int(RequestCode.SEND_MESSAGE_V2), int(RequestCode.SEND_MESSAGE))
_SUCCESS = int(ResponseCode.SUCCESS)
_PUT_OK = PutStatus.PUT_OK
_SHARDING_KEY = SHARDING_KEY_MARKER
_PREFIX = struct.Struct(">II")
#: the answer ``SendProcessor._response`` builds for one record, as protocol/remoting.py encodes it: code, opaque,
#: msgId prefix, commit-log offset, queue id, queue offset
_ANSWER = (b'{"code":%d,"language":"PYTHON","version":' + str(DEFAULT_VERSION).encode() + b',"opaque":%d,"flag":'
           + str(RESPONSE_FLAG).encode() + b',"extFields":{"msgId":"%s%016X","queueId":"%d","queueOffset":"%d",'
           b'"MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"serializeTypeCurrentRPC":"JSON"}')
#: topic names known to pass ``check_topic_name`` and to be none the fast path leaves alone (bounded)
_NAMES_MAX = 4096


class SendFastPath:
    """A ``connection.FastPath`` serving a lone single plain SEND_MESSAGE_V2 or SEND_MESSAGE for ``processor``."""

    def __init__(self, processor: SendProcessor, commitlog: CommitLog, table: Dispatcher) -> None:
        self._proc = processor
        self._commitlog = commitlog
        #: the server's handler table, and the send handler it holds now for each code: the fast path serves a code
        #: only while the table still names that handler (the table is read on every request; whoever replaces it
        #: gets them all)
        self._table = table
        self._handlers = {code: table.get(code) for code in _CODES}
        self._names: set[str] = set()
        #: the store host the msgId prefix was made for, and the prefix (``SendProcessor.msg_id_prefix``) as bytes
        self._host = b""
        self._prefix = b""

    def __call__(self, conn: RemotingConnection, data: bytes) -> int:
        """Serve the chunk's whole frames from its start while each is one this path takes; how many bytes it
        took. The rest (from the first frame it does not take, or a partial frame) goes to the generic path, in
        order: the frames it serves are appended before any later one."""
        return take_frames(data, lambda frame: self._serve(conn, frame))

    def _serve(self, conn: RemotingConnection, data: bytes) -> bool:
        req = decode_send_v2(data, conn.max_frame_size)
        if req is None:
            return False
        code, opaque, topic, queue_id, sys_flag, born_ts, flag, props, reconsume, body = req
        if self._table.get(code) is not self._handlers[code]:
            return False
        proc = self._proc
        if topic not in self._names and not self._plain_name(topic):
            return False
        cfg = proc.topics.topics.get(topic)
        if (cfg is None or not cfg.perm & PERM_WRITE or not proc.config.broker_permission & PERM_WRITE
                or queue_id >= cfg.write_queue_nums or cfg.write_queue_nums <= 0 or sys_flag & TRANSACTION_MASK
                or _DELAY in props or _TIMER in props or _TRAN in props):
            return False  # (the send hooks' business)
        try:
            raw = props.encode("utf-8")
        except UnicodeEncodeError:
            return False
        observer = conn.observer
        start = time.perf_counter_ns() if observer is not None else 0
        if queue_id < 0:  # (clients pick a queue; random is imported for the rare request that does not)
            from random import randrange

            queue_id = randrange(cfg.write_queue_nums)
        born_host = conn.attributes.get("born_host")
        if born_host is None:
            born_host = born_host_of(conn)
        msg = MessageInner(topic, body, queue_id, RawProperties(raw), raw, flag, sys_flag, born_ts, born_host,
                           reconsume)
        try:
            result = proc.appender.put_now([msg])
        except Exception as exc:
            self._failed(conn, code, opaque, start, exc)
            return True
        if isinstance(result, PutResult):
            self._answer(conn, code, opaque, topic, props, queue_id, result, start)
        else:
            conn.start_handler_task(self._answer_later(conn, code, opaque, topic, props, queue_id, result, start))
        return True

    def _plain_name(self, topic: str) -> bool:
        """Whether ``topic`` is a legal name the fast path may serve (not reserved, retry, DLQ, schedule or
        timer); remembered when it is."""
        if topic in NOT_ALLOWED_SEND_TOPICS or topic in _SPECIAL_TOPICS or topic.startswith("%"):
            return False
        try:
            check_topic_name(topic)
        except RemotingError:
            return False
        remember(self._names, topic, _NAMES_MAX)
        return True

    def _answer(self, conn: RemotingConnection, request_code: int, opaque: int, topic: str, props: str, queue_id: int,
                result: PutResult, start: int) -> None:
        try:
            stats = self._proc.stats
            if stats is not None:
                stats.put(topic, FIFO if _SHARDING_KEY in props else NORMAL, result)  # (plain_message_type)
            code = _SUCCESS if result.status is _PUT_OK else answer_code(result)
            host = self._commitlog.store_host
            if host is not self._host:
                self._host, self._prefix = host, offset_msg_id(host, 0)[:-16].encode("ascii")
            rec = result.records[0]
            header = _ANSWER % (code, opaque, self._prefix, rec.phy_offset, queue_id, rec.queue_offset)
        except RemotingError as exc:
            self._reply(conn, request_code, opaque, start, exc.code, exc.remark)
            return
        except Exception as exc:
            self._failed(conn, request_code, opaque, start, exc)
            return
        observer = conn.observer
        if observer is not None:
            observer(request_code, code, time.perf_counter_ns() - start, False)
        conn.send_frame(_PREFIX.pack(len(header) + 4, len(header)) + header, code, opaque)

    async def _answer_later(self, conn: RemotingConnection, request_code: int, opaque: int, topic: str, props: str,
                            queue_id: int, waiting: asyncio.Future[PutResult], start: int) -> None:
        try:
            result = await waiting
        except Exception as exc:
            self._failed(conn, request_code, opaque, start, exc)
            return
        self._answer(conn, request_code, opaque, topic, props, queue_id, result, start)

    def _failed(self, conn: RemotingConnection, request_code: int, opaque: int, start: int, exc: Exception) -> None:
        # as RemotingConnection._serve answers a handler's bug
        log.exception("handler for request code %d from %s failed", request_code, conn.remote_address, exc_info=exc)
        self._reply(conn, request_code, opaque, start, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _reply(conn: RemotingConnection, request_code: int, opaque: int, start: int, code: int,
               remark: str | None) -> None:
        """An answer with no fields (an error), encoded as ``make_response`` and the codec would."""
        reply = RemotingCommand(int(code), "PYTHON", DEFAULT_VERSION, opaque, RESPONSE_FLAG, remark)
        observer = conn.observer
        if observer is not None:
            observer(request_code, reply.code, time.perf_counter_ns() - start, False)
        conn.send_frame(encode(reply), reply.code, opaque)
