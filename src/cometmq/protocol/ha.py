"""RocketMQ 5's auto-switch HA protocol (the HA port, broker port + 1): frames, encoders and incremental decoders.

Sans-I/O: bytes in, frames out. All integers big-endian. Every frame starts with an ``i32`` connection state
(HAConnectionState.java: READY 0, HANDSHAKE 1, TRANSFER 2, SUSPEND 3, SHUTDOWN 4); only HANDSHAKE and TRANSFER
appear on the wire.

Slave → master (AutoSwitchHAClient.java; decoded by ``SlaveFrameDecoder``):

    handshake  16 B  i32 state=1 | i16 isSyncFromLastFile | i16 isAsyncLearner | i64 slaveBrokerId
    report     12 B  i32 state=2 | i64 maxPhyOffset

Master → slave (AutoSwitchHAConnection.java; decoded by ``MasterFrameDecoder``):

    handshake  20 B  i32 state=1 | i32 bodySize | i64 masterMaxOffset | i32 lastEpoch (-1: none)
               body  n * 12 B (i32 epoch | i64 startOffset), oldest first; no end offsets: the last entry ends at
                     masterMaxOffset, each other where the next starts
    transfer   36 B  i32 state=2 | i32 bodySize | i64 startOffset | i32 epoch | i64 epochStartOffset
                     | i64 confirmOffset, then bodySize raw commit-log bytes; bodySize 0 is a heartbeat

The decoders check what Java trusts: an unknown state, a negative or oversized body, a handshake body that is
not a whole number of epoch entries, entries out of order, negative offsets. Any of these raises
``HAProtocolError`` (a ``RemoteProtocolError``, so a ``ValueError``) and the decoder stays broken: the link must
be closed. The decoders do not check the order of frames (handshake first): that is the link's state.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from cometmq.protocol.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_BODY",
    "EPOCH_ENTRY_SIZE",
    "MASTER_HANDSHAKE_HEADER_SIZE",
    "SLAVE_HANDSHAKE_SIZE",
    "SLAVE_REPORT_SIZE",
    "TRANSFER_HEADER_SIZE",
    "EpochEntry",
    "HAProtocolError",
    "HAState",
    "MasterFrame",
    "MasterFrameDecoder",
    "MasterHandshake",
    "SlaveFrame",
    "SlaveFrameDecoder",
    "SlaveHandshake",
    "SlaveReport",
    "Transfer",
    "encode_frame",
    "encode_master_handshake",
    "encode_slave_handshake",
    "encode_slave_report",
    "encode_transfer",
    "encode_transfer_header",
]


class HAState(enum.IntEnum):
    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class HAProtocolError(RemoteProtocolError):
    """The peer on the HA port sent bytes that are not the protocol: close the link."""


_SLAVE_HANDSHAKE = struct.Struct(">ihhq")
_SLAVE_REPORT = struct.Struct(">iq")
_MASTER_HANDSHAKE = struct.Struct(">iiqi")
_TRANSFER = struct.Struct(">iiqiqq")
_EPOCH_ENTRY = struct.Struct(">iq")
_STATE = struct.Struct(">i")

SLAVE_HANDSHAKE_SIZE = _SLAVE_HANDSHAKE.size  # 16
SLAVE_REPORT_SIZE = _SLAVE_REPORT.size  # 12
MASTER_HANDSHAKE_HEADER_SIZE = _MASTER_HANDSHAKE.size  # 20
TRANSFER_HEADER_SIZE = _TRANSFER.size  # 36
EPOCH_ENTRY_SIZE = _EPOCH_ENTRY.size  # 12
#: the largest body a ``MasterFrameDecoder`` accepts by default: the Java slave's read buffer (4 MiB)
DEFAULT_MAX_BODY = 4 << 20

_I32_MAX = (1 << 31) - 1
_I64_MAX = (1 << 63) - 1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class SlaveHandshake:
    slave_broker_id: int
    is_sync_from_last_file: bool = False
    is_async_learner: bool = False


@dataclass(frozen=True, slots=True)
class SlaveReport:
    """The slave's log end (its ack); the first one after the handshake says where the transfer starts."""

    max_offset: int


@dataclass(frozen=True, slots=True)
class MasterHandshake:
    master_max_offset: int
    last_epoch: int
    entries: tuple[EpochEntry, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    start_offset: int
    epoch: int
    epoch_start_offset: int
    confirm_offset: int
    body: bytes = field(default=b"", repr=False)

    @property
    def is_heartbeat(self) -> bool:
        return not self.body

    def __repr__(self) -> str:
        return (f"Transfer(start_offset={self.start_offset}, epoch={self.epoch}, "
                f"epoch_start_offset={self.epoch_start_offset}, confirm_offset={self.confirm_offset}, "
                f"body=<{len(self.body)} bytes>)")


SlaveFrame = SlaveHandshake | SlaveReport
MasterFrame = MasterHandshake | Transfer


# -- encoders -----------------------------------------------------------------------------------------------------
def _check(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise LocalProtocolError(f"HA {name} {value} out of range {low}..{high}")


def encode_slave_handshake(slave_broker_id: int, *, sync_from_last_file: bool = False,
                           async_learner: bool = False) -> bytes:
    _check("slave broker id", slave_broker_id, 0, _I64_MAX)
    return _SLAVE_HANDSHAKE.pack(HAState.HANDSHAKE, int(sync_from_last_file), int(async_learner), slave_broker_id)


def encode_slave_report(max_offset: int) -> bytes:
    _check("reported offset", max_offset, 0, _I64_MAX)
    return _SLAVE_REPORT.pack(HAState.TRANSFER, max_offset)


def encode_master_handshake(master_max_offset: int, entries: Iterable[tuple[int, int]]) -> bytes:
    """The master's answer to a handshake: its log end and its epoch entries, oldest first."""
    return _master_handshake(master_max_offset, entries, None)


def _master_handshake(master_max_offset: int, entries: Iterable[tuple[int, int]], last_epoch: int | None) -> bytes:
    _check("master max offset", master_max_offset, 0, _I64_MAX)
    body = bytearray()
    prev: tuple[int, int] | None = None
    for epoch, start in entries:
        _check("epoch", epoch, 0, _I32_MAX)
        _check("epoch start offset", start, 0, _I64_MAX)
        if prev is not None and (epoch <= prev[0] or start < prev[1]):
            raise LocalProtocolError(f"HA epoch entries out of order: {prev[0]}-{prev[1]} then {epoch}-{start}")
        body += _EPOCH_ENTRY.pack(epoch, start)
        prev = (epoch, start)
    derived = prev[0] if prev is not None else -1
    if last_epoch is None:
        last_epoch = derived
    elif last_epoch != derived and not (prev is None and last_epoch == 0):
        raise LocalProtocolError(f"HA last epoch {last_epoch} is not the last entry's ({derived})")
    _check("handshake body size", len(body), 0, _I32_MAX)
    return _MASTER_HANDSHAKE.pack(HAState.HANDSHAKE, len(body), master_max_offset, last_epoch) + body


def encode_transfer_header(start_offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int,
                           body_size: int) -> bytes:
    """The 36-byte header of a transfer frame; ``body_size`` bytes of log follow it (0: a heartbeat)."""
    _check("transfer start offset", start_offset, -1 if body_size == 0 else 0, _I64_MAX)
    _check("epoch", epoch, 0, _I32_MAX)
    _check("epoch start offset", epoch_start_offset, 0, _I64_MAX)
    _check("confirm offset", confirm_offset, -1, _I64_MAX)
    _check("body size", body_size, 0, _I32_MAX)
    return _TRANSFER.pack(HAState.TRANSFER, body_size, start_offset, epoch, epoch_start_offset, confirm_offset)


def encode_transfer(start_offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int,
                    body: bytes = b"") -> bytes:
    return encode_transfer_header(start_offset, epoch, epoch_start_offset, confirm_offset, len(body)) + body


def encode_frame(frame: SlaveFrame | MasterFrame) -> bytes:
    match frame:
        case SlaveHandshake():
            return encode_slave_handshake(frame.slave_broker_id, sync_from_last_file=frame.is_sync_from_last_file,
                                          async_learner=frame.is_async_learner)
        case SlaveReport():
            return encode_slave_report(frame.max_offset)
        case MasterHandshake():
            return _master_handshake(frame.master_max_offset, frame.entries, frame.last_epoch)
        case Transfer():
            return encode_transfer(frame.start_offset, frame.epoch, frame.epoch_start_offset, frame.confirm_offset,
                                   frame.body)
    raise LocalProtocolError(f"not an HA frame: {frame!r}")


# -- decoders -----------------------------------------------------------------------------------------------------
class _Decoder:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._error: HAProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buf)

    def _fail(self, message: str) -> HAProtocolError:
        self._error = HAProtocolError(message)
        return self._error

    def _state(self, pos: int) -> int:
        (state,) = _STATE.unpack_from(self._buf, pos)
        if state not in (HAState.HANDSHAKE, HAState.TRANSFER):
            name = HAState(state).name if state in HAState._value2member_map_ else "unknown"
            raise self._fail(f"HA frame with state {state} ({name}); expected HANDSHAKE or TRANSFER")
        return int(state)


class SlaveFrameDecoder(_Decoder):
    """The master's side: decodes what a slave sends."""

    def feed(self, data: bytes | bytearray | memoryview) -> list[SlaveFrame]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        frames: list[SlaveFrame] = []
        pos = 0
        while len(buf) - pos >= 4:
            if self._state(pos) == HAState.HANDSHAKE:
                if len(buf) - pos < SLAVE_HANDSHAKE_SIZE:
                    break
                _, from_last, learner, broker_id = _SLAVE_HANDSHAKE.unpack_from(buf, pos)
                if from_last not in (0, 1) or learner not in (0, 1):
                    raise self._fail(f"HA slave handshake flags {from_last}, {learner} are not 0 or 1")
                if broker_id < 0:
                    raise self._fail(f"HA slave handshake with broker id {broker_id}")
                frames.append(SlaveHandshake(broker_id, bool(from_last), bool(learner)))
                pos += SLAVE_HANDSHAKE_SIZE
            else:
                if len(buf) - pos < SLAVE_REPORT_SIZE:
                    break
                _, offset = _SLAVE_REPORT.unpack_from(buf, pos)
                if offset < 0:
                    raise self._fail(f"HA slave report of offset {offset}")
                frames.append(SlaveReport(offset))
                pos += SLAVE_REPORT_SIZE
        del buf[:pos]
        return frames


class MasterFrameDecoder(_Decoder):
    """The slave's side: decodes what the master sends. ``max_body`` bounds a frame's body (handshake or log)."""

    def __init__(self, max_body: int = DEFAULT_MAX_BODY) -> None:
        super().__init__()
        if max_body < 0:
            raise ValueError(f"max_body {max_body} is negative")
        self.max_body = max_body

    def feed(self, data: bytes | bytearray | memoryview) -> list[MasterFrame]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        frames: list[MasterFrame] = []
        pos = 0
        while len(buf) - pos >= 8:
            state = self._state(pos)
            (body_size,) = _STATE.unpack_from(buf, pos + 4)
            if body_size < 0:
                raise self._fail(f"HA frame with body size {body_size}")
            if body_size > self.max_body:
                raise self._fail(f"HA frame body of {body_size} bytes is over the limit of {self.max_body}")
            header = MASTER_HANDSHAKE_HEADER_SIZE if state == HAState.HANDSHAKE else TRANSFER_HEADER_SIZE
            if len(buf) - pos < header + body_size:
                break
            if state == HAState.HANDSHAKE:
                frames.append(self._handshake(pos, body_size))
            else:
                frames.append(self._transfer(pos, body_size))
            pos += header + body_size
        del buf[:pos]
        return frames

    def _handshake(self, pos: int, body_size: int) -> MasterHandshake:
        buf = self._buf
        _, _, max_offset, last_epoch = _MASTER_HANDSHAKE.unpack_from(buf, pos)
        if max_offset < 0:
            raise self._fail(f"HA master handshake with max offset {max_offset}")
        if body_size % EPOCH_ENTRY_SIZE:
            raise self._fail(f"HA master handshake body of {body_size} bytes is not a whole number of "
                             f"{EPOCH_ENTRY_SIZE}-byte epoch entries")
        entries: list[EpochEntry] = []
        start = pos + MASTER_HANDSHAKE_HEADER_SIZE
        for epoch, offset in _EPOCH_ENTRY.iter_unpack(buf[start:start + body_size]):
            if epoch < 0 or offset < 0:
                raise self._fail(f"HA master epoch entry {epoch}-{offset} is negative")
            if entries and (epoch <= entries[-1].epoch or offset < entries[-1].start_offset):
                raise self._fail(f"HA master epoch entries out of order: {entries[-1].epoch}-"
                                 f"{entries[-1].start_offset} then {epoch}-{offset}")
            entries.append(EpochEntry(epoch, offset))
        if entries and last_epoch != entries[-1].epoch:
            raise self._fail(f"HA master handshake says last epoch {last_epoch}, its entries end with "
                             f"{entries[-1].epoch}")
        if not entries and last_epoch not in (-1, 0):
            raise self._fail(f"HA master handshake says last epoch {last_epoch} with no entries")
        return MasterHandshake(max_offset, last_epoch, tuple(entries))

    def _transfer(self, pos: int, body_size: int) -> Transfer:
        buf = self._buf
        _, _, start, epoch, epoch_start, confirm = _TRANSFER.unpack_from(buf, pos)
        # -1: Java's heartbeat before the master knows where the transfer starts
        if start < (-1 if body_size == 0 else 0):
            raise self._fail(f"HA transfer at offset {start}")
        if epoch < 0 or epoch_start < 0 or confirm < -1:
            raise self._fail(f"HA transfer with epoch {epoch}, epoch start {epoch_start}, confirm {confirm}")
        if body_size and epoch_start > start:
            raise self._fail(f"HA transfer at offset {start} before its epoch's start {epoch_start}")
        body_at = pos + TRANSFER_HEADER_SIZE
        return Transfer(start, epoch, epoch_start, confirm, bytes(buf[body_at:body_at + body_size]))
