"""The store's configuration: one frozen dataclass, readable from RocketMQ's key names."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CQ_UNIT_SIZE = 20


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class ConfigError(ValueError):
    """A configuration key or value that cannot be used; the message names it."""


@dataclass(frozen=True)
class StoreConfig:
    store_path: Path = field(default_factory=lambda: Path("data"))
    #: commit-log segment size in bytes (RocketMQ mappedFileSizeCommitLog)
    commitlog_segment_size: int = 1 << 30
    #: consume-queue units per file (RocketMQ mappedFileSizeConsumeQueue / 20)
    consume_queue_units_per_file: int = 300_000
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commitlog_ms: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    #: a consume queue is flushed when it has this many dirty pages (or a full file) ... (RocketMQ's)
    flush_consume_queue_least_pages: int = 2
    #: ... or, whatever it has, when this many ms passed since the last thorough flush (RocketMQ's)
    flush_consume_queue_thorough_interval_ms: int = 60_000
    #: ms between flushes of the index (cometmq's; RocketMQ flushes an index file only once it is full). Hash slots
    #: are written at random, and each flush makes every slot page fault again on its next write; checkpoints do
    #: not claim past the last index flush, so after a crash recovery re-indexes at most this much of the log
    flush_interval_index_ms: int = 10_000
    #: consume-queue files mapped at once; the least recently used is unmapped beyond (store/cq_file.py)
    max_open_consume_queue_files: int = 8192
    sync_flush_timeout_ms: int = 5000
    #: SYNC_FLUSH: the broker's send path runs the group commit's fdatasync on its own thread while the
    #: average fdatasync takes at most this many µs (no thread hand-offs); slower disks use the flush thread.
    #: 0 = always the flush thread.
    group_commit_inline_max_us: int = 2000
    max_message_size: int = 4 * 1024 * 1024
    #: hours a commit-log segment is kept after its last write
    file_reserved_time_h: float = 72
    #: hour(s) of the day when expired files are deleted, "04" or "04;16"
    delete_when: str = "04"
    #: above this % of the store's file system, expired segments are deleted whatever the hour (RocketMQ's)
    disk_max_used_space_ratio: int = 75
    #: above this %, the oldest segments are deleted before their reserved time, when ``clean_file_forcibly_enable``
    #: (RocketMQ diskSpaceCleanForciblyRatio); each such deletion is logged at WARNING and counted
    disk_force_clean_ratio: int = 85
    #: RocketMQ cleanFileForciblyEnable (default true): whether the forced clean above may delete segments before
    #: their reserved time, consumed or not. false: nothing is deleted early; writes are refused at the warning level
    clean_file_forcibly_enable: bool = True
    #: above this %, writes are refused before anything is written: SERVICE_NOT_AVAILABLE "disk full" (RocketMQ
    #: diskSpaceWarningLevelRatio); they are taken again once usage is back below ``disk_force_clean_ratio``
    disk_space_warning_level_ratio: int = 90
    clean_resource_interval_ms: int = 10_000
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    #: largest answer to one read, in bytes and records (RocketMQ maxTransfer*OnMessageInMemory). RocketMQ caps
    #: the count at 32; a read costs ~100 µs of fixed work here, so bulk readers (lite pull, Spark) asking
    #: for more get up to 1024 (measured: 170-280k -> 400-600k msg/s on a 1M backlog). Push consumers ask 32.
    max_transfer_bytes: int = 256 * 1024
    max_transfer_count: int = 1024
    #: preallocate segment blocks so a full disk fails an append instead of faulting a mapped page
    preallocate: bool = True
    #: fault the commit log's pages in this far ahead of the writer, from a background thread, so appends do not
    #: page-fault while holding the GIL (0: off). Costs at most this much extra resident memory.
    warm_ahead_bytes: int = 32 << 20
    #: a first commit-log segment that does not fit the log (a wrong size or name) refuses the start (it would
    #: leave an empty log, whose queue offsets restart from 0); true: set it and every later one aside, start empty
    set_aside_unfit_first_segment: bool = False
    #: after a clean stop, recovery still checks (lengths and body CRC) the records of the last this many
    #: commit-log segments (RocketMQ re-walks the last 3 with checkCRCOnRecover); 0: trust the checkpoint
    recover_check_segments: int = 3

    def __post_init__(self) -> None:
        if self.commitlog_segment_size < 4096:
            raise ConfigError(f"commitlog_segment_size {self.commitlog_segment_size} is below 4096")
        if self.consume_queue_units_per_file < 2:
            raise ConfigError("consume_queue_units_per_file must be at least 2")
        if self.max_open_consume_queue_files < 1:
            raise ConfigError("max_open_consume_queue_files must be at least 1")
        if self.max_message_size > self.commitlog_segment_size - 8:
            raise ConfigError(f"maxMessageSize (max_message_size) {self.max_message_size} must fit in one "
                              f"commit-log segment (mappedFileSizeCommitLog {self.commitlog_segment_size}, less 8)")
        if not 10 <= self.disk_max_used_space_ratio <= 95:
            raise ConfigError("disk_max_used_space_ratio must be within 10..95")
        if not 1 <= self.disk_space_warning_level_ratio <= 100:
            raise ConfigError("disk_space_warning_level_ratio must be within 1..100")
        try:
            delete_when(self.delete_when)
        except ValueError as exc:
            raise ConfigError(f"deleteWhen={self.delete_when!r}: {exc}") from None

    @property
    def commitlog_dir(self) -> Path:
        return Path(self.store_path) / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return Path(self.store_path) / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return Path(self.store_path) / "index"

    @property
    def config_dir(self) -> Path:
        return Path(self.store_path) / "config"

    @property
    def delete_hours(self) -> frozenset[int]:
        hours = set()
        for part in self.delete_when.replace(",", ";").split(";"):
            part = part.strip()
            if part:
                hours.add(int(part))
        return frozenset(hours)

    def replace(self, **changes: Any) -> StoreConfig:
        return dataclasses.replace(self, **changes)


def _to_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


#: the largest value of a number key (RocketMQ's fields are Java ints): larger waits overflow the system's timers
INT_MAX = 2**31 - 1


def int_in(lo: int, hi: int = INT_MAX) -> Callable[[str], int]:
    """A converter of a whole-number key whose value must be within lo..hi (the key tables' ranges)."""
    def convert(value: str) -> int:
        n = int(value)
        if not lo <= n <= hi:
            raise ValueError(f"must be at least {lo}" if n < lo and hi == INT_MAX else f"must be {lo}..{hi}")
        return n
    return convert


def float_in(lo: float, hi: float = INT_MAX) -> Callable[[str], float]:
    """A converter of a number key (fractions allowed) whose value must be within lo..hi."""
    def convert(value: str) -> float:
        x = float(value)
        if not (math.isfinite(x) and lo <= x <= hi):
            raise ValueError(f"must be at least {lo:g}" if x < lo and hi == INT_MAX else f"must be {lo:g}..{hi:g}")
        return x
    return convert


def delete_when(value: str) -> str:
    """deleteWhen: hours of the day, "04" or "04;16"."""
    hours = [part.strip() for part in value.replace(",", ";").split(";") if part.strip()]
    if not hours or not all(h.isdigit() and 0 <= int(h) <= 23 for h in hours):
        raise ValueError('must be hours of the day, 0..23, separated by ";" (as "04;16")')
    return value


#: RocketMQ key name -> (field name, converter); a converter made by int_in/float_in holds the key's range
STORE_KEYS: dict[str, tuple[str, Any]] = {
    "storePathRootDir": ("store_path", Path),
    "mappedFileSizeCommitLog": ("commitlog_segment_size", int_in(4096)),
    "setAsideUnfitFirstSegment": ("set_aside_unfit_first_segment", _to_bool),
    "recoverCheckSegments": ("recover_check_segments", int_in(0)),
    "mappedFileSizeConsumeQueue": ("consume_queue_units_per_file",
                                   lambda v: int_in(2 * CQ_UNIT_SIZE)(v) // CQ_UNIT_SIZE),
    "flushDiskType": ("flush_disk_type", lambda v: FlushDiskType(v.strip().upper())),
    "flushIntervalCommitLog": ("flush_interval_commitlog_ms", int_in(1)),
    "flushCommitLogLeastPages": ("flush_commitlog_least_pages", int_in(0)),
    "flushCommitLogThoroughInterval": ("flush_commitlog_thorough_interval_ms", int_in(0)),
    "flushIntervalConsumeQueue": ("flush_interval_consume_queue_ms", int_in(1)),
    "flushConsumeQueueLeastPages": ("flush_consume_queue_least_pages", int_in(0)),
    "flushConsumeQueueThoroughInterval": ("flush_consume_queue_thorough_interval_ms", int_in(0)),
    "flushIntervalIndex": ("flush_interval_index_ms", int_in(0)),
    "maxOpenConsumeQueueFiles": ("max_open_consume_queue_files", int_in(1)),
    "syncFlushTimeout": ("sync_flush_timeout_ms", int_in(1)),
    "groupCommitInlineMaxMicros": ("group_commit_inline_max_us", int_in(0)),
    "maxMessageSize": ("max_message_size", int_in(1)),
    "fileReservedTime": ("file_reserved_time_h", float_in(0)),
    "deleteWhen": ("delete_when", delete_when),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio", int_in(10, 95)),
    "diskForceCleanRatio": ("disk_force_clean_ratio", int_in(1, 100)),
    "diskSpaceCleanForciblyRatio": ("disk_force_clean_ratio", int_in(1, 100)),  # RocketMQ 5's MessageStoreConfig name
    "diskSpaceWarningLevelRatio": ("disk_space_warning_level_ratio", int_in(1, 100)),
    "cleanFileForciblyEnable": ("clean_file_forcibly_enable", _to_bool),
    "cleanResourceInterval": ("clean_resource_interval_ms", int_in(1)),
    "messageIndexEnable": ("message_index_enable", _to_bool),
    "maxHashSlotNum": ("max_hash_slot_num", int_in(1)),
    "maxIndexNum": ("max_index_num", int_in(1)),
    "commitLogWarmAheadBytes": ("warm_ahead_bytes", int_in(0)),
    "maxTransferBytesOnMessageInMemory": ("max_transfer_bytes", int_in(1)),
    "maxTransferCountOnMessageInMemory": ("max_transfer_count", int_in(1)),
}


def property_bool(value: str) -> bool:
    """A properties file's boolean: true/false (also 1/0, yes/no), any case."""
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def property_port(value: str) -> int:
    """A properties file's port number (0: any free port)."""
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError("a port is 0..65535 (0: any free port)")
    return port


def convert_keys(props: Mapping[str, str], keys: Mapping[str, tuple[str, Any]]) -> dict[str, Any]:
    """Field values for the RocketMQ-named keys of ``props`` that ``keys`` knows; a bad value names its key."""
    changes: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    for key, raw in props.items():
        spec = keys.get(key)
        if spec is None:
            continue
        name, convert = spec
        if set_by.setdefault(name, key) != key:  # two names of one setting (registerBrokerInterval, ...)
            raise ConfigError(f"{set_by[name]} and {key} are the same setting: give one of them")
        try:
            changes[name] = convert(raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{key}={raw!r}: {exc}") from None
    return changes


def parse_properties(text: str) -> dict[str, str]:
    """Java-properties-style ``key=value`` lines; ``#`` and ``!`` start comments."""
    out: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"line {number}: expected key=value, got {line!r}")
        key = line[:sep].strip()
        if key in lines:  # Java's Properties keeps the last silently: one of the two is a mistake
            raise ConfigError(f"line {number}: {key} is given twice (also on line {lines[key]})")
        lines[key] = number
        out[key] = line[sep + 1 :].strip()
    return out


def read_properties(path: str | Path) -> dict[str, str]:
    """A properties file's keys; ConfigError naming the file when it cannot be read, is not UTF-8 or does not
    parse."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: line {line} is not UTF-8 text (byte {data[exc.start]:#04x})") from None
    try:
        return parse_properties(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def store_config_from_properties(props: Mapping[str, str], base: StoreConfig | None = None) -> StoreConfig:
    """Build a StoreConfig from RocketMQ-named keys. Keys not about the store are ignored here;
    the broker's config reader reports keys that no component knows."""
    return dataclasses.replace(base or StoreConfig(), **convert_keys(props, STORE_KEYS))
