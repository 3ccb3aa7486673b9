"""Messages as users write and read them."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from cometmq.client.errors import InvalidArgumentError
from cometmq.common.native import load_c_helper
from cometmq.protocol.client_bodies import MessageQueue
from cometmq.protocol.message import (
    DEFAULT_MAX_INFLATED_BODY,
    MessageRecord,
    SysFlag,
    host_string,
    inflate_body,
    pack_host,
)
from cometmq.protocol.msgid import offset_msg_id
from cometmq.protocol.properties import (
    DELAY,
    KEYS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    RETRY_TOPIC,
    TAGS,
    TIMER_DELAY_MS,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    encode_properties,
)

__all__ = ["Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus"]

#: property names a user property may not have (a Message field or the producer writes them)
RESERVED_PROPERTIES = frozenset({TAGS, KEYS, UNIQ_KEY, DELAY, "WAIT", TIMER_DELIVER_MS, TIMER_DELAY_MS,
                                 "TIMER_DELAY_SEC"})
_RESERVED = RESERVED_PROPERTIES
_SEPARATORS = frozenset(NAME_VALUE_SEPARATOR + PROPERTY_SEPARATOR)


@dataclass
class Message:
    """A message to send. ``keys`` index it for lookups; ``tags`` let consumers filter on the broker.

    Scheduling: ``delay_level`` (4.x levels, 1 = 1 s … 18 = 2 h), or ``deliver_at`` (epoch ms) / ``delay``
    (seconds) for RocketMQ 5 timer messages with any delay.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    deliver_at: int | None = None
    delay: float | None = None
    flag: int = 0

    def __post_init__(self) -> None:
        if type(self.body) is bytes:  # the usual body: nothing to check
            return
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"message body must be bytes, not {type(self.body).__name__}")

    @property
    def key_list(self) -> list[str]:
        if self.keys is None:
            return []
        if isinstance(self.keys, str):
            return [k for k in self.keys.split(" ") if k]
        return [k for k in self.keys if k]

    def wire_properties(self, uniq_key: str) -> dict[str, str]:
        """The properties as sent: user properties plus TAGS, KEYS, UNIQ_KEY, WAIT and scheduling keys."""
        props = self._leading_properties()
        props[UNIQ_KEY] = uniq_key
        props["WAIT"] = "true"
        if self.delay_level:
            if type(self.delay_level) is not int:
                raise InvalidArgumentError(f"delay_level must be an int (a 4.x level), not {self.delay_level!r}")
            props[DELAY] = str(self.delay_level)
        if self.deliver_at is not None:
            props[TIMER_DELIVER_MS] = str(int(self.deliver_at))
        elif self.delay is not None:
            props[TIMER_DELIVER_MS] = str(int(time.time() * 1000 + self.delay * 1000))
        return props

    def _leading_properties(self) -> dict[str, str]:
        """The wire properties that come before UNIQ_KEY: user properties, TAGS and KEYS."""
        props: dict[str, str] = {}
        for k, v in self.properties.items():
            if k in _RESERVED:
                raise InvalidArgumentError(f"property {k!r} is reserved: use the Message field for it")
            props[k] = str(v)
        if self.tags:
            props[TAGS] = self.tags
        keys = self.key_list
        if keys:
            props[KEYS] = " ".join(keys)
        for k, v in props.items():  # (the wire's separators would cut the record's properties wrong)
            if type(k) is not str or not k or _SEPARATORS.intersection(k) or _SEPARATORS.intersection(v):
                raise InvalidArgumentError(f"property {k!r} = {v[:40]!r}: a name or value may not hold a separator "
                                           f"(\\x01, \\x02), and a name is a non-empty str")
        return props

    @property
    def plain(self) -> bool:
        """No properties, tags, keys or scheduling: the wire properties are UNIQ_KEY and WAIT alone."""
        return not self.properties and not self.tags and not self.keys and not self.delay_level \
            and self.deliver_at is None and self.delay is None

    def batch_properties_head(self) -> bytes:
        """The encoded wire properties before UNIQ_KEY, for a batch item (which holds no scheduling keys):
        the item's properties are this + ``UNIQ_KEY\x01<key>\x02WAIT\x01true\x02``, as
        ``encode_properties(wire_properties(key))`` gives."""
        if not self.properties and not self.tags and not self.keys:
            return b""
        return encode_properties(self._leading_properties())


def properties_text(msg: Message, uniq_key: str) -> str:
    """``encode_properties(msg.wire_properties(uniq_key))`` as text (a send header's ``properties``), with the
    common plain message written straight out."""
    if msg.plain:
        return f"UNIQ_KEY\x01{uniq_key}\x02WAIT\x01true\x02"
    return encode_properties(msg.wire_properties(uniq_key)).decode("utf-8")


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    #: a timer message's handle for ``Producer.recall`` (None for other messages)
    recall_handle: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


def send_results_py(status: SendStatus, msg_ids: Sequence[str], offset_msg_ids: Sequence[str], queue: MessageQueue,
                    first_offset: int) -> list[SendResult]:
    """A batch's results (message ``i``: ``msg_ids[i]``, ``offset_msg_ids[i]`` or "", offset ``first_offset + i``,
    no recall handle), equal to ``SendResult(...)`` built one by one at a third of the cost: a frozen
    dataclass's ``__init__`` goes through ``object.__setattr__`` per field, here the slots are set directly.
    The reference of the C helper's ``send_results`` (:data:`send_results` is that one when it is built)."""
    new = object.__new__
    set_status, set_id, set_offset_id, set_queue, set_offset, set_recall = _SEND_RESULT_SLOTS
    results: list[SendResult] = []
    add = results.append
    n_offset_ids = len(offset_msg_ids)
    offset = first_offset
    for i, msg_id in enumerate(msg_ids):
        r = new(SendResult)
        set_status(r, status)
        set_id(r, msg_id)
        set_offset_id(r, offset_msg_ids[i] if i < n_offset_ids else "")
        set_queue(r, queue)
        set_offset(r, offset)
        set_recall(r, None)
        add(r)
        offset += 1
    return results


_SEND_RESULT_FIELDS = ("status", "msg_id", "offset_msg_id", "queue", "queue_offset", "recall_handle")
_SEND_RESULT_SLOTS = tuple(SendResult.__dict__[f.name].__set__ for f in fields(SendResult))
if tuple(f.name for f in fields(SendResult)) != _SEND_RESULT_FIELDS:
    raise RuntimeError("SendResult's fields changed: update send_results")


def send_result(status: SendStatus, msg_id: str, offset_msg_id: str, queue: MessageQueue, queue_offset: int,
                recall_handle: str | None) -> SendResult:
    """``SendResult(...)``, with the slots set directly (see :func:`send_results_py`): one send's result."""
    r = object.__new__(SendResult)
    set_status, set_id, set_offset_id, set_queue, set_offset, set_recall = _SEND_RESULT_SLOTS
    set_status(r, status)
    set_id(r, msg_id)
    set_offset_id(r, offset_msg_id)
    set_queue(r, queue)
    set_offset(r, queue_offset)
    set_recall(r, recall_handle)
    return r


def _bound_c_helper() -> Any:
    """protocol/_batchenc.c bound to SendResult's slots, or None (not built, or COMETMQ_PURE_PYTHON)."""
    helper = load_c_helper("cometmq.protocol._batchenc")
    if helper is not None:
        helper.bind_results(SendResult, _SEND_RESULT_FIELDS)
    return helper


_C_RESULTS: Any = _bound_c_helper()


def _send_results_c(status: SendStatus, msg_ids: Sequence[str], offset_msg_ids: Sequence[str], queue: MessageQueue,
                    first_offset: int) -> list[SendResult]:
    if type(msg_ids) is list and type(offset_msg_ids) is list and type(first_offset) is int \
            and -(2**62) < first_offset < 2**62:
        results: list[SendResult] = _C_RESULTS.send_results(status, msg_ids, offset_msg_ids, queue, first_offset)
        return results
    return send_results_py(status, msg_ids, offset_msg_ids, queue, first_offset)


#: a batch's results: one C call when the helper is built, else :func:`send_results_py`
send_results = _send_results_c if _C_RESULTS is not None else send_results_py


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A received message."""

    topic: str
    body: bytes
    properties: Mapping[str, str]
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    commit_log_offset: int
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(KEYS, "").split(" ") if k]

    @classmethod
    def from_record(cls, rec: MessageRecord, broker_name: str, *,
                    max_inflated_body_size: int = DEFAULT_MAX_INFLATED_BODY) -> MessageExt:
        """The message of a stored record. A COMPRESSED body is inflated when it inflates to at most
        ``max_inflated_body_size`` bytes, and its COMPRESSED bit cleared (as RocketMQ's MessageDecoder does); else it
        stays as stored, the bit set: ``sys_flag`` says whether ``body`` is still compressed."""
        body = rec.body
        sys_flag = rec.sys_flag
        if sys_flag & SysFlag.COMPRESSED:
            inflated = inflate_body(body, max_inflated_body_size)
            if inflated is not None:
                body = inflated
                sys_flag &= ~SysFlag.COMPRESSED
        topic = rec.topic
        retry_of = rec.properties.get(RETRY_TOPIC)
        if retry_of and topic.startswith("%RETRY%"):
            topic = retry_of
        offset_id = offset_msg_id(pack_host(*rec.store_host), rec.physical_offset)
        values = (topic, body, rec.properties, rec.properties.get(UNIQ_KEY) or offset_id, offset_id,
                  MessageQueue(rec.topic, broker_name, rec.queue_id), rec.queue_offset, rec.physical_offset,
                  rec.born_timestamp, rec.store_timestamp, host_string(rec.born_host), host_string(rec.store_host),
                  rec.reconsume_times, int(sys_flag), rec.flag)
        if cls is not MessageExt:
            return cls(*values)
        # What the frozen dataclass's __init__ does, without an object.__setattr__ call per field.
        ext = object.__new__(MessageExt)
        for set_slot, value in zip(_MESSAGE_EXT_SLOTS, values, strict=True):
            set_slot(ext, value)
        return ext


_MESSAGE_EXT_SLOTS = tuple(MessageExt.__dict__[f.name].__set__ for f in fields(MessageExt))
