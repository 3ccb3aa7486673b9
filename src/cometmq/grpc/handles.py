"""Opaque strings the endpoint hands to clients and reads back: receipt handles and transaction ids.

Both carry everything the remoting request they lead to needs, so the endpoint keeps no table of them and a
restarted (or another) proxy still understands them.

* A receipt handle names one delivery of one message: the broker that popped it, the topic, the POP
  "extra info" (which itself holds the queue, the queue offset and the pop time) and the message's commit-log
  offset (for CONSUMER_SEND_MSG_BACK when it is forwarded to the dead-letter queue). A later delivery or a change
  of invisible time gives a new pop time, so the broker refuses an old handle (INVALID_RECEIPT_HANDLE).
* A transaction id names one half message: the broker address that stored it, its commit-log offset, its
  queue offset in the half topic (RocketMQ's ``tranStateTableOffset``), the offset message id, the broker's
  transaction id and the producer group, which END_TRANSACTION needs.

Encoding: fields joined by a newline, then URL-safe base64 without padding (printable, no separators that a
topic or group name could contain).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cometmq.protocol.errors import RemoteProtocolError
from cometmq.protocol.pop import ExtraInfo

_RECEIPT_VERSION = "r1"
_TXN_VERSION = "t1"


def _pack(*fields: str) -> str:
    return base64.urlsafe_b64encode("\n".join(fields).encode("utf-8")).decode("ascii").rstrip("=")


def _unpack(text: str, version: str, count: int, what: str) -> list[str]:
    if not text or not isinstance(text, str):
        raise RemoteProtocolError(f"{what} is empty")
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise RemoteProtocolError(f"{what} is not one this endpoint issued") from None
    parts = raw.split("\n")
    if len(parts) != count or parts[0] != version:
        raise RemoteProtocolError(f"{what} is not one this endpoint issued")
    return parts[1:]


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    broker_name: str
    topic: str
    extra_info: ExtraInfo
    commit_log_offset: int

    @property
    def queue_id(self) -> int:
        return self.extra_info.queue_id

    @property
    def offset(self) -> int:
        return self.extra_info.queue_offset

    def encode(self) -> str:
        return _pack(_RECEIPT_VERSION, self.broker_name, self.topic, str(self.extra_info), str(self.commit_log_offset))

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        broker_name, topic, extra, clo = _unpack(text, _RECEIPT_VERSION, 5, "receipt handle")
        try:
            offset = int(clo)
        except ValueError:
            raise RemoteProtocolError("receipt handle has a non-numeric commit-log offset") from None
        return cls(broker_name, topic, ExtraInfo.parse(extra), offset)

    def renewed(self, pop_time: int, invisible_time: int) -> ReceiptHandle:
        return ReceiptHandle(self.broker_name, self.topic, self.extra_info.renewed(pop_time, invisible_time),
                             self.commit_log_offset)


@dataclass(frozen=True, slots=True)
class TransactionRef:
    broker_addr: str
    commit_log_offset: int
    tran_state_table_offset: int
    offset_msg_id: str
    broker_transaction_id: str
    producer_group: str

    def encode(self) -> str:
        return _pack(_TXN_VERSION, self.broker_addr, str(self.commit_log_offset), str(self.tran_state_table_offset),
                     self.offset_msg_id, self.broker_transaction_id, self.producer_group)

    @classmethod
    def decode(cls, text: str) -> TransactionRef:
        addr, clo, tsto, msg_id, txn, group = _unpack(text, _TXN_VERSION, 7, "transaction id")
        try:
            return cls(addr, int(clo), int(tsto), msg_id, txn, group)
        except ValueError:
            raise RemoteProtocolError("transaction id has non-numeric offsets") from None


def recall_broker_name(handle: str) -> str:
    """The broker named in a RocketMQ recall handle (``v1 topic brokerName timestamp messageId``, URL-safe
    base64), where RECALL_MESSAGE must go."""
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii") + b"=" * (-len(handle) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise RemoteProtocolError("recall handle is invalid") from None
    parts = raw.split(" ")
    if len(parts) < 5 or parts[0] != "v1" or not parts[2]:
        raise RemoteProtocolError("recall handle is invalid")
    return parts[2]
