"""Status values and small result records the store returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cometmq.store.mapped_file import FileRegion
from cometmq.store.message import DispatchRequest


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    #: stored, but the in-sync replicas did not all acknowledge it in time
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    #: refused before the write: fewer in-sync replicas than minInSyncReplicas
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    OS_ERROR = "OS_ERROR"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class PutResult:
    status: PutStatus
    #: where each record landed: phy_offset, size, queue_offset, store_timestamp (and what was dispatched)
    records: list[DispatchRequest] = field(default_factory=list)
    remark: str = ""
    #: commit-log offset just past the last record; SYNC_FLUSH callers wait until flushed >= this
    end_offset: int = 0

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def stored(self) -> bool:
        """In the log, whether or not it became durable in time (a timeout is not a refusal)."""
        return self.status in _STORED

    @property
    def unputtable(self) -> bool:
        """Refused for what the messages are (putting them again cannot help), not for a passing condition."""
        return self.status in _UNPUTTABLE


_STORED = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT})
_UNPUTTABLE = frozenset({PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED})


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: zero-copy views of whole records, back to back in queue order
    buffers: list[memoryview] = field(default_factory=list)
    #: a list, or a range when a coalesced read returns every offset in order
    queue_offsets: list[int] | range = field(default_factory=list)
    buffer_total_size: int = 0
    #: where the one buffer of a coalesced read lies in its segment (a socket can be sent it from the file)
    file_region: FileRegion | None = None

    @property
    def message_count(self) -> int:
        return len(self.buffers)
