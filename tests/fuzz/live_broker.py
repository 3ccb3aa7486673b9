"""Hostile input against a live ``cometmq serve``: frame strategies, a raw multi-socket sender, a good client.

* :class:`LiveBroker` runs ``python -m cometmq.cli serve`` (nameserver + broker in one process) in a subprocess
  with a fresh data folder and free 127.0.0.1 ports (``tests/interop/cometmq_server.CometServer``), and reads its
  RSS (psutil) and its log (every ERROR line, and which request codes made a handler raise).
* :func:`frames` is the hypothesis strategy of hostile frames: well-formed frames of every ``RequestCode`` (and
  random codes) whose header fields are missing, mistyped, huge, negative, unicode or random, with random bodies
  (binary, JSON-ish with the keys RocketMQ bodies use, message batches, property strings); a share of them is
  then damaged byte-wise (bit flips, truncation, extension, a wrong length prefix, a bad serialize type, a header
  length past the frame) or replaced by garbage.
* :func:`send_batch` sends a batch over several sockets at once (to the broker and the nameserver port), reads
  what comes back and counts the replies by code. A socket the server closed (framing lost) is reopened.
* :class:`GoodClient` is the client that must keep being served: the SDK ``Producer`` and ``Admin`` (its
  ``pull`` is a plain PULL_MESSAGE) on their own event loop thread, on topics and a group no hostile frame names.

The hostile names never include the good client's names (``GOOD`` prefix), so a hostile admin request (delete a
topic, reset offsets) cannot legitimately break the good client; broker-wide switches that would
(WIPE_WRITE_PERM_OF_BROKER for the broker's own name, UPDATE_BROKER_CONFIG of brokerPermission) are kept out of
the name and key pools for the same reason.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
from hypothesis import strategies as st

from cometmq.protocol import headers as _headers
from cometmq.protocol.batch import encode_batch
from cometmq.protocol.codes import LanguageCode, RequestCode
from cometmq.protocol.remoting import FrameDecoder
from tests.interop.cometmq_server import CometServer

T = TypeVar("T")

#: The broker.conf of the fuzzed broker: small files, so rolls and index files happen within a short run.
FUZZ_CONF: dict[str, str] = {
    "mappedFileSizeCommitLog": str(8 << 20),
    "mappedFileSizeConsumeQueue": str(20 * 2000),
    "maxHashSlotNum": "1024",
    "maxIndexNum": "4096",
    "mappedFileSizeTimerLog": str(1 << 20),
    "messageDelayLevel": "1s 2s 3s",
    "flushConsumerOffsetInterval": "500",
}


def fuzz_seconds(default: float) -> float:
    """The time budget of one fuzz test: ``COMETMQ_FUZZ_SECONDS`` (the long run sets it), else ``default``."""
    raw = os.environ.get("COMETMQ_FUZZ_SECONDS")
    return float(raw) if raw else default


def report_dir() -> Path | None:
    """Where the tests write their numbers (``COMETMQ_FUZZ_REPORT``, a folder), for docs/reliability.md."""
    raw = os.environ.get("COMETMQ_FUZZ_REPORT")
    if not raw:
        return None
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_report(name: str, data: dict[str, Any]) -> None:
    out = report_dir()
    if out is not None:
        (out / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str), encoding="utf-8")


# -- the broker ------------------------------------------------------------------------------------------------

_HANDLER_FAILED = re.compile(r"handler for request code (-?\d+) from \S+ failed")
_REPLY_FAILED = re.compile(r"cannot send reply to request code (-?\d+)")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b.*)$")


@dataclass
class LogSummary:
    error_lines: int = 0
    tracebacks: int = 0
    #: (request code, exception line) -> count, from "handler for request code N ... failed" tracebacks
    handler_failures: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    #: other ERROR lines (message text without the timestamp) -> count
    other_errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"error_lines": self.error_lines, "tracebacks": self.tracebacks,
                "handler_failures": {f"{c}: {e}": n for (c, e), n in self.handler_failures.most_common()},
                "other_errors": dict(self.other_errors.most_common(30))}


def summarize_log(text: str) -> LogSummary:
    """Count the ERROR lines of a broker log and attribute handler tracebacks to their request code."""
    out = LogSummary()
    lines = text.splitlines()
    pending: tuple[int, str] | None = None  # (code, kind) of the traceback being read
    for line in lines:
        if " ERROR " in line or line.startswith("ERROR"):
            out.error_lines += 1
            m = _HANDLER_FAILED.search(line) or _REPLY_FAILED.search(line)
            if m:
                pending = (int(m.group(1)), "reply" if "cannot send reply" in line else "handler")
            else:
                msg = re.sub(r"^\S+ \S+ ", "", line)
                out.other_errors[re.sub(r"\d+", "N", msg)[:160]] += 1
                pending = None
            continue
        if line.startswith("Traceback"):
            out.tracebacks += 1
            continue
        if pending is not None:
            m = _EXC_LINE.match(line)
            if m:
                label = m.group(1)[:160] if pending[1] == "handler" else "reply: " + m.group(1)[:150]
                out.handler_failures[(pending[0], label)] += 1
                pending = None
    return out


class LiveBroker(CometServer):
    """A ``cometmq serve`` subprocess for fuzzing (see the module docstring)."""

    def __init__(self, workdir: Path, conf: dict[str, str] | None = None) -> None:
        super().__init__(workdir, {**FUZZ_CONF, **(conf or {})})
        self.max_rss = 0

    def rss(self) -> int:
        """The broker process's resident set size in bytes (0 when it is not running); tracks the maximum."""
        if not self.running or self.pid is None:
            return 0
        try:
            value = int(psutil.Process(self.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            return 0
        self.max_rss = max(self.max_rss, value)
        return value

    def log_summary(self) -> LogSummary:
        return summarize_log(self.all_logs())


# -- the good client -------------------------------------------------------------------------------------------


class LoopThread:
    """An event loop in a daemon thread: ``run(coro)`` from synchronous (hypothesis) code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-good-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class GoodClient:
    """SDK Producer + Admin (pull, offsets) kept connected across hostile batches; every call checks itself."""

    def __init__(self, namesrv: str) -> None:
        from cometmq.client import Producer
        from cometmq.client.admin import Admin

        self.lt = LoopThread()
        self.producer = Producer("GOOD_PG", namesrv=namesrv, send_timeout=5.0, retries=0)
        self.admin = Admin(namesrv=namesrv, timeout=5.0)
        self.lt.run(self.producer.start())
        self.lt.run(self.admin.start())
        self.broker_name = ""
        self.round_trips = 0

    def create_topic(self, topic: str, queues: int = 2) -> None:
        self.lt.run(self.admin.create_topic(topic, read_queues=queues, write_queues=queues, wait=10.0))
        route = self.lt.run(self.admin.topic_route(topic))
        self.broker_name = route.broker_datas[0].broker_name

    def send(self, topic: str, body: bytes, queue_id: int) -> int:
        """Send to one queue; the queue offset the broker gave it."""
        from cometmq.client import Message, MessageQueue

        q = MessageQueue(topic, self.broker_name, queue_id)
        result = self.lt.run(self.producer.send(Message(topic, body, tags="GOOD"), queue=q))
        assert result.ok, f"good send failed: {result}"
        return int(result.queue_offset)

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> list[tuple[int, bytes]]:
        from cometmq.client import MessageQueue

        r = self.lt.run(self.admin.pull(MessageQueue(topic, self.broker_name, queue_id), offset, max_nums,
                                        group="GOOD_CG"))
        return [(m.queue_offset, m.body) for m in r.messages]

    def commit(self, topic: str, queue_id: int, offset: int) -> None:
        from cometmq.client import MessageQueue

        self.lt.run(self.admin.update_consumer_offset("GOOD_CG", MessageQueue(topic, self.broker_name, queue_id),
                                                      offset))

    def committed(self, topic: str, queue_id: int) -> int | None:
        from cometmq.client import MessageQueue

        return self.lt.run(self.admin.committed_offset("GOOD_CG", MessageQueue(topic, self.broker_name, queue_id)))

    def round_trip(self, topic: str, tag: str) -> None:
        """Send one message and pull it back at the offset it got: the broker still serves a good client."""
        body = f"good {tag} {self.round_trips}".encode()
        offset = self.send(topic, body, self.round_trips % 2)
        got = self.pull(topic, self.round_trips % 2, offset, 1)
        assert got == [(offset, body)], f"good round trip: sent {body!r} at {offset}, pulled {got!r}"
        self.round_trips += 1

    def close(self) -> None:
        try:
            self.lt.run(self.producer.close(), 10)
            self.lt.run(self.admin.close(), 10)
        finally:
            self.lt.close()


# -- hostile frames --------------------------------------------------------------------------------------------

CODES = sorted(int(c) for c in RequestCode)
LANGUAGES = [lc.name for lc in LanguageCode]


def _header_keys() -> list[str]:
    keys: set[str] = set()
    for obj in vars(_headers).values():
        if isinstance(obj, type) and issubclass(obj, _headers.Header) and obj is not _headers.Header:
            keys.update(wire for _, wire, _, _ in _headers._spec(obj))
    keys.update(["topic", "queueId", "queueOffset", "consumerGroup", "group", "brokerName", "brokerAddr",
                 "clusterName", "brokerId", "haServerAddr", "msgId", "offsetMsgId", "key", "commitLogOffset",
                 "transactionId", "tranStateTableOffset", "recallHandle", "extraInfo", "invisibleTime",
                 "maxMsgNums", "sysFlag", "subscription", "expressionType", "suspendTimeoutMillis", "timestamp",
                 "beginTimestamp", "endTimestamp", "maxNum", "namespace", "topicList", "compareGroup", "offset",
                 "properties", "bornTimestamp", "delayLevel", "originMsgId", "originTopic", "maxReconsumeTimes",
                 "readQueueNums", "writeQueueNums", "perm", "topicFilterType", "order", "attributes", "pollTime",
                 "bornTime", "initMode", "orderCountInfo", "unitMode", "batch", "defaultTopic",
                 "defaultTopicQueueNums", "producerGroup", "flag", "reconsumeTimes", "a", "b", "c", "d", "e",
                 "f", "g", "h", "i", "j", "k", "l", "m", "n"])
    # broker-wide switches that would legitimately stop the good client (see the module docstring)
    keys -= {"brokerPermission"}
    return sorted(keys)


HEADER_KEYS = _header_keys()

#: names hostile requests use: system topics and groups included, the good client's never
HOSTILE_NAMES = ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                 "rmq_sys_wheel_timer", "%RETRY%cg", "%DLQ%cg", "%RETRY%fuzz", "fuzz", "fuzz-topic", "cg",
                 "DefaultCluster", "DEFAULT_CONSUMER", "TOOLS_CONSUMER", "CID_RMQ_SYS_TRANS", "rmq_sys_REVIVE_LOG_",
                 "fuzz_group", "%LMQ%x", "topic with space", "a" * 127, "a" * 128, "a" * 300, "..", "../..",
                 "/etc/passwd", "x/../../y", "\x00", "\u00e9\u4e2d\U0001f600", "\ud800", "*", "", " ", "||", "%", ":"]

NUMBERS = ["0", "-1", "1", "2", "3", "16", "127", "128", "255", "32767", "32768", "65535", "65536",
           "2147483647", "2147483648", "-2147483648", "-2147483649", "4294967296",
           "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
           "99999999999999999999999999999", "1e308", "1e309", "NaN", "nan", "inf", "-inf", "0x10", " 1", "1 ",
           "1.5", "-0", "+1", "\u0661\u0662", "1_000", "", "true", "false", "null"]

SPECIAL_STRINGS = ["*", "TAG1 || TAG2", "a > 1", "a BETWEEN 1 AND 2", "SQL92", "TAG", "(((((", "a=1 AND",
                   "127.0.0.1:10911", "127.0.0.1:0", ":", "127.0.0.1:99999", "[::1]:1", "0 1 2 3 4 5 b 0 0",
                   "1 1 1 1 1 1 broker-a 0 0 1", "x" * 70_000, "\x01\x02\x01\x02",
                   "KEYS\x01k\x02TAGS\x01t\x02", "DELAY\x0199\x02", "TIMER_DELIVER_MS\x0199999999999999\x02",
                   "TIMER_DELAY_SEC\x01-5\x02", "TRAN_MSG\x01true\x02", "MAX_OFFSET\x01x\x02",
                   "7F0000010000000000000001", "7F000001000000000000000000000000", "ZZZZ", "0" * 32,
                   "00000000000000000000000000000000FFFFFFFF"]


def _big_int() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**31, -(2**31) - 1, 2**63, 2**64, -(2**63)]))


def ext_values() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMBERS), st.sampled_from(HOSTILE_NAMES), st.sampled_from(SPECIAL_STRINGS),
        st.integers(-(2**40), 2**40).map(str), _big_int().map(str), st.text(max_size=24),
        st.binary(max_size=24).map(lambda b: b.decode("latin-1")),
    )


#: raw JSON values for the JSON header: what normalize_ext_fields turns into strings, and what it refuses
json_scalars = st.one_of(st.none(), st.booleans(), _big_int(), st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3)), max_leaves=6)

BODY_KEYS = ["topic", "topicConfigTable", "offsetTable", "mqSet", "consumerDataSet", "producerDataSet",
             "subscriptionDataSet", "subscriptionGroupTable", "groupName", "consumerGroup", "brokerName",
             "brokerAddr", "queueId", "clientID", "clientId", "heartbeatFingerprint", "consumeType",
             "messageModel", "consumeFromWhere", "subString", "tagsSet", "codeSet", "expressionType",
             "readQueueNums", "writeQueueNums", "perm", "topicName", "dataVersion", "timestamp", "counter",
             "filterServerList", "topicList", "brokerId", "clientAddr", "groupSet", "topicSet", "configs",
             "brokerPermission", "table", "ackOffsetList", "bitSet", "startOffset", "reviveQueueId", "popTime",
             "invisibleTime", "retryMaxTimes", "consumeEnable", "attributes", "order", "unitMode", "mode",
             "popShareQueueNum", "epoch", "syncStateSet", "masterAddress", "brokerSet"]
BODY_KEYS.remove("brokerPermission")

json_bodies = st.recursive(
    st.one_of(json_scalars, st.sampled_from(HOSTILE_NAMES)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(BODY_KEYS), st.text(max_size=6)), inner,
                                            max_size=5)),
    max_leaves=20,
).map(lambda v: json.dumps(v, allow_nan=True).encode())

props_text = st.dictionaries(st.sampled_from(["KEYS", "TAGS", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
                                              "TRAN_MSG", "PGROUP", "UNIQ_KEY", "WAIT", "__SHARDINGKEY",
                                              "INNER_NUM", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC",
                                              "CLUSTER", "MSG_REGION"]) | st.text(max_size=6),
                             ext_values(), max_size=4)

def _batch(items: list[tuple[bytes, dict[str, str], int]]) -> bytes:
    """A SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages) of what the encoder accepts, else raw bytes."""
    try:
        return encode_batch([(b, {k: v for k, v in p.items() if k and v and "\x01" not in k + v
                                  and "\x02" not in k + v}, f) for b, p, f in items])
    except Exception:  # a LocalProtocolError: properties the encoder refuses (too long, not UTF-8)
        return b"".join(b for b, _, _ in items)


batch_bodies = st.lists(st.tuples(st.binary(max_size=64), props_text, st.integers(-5, 2**31 - 1)),
                        min_size=1, max_size=4).map(_batch)

bodies = st.one_of(st.just(b""), st.binary(max_size=512), json_bodies, batch_bodies,
                   props_text.map(lambda p: "".join(f"{k}\x01{v}\x02" for k, v in p.items()).encode("utf-8",
                                                                                                   "surrogatepass")),
                   st.sampled_from([b"\x00" * 4096, b"{" * 5000, b"[" * 100_000, b'{"a":' * 2000]))


#: a plausible value for the header fields most requests require, so that hostile requests get past the
#: "field missing" check into the handlers; the fields are then damaged a few at a time
FUZZ_TOPICS = ["fuzz", "fuzz", "fuzz", "TBW102", "%RETRY%cg", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
               "rmq_sys_wheel_timer", "fuzz-new"]
BASE_EXT: dict[str, st.SearchStrategy[str]] = {
    "topic": st.sampled_from(FUZZ_TOPICS), "queueId": st.sampled_from(["0", "1", "2", "3", "-1", "4"]),
    "consumerGroup": st.sampled_from(["cg", "fuzz_group"]), "producerGroup": st.just("pg"),
    "group": st.sampled_from(["cg", "fuzz_group"]), "queueOffset": st.sampled_from(["0", "1", "5", "-1"]),
    "maxMsgNums": st.sampled_from(["1", "32", "0"]), "sysFlag": st.sampled_from(["0", "2", "4", "6", "8", "-1"]),
    "commitOffset": st.just("0"), "suspendTimeoutMillis": st.sampled_from(["0", "100", "15000"]),
    "subscription": st.sampled_from(["*", "TAG1 || TAG2", "a > 1"]), "subVersion": st.just("0"),
    "expressionType": st.sampled_from(["TAG", "SQL92"]), "defaultTopic": st.just("TBW102"),
    "defaultTopicQueueNums": st.just("4"), "bornTimestamp": st.just("1700000000000"), "flag": st.just("0"),
    "properties": st.sampled_from(["", "TAGS\x01t\x02", "DELAY\x012\x02", "TIMER_DELAY_SEC\x013\x02",
                                   "TRAN_MSG\x01true\x02PGROUP\x01pg\x02"]),
    "reconsumeTimes": st.just("0"), "unitMode": st.just("false"), "batch": st.just("false"),
    "offset": st.sampled_from(["0", "1", "100"]), "commitLogOffset": st.sampled_from(["0", "100", "999999999"]),
    "brokerName": st.sampled_from(["broker-fuzz", "b"]), "clusterName": st.just("DefaultCluster"),
    "timestamp": st.just("1700000000000"), "maxNum": st.just("32"), "key": st.just("k"),
    "beginTimestamp": st.just("0"), "endTimestamp": st.just("9999999999999"),
    "invisibleTime": st.sampled_from(["1000", "60000"]), "pollTime": st.sampled_from(["0", "100"]),
    "bornTime": st.just("1700000000000"), "initMode": st.sampled_from(["0", "1"]),
    "extraInfo": st.sampled_from(["0 1700000000000 60000 0 0 broker-fuzz 0 0", "1 1 1 1 1 1 b 0 0 1"]),
    "msgId": st.sampled_from(["7F0000010000000000000001", "ZZ"]), "readQueueNums": st.just("4"),
    "writeQueueNums": st.just("4"), "perm": st.sampled_from(["6", "0", "2"]), "transactionId": st.just("t"),
    "tranStateTableOffset": st.just("0"), "namespace": st.just("ns"), "brokerId": st.just("0"),
    "brokerAddr": st.just("127.0.0.1:1"), "haServerAddr": st.just("127.0.0.1:1"),
}


@st.composite
def json_header_frame(draw: st.DrawFn, code: int) -> bytes:
    ext: dict[str, Any] = {}
    if draw(st.integers(0, 3)) > 0:
        for key in draw(st.lists(st.sampled_from(sorted(BASE_EXT)), min_size=3, max_size=len(BASE_EXT),
                                 unique=True)):
            ext[key] = draw(BASE_EXT[key])
    for key in draw(st.lists(st.one_of(st.sampled_from(HEADER_KEYS), st.text(max_size=8)), max_size=6)):
        ext[key] = draw(json_values) if draw(st.integers(0, 9)) == 0 else draw(ext_values())
    header: dict[str, Any] = {"code": code, "language": draw(st.sampled_from(LANGUAGES)), "version": 401,
                              "opaque": draw(st.integers(0, 2**31 - 1)), "flag": draw(st.sampled_from([0, 0, 0, 2])),
                              "extFields": ext, "serializeTypeCurrentRPC": "JSON"}
    if draw(st.integers(0, 9)) == 0:  # damage the header's own fields
        key = draw(st.sampled_from(sorted(header)))
        if draw(st.booleans()):
            del header[key]
        else:
            header[key] = draw(json_values)
    if draw(st.integers(0, 5)) == 0:
        header["remark"] = draw(st.one_of(st.text(max_size=20), json_values))
    raw = json.dumps(header, allow_nan=True, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    body = draw(bodies)
    return struct.pack(">II", 4 + len(raw) + len(body), len(raw)) + raw + body


@st.composite
def binary_header_frame(draw: st.DrawFn, code: int) -> bytes:
    fields = b""
    for _ in range(draw(st.integers(0, 8))):
        k = draw(st.one_of(st.sampled_from(HEADER_KEYS), st.text(max_size=8))).encode("utf-8", "surrogatepass")
        v = draw(ext_values()).encode("utf-8", "surrogatepass")
        fields += struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
    remark = draw(st.one_of(st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")),
                            st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")),
                            st.binary(max_size=8)))
    raw = (struct.pack(">hBhii", code if -(2**15) <= code < 2**15 else draw(st.integers(-(2**15), 2**15 - 1)),
                       draw(st.integers(0, 255)), draw(st.integers(-(2**15), 2**15 - 1)),
                       draw(st.integers(-(2**31), 2**31 - 1)), draw(st.sampled_from([0, 0, 2, -1, 1])))
           + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(fields)) + fields)
    body = draw(bodies)
    return struct.pack(">II", 4 + len(raw) + len(body), (1 << 24) | len(raw)) + raw + body


codes = st.one_of(st.sampled_from(CODES), st.sampled_from(CODES), st.sampled_from(CODES),
                  st.integers(-(2**31), 2**31 - 1), st.integers(-3, 1100))


@st.composite
def valid_frames(draw: st.DrawFn) -> bytes:
    """A frame the codec decodes: every request code, hostile header fields and body."""
    code = draw(codes)
    if draw(st.integers(0, 3)) == 0:
        return draw(binary_header_frame(code))
    return draw(json_header_frame(code))


@st.composite
def mutated(draw: st.DrawFn, frame: bytes) -> bytes:
    """``frame`` damaged byte-wise (one to three mutations)."""
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "flip", "truncate", "extend", "length", "stype", "hlen", "zero"]))
        if kind == "flip" and data:
            for _ in range(draw(st.integers(1, 8))):
                i = draw(st.integers(0, len(data) - 1))
                data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=64))
        elif kind == "length" and len(data) >= 4:
            n = len(data) - 4
            data[0:4] = struct.pack(">I", draw(st.sampled_from([0, 1, 3, 4, 5, n - 1, n + 1, n * 2, 2**24, 2**24 + 1,
                                                                2**31 - 1, 2**31, 2**32 - 1]) .filter(
                lambda v: 0 <= v < 2**32)))
        elif kind == "stype" and len(data) >= 5:
            data[4] = draw(st.integers(0, 255))
        elif kind == "hlen" and len(data) >= 8:
            n = len(data) - 4
            data[5:8] = struct.pack(">I", draw(st.sampled_from([n, n - 3, n + 1, 0xFFFFFF, 0])) & 0xFFFFFF)[1:]
        elif kind == "zero" and data:
            i = draw(st.integers(0, len(data) - 1))
            end = min(len(data), i + draw(st.integers(1, 32)))
            data[i:end] = bytes(end - i)
    return bytes(data)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One hostile frame: mostly decodable with hostile contents, some damaged, a few pure garbage."""
    roll = draw(st.integers(0, 19))
    if roll == 0:
        return draw(st.binary(min_size=1, max_size=256))
    frame = draw(valid_frames())
    if roll <= 5:
        return draw(mutated(frame))
    return frame


def decodable(data: bytes) -> bool:
    """Whether ``data`` is exactly whole frames our codec reads (the server keeps such a connection open)."""
    decoder = FrameDecoder()
    try:
        decoder.feed(data)
    except Exception:  # a RemoteProtocolError: the server closes the connection on these bytes
        return False
    return decoder.buffered == 0


# -- sending -----------------------------------------------------------------------------------------------------


@dataclass
class SendStats:
    frames: int = 0
    bytes: int = 0
    replies: collections.Counter[int] = field(default_factory=collections.Counter)
    closed_by_server: int = 0
    connects: int = 0

    def add(self, other: SendStats) -> None:
        self.frames += other.frames
        self.bytes += other.bytes
        self.replies.update(other.replies)
        self.closed_by_server += other.closed_by_server
        self.connects += other.connects


def _drain(sock: socket.socket, stats: SendStats, decoder: FrameDecoder | None, until: float) -> bool:
    """Read what is there until ``until``; False when the server closed the connection."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return True
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return True
        except OSError:
            return False
        if not data:
            return False
        if decoder is not None:
            try:
                for cmd in decoder.feed(data):
                    stats.replies[cmd.code] += 1
            except Exception:  # the broker's reply did not decode: count it, keep going
                stats.replies[-99999] += 1
                decoder = None


def _one_socket(addr: tuple[str, int], payloads: list[bytes], stats: SendStats, linger: float) -> None:
    """Frames that decode go first, on one connection; each damaged frame then gets a connection of its own
    (the server drops a connection whose framing broke, and would never see the frames after it)."""
    sock: socket.socket | None = None
    decoder = FrameDecoder()
    good = [p for p in payloads if decodable(p)]
    bad = [p for p in payloads if not decodable(p)]
    for data in good:
        if sock is None:
            sock = socket.create_connection(addr, timeout=5)
            stats.connects += 1
            decoder = FrameDecoder()
        try:
            sock.settimeout(5)
            sock.sendall(data)
            stats.frames += 1
            stats.bytes += len(data)
        except OSError:
            stats.closed_by_server += 1
            sock.close()
            sock = None
            continue
        if not _drain(sock, stats, decoder, time.monotonic() + 0.002):
            stats.closed_by_server += 1
            sock.close()
            sock = None
    if sock is not None:
        _drain(sock, stats, decoder, time.monotonic() + linger)
        sock.close()
    for data in bad:
        with socket.create_connection(addr, timeout=5) as one:
            stats.connects += 1
            try:
                one.sendall(data)
                stats.frames += 1
                stats.bytes += len(data)
            except OSError:
                stats.closed_by_server += 1
                continue
            if not _drain(one, stats, FrameDecoder(), time.monotonic() + 0.02):
                stats.closed_by_server += 1


def send_batch(addrs: list[tuple[str, int]], batch: Iterable[tuple[int, bytes]], sockets: int = 4,
               linger: float = 0.3) -> SendStats:
    """Send ``(lane, frame)`` pairs: lane % sockets picks the connection, lane % len(addrs) its address. The
    connections run at once (threads); each reads replies while sending and for ``linger`` s after."""
    lanes: dict[int, list[bytes]] = collections.defaultdict(list)
    for lane, data in batch:
        lanes[lane % sockets].append(data)
    results = [SendStats() for _ in lanes]
    threads = [threading.Thread(target=_one_socket, args=(addrs[lane % len(addrs)], payloads, res, linger))
               for (lane, payloads), res in zip(sorted(lanes.items()), results, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total = SendStats()
    for res in results:
        total.add(res)
    return total


batches = st.lists(st.tuples(st.integers(0, 7), frames()), min_size=1, max_size=24)
