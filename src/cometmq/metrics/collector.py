"""A prometheus-client collector that reads a broker at scrape time, under RocketMQ 5's metric names and labels.

Counters come from the broker's ``BrokerStats`` (broker/stats.py); gauges — lag, in-flight and ready messages,
connections, storage, timer and transaction backlogs, held long polls — from the broker's parts as they are when
scraped. :func:`snapshot` must run on the broker's event loop (the exporter calls it there), so nothing it reads
changes under it; it returns plain data (metrics/text.py), which the exporter writes out in a thread.
``BrokerCollector`` gives the same families as prometheus-client metrics (prometheus-client's own exposition of them
is the reference the direct one is tested against).

Every sample carries RocketMQ's common labels: ``cluster`` (brokerClusterName), ``node_type`` ("broker") and
``node_id`` (brokerName).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from cometmq.broker.stats import (
    IN_BUCKETS,
    IN_BYTES,
    IN_COUNT,
    IN_SIZE_SUM,
    MESSAGE_SIZE_BOUNDS,
    RPC_BUCKETS,
    RPC_LATENCY_BOUNDS_MS,
    RPC_SUM_NS,
    BrokerStats,
)
from cometmq.metrics.text import Family, HistogramFamily
from cometmq.protocol.client_bodies import CONSUME_ACTIVELY, CONSUME_PASSIVELY, CONSUME_POP
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.names import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX, SYSTEM_GROUP_PREFIX, is_system_topic

if TYPE_CHECKING:
    from cometmq.broker.controller import BrokerController

COMMON_LABELS: tuple[str, ...] = ("cluster", "node_type", "node_id")
#: how long a slice of a scrape's reading holds the loop, at most (about)
SLICE_S = 0.005
_SYSTEM_GROUP_PREFIX_LOWER = SYSTEM_GROUP_PREFIX.lower()
#: series read between two checks of the slice's time
_STEP = 512
_CONSUME_MODES = {CONSUME_ACTIVELY: "pull", CONSUME_PASSIVELY: "push", CONSUME_POP: "pop"}


def is_system_group(group: str) -> bool:
    """RocketMQ's metrics: a group starting ``CID_RMQ_SYS_`` in any case."""
    return group.lower().startswith(_SYSTEM_GROUP_PREFIX_LOWER)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _code_name(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    """RocketMQ's label value: the code's constant name in lower case; "other" for the codes that are not
    RocketMQ's (``BrokerStats`` keeps them as one, ``OTHER_CODE``)."""
    try:
        return enum(code).name.lower()
    except ValueError:
        return "other"


def _bucket_label(bound: float) -> str:
    return str(float(bound))


class BrokerCollector(Collector):
    """The broker's families as prometheus-client metrics (for a registry; the exporter writes them directly)."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        for f in snapshot(self.broker):
            labels = list(f.labels)
            if isinstance(f, HistogramFamily):
                h = HistogramMetricFamily(f.name, f.help, labels=labels)
                for values, buckets, sum_value in f.buckets:
                    h.add_metric(list(values), buckets, sum_value)
                yield h
                continue
            m = (CounterMetricFamily if f.type == "counter" else GaugeMetricFamily)(f.name, f.help, labels=labels)
            for values, v in f.rows:
                m.add_metric(list(values), v)
            yield m


def snapshot(broker: BrokerController) -> list[Family]:
    """Every family now, as plain data (call on the broker's loop), read in one go."""
    snap = _Snapshot(broker)
    for _ in snap.steps():
        pass
    return snap.out


async def snapshot_async(broker: BrokerController, slice_s: float = SLICE_S) -> list[Family]:
    """The same, read in slices of about ``slice_s`` between which the loop runs: the series of a large broker
    (10,000 consumer groups: 40,000 queues' offsets read) would hold it ~0.2 s. Each series is read in one slice
    (a group's lag on a topic from its queues' offsets at one moment); two series may be read a few milliseconds
    apart, as two scrapes are."""
    snap = _Snapshot(broker)
    since = time.perf_counter()
    for _ in snap.steps():
        if time.perf_counter() - since >= slice_s:
            await asyncio.sleep(0)
            since = time.perf_counter()
    return snap.out


class _Snapshot:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        cfg = broker.config
        self._common = (cfg.broker_cluster_name, "broker", cfg.broker_name)

        self.out: list[Family] = []

    def steps(self) -> Iterator[None]:
        """Reads the families into ``out``; yields where the loop may run in between (every few hundred series)."""
        stats = self.broker.stats
        if stats is not None:
            yield from self._counters(stats)
            self.out += self._rpc(stats)
        yield from self._lag(stats)
        self.out += self._connections()
        self.out += self._storage()
        self.out += self._services()

    # -- counters -------------------------------------------------------------------------------------------
    def _counters(self, stats: BrokerStats) -> Iterator[None]:
        common = self._common
        labels_in = (*COMMON_LABELS, "topic", "message_type", "is_system")
        msgs_in = Family("rocketmq_messages_in", "counter", "Total number of incoming messages", labels_in)
        bytes_in = Family("rocketmq_throughput_in", "counter", "Total traffic of incoming messages (record bytes)",
                          labels_in)
        size = HistogramFamily("rocketmq_message_size", "Incoming messages size (bytes; one sample per send "
                               "request: its average record size)", labels_in)
        bounds = [*(_bucket_label(b) for b in MESSAGE_SIZE_BOUNDS), "+Inf"]
        for n, ((topic, mtype), e) in enumerate(list(stats.messages_in.items()), 1):
            if not n % _STEP:
                yield
            values: tuple[str, ...] = (*common, topic, mtype, _bool(is_system_topic(topic)))
            msgs_in.add(values, e[IN_COUNT])
            bytes_in.add(values, e[IN_BYTES])
            size.add_histogram(values, _cumulative(bounds, e[IN_BUCKETS:]), e[IN_SIZE_SUM])

        labels_out = (*COMMON_LABELS, "topic", "consumer_group", "is_retry", "is_system")
        msgs_out = Family("rocketmq_messages_out", "counter", "Total number of outgoing messages", labels_out)
        bytes_out = Family("rocketmq_throughput_out", "counter", "Total traffic of outgoing messages (record bytes)",
                           labels_out)
        for n, ((topic, group, retry), (count, nbytes, _requests)) in enumerate(list(stats.messages_out.items()), 1):
            if not n % _STEP:
                yield
            values = (*common, topic, group, _bool(retry), _bool(is_system_topic(topic) or is_system_group(group)))
            msgs_out.add(values, count)
            bytes_out.add(values, nbytes)

        labels_group = (*COMMON_LABELS, "consumer_group", "topic", "is_system")
        dlq = Family("rocketmq_send_to_dlq_messages", "counter", "Consumer send to DLQ messages", labels_group)
        for n, ((group, topic), count) in enumerate(list(stats.dlq.items()), 1):
            if not n % _STEP:
                yield
            dlq.add((*common, group, topic, _bool(is_system_group(group))), count)
        retries = Family("cometmq_send_to_retry_messages", "counter", "Messages consumers sent back for a later "
                         "retry (CONSUMER_SEND_MSG_BACK; POP redeliveries are messages_out with is_retry=true)",
                         labels_group)
        for n, ((group, topic), count) in enumerate(list(stats.retry.items()), 1):
            if not n % _STEP:
                yield
            retries.add((*common, group, topic, _bool(is_system_group(group))), count)
        self.out += (msgs_in, bytes_in, size, msgs_out, bytes_out, dlq, retries)

    def _rpc(self, stats: BrokerStats) -> list[Family]:
        common = self._common
        rpc = HistogramFamily(
            "rocketmq_rpc_latency", "Rpc latency (milliseconds, from a request's arrival to its answer)",
            (*COMMON_LABELS, "protocol_type", "request_code", "response_code", "is_long_polling"))
        bounds = [*(_bucket_label(b) for b in RPC_LATENCY_BOUNDS_MS), "+Inf"]
        for (req, resp, held), e in list(stats.rpc.items()):
            rpc.add_histogram((*common, "remoting", _code_name(RequestCode, req), _code_name(ResponseCode, resp),
                               _bool(held)), _cumulative(bounds, e[RPC_BUCKETS:]), e[RPC_SUM_NS] / 1e6)
        return [rpc]

    # -- consumer lag -----------------------------------------------------------------------------------------
    def _lag(self, stats: BrokerStats | None) -> Iterator[None]:
        """Per (group, topic): lag = the queues' max offsets less the committed ones; in flight = handed out and not
        yet committed (POP: delivered and not acked; pull: pulled past the committed offset); ready = not yet handed
        out. Latencies: now less the store time of the oldest unconsumed / not handed out message."""
        b = self.broker
        store = b.store
        now = b.clock()
        # (group, topic) -> [lag, in flight, ready, oldest unconsumed store time, oldest not handed out]
        agg: dict[tuple[str, str], list[int]] = {}
        never = 1 << 62
        # read once per queue and scrape: many groups read the same queues, often at the same offsets
        tops: dict[tuple[str, int], int] = {}
        times: dict[tuple[str, int, int], int] = {}

        def store_time(topic: str, qid: int, offset: int) -> int:
            t = times.get((topic, qid, offset))
            if t is None:
                found = store.store_time(topic, qid, offset)
                t = times[(topic, qid, offset)] = never if found is None else found
            return t

        def add(group: str, topic: str, qid: int, committed: int, handed: int, inflight: int) -> None:
            top = tops.get((topic, qid))
            if top is None:
                top = tops[(topic, qid)] = store.max_offset(topic, qid)
            row = agg.get((group, topic))
            if row is None:
                row = agg[(group, topic)] = [0, 0, 0, never, never]
            committed = min(committed, top)
            handed = min(max(handed, committed), top)
            row[0] += top - committed
            row[1] += inflight
            row[2] += top - handed
            if committed < top:
                row[3] = min(row[3], store_time(topic, qid, committed))
            if handed < top:
                row[4] = min(row[4], store_time(topic, qid, handed))

        done: set[tuple[str, str, int]] = set()
        for n, ((group, topic, qid), qs) in enumerate(list(b.pop.states.items()), 1):
            if not n % _STEP:
                yield
            done.add((group, topic, qid))
            add(group, topic, qid, qs.committed, qs.cursor, len(qs.inflight))
        pulled = stats.pulled if stats is not None else {}
        # The groups that committed offsets, that pulled, or that are online with a subscription.
        pairs: dict[tuple[str, str], dict[int, int]] = {}
        for n, (key, queues) in enumerate(list(b.offsets.table.items()), 1):
            if not n % _STEP:
                yield
            topic, _, group = key.partition("@")
            pairs[(group, topic)] = queues
        for group, topic, _ in list(pulled):
            pairs.setdefault((group, topic), {})
        for group, info in list(b.consumers.groups.items()):
            for topic in list(info.subscriptions):
                pairs.setdefault((group, topic), {})
        read_qids: dict[str, set[int]] = {}
        for n, ((group, topic), queues) in enumerate(pairs.items(), 1):
            if not n % (_STEP // 4):
                yield
            if topic.startswith(DLQ_TOPIC_PREFIX):
                continue
            qids = read_qids.get(topic)
            if qids is None:
                cfg = b.topics.get(topic)
                qids = read_qids[topic] = set(range(cfg.read_queue_nums)) if cfg is not None else set()
            for qid in sorted(qids.union(queues)):
                if done and (group, topic, qid) in done:
                    continue
                committed = queues.get(qid)
                if committed is None:
                    committed = store.min_offset(topic, qid)
                handed = pulled.get((group, topic, qid), committed) if pulled else committed
                add(group, topic, qid, committed, handed, max(handed - committed, 0))

        labels = (*COMMON_LABELS, "consumer_group", "topic", "is_retry", "is_system")
        lag = Family("rocketmq_consumer_lag_messages", "gauge", "Consumer lag messages", labels)
        lag_latency = Family("rocketmq_consumer_lag_latency", "gauge", "Consumer lag time (milliseconds)", labels)
        inflight = Family("rocketmq_consumer_inflight_messages", "gauge", "Consumer inflight messages", labels)
        queueing = Family("rocketmq_consumer_queueing_latency", "gauge", "Consumer queueing time (milliseconds)",
                          labels)
        ready = Family("rocketmq_consumer_ready_messages", "gauge", "Consumer ready messages", labels)
        common = self._common
        for n, (group, topic) in enumerate(sorted(agg), 1):  # (the keys only: sorting the items takes 3 times longer)
            if not n % _STEP:
                yield
            n_lag, n_inflight, n_ready, oldest, oldest_ready = agg[(group, topic)]
            values = (*common, group, topic, _bool(topic.startswith(RETRY_TOPIC_PREFIX)),
                      _bool(is_system_topic(topic) or is_system_group(group)))
            lag.rows.append((values, n_lag))
            lag_latency.rows.append((values, max(now - oldest, 0) if oldest != never else 0))
            inflight.rows.append((values, n_inflight))
            queueing.rows.append((values, max(now - oldest_ready, 0) if oldest_ready != never else 0))
            ready.rows.append((values, n_ready))
        self.out += (lag, lag_latency, inflight, queueing, ready)

    # -- connections ----------------------------------------------------------------------------------------
    def _connections(self) -> list[Family]:
        b = self.broker
        common = self._common
        producers: dict[tuple[str, str], int] = {}
        for channels in list(b.producers.groups.values()):
            for ch in list(channels.values()):
                key = (ch.language.lower(), str(ch.version))
                producers[key] = producers.get(key, 0) + 1
        prod = Family("rocketmq_producer_connections", "gauge", "Producer connections",
                      (*COMMON_LABELS, "language", "version", "protocol_type"))
        for (language, version), n in sorted(producers.items()):
            prod.add((*common, language, version, "remoting"), n)
        consumers: dict[tuple[str, str, str, str], int] = {}
        for group, info in list(b.consumers.groups.items()):
            mode = _CONSUME_MODES.get(info.consume_type, info.consume_type.lower())
            for ch in list(info.channels.values()):
                ckey = (group, ch.language.lower(), str(ch.version), mode)
                consumers[ckey] = consumers.get(ckey, 0) + 1
        cons = Family("rocketmq_consumer_connections", "gauge", "Consumer connections",
                      (*COMMON_LABELS, "consumer_group", "language", "version", "consume_mode", "protocol_type",
                       "is_system"))
        for (group, language, version, mode), n in sorted(consumers.items()):
            cons.add((*common, group, language, version, mode, "remoting", _bool(is_system_group(group))), n)
        return [prod, cons]

    # -- storage --------------------------------------------------------------------------------------------
    def _storage(self) -> list[Family]:
        store = self.broker.store
        labels = (*COMMON_LABELS, "storage_type", "storage_medium")
        values = (*self._common, "local", "disk")
        size = Family("rocketmq_storage_size", "gauge", "Broker storage size (bytes used on the store's file system)",
                      labels)
        try:
            st = os.statvfs(store.config.store_path)
            size.add(values, (st.f_blocks - st.f_bfree) * st.f_frsize)
        except OSError:
            pass
        end = store.commitlog.max_offset
        flush = Family("rocketmq_storage_flush_behind_bytes", "gauge", "Broker flush behind bytes", labels)
        flush.add(values, max(end - store.flushed_offset, 0))
        dispatch = Family("rocketmq_storage_dispatch_behind_bytes", "gauge", "Broker dispatch behind bytes", labels)
        dispatch.add(values, max(end - store.reput.reput_offset, 0))
        forced = Family("cometmq_storage_forced_deleted_messages", "counter", "Messages deleted by the forced clean "
                        "(disk over diskSpaceCleanForciblyRatio) before their reserved time, consumed or not", labels)
        forced.add(values, store.cleaner.forced_deleted_messages)
        unindexed = Family("cometmq_storage_unindexed_keys", "counter", "Message keys not indexed for want of disk "
                           "space (never indexed later, as RocketMQ's IndexService drops them)", labels)
        unindexed.add(values, store.index.unindexed_keys if store.index is not None else 0)
        unreadable = Family("cometmq_storage_unreadable_units", "counter", "Consume-queue units whose record is not "
                            "where they say (damaged files): stepped over by reads, logged once each", labels)
        unreadable.add(values, store.bad_units.unreadable)
        return [size, flush, dispatch, forced, unindexed, unreadable]

    # -- POP, transactions, timer, long polling ---------------------------------------------------------------
    def _services(self) -> list[Family]:
        b = self.broker
        common = self._common

        def one(name: str, type_: str, help_: str, value: int) -> Family:
            f = Family(name, type_, help_, COMMON_LABELS)
            f.add(common, value)
            return f

        out = [one("rocketmq_broker_permission", "gauge", "Broker permission", b.config.broker_permission)]
        pending, committed, rolled_back = b.transactions.counts()  # builds nothing
        out += [one("rocketmq_half_messages", "gauge", "Half messages of all topics (pending transactions)", pending),
                one("rocketmq_commit_messages", "counter", "Total number of commit messages", committed),
                one("rocketmq_rollback_messages", "counter", "Total number of rollback messages", rolled_back)]
        if b.timer.config.enable:
            timer = b.timer.service  # (not built yet: nothing scheduled, enqueued or delivered; it stays unbuilt)
            m = timer.metrics() if timer is not None else {"scheduled": 0, "enqueued": 0, "delivered": 0,
                                                            "enqueueLag": 0}
            out += [one("rocketmq_timing_messages", "gauge", "Current message number in timing", int(m["scheduled"])),
                    one("rocketmq_timer_enqueue", "counter", "Total number of timer enqueue", int(m["enqueued"])),
                    one("rocketmq_timer_dequeue", "counter", "Total number of timer dequeue", int(m["delivered"])),
                    one("rocketmq_timer_enqueue_lag", "gauge", "Timer enqueue messages lag", int(m["enqueueLag"]))]
        out.append(one("rocketmq_pop_revive_retry_messages", "counter", "POP messages handed out again after their "
                       "invisible time passed", b.pop.metrics.redelivered))
        holds = Family("cometmq_long_polling_holds", "gauge", "Requests held by long polling now",
                       (*COMMON_LABELS, "request_type"))
        holds.add((*common, "pull"), b.hold.held_count)
        holds.add((*common, "pop"), b.pop.waiting())
        out.append(holds)
        return out


def _cumulative(bounds: list[str], counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(bounds, counts, strict=True):
        total += n
        out.append((bound, total))
    return out
