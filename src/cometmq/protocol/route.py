"""Route and topic bodies shared by the nameserver, brokers and clients (JSON, RocketMQ field names)."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cometmq.protocol.errors import RemoteProtocolError

# Topic permissions (PermName).
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE
#: the most read or write queues a topic may have on one broker (cometmq's bound; RocketMQ sets none)
MAX_QUEUE_NUMS = 1024
#: the most queues a topic config or a route read off the wire may give one broker: a Java broker sets no bound, but
#: a client enumerates the queues a route lists, and a made-up count (2**31 - 1, 10**23) hung it
WIRE_QUEUE_NUMS_MAX = 65536


def perm_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def perm_writable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic as brokers keep it and register it with the nameserver."""

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    #: 5.x message type attribute (NORMAL, FIFO, DELAY, TRANSACTION, MIXED); not on the 4.x wire
    message_type: str = "NORMAL"

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
            "attributes": {"+message.type": self.message_type} if self.message_type != "NORMAL" else {},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TopicConfig:
        try:
            attrs = raw.get("attributes") or {}
            return cls(
                topic_name=str(raw["topicName"]),
                read_queue_nums=_int(raw, "readQueueNums", "topic config", 4, 0, WIRE_QUEUE_NUMS_MAX),
                write_queue_nums=_int(raw, "writeQueueNums", "topic config", 4, 0, WIRE_QUEUE_NUMS_MAX),
                perm=int(raw.get("perm", PERM_READ_WRITE)),
                topic_filter_type=str(raw.get("topicFilterType", "SINGLE_TAG")),
                topic_sys_flag=int(raw.get("topicSysFlag", 0)),
                order=bool(raw.get("order", False)),
                message_type=str(attrs.get("+message.type", "NORMAL")) if isinstance(attrs, Mapping) else "NORMAL",
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"bad topic config: {exc}") from None


# -- JSON helpers ------------------------------------------------------------------------------------------

# Java's fastjson writes Map<Long, String> keys bare ({0:"ip:port"}); only tried after strict parsing fails, so
# a well-formed body is never rewritten.
_BARE_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")
_json_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False).encode

#: Largest register body we inflate: a frame is at most 16 MiB, and a zip bomb must not exhaust memory.
MAX_INFLATED_SIZE = 64 * 1024 * 1024


def encode_json(value: object) -> bytes:
    """Compact ASCII JSON (every JSON reader, jsoncpp and fastjson included, handles the \\u escapes)."""
    return _json_encode(value).encode("ascii")


def decode_json(data: bytes | bytearray | memoryview, what: str) -> Any:
    """Parse a JSON body; ``what`` names it in the ``RemoteProtocolError`` raised for anything malformed."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"{what} is not UTF-8: {exc}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        fixed = _BARE_INT_KEY.sub(r'\1"\2"\3', text)
        if fixed != text:
            try:
                return json.loads(fixed)
            except (ValueError, RecursionError):
                pass
        raise RemoteProtocolError(f"{what} is not valid JSON: {exc}") from None


def _obj(raw: object, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise RemoteProtocolError(f"{what} must be a JSON object, got {type(raw).__name__}")
    return raw


def _member(obj: Mapping[str, Any], key: str, what: str) -> Mapping[str, Any]:
    """The object under ``key``; absent or null reads as empty (fastjson leaves empty maps out)."""
    value = obj.get(key)
    return {} if value is None else _obj(value, what)


def _list(raw: object, what: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RemoteProtocolError(f"{what} must be a JSON array, got {type(raw).__name__}")
    return raw


def _str(raw: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if value is None:
        raise RemoteProtocolError(f"{what}: {key!r} is missing")
    if not isinstance(value, str):
        raise RemoteProtocolError(f"{what}: {key!r} must be a string, got {type(value).__name__}")
    return value


def _int(raw: Mapping[str, Any], key: str, what: str, default: int | None = None, minimum: int | None = None,
         maximum: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise RemoteProtocolError(f"{what}: {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise RemoteProtocolError(f"{what}: {key!r} must be an integer, got {value!r:.40}")
    try:
        number = int(value)  # fastjson and the C++ client sometimes send numbers as strings
    except ValueError:
        raise RemoteProtocolError(f"{what}: {key!r} must be an integer, got {value!r:.40}") from None
    if minimum is not None and number < minimum:
        raise RemoteProtocolError(f"{what}: {key!r} = {number} is below {minimum}")
    if maximum is not None and number > maximum:
        raise RemoteProtocolError(f"{what}: {key!r} = {str(number)[:40]} is above {maximum}")
    return number


# -- route bodies --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueData:
    """One broker's queues of a topic, as the nameserver hands them to clients."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0

    @classmethod
    def from_topic_config(cls, broker_name: str, config: TopicConfig) -> QueueData:
        return cls(broker_name, config.read_queue_nums, config.write_queue_nums, config.perm, config.topic_sys_flag)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json(cls, raw: object) -> QueueData:
        obj = _obj(raw, "queue data")
        # 4.x Java spells the flag "topicSynFlag"; 5.x and the C++ client "topicSysFlag".
        flag_key = "topicSysFlag" if "topicSysFlag" in obj else "topicSynFlag"
        return cls(
            broker_name=_str(obj, "brokerName", "queue data"),
            read_queue_nums=_int(obj, "readQueueNums", "queue data", minimum=0, maximum=WIRE_QUEUE_NUMS_MAX),
            write_queue_nums=_int(obj, "writeQueueNums", "queue data", minimum=0, maximum=WIRE_QUEUE_NUMS_MAX),
            perm=_int(obj, "perm", "queue data", PERM_READ_WRITE, minimum=0),
            topic_sys_flag=_int(obj, flag_key, "queue data", 0),
        )


MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class BrokerData:
    """A broker group: its master (id 0) and replicas (ids 1, 2, ...) by address."""

    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A private copy ordered by id: the instance stays immutable and its JSON deterministic.
        object.__setattr__(self, "broker_addrs", dict(sorted(self.broker_addrs.items())))

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            # Keys are decimal strings: the C++ client runs stoi on them and requires "0" for the master.
            "brokerAddrs": {str(broker_id): addr for broker_id, addr in self.broker_addrs.items()},
        }

    @classmethod
    def from_json(cls, raw: object) -> BrokerData:
        obj = _obj(raw, "broker data")
        addrs_raw = _member(obj, "brokerAddrs", "broker data brokerAddrs")
        addrs: dict[int, str] = {}
        for key, addr in addrs_raw.items():
            try:
                broker_id = int(key)
            except ValueError:
                raise RemoteProtocolError(f"broker data: broker id {key!r} is not an integer") from None
            if not isinstance(addr, str):
                raise RemoteProtocolError(f"broker data: address of broker id {key} is not a string")
            addrs[broker_id] = addr
        return cls(
            cluster=_str(obj, "cluster", "broker data", ""),
            broker_name=_str(obj, "brokerName", "broker data"),
            broker_addrs=addrs,
        )


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC's body: which brokers hold a topic and how many queues each has."""

    queue_datas: tuple[QueueData, ...] = ()
    broker_datas: tuple[BrokerData, ...] = ()
    #: "brokerName:n;..." for globally ordered topics; anything else crashes the C++ client, so usually "".
    order_topic_conf: str = ""
    #: broker address -> filter server addresses (class filtering, unused by current clients)
    filter_server_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.order_topic_conf:  # left out when empty, as Java does for null
            out["orderTopicConf"] = self.order_topic_conf
        out["queueDatas"] = [qd.to_json() for qd in self.queue_datas]
        out["brokerDatas"] = [bd.to_json() for bd in self.broker_datas]
        out["filterServerTable"] = {addr: list(servers) for addr, servers in self.filter_server_table.items()}
        return out

    @classmethod
    def from_json(cls, raw: object) -> TopicRouteData:
        obj = _obj(raw, "topic route")
        order = obj.get("orderTopicConf")
        if order is not None and not isinstance(order, str):
            raise RemoteProtocolError("topic route: 'orderTopicConf' must be a string")
        filters: dict[str, tuple[str, ...]] = {}
        for addr, servers in _member(obj, "filterServerTable", "topic route filterServerTable").items():
            filters[addr] = tuple(_str_list(servers, "topic route filter servers"))
        return cls(
            queue_datas=tuple(QueueData.from_json(qd) for qd in _list(obj.get("queueDatas"), "queueDatas")),
            broker_datas=tuple(BrokerData.from_json(bd) for bd in _list(obj.get("brokerDatas"), "brokerDatas")),
            order_topic_conf=order or "",
            filter_server_table=filters,
        )

    def encode(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> TopicRouteData:
        return cls.from_json(decode_json(data, "topic route"))


def _str_list(raw: object, what: str) -> list[str]:
    items = _list(raw, what)
    for item in items:
        if not isinstance(item, str):
            raise RemoteProtocolError(f"{what} must hold strings, got {type(item).__name__}")
    return items


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO's body: every broker group, and the broker names of each cluster."""

    broker_addr_table: Mapping[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: bd.to_json() for name, bd in self.broker_addr_table.items()},
            "clusterAddrTable": {cluster: list(names) for cluster, names in self.cluster_addr_table.items()},
        }

    @classmethod
    def from_json(cls, raw: object) -> ClusterInfo:
        obj = _obj(raw, "cluster info")
        brokers = {
            name: BrokerData.from_json(bd)
            for name, bd in _member(obj, "brokerAddrTable", "cluster info brokerAddrTable").items()
        }
        clusters = {
            cluster: tuple(_str_list(names, "cluster info broker names"))
            for cluster, names in _member(obj, "clusterAddrTable", "cluster info clusterAddrTable").items()
        }
        return cls(brokers, clusters)

    def encode(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> ClusterInfo:
        return cls.from_json(decode_json(data, "cluster info"))


@dataclass(frozen=True, slots=True)
class TopicList:
    """The body of the topic-list queries (206, 224, ...): ``{"topicList": [...]}``."""

    topics: tuple[str, ...] = ()
    broker_addr: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topicList": list(self.topics)}
        if self.broker_addr is not None:
            out["brokerAddr"] = self.broker_addr
        return out

    @classmethod
    def from_json(cls, raw: object) -> TopicList:
        obj = _obj(raw, "topic list")
        addr = obj.get("brokerAddr")
        if addr is not None and not isinstance(addr, str):
            raise RemoteProtocolError("topic list: 'brokerAddr' must be a string")
        return cls(tuple(_str_list(obj.get("topicList"), "topic list")), addr)

    def encode(self) -> bytes:
        return encode_json(self.to_json())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> TopicList:
        return cls.from_json(decode_json(data, "topic list"))


# -- broker registration -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataVersion:
    """A broker's topic-table version; the nameserver re-reads the topics only when it changes."""

    timestamp: int = 0
    counter: int = 0
    #: 5.x controller epoch; part of equality, as in 5.x
    state_version: int = 0

    def next_version(self, now_ms: int) -> DataVersion:
        return DataVersion(now_ms, self.counter + 1, self.state_version)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timestamp": self.timestamp, "counter": self.counter}
        if self.state_version:
            out["stateVersion"] = self.state_version
        return out

    @classmethod
    def from_json(cls, raw: object) -> DataVersion:
        obj = _obj(raw, "data version")
        return cls(
            _int(obj, "timestamp", "data version", 0),
            _int(obj, "counter", "data version", 0),
            _int(obj, "stateVersion", "data version", 0),
        )

    def encode(self) -> bytes:
        """QUERY_DATA_VERSION's request and answer body (Java's ``DataVersion.encode()``: the JSON object)."""
        return encode_json(self.to_json())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> DataVersion:
        return cls.from_json(decode_json(data, "data version"))


_I32 = struct.Struct(">i")


def body_crc32(body: bytes | bytearray | memoryview) -> int:
    """REGISTER_BROKER's ``bodyCrc32`` header: CRC32 of the body as sent, masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


class RegisterBrokerResult(NamedTuple):
    """REGISTER_BROKER's reply header: a replica's master address and its HA address (None for a master)."""

    master_addr: str | None
    ha_server_addr: str | None


@dataclass(frozen=True, slots=True)
class RegisterBrokerBody:
    """REGISTER_BROKER's body: the broker's topics, their data version and its filter servers."""

    topic_configs: tuple[TopicConfig, ...] = ()
    data_version: DataVersion = field(default_factory=DataVersion)
    filter_server_list: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": {tc.topic_name: tc.to_json() for tc in self.topic_configs},
                "dataVersion": self.data_version.to_json(),
            },
            "filterServerList": list(self.filter_server_list),
        }

    @classmethod
    def from_json(cls, raw: object) -> RegisterBrokerBody:
        obj = _obj(raw, "register body")
        wrapper = _member(obj, "topicConfigSerializeWrapper", "register body topicConfigSerializeWrapper")
        table = _member(wrapper, "topicConfigTable", "register body topicConfigTable")
        configs = []
        for name, raw_config in table.items():
            config_obj = dict(_obj(raw_config, f"topic config {name!r}"))
            if config_obj.get("topicName") is None:  # the table key names the topic when the value does not
                config_obj["topicName"] = name
            configs.append(_checked(_topic_config(config_obj)))
        version = wrapper.get("dataVersion")
        return cls(
            topic_configs=tuple(configs),
            data_version=DataVersion() if version is None else DataVersion.from_json(version),
            filter_server_list=tuple(_str_list(obj.get("filterServerList"), "register body filterServerList")),
        )

    def encode(self, compress: bool = False) -> bytes:
        """JSON, or with ``compress`` Java's compact layout deflated (header ``compressed`` "true"), as
        RocketMQ's ``RegisterBrokerBody.encode(true)``.

        That layout is: int32 length + DataVersion JSON, int32 topic count, per topic int32 length +
        "name read write perm filterType attributesJSON" (``TopicConfig.encode()``), int32 length + filter
        server JSON array, int32 count of static-topic mappings (always 0 here). It carries neither topicSysFlag
        nor order: ``compressible()`` says whether a table loses nothing by it.
        """
        if not compress:
            return encode_json(self.to_json())
        parts = [_framed(encode_json(self.data_version.to_json())), _I32.pack(len(self.topic_configs))]
        pack = _I32.pack
        for tc in self.topic_configs:
            attrs = b"{}" if tc.message_type == "NORMAL" else encode_json(tc.to_json()["attributes"])
            line = (f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} {tc.topic_filter_type} "
                    ).encode() + attrs
            parts += (pack(len(line)), line)
        parts += (_framed(encode_json(list(self.filter_server_list))), _I32.pack(0))
        # Deflater.BEST_COMPRESSION, as Java: the body is built once per change and read by every nameserver
        return zlib.compress(b"".join(parts), 9)

    @staticmethod
    def compressible(config: TopicConfig) -> bool:
        """Whether the compact (compressed) layout carries all of ``config`` that routes use: it has no
        topicSysFlag field, so a unit topic (flag != 0) must go in a JSON body to keep its flag."""
        return config.topic_sys_flag == 0

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, compressed: bool = False) -> RegisterBrokerBody:
        if not compressed and not looks_deflated(data):
            if not data:  # Java accepts a bodiless registration as an empty topic table
                return cls()
            return cls.from_json(decode_json(data, "register body"))
        raw = _inflate(bytes(data))
        if raw[:1] == b"{":  # zlib-compressed JSON (a peer that compresses the plain body) is accepted too
            return cls.from_json(decode_json(raw, "register body"))
        return cls._from_compact(raw)

    @classmethod
    def _from_compact(cls, raw: bytes) -> RegisterBrokerBody:
        reader = _Reader(raw)
        version = DataVersion.from_json(decode_json(reader.framed(), "register body data version"))
        count = reader.int32()
        if count < 0 or count > len(raw) // 4:  # every entry takes at least its 4-byte length
            raise RemoteProtocolError(f"register body: topic count {count} does not fit the body")
        configs = [_compact_topic(reader.framed()) for _ in range(count)]
        servers = _str_list(decode_json(reader.framed(), "register body filterServerList"), "filterServerList")
        # What follows (5.x static-topic mappings) does not concern routing; it is ignored.
        return cls(tuple(configs), version, tuple(servers))


def _topic_config(raw: Mapping[str, Any]) -> TopicConfig:
    try:
        return TopicConfig.from_json(raw)
    except OverflowError:  # int() of a JSON infinity, which TopicConfig.from_json does not expect
        raise RemoteProtocolError(f"topic config {raw.get('topicName')!r:.80}: a number is out of range") from None


def _checked(config: TopicConfig) -> TopicConfig:
    if not config.topic_name:
        raise RemoteProtocolError("topic config: empty topic name")
    if config.read_queue_nums < 0 or config.write_queue_nums < 0 or config.perm < 0:
        raise RemoteProtocolError(f"topic config {config.topic_name!r}: negative queue count or perm")
    return config


def _compact_topic(line_bytes: bytes) -> TopicConfig:
    try:
        line = line_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("register body: topic entry is not UTF-8") from None
    fields = line.split(" ")
    if len(fields) < 5:
        raise RemoteProtocolError(f"register body: topic entry {line[:80]!r} has fewer than 5 fields")
    attrs: object = {}
    if len(fields) >= 6 and fields[5]:
        try:
            attrs = json.loads(" ".join(fields[5:]))
        except ValueError:
            attrs = {}  # Java ignores attributes it cannot parse as well
    raw: dict[str, Any] = {
        "topicName": fields[0],
        "readQueueNums": fields[1],
        "writeQueueNums": fields[2],
        "perm": fields[3],
        "topicFilterType": fields[4],
        "attributes": attrs if isinstance(attrs, dict) else {},
    }
    return _checked(_topic_config(raw))


def looks_deflated(data: bytes | bytearray | memoryview) -> bool:
    """Whether a register body is a zlib stream rather than JSON. RocketMQ 5.x brokers with
    ``compressedRegister=true`` deflate the body but send the header ``compressed`` "false" (BrokerOuterAPI
    since RIP-32); a JSON body starts with ``{`` (or blanks), a zlib stream with CMF 0x78 and a header whose
    16-bit value is a multiple of 31."""
    if len(data) < 2 or data[0] != 0x78:
        return False
    return (data[0] * 256 + data[1]) % 31 == 0


def _framed(payload: bytes) -> bytes:
    return _I32.pack(len(payload)) + payload


def _inflate(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, MAX_INFLATED_SIZE + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(f"compressed register body does not inflate: {exc}") from None
    if len(raw) > MAX_INFLATED_SIZE or inflater.unconsumed_tail:
        raise RemoteProtocolError(f"compressed register body inflates beyond {MAX_INFLATED_SIZE} bytes")
    if not inflater.eof:
        raise RemoteProtocolError("compressed register body is truncated: its zlib stream does not end")
    return raw


class _Reader:
    """Big-endian cursor over the inflated compact layout; running short is a RemoteProtocolError."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def int32(self) -> int:
        if self._pos + 4 > len(self._data):
            raise RemoteProtocolError("compressed register body is truncated")
        (value,) = _I32.unpack_from(self._data, self._pos)
        self._pos += 4
        return int(value)

    def framed(self) -> bytes:
        length = self.int32()
        if length < 0 or self._pos + length > len(self._data):
            raise RemoteProtocolError(f"compressed register body: field length {length} overruns the body")
        chunk = self._data[self._pos : self._pos + length]
        self._pos += length
        return chunk
