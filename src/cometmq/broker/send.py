"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and CONSUMER_SEND_MSG_BACK (36)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import NoReturn

from cometmq.broker.appender import Appender, answer_code
from cometmq.broker.config import BrokerConfig
from cometmq.broker.groups import SubscriptionGroupManager
from cometmq.broker.send_hooks import SendContext, SendHooks, SendKind
from cometmq.broker.stats import BrokerStats, message_type, plain_message_type
from cometmq.broker.topics import (
    SCHEDULE_TOPIC,
    TopicConfigManager,
    check_send_allowed,
    check_topic_name,
    dlq_topic,
    retry_topic,
)
from cometmq.net.connection import RemotingConnection, eager_start
from cometmq.protocol.batch import decode_batch_raw
from cometmq.protocol.codes import RemotingError, RequestCode, ResponseCode
from cometmq.protocol.errors import ProtocolError, RemoteProtocolError
from cometmq.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    parse_bool,
    send_header_from_v2,
)
from cometmq.protocol.message import TRANSACTION_MASK, SysFlag, decode_record, pack_host
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.names import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX
from cometmq.protocol.properties import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    REAL_QID,
    REAL_TOPIC,
    RETRY_TOPIC,
    UNIQ_KEY,
    RawProperties,
    decode_properties,
    encode_properties,
)
from cometmq.protocol.remoting import RemotingCommand, make_response
from cometmq.protocol.route import perm_writable
from cometmq.protocol.transaction_batch import HALF_BATCH_FIELD, PACKED_HALF, PACKED_PROPERTY
from cometmq.store.batch_codec import offset_msg_ids, plain_batch_messages
from cometmq.store.message import MessageInner
from cometmq.store.status import PutResult
from cometmq.timer.message import TIMER_SRC_PHY, TIMER_TOPIC

log = logging.getLogger(__name__)

#: Property names (with the name/value separator where a longer name could end in them) whose presence needs
#: the per-message delay (DELAY), timer (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_OUT_MS)
#: and transaction (TRAN_MSG) checks of a send.
_SPECIAL_MARKERS = (b"DELAY\x01", b"TIMER_", b"TRAN_MSG\x01")
_SPECIAL_MARKERS_STR = tuple(m.decode("ascii") for m in _SPECIAL_MARKERS)
_SPECIAL_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})
# _single_message and _batch_messages build MessageInner positionally: fail at import if its fields ever move.
if [f.name for f in fields(MessageInner)][:10] != ["topic", "body", "queue_id", "properties", "properties_raw", "flag",
                                                   "sys_flag", "born_timestamp", "born_host", "reconsume_times"]:
    raise RuntimeError("MessageInner's fields changed: update SendProcessor._batch_messages")


def _flag(raw: str) -> bool:
    try:
        return parse_bool(raw)
    except ValueError:
        raise RemoteProtocolError(f"{HALF_BATCH_FIELD} {raw!r} is not a boolean") from None


def born_host_of(conn: RemotingConnection) -> bytes:
    """The peer as a record's BORNHOST: 8 bytes for an IPv4 peer, 20 for an IPv6 one. The store sets the sys
    flag's BORNHOST_V6 bit from the width, as RocketMQ's CommitLog does from the address."""
    cached = conn.attributes.get("born_host")
    if cached is None:
        host, _, port = conn.remote_address.rpartition(":")
        try:
            cached = pack_host(host.strip("[]"), int(port))
        except (ProtocolError, ValueError):
            cached = b"\x7f\x00\x00\x01\x00\x00\x00\x00"  # not an IP peer (in-process): 127.0.0.1:0
        conn.attributes["born_host"] = cached
    return cached


class SendProcessor:
    def __init__(self, config: BrokerConfig, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 appender: Appender, hooks: SendHooks, *, read_record: Callable[[int], memoryview | None],
                 store_host: Callable[[], bytes], stats: BrokerStats | None = None) -> None:
        self.config = config
        #: None: metrics are off, nothing is counted
        self.stats = stats
        self.topics = topics
        self.groups = groups
        self.appender = appender
        self.hooks = hooks
        self._read_record = read_record
        self._store_host = store_host
        self._id_host: bytes | None = None
        self._id_prefix: str | None = None

    @eager_start
    async def send(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        # V2 (310, and 320 as Java sends batches) shortens keys to letters; accept either form on any code.
        # A bad header raises RemoteProtocolError, answered MESSAGE_ILLEGAL at the dispatch (codes.py).
        if cmd.code == RequestCode.SEND_MESSAGE_V2 or ("b" in cmd.ext_fields and "topic" not in cmd.ext_fields):
            header = send_header_from_v2(cmd.ext_fields)
        else:
            header = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        config = self.config
        if not perm_writable(config.broker_permission):
            self._not_writable()
        check_send_allowed(header.topic)  # the broker's own topics: its appender writes them, clients may not
        batch = header.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        if batch and header.topic.startswith(RETRY_TOPIC_PREFIX):  # (RocketMQ's sendBatchMessage)
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"a batch cannot be sent to retry topic {header.topic}")
        topic_cfg = self.topics.topic_for_send(header.topic, header.default_topic, header.default_topic_queue_nums,
                                               conn.remote_address)
        if not perm_writable(topic_cfg.perm):
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the topic {header.topic} is not writable")
        queue_id = header.queue_id
        if queue_id < 0:  # (clients pick a queue; random is imported for the rare request that does not)
            from random import randrange

            queue_id = randrange(topic_cfg.write_queue_nums)
        elif queue_id >= topic_cfg.write_queue_nums:
            raise RemotingError(ResponseCode.SYSTEM_ERROR,
                                f"queueId {queue_id} is out of range: {header.topic} has {topic_cfg.write_queue_nums}"
                                " write queues")
        born_host = born_host_of(conn)
        half_batch = False
        asked = cmd.ext_fields.get(HALF_BATCH_FIELD) if batch else None
        if asked == PACKED_HALF:
            # cometmq's packed half: the batch body is one half's body, the header's properties its own (sent as a
            # batch so that a broker without the extension refuses it); the transaction hook checks and stores it
            msgs, plain, batch = [self._single_message(header, cmd.body, queue_id, born_host)], False, False
            if PACKED_PROPERTY not in msgs[0].properties:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"a packed half ({HALF_BATCH_FIELD}={PACKED_HALF})"
                                    f" needs the property {PACKED_PROPERTY}")
        elif batch:
            # cometmq's batch of transaction halves: the transaction hook checks and stores it
            half_batch = asked is not None and _flag(asked)
            msgs, plain = self._batch_messages(header, cmd.body, queue_id, born_host, half_batch)
            plain = plain and asked is None
        else:
            props = header.properties
            plain = header.sys_flag & TRANSACTION_MASK == 0 and header.topic not in _SPECIAL_TOPICS and not any(
                marker in props for marker in _SPECIAL_MARKERS_STR)
            msgs = [self._single_message(header, cmd.body, queue_id, born_host, plain)]
        topic = header.topic
        retry = topic.startswith(RETRY_TOPIC_PREFIX)
        if retry:
            for m in msgs:
                self._retry_or_dlq(m, header)
        stats = self.stats
        if plain:
            # No message names a delay, timer or transaction property, the send is no prepared half and goes to
            # no schedule or timer topic: the per-message checks below could not change anything.
            result = await self.appender.put(msgs)
            if stats is not None and not retry and not topic.startswith(DLQ_TOPIC_PREFIX):
                stats.put(topic, plain_message_type(header.properties), result)
            return self._response(cmd, result, queue_id)
        for m in msgs:
            if TIMER_SRC_PHY in m.properties:
                # Only the timer's own copies may name the timer record they were put from: crash recovery and a
                # replica skip the record a copy names. A producer's (a consumed timer message forwarded as it is,
                # maybe from another broker) is dropped, not believed.
                del m.edit_properties()[TIMER_SRC_PHY]
        # The send hooks (send_hooks.py): a transaction's half, a delay level, a timer message.
        ctx = SendContext(SendKind.SEND, header.producer_group, batch, half_batch)
        self.hooks.before_put(msgs, ctx)
        result = await self.appender.put(msgs, ctx.on_stored)
        self.hooks.after_put(msgs, result, ctx)
        if stats is not None and not retry and not topic.startswith(DLQ_TOPIC_PREFIX):
            stats.put(topic, message_type(header.properties, header.sys_flag), result)
        response = self._response(cmd, result, queue_id)
        if ctx.response_ext and response.code == ResponseCode.SUCCESS:
            response.ext_fields.update(ctx.response_ext)
        return response

    def _not_writable(self) -> NoReturn:
        raise RemotingError(ResponseCode.NO_PERMISSION, f"the broker {self.config.broker_name} is not writable")

    def _single_message(self, header: SendMessageRequestHeader, body: bytes, queue_id: int,
                        born_host: bytes, plain: bool = False) -> MessageInner:
        try:
            raw = header.properties.encode("utf-8")
            props: Mapping[str, str] = RawProperties(raw) if plain else decode_properties(raw)
        except (ProtocolError, UnicodeEncodeError) as exc:  # name the part; the dispatch picks the code
            raise RemoteProtocolError(f"bad properties: {exc}") from None
        return MessageInner(header.topic, body, queue_id, props, raw, header.flag, header.sys_flag,
                            header.born_timestamp, born_host, header.reconsume_times)

    def _batch_messages(self, header: SendMessageRequestHeader, body: bytes, queue_id: int,
                        born_host: bytes, keep_raw: bool = False) -> tuple[list[MessageInner], bool]:
        """The batch's messages, and whether it is plain: not a prepared transaction, and no delay, timer or
        transaction property in any of them (a byte search of each item's properties for the property names,
        which a name ending in one or a value holding one also hits: that only costs the per-message checks).
        ``keep_raw``: keep the properties encoded even so (a half batch: the transaction hook reads a few and
        appends its own, transaction/messages.py)."""
        sys_flag = header.sys_flag
        # A batch is one write of at most maxMessageSize bytes (as RocketMQ's batch encoder checks), its inflated
        # size included: a small compressed body must not inflate to gigabytes in the broker's memory.
        limit = self.config.store.max_message_size
        if len(body) > limit:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                                f"the batch body of {len(body)} bytes exceeds maxMessageSize {limit}")
        if sys_flag & SysFlag.COMPRESSED:
            try:
                inflater = zlib.decompressobj()
                body = inflater.decompress(body, limit + 1)
            except zlib.error as exc:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, f"compressed batch does not inflate: {exc}") from None
            if len(body) > limit:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL,
                                    f"the compressed batch inflates to more than maxMessageSize {limit} bytes")
            if not inflater.eof:
                raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "compressed batch does not inflate: truncated")
            sys_flag &= ~SysFlag.COMPRESSED
        if type(body) is not bytes:
            body = bytes(body)
        plain = sys_flag & TRANSACTION_MASK == 0 and header.topic not in _SPECIAL_TOPICS
        try:
            topic, born_ts, born_at, reconsume = header.topic, header.born_timestamp, born_host, header.reconsume_times
            msgs = None
            if plain or keep_raw:
                # Nothing will rewrite these messages: their properties stay encoded (RawProperties), checked as
                # UTF-8 but not decoded into a dict each; one C call when built (store/batch_codec.py). A half
                # batch's items all hold TRAN_MSG: no marker search.
                msgs = plain_batch_messages(body, topic, queue_id, sys_flag, born_ts, born_at, reconsume,
                                            () if keep_raw else _SPECIAL_MARKERS)
            if msgs is None:
                plain = False
                # Positional arguments (checked against MessageInner's fields at import): half the cost of keywords.
                msgs = [MessageInner(topic, item_body, queue_id, decode_properties(raw), raw, flag, sys_flag,
                                     born_ts, born_at, reconsume) for item_body, raw, flag in decode_batch_raw(body)]
        except ProtocolError as exc:  # name the part; the dispatch picks the code
            raise RemoteProtocolError(f"bad batch body: {exc}") from None
        if not msgs:
            raise RemotingError(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
        return msgs, plain

    def _retry_or_dlq(self, m: MessageInner, header: SendMessageRequestHeader) -> None:
        """A client sending straight to a retry topic (Java's ``sendMessageBack`` fallback): past the
        group's limit the message goes to the DLQ instead."""
        group = m.topic[len(RETRY_TOPIC_PREFIX):]
        cfg = self.groups.find(group)
        limit = header.max_reconsume_times if header.max_reconsume_times is not None else (
            cfg.retryMaxTimes if cfg else self.config.max_reconsume_times)
        if m.reconsume_times >= limit:
            dlq = dlq_topic(group)
            self.topics.create_system_topic(dlq, 1)
            if self.stats is not None:
                self.stats.to_dlq(group, m.properties.get(RETRY_TOPIC) or m.topic)
            m.topic, m.queue_id = dlq, 0

    def msg_id_prefix(self) -> str:
        """The store host's part of the records' offset msgIds (protocol/msgid's ``offset_msg_id`` without the
        16 hex digits of the offset)."""
        store_host = self._store_host()
        prefix = self._id_prefix
        if prefix is None or self._id_host != store_host:
            self._id_host, prefix = store_host, offset_msg_id(store_host, 0)[:-16]
            self._id_prefix = prefix
        return prefix

    def _response(self, cmd: RemotingCommand, result: PutResult, queue_id: int) -> RemotingCommand:
        code = answer_code(result)
        prefix = self.msg_id_prefix()
        # offset_msg_id's layout (host hex + 16 hex digits of the offset), written for all records at once
        first = result.records[0]
        ext = {"msgId": offset_msg_ids(prefix, result.records), "queueId": str(queue_id),
               "queueOffset": str(first.queue_offset), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return make_response(cmd, code, None, ext)

    # -- CONSUMER_SEND_MSG_BACK ---------------------------------------------------------------------------
    def record_topic(self, offset: int) -> str | None:
        """The topic of the record at commit-log ``offset`` (None when none starts there): what the broker's ACL
        checks a send-back that names no originTopic on (acl.policy.send_back_needs)."""
        view = self._read_record(offset)
        if view is None:
            return None
        try:  # the CRC: an offset inside a body that holds a made-up record header names no message
            return decode_record(view, check_crc=True)[0].topic
        except ProtocolError:
            return None

    async def send_back(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand:
        header = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)  # a bad header: answered at the dispatch
        cfg = self.groups.require(header.group)
        if not perm_writable(self.config.broker_permission):  # (RocketMQ's order of checks)
            self._not_writable()
        if cfg.retryQueueNums <= 0:  # the group takes no retries: the message is dropped, as RocketMQ does
            return make_response(cmd, ResponseCode.SUCCESS)
        view = self._read_record(header.offset)
        if view is None:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"no message at commit-log offset {header.offset}")
        checked = self.config.acl_enable or bool(header.origin_topic)
        try:
            # checked (below) the body CRC too: a user may publish a body holding a made-up record header (of a topic
            # it may read, with a body length running over the next records) and name the offset of that header
            rec, _ = decode_record(view, check_crc=checked)
        except ProtocolError as exc:
            raise RemotingError(ResponseCode.NO_PERMISSION if checked else ResponseCode.SYSTEM_ERROR,
                                f"no message at commit-log offset {header.offset}: {exc}") from None
        props = dict(rec.properties)
        if header.origin_topic and header.origin_topic not in (rec.topic, props.get(RETRY_TOPIC)):
            # an ACL (the broker's, or a gRPC endpoint's in front of it, whose ForwardMessageToDeadLetterQueue names
            # the receipt handle's topic and offset, both client-written) checked the request's originTopic: the
            # offset must name a message of that topic, else any message of the log could be copied into the
            # caller's own retry or dead-letter topic and read there. (RocketMQ does not check this.) Without one
            # (the 4.x C++ client), the broker's ACL checked the topic of this record (``record_topic``).
            raise RemotingError(ResponseCode.NO_PERMISSION, f"the message at commit-log offset {header.offset} is "
                                                            f"not one of topic {header.origin_topic}")
        props.setdefault(RETRY_TOPIC, rec.topic)
        origin = header.origin_msg_id or props.get(ORIGIN_MESSAGE_ID) or props.get(UNIQ_KEY) or offset_msg_id(
            self._store_host(), header.offset)
        props[ORIGIN_MESSAGE_ID] = origin
        max_times = header.max_reconsume_times if header.max_reconsume_times is not None else cfg.retryMaxTimes
        delay_level = header.delay_level
        if rec.reconsume_times >= max_times or delay_level < 0:
            topic = dlq_topic(header.group)
            self.topics.create_system_topic(topic, 1)
            queue_id = 0
            props.pop(DELAY, None)
        else:
            topic = retry_topic(header.group)
            retry_cfg = self.topics.create_system_topic(topic, cfg.retryQueueNums)
            if not perm_writable(retry_cfg.perm):
                raise RemotingError(ResponseCode.NO_PERMISSION, f"the topic {topic} is not writable")
            from random import randrange  # (imported at the first send-back: an idle broker does not hold it)

            queue_id = randrange(retry_cfg.write_queue_nums)
            if delay_level == 0:
                delay_level = 3 + rec.reconsume_times
            props[DELAY] = str(min(delay_level, len(self.config.message_delay_level)))
        props.pop(REAL_TOPIC, None)
        props.pop(REAL_QID, None)
        props.pop(TIMER_SRC_PHY, None)  # a retry is no copy put by the timer (a replica would keep its name for good)
        props[MAX_RECONSUME_TIMES] = str(max_times)
        msg = MessageInner(topic=topic, body=rec.body, queue_id=queue_id, properties=props,
                           properties_raw=encode_properties(props), flag=rec.flag, sys_flag=rec.sys_flag,
                           born_timestamp=rec.born_timestamp, born_host=pack_host(*rec.born_host),
                           reconsume_times=rec.reconsume_times + 1)
        ctx = SendContext(SendKind.SEND_BACK)
        self.hooks.before_put([msg], ctx)
        result = await self.appender.put([msg])
        self.hooks.after_put([msg], result, ctx)
        if not result.ok:  # as before: a send-back that is not durable in time is an error to the consumer
            answer_code(result)
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{result.status.value}: {result.remark}")
        if self.stats is not None:
            if topic.startswith(DLQ_TOPIC_PREFIX):
                self.stats.to_dlq(header.group, props[RETRY_TOPIC])
            else:
                self.stats.to_retry(header.group, props[RETRY_TOPIC])
        return make_response(cmd, ResponseCode.SUCCESS)


__all__ = ["SCHEDULE_TOPIC", "SendProcessor", "born_host_of", "check_topic_name"]
