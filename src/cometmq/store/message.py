"""What the broker hands the store, and what the dispatcher hands consume queues and listeners."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cometmq.protocol.message import transaction_value
from cometmq.protocol.properties import KEYS, TAGS, UNIQ_KEY
from cometmq.protocol.taghash import tags_code

LOCALHOST_ADDR = b"\x7f\x00\x00\x01\x00\x00\x00\x00"  # 127.0.0.1:0, 8 bytes

TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC


@dataclass(slots=True)
class MessageInner:
    """A message on its way into the commit log (RocketMQ MessageExtBrokerInner)."""

    topic: str
    body: bytes
    queue_id: int = 0
    #: a dict, or (plain sends) a read-only RawProperties over ``properties_raw``
    properties: Mapping[str, str] = field(default_factory=dict)
    #: the properties already encoded (a producer's header carries them so); None: encode ``properties``
    properties_raw: bytes | None = None
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    #: packed as a record holds it: 8 bytes (IPv4 + port) or 20 (IPv6 + port); the append sets the sys flag's
    #: host bits from the width (and from the store host's)
    born_host: bytes = LOCALHOST_ADDR
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: None: derived from the TAGS property
    tags_code: int | None = None
    #: the whole record, encoded ahead of the append by ``CommitLog.prepare`` (the timer's read-ahead); the append
    #: only writes in the queue offset, position, store time and store host. None: encoded at append time.
    #: Whoever changes the message after ``prepare`` must drop it (``edit_properties`` does).
    encoded: bytearray | None = None
    #: 0: one record. n > 0: ``body`` holds n messages in the batch layout (protocol/batch.py), appended as n
    #: records (a transaction's packed half on its commit): each this message's topic, queue, sys flag, born time
    #: and host, reconsume times and prepared offset, with its item's flag, body and properties (``properties``
    #: and ``tags_code`` are the whole's, not stored). The append refuses a body that does not hold n.
    batch_items: int = 0

    def edit_properties(self) -> dict[str, str]:
        """The properties as a dict to change in place (a RawProperties is decoded into one); the encoded
        form is dropped, so the append encodes what the caller leaves."""
        props = self.properties
        if type(props) is not dict:
            props = self.properties = dict(props)
        self.properties_raw = None
        self.encoded = None
        return props

    def tag_hash(self) -> int:
        if self.tags_code is None:
            self.tags_code = tags_code(self.properties.get(TAGS))
        return self.tags_code


@dataclass(slots=True)
class DispatchRequest:
    """One committed record as the dispatcher sees it."""

    topic: str
    queue_id: int
    phy_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sys_flag: int
    properties: Mapping[str, str]

    @property
    def keys(self) -> str:
        return self.properties.get(KEYS, "")

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)

    @property
    def goes_to_consume_queue(self) -> bool:
        """Prepared and rolled-back transactional halves are never consumable."""
        return transaction_value(self.sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
