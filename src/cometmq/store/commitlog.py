"""The commit log: every message of every topic, appended to fixed-size mapped segments.

A record never straddles two segments: when it does not fit, the rest of the segment is marked
with the blank magic code and the record goes to the next one. Appends assign the physical offset,
the queue offset and the store time while holding the append lock, so records are in log order.
"""

from __future__ import annotations

import errno
import logging
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from cometmq.protocol.errors import ProtocolError
from cometmq.protocol.message import MAX_PROPERTIES_LENGTH, MAX_TOPIC_LENGTH
from cometmq.protocol.properties import decode_properties, encode_properties
from cometmq.protocol.record_layout import (
    BLANK_MAGIC_CODE,
    BODY_CRC_POS,
    BORNHOST_V6_FLAG,
    HOST_V6_FLAGS,
    IPV4_HOST_SIZE,
    IPV6_HOST_SIZE,
    LAYOUT_V4,
    LAYOUTS,
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    STOREHOST_V6_FLAG,
    RecordLayout,
    layout_for,
    record_layout,
)
from cometmq.protocol.taghash import tags_code
from cometmq.store.batch_codec import C_BATCH, plain_batch_messages_py
from cometmq.store.config import StoreConfig
from cometmq.store.mapped_file import MappedFile, MappedFileQueue
from cometmq.store.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    DispatchRequest,
    MessageInner,
)
from cometmq.store.record_walk import BLANK, SHORT, walk_records
from cometmq.store.status import PutResult, PutStatus

log = logging.getLogger(__name__)

#: errors that mean the file system has no room for a new segment
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_Q = struct.Struct(">q")
#: TOTALSIZE and MAGIC: what a scan reads first, and all a blank segment tail holds
_SIZE_MAGIC = LAYOUT_V4.struct_of("total_size", "magic_code")
#: what an append writes into a record encoded ahead (``CommitLog.prepare``), at QUEUE_OFFSET_POS: queue offset
#: and position (then store time and store host, whose place depends on the layout: ``CommitLog._append_layout``)
_QOFF_PHY = LAYOUT_V4.struct_of("queue_offset", "physical_offset")
#: the transaction bit set in exactly the halves that take no queue offset: prepared (0x4) and rolled back (0xC)
_HALVES_BIT = TRANSACTION_PREPARED_TYPE & TRANSACTION_ROLLBACK_TYPE
assert _HALVES_BIT and not _HALVES_BIT & TRANSACTION_COMMIT_TYPE
#: what the dispatcher needs of a stored record, at QUEUE_ID_POS, by layout
_DISPATCH_FIELDS = tuple(layout.struct_of("queue_id", "queue_offset", "sys_flag", "store_timestamp", "body_length")
                         for layout in LAYOUTS)


@dataclass(slots=True)
class ScanResult:
    """What a recovery scan found: where valid records end, and how many it checked."""

    end_offset: int
    records: int
    corrupt_at: int | None


class CommitLog:
    def __init__(self, config: StoreConfig, store_host: bytes, clock: Callable[[], int]) -> None:
        self.config = config
        self.store_host = store_host
        self.clock = clock
        self.files = MappedFileQueue(config.commitlog_dir, config.commitlog_segment_size,
                                     preallocate=config.preallocate, refuse_empty=True,
                                     set_aside_first=config.set_aside_unfit_first_segment)
        self.lock = threading.Lock()
        #: (topic, queueId) -> next queue offset
        self.queue_table: dict[tuple[str, int], int] = {}
        #: topic -> its encoded length byte + name, reused by every append to that topic
        self._topic_parts: dict[str, bytes] = {}

    # -- store host ------------------------------------------------------------------------
    @property
    def store_host(self) -> bytes:
        """The STOREHOSTADDRESS of every record appended: 8 bytes (IPv4 + port) or 20 (IPv6 + port)."""
        return self._store_host

    @store_host.setter
    def store_host(self, host: bytes) -> None:
        # Set before messages are appended or prepared (the broker sets it once it knows its port): a record
        # prepared under another host width would be patched at the wrong place.
        if len(host) == IPV4_HOST_SIZE:
            self._store_flags = 0
        elif len(host) == IPV6_HOST_SIZE:
            self._store_flags = STOREHOST_V6_FLAG  # as RocketMQ's CommitLog sets for an Inet6Address
        else:
            raise ValueError(f"a store host is {IPV4_HOST_SIZE} or {IPV6_HOST_SIZE} bytes, got {len(host)}")
        self._store_host = bytes(host)
        #: the layout of this store's records with an IPv4 born host
        self._layout = layout = layout_for(self._store_flags)
        #: what an append needs of it, in one attribute: fixed size (header, body length, properties length),
        #: header packer, the store's host bits, and the store time + host patcher of a prepared record and where
        self._append_layout = (layout.body_pos + 2, layout.head.pack, self._store_flags,
                               layout.struct_of("store_timestamp", "store_host").pack_into, layout.store_timestamp_pos)

    # -- offsets ---------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    # -- append ----------------------------------------------------------------------------
    def append(self, msgs: list[MessageInner]) -> PutResult:
        """Append messages contiguously (a batch stays in one segment). All or nothing.

        The result's records are also the dispatch requests for the dispatcher. With the C helper built
        (store/batch_codec.py) a batch it can take is measured and packed in two calls; anything else, a refusal
        included, goes through the Python loop below, the reference the helper is tested against."""
        native = C_BATCH
        if native is not None and type(msgs) is list:
            total = native.measure(msgs, self.config.max_message_size, self._store_flags)
            if total is not None:
                return self._append_native(msgs, total)
        if any(m.batch_items for m in msgs):
            expanded = _expand_items(msgs)
            if isinstance(expanded, PutResult):
                return expanded
            msgs = expanded
        prepared: list[tuple[MessageInner, bytes, bytes, int, Callable[..., bytes]]] = []
        add_prepared = prepared.append
        total = 0
        max_body = self.config.max_message_size
        topic_cache = self._topic_parts
        if len(topic_cache) > 4096:
            topic_cache.clear()
        # Runs of one topic (a batch is one) look its encoded name up once.
        last_topic: str | None = None
        topic_part = b""
        fixed, pack, store_flags, ts_pack, ts_pos = self._append_layout
        v4_host = IPV4_HOST_SIZE
        # A born host known to take the fast path (IPv4, on a store with an IPv4 host): a batch's messages share one.
        fast_born: bytes | None = None
        for m in msgs:
            enc = m.encoded
            if enc is not None:
                size = len(enc)
                add_prepared((m, b"", b"", size, _encoded))  # an empty topic part marks it: written from ``encoded``
                total += size
                continue
            if m.topic != last_topic:
                last_topic = m.topic
                cached = topic_cache.get(last_topic)
                if cached is None:
                    topic_b = last_topic.encode("utf-8")
                    if not topic_b or len(topic_b) > MAX_TOPIC_LENGTH:
                        return PutResult(PutStatus.MESSAGE_ILLEGAL, remark=f"topic length {len(topic_b)}")
                    cached = topic_cache[last_topic] = bytes((len(topic_b),)) + topic_b
                topic_part = cached
            props_b = m.properties_raw
            if props_b is None:
                props_b = _encode_props(m.properties)
                if props_b is None:
                    return PutResult(PutStatus.MESSAGE_ILLEGAL, remark="a property holds a separator character")
            if len(props_b) > MAX_PROPERTIES_LENGTH:
                return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                                 remark=f"properties are {len(props_b)} bytes, at most {MAX_PROPERTIES_LENGTH}")
            body_len = len(m.body)
            if body_len > max_body:
                return PutResult(PutStatus.MESSAGE_ILLEGAL,
                                 remark=f"message body of {body_len} bytes exceeds {max_body}")
            born = m.born_host
            if born is not fast_born:
                if len(born) != v4_host or store_flags:  # an IPv6 host: the sys flag's host bits are set now
                    other = _layout_of(m, store_flags)
                    if other is None:
                        return PutResult(PutStatus.MESSAGE_ILLEGAL, remark=f"born host of {len(born)} bytes")
                    size = other.body_pos + 2 + body_len + len(topic_part) + len(props_b)
                    add_prepared((m, topic_part, props_b, size, other.head.pack))
                    total += size
                    continue
                fast_born = born
            size = fixed + body_len + len(topic_part) + len(props_b)
            add_prepared((m, topic_part, props_b, size, pack))
            total += size
        if not prepared:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, remark="no message")

        with self.lock:
            mf = self._segment_for(total)
            if isinstance(mf, PutResult):
                return mf
            now = self.clock()
            phy = mf.file_from_offset + mf.wrote_position
            parts: list[bytes | bytearray] = []
            add = parts.append
            records: list[DispatchRequest] = []
            add_record = records.append
            table = self.queue_table
            store_host = self._store_host
            i16 = _I16.pack
            qp_pack = _QOFF_PHY.pack_into
            crc32 = zlib.crc32
            halves_bit, rare_bits = _HALVES_BIT, _HALVES_BIT | HOST_V6_FLAGS
            # The next queue offset of the current run of one (topic, queue): written back when the run ends.
            key: tuple[str, int] | None = None
            next_qoff = 0
            for m, topic_part, props_b, size, pack_head in prepared:
                sys_flag = m.sys_flag
                qid = m.queue_id
                # Not a prepared or rolled-back half: it takes a queue offset. A sys flag with host bits has them
                # checked first (those of a record with IPv4 hosts cleared: a client may send any sys flag).
                if not sys_flag & rare_bits or not (sys_flag := _checked_flags(m, pack_head is pack)) & halves_bit:
                    if key is None or qid != key[1] or m.topic != key[0]:
                        if key is not None:
                            table[key] = next_qoff
                        key = (m.topic, qid)
                        next_qoff = table.get(key, 0)
                    qoff = next_qoff
                    next_qoff += 1
                else:
                    qoff = 0
                if not topic_part:
                    enc = m.encoded
                    assert enc is not None
                    qp_pack(enc, QUEUE_OFFSET_POS, qoff, phy)
                    ts_pack(enc, ts_pos, now, store_host)
                    add(enc)
                else:
                    body = m.body
                    add(pack_head(size, MAGIC_CODE, crc32(body) & 0x7FFFFFFF, qid, m.flag, qoff, phy, sys_flag,
                                  m.born_timestamp, m.born_host, now, store_host, m.reconsume_times,
                                  m.prepared_transaction_offset, len(body)))
                    add(body)
                    add(topic_part)
                    add(i16(len(props_b)))
                    add(props_b)
                tcode = m.tags_code
                if tcode is None:
                    tcode = tags_code(m.properties.get("TAGS"))
                add_record(DispatchRequest(m.topic, qid, phy, size, tcode, now, qoff, sys_flag, m.properties))
                phy += size
            if key is not None:
                table[key] = next_qoff
            mf.append(b"".join(parts))
        return PutResult(PutStatus.PUT_OK, records, end_offset=phy)

    def _append_native(self, msgs: list[MessageInner], total: int) -> PutResult:
        """The C helper's append of messages it measured at ``total`` bytes: the records are written straight into
        the segment's mapping, byte for byte what the Python loop of ``append`` writes."""
        with self.lock:
            files = self.files.files
            last = files[-1] if files else None
            # (the usual case, a segment with room, without a call; anything else as _segment_for decides)
            if last is None or total + 8 > last.size - last.wrote_position \
                    or total + 8 > self.config.commitlog_segment_size:
                segment = self._segment_for(total)
                if isinstance(segment, PutResult):
                    return segment
                last = segment
            mf = last
            pos = mf.wrote_position
            phy = mf.file_from_offset + pos
            records: list[DispatchRequest] = C_BATCH.pack(msgs, mf.mm, pos, phy, self.clock(), self._store_host,
                                                          self.queue_table, total)
            mf.wrote_position = pos + total
        return PutResult(PutStatus.PUT_OK, records, end_offset=phy + total)

    def _segment_for(self, total: int) -> MappedFile | PutResult:
        """The segment to append ``total`` bytes to, or the refusal to answer (under ``lock``)."""
        if total + 8 > self.config.commitlog_segment_size:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, remark=f"batch of {total} bytes exceeds a segment")
        try:
            files = self.files.files
            mf = files[-1] if files else None
            if mf is None or total + 8 > mf.size - mf.wrote_position:
                mf = self._file_with_room(total)
        except OSError as exc:
            if exc.errno in _NO_SPACE:  # answered as RocketMQ answers a full disk, nothing written
                return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=f"disk full: {exc.strerror}")
            log.error("cannot create a commit-log segment: %s", exc)
            return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, remark=str(exc))
        return mf

    def prepare(self, m: MessageInner) -> bool:
        """Encode ``m``'s record now (into ``m.encoded``), so that appending it later only writes in its queue
        offset, position, store time and store host: the timer reads due messages ahead and puts a burst of
        them at once, when every microsecond of the append counts. False (nothing set) when the message would
        be refused, its append then reports why, or has an IPv6 born host, encoded when appended. Not for
        transactional halves (their queue offset is 0)."""
        topic_b = m.topic.encode("utf-8")
        props_b = m.properties_raw
        if props_b is None:
            props_b = _encode_props(m.properties)
        body = m.body
        if (props_b is None or not topic_b or len(topic_b) > MAX_TOPIC_LENGTH or len(props_b) > MAX_PROPERTIES_LENGTH
                or len(body) > self.config.max_message_size or m.sys_flag & 0xC
                or len(m.born_host) != IPV4_HOST_SIZE or m.batch_items):
            return False
        if m.tags_code is None:
            m.tags_code = tags_code(m.properties.get("TAGS"))
        layout = self._layout
        m.sys_flag = m.sys_flag & ~HOST_V6_FLAGS | self._store_flags
        size = layout.body_pos + len(body) + 1 + len(topic_b) + 2 + len(props_b)
        m.encoded = bytearray(b"".join((
            layout.head.pack(size, MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, m.queue_id, m.flag, 0, 0, m.sys_flag,
                             m.born_timestamp, m.born_host, 0, self._store_host, m.reconsume_times,
                             m.prepared_transaction_offset, len(body)),
            body, bytes((len(topic_b),)), topic_b, _I16.pack(len(props_b)), props_b)))
        return True

    def _file_with_room(self, size: int) -> MappedFile:
        """The segment to write ``size`` bytes to; seals the current one with a blank tail if needed."""
        mf = self.files.last_for_append()
        # A record needs 8 bytes after it for a possible blank marker (RocketMQ's END_FILE_MIN_BLANK_LENGTH).
        if size + 8 > mf.remaining:
            remaining = mf.remaining
            if remaining >= 8:
                mf.write_at(mf.wrote_position, _SIZE_MAGIC.pack(remaining, BLANK_MAGIC_CODE))
            mf.wrote_position = mf.size
            mf = self.files.last_for_append()
        return mf

    # -- replication hooks ------------------------------------------------------------------
    def append_raw(self, offset: int, data: bytes | memoryview) -> bool:
        """Append bytes copied from a master at exactly ``offset`` (the end of this log).

        The master's segments have the same size, so segment boundaries line up."""
        with self.lock:
            if offset != self.max_offset:
                return False
            view = memoryview(data)
            while view:
                mf = self.files.last_for_append(offset)
                n = min(len(view), mf.remaining)
                mf.append(view[:n])
                view = view[n:]
            return True

    def truncate(self, offset: int) -> None:
        """Cut the log back to ``offset`` (replica truncation, or a torn tail found by recovery)."""
        with self.lock:
            self.files.set_write_end(offset)

    # -- read ------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> memoryview | None:
        """A zero-copy view of ``size`` bytes at ``offset``, or None when that range is not in the log."""
        mf = self.files.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote_position:
            return None
        return mf.view(pos, size)

    def read_upto(self, offset: int, size: int) -> memoryview | None:
        """A zero-copy view of at most ``size`` bytes at ``offset``, up to the end of what its segment holds; None
        when ``offset`` is not in the log."""
        mf = self.files.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        n = min(size, mf.wrote_position - pos)
        return mf.view(pos, n) if n > 0 else None

    def store_time_at(self, offset: int, size: int) -> int | None:
        view = self.read(offset, size)
        if view is None or size < MIN_RECORD_SIZE:
            return None
        pos = record_layout(view).store_timestamp_pos
        if size < pos + 8:
            return None
        return int(_Q.unpack_from(view, pos)[0])

    def record_at(self, offset: int) -> memoryview | None:
        """The whole record that starts at ``offset``, read by its own size field."""
        mf = self.files.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos + 8 > mf.wrote_position:
            return None
        size, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
        if magic != MAGIC_CODE or size < MIN_RECORD_SIZE or pos + size > mf.wrote_position:
            return None
        return mf.view(pos, size)

    def record_matches(self, offset: int, size: int, queue_id: int, queue_offset: int) -> bool:
        """Whether a consume-queue unit (``offset``, ``size``) for ``queue_offset`` of queue ``queue_id`` points at
        a record that says the same: magic code, total size, queue id and queue offset (recovery's check)."""
        mf = self.files.find(offset)
        if mf is None or size < MIN_RECORD_SIZE:
            return False
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote_position:
            return False
        total, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
        return bool(total == size and magic == MAGIC_CODE
                and _I32.unpack_from(mf.mm, pos + QUEUE_ID_POS)[0] == queue_id
                and _Q.unpack_from(mf.mm, pos + QUEUE_OFFSET_POS)[0] == queue_offset)

    def record_starts_at(self, offset: int, size: int) -> bool:
        """Whether a record of ``size`` bytes starts at ``offset`` (magic code and total size only)."""
        mf = self.files.find(offset)
        if mf is None or size < MIN_RECORD_SIZE:
            return False
        pos = offset - mf.file_from_offset
        if pos + size > mf.wrote_position:
            return False
        return bool(_SIZE_MAGIC.unpack_from(mf.mm, pos) == (size, MAGIC_CODE))

    # -- scanning (recovery and reput from bytes) --------------------------------------------
    def scan(self, start: int, end: int | None = None, *, check_crc: bool = True
             ) -> Iterator[tuple[int, memoryview]]:
        """Valid records from ``start`` (a record boundary) up to ``end`` or the first invalid one.

        Blank tails move on to the next segment. The generator's ``return`` value is unused; callers
        learn where it stopped from the last offset + size they saw."""
        offset = start
        limit = self.max_offset if end is None else end
        while offset < limit:
            mf = self.files.find(offset)
            if mf is None:
                return
            pos = offset - mf.file_from_offset
            file_end = mf.wrote_position if end is None else min(mf.wrote_position, limit - mf.file_from_offset)
            if pos + 8 > file_end:
                if mf.wrote_position == mf.size and mf is not self.files.last:
                    offset = mf.end_offset
                    continue
                return
            size, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
            if magic == BLANK_MAGIC_CODE:
                offset = mf.end_offset
                continue
            # A record must end within the bytes written (and asked for): a replica's log can end inside one,
            # whose missing tail reads as zeros until the rest arrives.
            if magic != MAGIC_CODE or size < MIN_RECORD_SIZE or pos + size > file_end:
                return
            view = mf.view(pos, size)
            if not record_is_valid(view, check_crc):
                return
            yield offset, view
            offset += size

    def dispatch_requests(self, start: int, end: int, limit: int) -> tuple[list[DispatchRequest], int, int]:
        """What ``scan`` and ``dispatch_request_from_record`` give for up to ``limit`` records from ``start`` (a record
        boundary) on, read in one go from the segment holding it (``record_walk``), none reaching past ``end``.

        Returns the requests, the offset to go on from, and why the walk stopped there: ``LIMIT`` (more may
        follow), ``BLANK`` (the offset is the next segment's start), ``UNDECODABLE`` (the record at the offset
        cannot be dispatched), or anything else: no more valid records for now."""
        mf = self.files.find(start)
        if mf is None:
            return [], start, SHORT
        base = mf.file_from_offset
        reqs, pos, why = walk_records(mf.mm, start - base, min(mf.wrote_position, end - base), base, limit)
        if why == BLANK or (why == SHORT and mf.wrote_position == mf.size and mf is not self.files.last):
            return reqs, mf.end_offset, BLANK
        return reqs, base + pos, why

    def recover_end(self, start: int) -> ScanResult:
        """Scan valid records from ``start`` and return where they end (the new max offset)."""
        end = start
        count = 0
        for offset, view in self.scan(start, None):
            end = offset + len(view)
            count += 1
        # The scan stops at a blank tail's segment end too: find the true end.
        mf = self.files.find(end)
        corrupt: int | None = None
        if mf is not None:
            pos = end - mf.file_from_offset
            if pos + 8 <= mf.size:
                size, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
                if (size != 0 or magic != 0) and magic != BLANK_MAGIC_CODE:
                    corrupt = end
        return ScanResult(end, count, corrupt)

    def flush(self) -> int:
        return self.files.flush()

    def close(self) -> None:
        self.files.close()


def _encoded(*fields: object) -> bytes:
    """The header packer listed for a record encoded ahead, which has its header already: never called."""
    raise AssertionError("a prepared record is not packed again")


def _expand_items(msgs: list[MessageInner]) -> list[MessageInner] | PutResult:
    """``msgs`` with each message of ``batch_items`` replaced by the messages its body holds (the reference of the
    C helper's append of them), or the refusal of a body that does not hold that many."""
    out: list[MessageInner] = []
    for m in msgs:
        if not m.batch_items:
            out.append(m)
            continue
        try:
            items = plain_batch_messages_py(m.body, m.topic, m.queue_id, m.sys_flag, m.born_timestamp, m.born_host,
                                            m.reconsume_times)
        except ProtocolError as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, remark=f"a batch of {m.batch_items} items: {exc}")
        assert items is not None  # (no markers)
        if len(items) != m.batch_items:
            return PutResult(PutStatus.MESSAGE_ILLEGAL,
                             remark=f"a batch of {m.batch_items} items holds {len(items)}")
        for item in items:
            item.prepared_transaction_offset = m.prepared_transaction_offset
        out.extend(items)
    return out


def _checked_flags(m: MessageInner, ipv4_hosts: bool) -> int:
    """``m``'s sys flag, its host bits cleared when its record has IPv4 hosts (others were set by ``_layout_of``)."""
    if ipv4_hosts:
        m.sys_flag &= ~HOST_V6_FLAGS
    return m.sys_flag


def _layout_of(m: MessageInner, store_flags: int) -> RecordLayout | None:
    """The layout of ``m``'s record on a store whose host has ``store_flags``, with the host bits of ``m.sys_flag``
    set to match (as RocketMQ's CommitLog sets them from the addresses); None for a born host of neither width."""
    if len(m.born_host) == IPV4_HOST_SIZE:
        flags = store_flags
    elif len(m.born_host) == IPV6_HOST_SIZE:
        flags = store_flags | BORNHOST_V6_FLAG
    else:
        return None
    m.sys_flag = m.sys_flag & ~HOST_V6_FLAGS | flags
    return layout_for(flags)


def _encode_props(props: Mapping[str, str]) -> bytes | None:
    try:
        return encode_properties(props)
    except ProtocolError:
        return None


def record_is_valid(view: memoryview, check_crc: bool) -> bool:
    """Structural checks (lengths add up to TOTALSIZE) and, optionally, the body CRC."""
    total = len(view)
    layout = record_layout(view)
    if total < layout.min_record_size:
        return False
    (body_len,) = _I32.unpack_from(view, layout.body_length_pos)
    body_at = layout.body_pos
    p = body_at + body_len
    if body_len < 0 or p + 3 > total:
        return False
    topic_len = view[p]
    p += 1 + topic_len
    if p + 2 > total:
        return False
    (props_len,) = _I16.unpack_from(view, p)
    if props_len < 0 or p + 2 + props_len != total:
        return False
    if check_crc:
        crc = _I32.unpack_from(view, BODY_CRC_POS)[0]
        if zlib.crc32(view[body_at : body_at + body_len]) & 0x7FFFFFFF != crc:
            return False
    return True


def dispatch_request_from_record(offset: int, view: memoryview) -> DispatchRequest | None:
    """Decode the fields the dispatcher needs from a stored record (recovery, replicas)."""
    try:
        layout = record_layout(view)
        queue_id, qoff, sys_flag, store_ts, body_len = _DISPATCH_FIELDS[layout.index].unpack_from(
            view, QUEUE_ID_POS)
        p = layout.body_pos + body_len
        topic_len = view[p]
        topic = bytes(view[p + 1 : p + 1 + topic_len]).decode("utf-8")
        p += 1 + topic_len
        (props_len,) = _I16.unpack_from(view, p)
        props = decode_properties(view[p + 2 : p + 2 + props_len])
    except (ProtocolError, UnicodeDecodeError, struct.error, IndexError):
        return None
    return DispatchRequest(topic, queue_id, offset, len(view), tags_code(props.get("TAGS")), store_ts, qoff,
                           sys_flag, props)
