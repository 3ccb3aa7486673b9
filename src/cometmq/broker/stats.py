"""The broker's own counters, for metrics (``metricsExporterType``; cometmq.metrics reads them at scrape time).

Plain ints in dicts and lists, bumped on the event loop (no locks: one loop runs the broker) once per request, not
per message: a send adds its message count and its records' bytes, a pull its count and bytes. Everything that is
state rather than a count — lag, in-flight POP messages, timer and transaction backlogs, connections, storage — is
not kept here: the exporter reads it from the broker's parts when it is scraped. With metrics off the broker builds
``BrokerStats`` all the same (cheap: a few dict updates per request; the rates of GET_BROKER_RUNTIME_INFO and
VIEW_BROKER_STATS_DATA come from them, cometmq.broker.stats_windows); only the RPC latency observer is off then.

The names follow RocketMQ 5's BrokerMetricsManager: ``messages_in`` is rocketmq_messages_in_total /
rocketmq_throughput_in_total / rocketmq_message_size by (topic, message_type); ``messages_out`` is
rocketmq_messages_out_total / rocketmq_throughput_out_total by (topic, consumer_group, is_retry). Bytes are the
stored records' bytes, as RocketMQ's (a record is its body plus ~100 bytes of header, topic and properties).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import TRANSACTION_MASK
from cometmq.store.status import PutResult

#: RocketMQ's rocketmq_message_size buckets (bytes): 1 KiB, 4 KiB, 512 KiB, 1 MiB, 2 MiB, 4 MiB
MESSAGE_SIZE_BOUNDS: tuple[int, ...] = (1024, 4096, 512 * 1024, 1 << 20, 2 << 20, 4 << 20)
#: RocketMQ's rocketmq_rpc_latency buckets (ms): 1, 3, 5, 7, 10, 100 ms, 1, 2, 3 s
RPC_LATENCY_BOUNDS_MS: tuple[int, ...] = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
_RPC_BOUNDS_NS = tuple(ms * 1_000_000 for ms in RPC_LATENCY_BOUNDS_MS)

#: RocketMQ's TopicMessageType metric values
NORMAL, FIFO, DELAY, TRANSACTION = "normal", "fifo", "delay", "transaction"
MESSAGE_TYPES = (NORMAL, FIFO, DELAY, TRANSACTION)
#: what marks a FIFO send's properties (its sharding key property, name and separator)
SHARDING_KEY_MARKER = _SHARDING_KEY = "__SHARDINGKEY\x01"
_DELAY_MARKERS = ("DELAY\x01", "TIMER_DELIVER_MS\x01", "TIMER_DELAY_SEC\x01", "TIMER_DELAY_MS\x01",
                  "__STARTDELIVERTIME\x01")

#: the rpc key of a request or response code that is not RocketMQ's (any client may send any number): one series
#: for them all, not one per code
OTHER_CODE = -1
_REQUEST_CODES = frozenset(int(c) for c in RequestCode)
_RESPONSE_CODES = frozenset(int(c) for c in ResponseCode)

# Index of the fields in a messages_in entry: count, bytes, size sum, then one count per size bucket (+Inf last).
IN_COUNT, IN_BYTES, IN_SIZE_SUM, IN_BUCKETS = 0, 1, 2, 3
# ... in an rpc entry: count, nanoseconds sum, then one count per latency bucket (+Inf last).
RPC_COUNT, RPC_SUM_NS, RPC_BUCKETS = 0, 1, 2


def message_type(properties: str, sys_flag: int) -> str:
    """A send's RocketMQ TopicMessageType, from its request header (a batch's header, as RocketMQ reads it)."""
    if sys_flag & TRANSACTION_MASK or "TRAN_MSG\x01true" in properties:
        return TRANSACTION
    if _SHARDING_KEY in properties:
        return FIFO
    if any(marker in properties for marker in _DELAY_MARKERS):
        return DELAY
    return NORMAL


def plain_message_type(properties: str) -> str:
    """The type of a send with no delay, timer or transaction property (the send path's "plain" case)."""
    return FIFO if _SHARDING_KEY in properties else NORMAL


class BrokerStats:
    def __init__(self) -> None:
        #: (topic, message_type) -> [messages, bytes, size sum, size buckets...]
        self.messages_in: dict[tuple[str, str], list[int]] = {}
        #: (topic, consumer_group, is_retry) -> [messages, bytes, requests]
        self.messages_out: dict[tuple[str, str, bool], list[int]] = {}
        #: (consumer_group, topic) -> messages sent to the group's DLQ (topic: where they came from)
        self.dlq: dict[tuple[str, str], int] = {}
        #: (consumer_group, topic) -> messages a consumer sent back for a later retry
        self.retry: dict[tuple[str, str], int] = {}
        #: (request code, response code, held) -> [count, ns sum, latency buckets...]
        self.rpc: dict[tuple[int, int, bool], list[int]] = {}
        #: (consumer_group, topic, queue_id) -> the next offset the group's pulls asked for after their last answer
        #: (messages between the committed offset and this one are in flight at the consumer)
        self.pulled: dict[tuple[str, str, int], int] = {}
        #: what the entries of deleted topics and groups had counted: [messages, bytes, requests] in and out; the
        #: broker's totals (``total_in``, ``total_out``) still count them
        self._gone_in = [0, 0, 0]
        self._gone_out = [0, 0, 0]

    def total_in(self) -> tuple[int, int, int]:
        """Messages stored, their record bytes and the send requests, since start (deleted topics too)."""
        count, nbytes, times = self._gone_in
        for e in list(self.messages_in.values()):
            count += e[IN_COUNT]
            nbytes += e[IN_BYTES]
            times += sum(e[IN_BUCKETS:])
        return count, nbytes, times

    def total_out(self) -> tuple[int, int, int]:
        """Messages handed to consumers, their record bytes and the requests, since start (deleted ones too)."""
        count, nbytes, times = self._gone_out
        for e in list(self.messages_out.values()):
            count += e[0]
            nbytes += e[1]
            times += e[2]
        return count, nbytes, times

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its entries go (a workload that creates and deletes topics would grow them, and
        the metrics' series, without bound); the totals keep what they counted."""
        self._forget(lambda t, g: t == topic)

    def forget_group(self, group: str) -> None:
        """``group`` was deleted: its entries go, as ``forget_topic``'s."""
        self._forget(lambda t, g: g == group)

    def _forget(self, match: Callable[[str, str | None], bool]) -> None:
        for key in [k for k in self.messages_in if match(k[0], None)]:
            e = self.messages_in.pop(key)
            self._gone_in[0] += e[IN_COUNT]
            self._gone_in[1] += e[IN_BYTES]
            self._gone_in[2] += sum(e[IN_BUCKETS:])
        for out_key in [k for k in self.messages_out if match(k[0], k[1])]:
            e = self.messages_out.pop(out_key)
            for i in range(3):
                self._gone_out[i] += e[i]
        for table in (self.dlq, self.retry):
            for pair in [k for k in table if match(k[1], k[0])]:
                del table[pair]
        for queue in [k for k in self.pulled if match(k[1], k[0])]:
            del self.pulled[queue]

    def put(self, topic: str, message_type: str, result: PutResult) -> None:
        """A send's records are in the log."""
        records = result.records
        if not records:
            return
        count = len(records)
        nbytes = result.end_offset - records[0].phy_offset  # one request's records are contiguous
        entry = self.messages_in.get((topic, message_type))
        if entry is None:
            entry = self.messages_in[(topic, message_type)] = [0] * (IN_BUCKETS + len(MESSAGE_SIZE_BOUNDS) + 1)
        # RocketMQ records one message-size sample per request: its average record size.
        size = nbytes // count
        entry[IN_COUNT] += count
        entry[IN_BYTES] += nbytes
        entry[IN_SIZE_SUM] += size
        entry[IN_BUCKETS + bisect_left(MESSAGE_SIZE_BOUNDS, size)] += 1

    def got(self, topic: str, group: str, queue_id: int, count: int, nbytes: int, next_offset: int) -> None:
        """A pull answered ``count`` messages (``nbytes`` of records); the group goes on from ``next_offset``."""
        key = (topic, group, topic.startswith("%RETRY%"))
        entry = self.messages_out.get(key)
        if entry is None:
            entry = self.messages_out[key] = [0, 0, 0]
        entry[0] += count
        entry[1] += nbytes
        entry[2] += 1
        self.pulled[(group, topic, queue_id)] = next_offset

    def popped(self, topic: str, group: str, is_retry: bool, count: int, nbytes: int) -> None:
        key = (topic, group, is_retry)
        entry = self.messages_out.get(key)
        if entry is None:
            entry = self.messages_out[key] = [0, 0, 0]
        entry[0] += count
        entry[1] += nbytes
        entry[2] += 1

    def to_dlq(self, group: str, topic: str, count: int = 1) -> None:
        self.dlq[(group, topic)] = self.dlq.get((group, topic), 0) + count

    def to_retry(self, group: str, topic: str, count: int = 1) -> None:
        self.retry[(group, topic)] = self.retry.get((group, topic), 0) + count

    def rpc_done(self, request_code: int, response_code: int, elapsed_ns: int, held: bool) -> None:
        """A remoting request was answered (``RemotingServer``'s observer)."""
        key = (request_code if request_code in _REQUEST_CODES else OTHER_CODE,
               response_code if response_code in _RESPONSE_CODES else OTHER_CODE, held)
        entry = self.rpc.get(key)
        if entry is None:
            entry = self.rpc[key] = [0] * (RPC_BUCKETS + len(_RPC_BOUNDS_NS) + 1)
        entry[RPC_COUNT] += 1
        entry[RPC_SUM_NS] += elapsed_ns
        entry[RPC_BUCKETS + bisect_left(_RPC_BOUNDS_NS, elapsed_ns)] += 1
