"""A prometheus-client collector that reads a broker at scrape time, under RocketMQ 5's metric names and labels.

Counters come from the broker's ``BrokerStats`` (broker/stats.py); gauges — lag, in-flight and ready messages,
connections, storage, timer and transaction backlogs, held long polls — from the broker's parts as they are when
scraped. ``collect`` must run on the broker's event loop (the exporter calls it there), so nothing it reads changes
under it.

Every sample carries RocketMQ's common labels: ``cluster`` (brokerClusterName), ``node_type`` ("broker") and
``node_id`` (brokerName).
"""

from __future__ import annotations

import os
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
from cometmq.broker.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from cometmq.protocol.client_bodies import CONSUME_ACTIVELY, CONSUME_PASSIVELY, CONSUME_POP
from cometmq.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from cometmq.broker.controller import BrokerController

COMMON_LABELS = ("cluster", "node_type", "node_id")
#: RocketMQ's TopicValidator system topics (and cometmq's own internal ones)
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                           "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"})
_CONSUME_MODES = {CONSUME_ACTIVELY: "pull", CONSUME_PASSIVELY: "push", CONSUME_POP: "pop"}


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.lower().startswith("rmq_sys_")


def is_system_group(group: str) -> bool:
    return group.lower().startswith("cid_rmq_sys_")


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
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    @property
    def _common(self) -> list[str]:
        cfg = self.broker.config
        return [cfg.broker_cluster_name, "broker", cfg.broker_name]

    def collect(self) -> Iterator[Metric]:
        stats = self.broker.stats
        if stats is not None:
            yield from self._counters(stats)
            yield from self._rpc(stats)
        yield from self._lag(stats)
        yield from self._connections()
        yield from self._storage()
        yield from self._services()

    # -- counters -------------------------------------------------------------------------------------------
    def _counters(self, stats: BrokerStats) -> Iterator[Metric]:
        common = self._common
        labels_in = [*COMMON_LABELS, "topic", "message_type", "is_system"]
        msgs_in = CounterMetricFamily("rocketmq_messages_in", "Total number of incoming messages", labels=labels_in)
        bytes_in = CounterMetricFamily("rocketmq_throughput_in", "Total traffic of incoming messages (record bytes)",
                                       labels=labels_in)
        size = HistogramMetricFamily("rocketmq_message_size", "Incoming messages size (bytes; one sample per send "
                                     "request: its average record size)", labels=labels_in)
        bounds = [*(_bucket_label(b) for b in MESSAGE_SIZE_BOUNDS), "+Inf"]
        for (topic, mtype), e in list(stats.messages_in.items()):
            values = [*common, topic, mtype, _bool(is_system_topic(topic))]
            msgs_in.add_metric(values, e[IN_COUNT])
            bytes_in.add_metric(values, e[IN_BYTES])
            size.add_metric(values, _cumulative(bounds, e[IN_BUCKETS:]), e[IN_SIZE_SUM])
        yield from (msgs_in, bytes_in, size)

        labels_out = [*COMMON_LABELS, "topic", "consumer_group", "is_retry", "is_system"]
        msgs_out = CounterMetricFamily("rocketmq_messages_out", "Total number of outgoing messages", labels=labels_out)
        bytes_out = CounterMetricFamily("rocketmq_throughput_out", "Total traffic of outgoing messages (record bytes)",
                                        labels=labels_out)
        for (topic, group, retry), (count, nbytes, _requests) in list(stats.messages_out.items()):
            values = [*common, topic, group, _bool(retry), _bool(is_system_topic(topic) or is_system_group(group))]
            msgs_out.add_metric(values, count)
            bytes_out.add_metric(values, nbytes)
        yield from (msgs_out, bytes_out)

        labels_group = [*COMMON_LABELS, "consumer_group", "topic", "is_system"]
        dlq = CounterMetricFamily("rocketmq_send_to_dlq_messages", "Consumer send to DLQ messages",
                                  labels=labels_group)
        for (group, topic), count in list(stats.dlq.items()):
            dlq.add_metric([*common, group, topic, _bool(is_system_group(group))], count)
        retries = CounterMetricFamily("cometmq_send_to_retry_messages", "Messages consumers sent back for a later "
                                    "retry (CONSUMER_SEND_MSG_BACK; POP redeliveries are messages_out with "
                                      "is_retry=true)", labels=labels_group)
        for (group, topic), count in list(stats.retry.items()):
            retries.add_metric([*common, group, topic, _bool(is_system_group(group))], count)
        yield from (dlq, retries)

    def _rpc(self, stats: BrokerStats) -> Iterator[Metric]:
        common = self._common
        rpc = HistogramMetricFamily(
            "rocketmq_rpc_latency", "Rpc latency (milliseconds, from a request's arrival to its answer)",
            labels=[*COMMON_LABELS, "protocol_type", "request_code", "response_code", "is_long_polling"])
        bounds = [*(_bucket_label(b) for b in RPC_LATENCY_BOUNDS_MS), "+Inf"]
        for (req, resp, held), e in list(stats.rpc.items()):
            rpc.add_metric([*common, "remoting", _code_name(RequestCode, req), _code_name(ResponseCode, resp),
                            _bool(held)], _cumulative(bounds, e[RPC_BUCKETS:]), e[RPC_SUM_NS] / 1e6)
        yield rpc

    # -- consumer lag -----------------------------------------------------------------------------------------
    def _lag(self, stats: BrokerStats | None) -> Iterator[Metric]:
        """Per (group, topic): lag = the queues' max offsets less the committed ones; in flight = handed out and not
        yet committed (POP: delivered and not acked; pull: pulled past the committed offset); ready = not yet handed
        out. Latencies: now less the store time of the oldest unconsumed / not handed out message."""
        b = self.broker
        store = b.store
        now = b.clock()
        # (group, topic) -> [lag, in flight, ready, oldest unconsumed store time, oldest not handed out]
        agg: dict[tuple[str, str], list[int]] = {}
        never = 1 << 62

        def add(group: str, topic: str, qid: int, committed: int, handed: int, inflight: int) -> None:
            top = store.max_offset(topic, qid)
            row = agg.get((group, topic))
            if row is None:
                row = agg[(group, topic)] = [0, 0, 0, never, never]
            committed = min(committed, top)
            handed = min(max(handed, committed), top)
            row[0] += top - committed
            row[1] += inflight
            row[2] += top - handed
            if committed < top:
                t = store.store_time(topic, qid, committed)
                if t is not None:
                    row[3] = min(row[3], t)
            if handed < top:
                t = store.store_time(topic, qid, handed)
                if t is not None:
                    row[4] = min(row[4], t)

        done: set[tuple[str, str, int]] = set()
        for (group, topic, qid), qs in list(b.pop.states.items()):
            done.add((group, topic, qid))
            add(group, topic, qid, qs.committed, qs.cursor, len(qs.inflight))
        pulled = stats.pulled if stats is not None else {}
        # The groups that committed offsets, that pulled, or that are online with a subscription.
        pairs: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in list(b.offsets.table.items()):
            topic, _, group = key.partition("@")
            pairs[(group, topic)] = queues
        for group, topic, _ in list(pulled):
            pairs.setdefault((group, topic), {})
        for group, info in list(b.consumers.groups.items()):
            for topic in list(info.subscriptions):
                pairs.setdefault((group, topic), {})
        for (group, topic), queues in pairs.items():
            if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                continue
            cfg = b.topics.get(topic)
            qids = set(queues) | (set(range(cfg.read_queue_nums)) if cfg is not None else set())
            for qid in sorted(qids):
                if (group, topic, qid) in done:
                    continue
                committed = queues.get(qid, store.min_offset(topic, qid))
                handed = pulled.get((group, topic, qid), committed)
                add(group, topic, qid, committed, handed, max(handed - committed, 0))

        labels = [*COMMON_LABELS, "consumer_group", "topic", "is_retry", "is_system"]
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Consumer lag messages", labels=labels)
        lag_latency = GaugeMetricFamily("rocketmq_consumer_lag_latency", "Consumer lag time (milliseconds)",
                                        labels=labels)
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages", "Consumer inflight messages",
                                     labels=labels)
        queueing = GaugeMetricFamily("rocketmq_consumer_queueing_latency", "Consumer queueing time (milliseconds)",
                                     labels=labels)
        ready = GaugeMetricFamily("rocketmq_consumer_ready_messages", "Consumer ready messages", labels=labels)
        common = self._common
        for (group, topic), (n_lag, n_inflight, n_ready, oldest, oldest_ready) in sorted(agg.items()):
            values = [*common, group, topic, _bool(topic.startswith(RETRY_GROUP_TOPIC_PREFIX)),
                      _bool(is_system_topic(topic) or is_system_group(group))]
            lag.add_metric(values, n_lag)
            lag_latency.add_metric(values, max(now - oldest, 0) if oldest != never else 0)
            inflight.add_metric(values, n_inflight)
            queueing.add_metric(values, max(now - oldest_ready, 0) if oldest_ready != never else 0)
            ready.add_metric(values, n_ready)
        yield from (lag, lag_latency, inflight, queueing, ready)

    # -- connections ----------------------------------------------------------------------------------------
    def _connections(self) -> Iterator[Metric]:
        b = self.broker
        common = self._common
        producers: dict[tuple[str, str], int] = {}
        for channels in list(b.producers.groups.values()):
            for ch in list(channels.values()):
                key = (ch.language.lower(), str(ch.version))
                producers[key] = producers.get(key, 0) + 1
        prod = GaugeMetricFamily("rocketmq_producer_connections", "Producer connections",
                                 labels=[*COMMON_LABELS, "language", "version", "protocol_type"])
        for (language, version), n in sorted(producers.items()):
            prod.add_metric([*common, language, version, "remoting"], n)
        consumers: dict[tuple[str, str, str, str], int] = {}
        for group, info in list(b.consumers.groups.items()):
            mode = _CONSUME_MODES.get(info.consume_type, info.consume_type.lower())
            for ch in list(info.channels.values()):
                ckey = (group, ch.language.lower(), str(ch.version), mode)
                consumers[ckey] = consumers.get(ckey, 0) + 1
        cons = GaugeMetricFamily("rocketmq_consumer_connections", "Consumer connections",
                                 labels=[*COMMON_LABELS, "consumer_group", "language", "version", "consume_mode",
                                         "protocol_type", "is_system"])
        for (group, language, version, mode), n in sorted(consumers.items()):
            cons.add_metric([*common, group, language, version, mode, "remoting", _bool(is_system_group(group))], n)
        yield from (prod, cons)

    # -- storage --------------------------------------------------------------------------------------------
    def _storage(self) -> Iterator[Metric]:
        store = self.broker.store
        common = self._common
        labels = [*COMMON_LABELS, "storage_type", "storage_medium"]
        values = [*common, "local", "disk"]
        size = GaugeMetricFamily("rocketmq_storage_size", "Broker storage size (bytes used on the store's file "
                                 "system)", labels=labels)
        try:
            st = os.statvfs(store.config.store_path)
            size.add_metric(values, (st.f_blocks - st.f_bfree) * st.f_frsize)
        except OSError:
            pass
        end = store.commitlog.max_offset
        flush = GaugeMetricFamily("rocketmq_storage_flush_behind_bytes", "Broker flush behind bytes", labels=labels)
        flush.add_metric(values, max(end - store.flushed_offset, 0))
        dispatch = GaugeMetricFamily("rocketmq_storage_dispatch_behind_bytes", "Broker dispatch behind bytes",
                                     labels=labels)
        dispatch.add_metric(values, max(end - store.reput.reput_offset, 0))
        forced = CounterMetricFamily("cometmq_storage_forced_deleted_messages", "Messages deleted by the forced "
                                     "clean (disk over diskSpaceCleanForciblyRatio) before their reserved time, "
                                     "consumed or not", labels=labels)
        forced.add_metric(values, store.cleaner.forced_deleted_messages)
        unindexed = CounterMetricFamily("cometmq_storage_unindexed_keys", "Message keys not indexed for want of disk "
                                        "space (never indexed later, as RocketMQ's IndexService drops them)",
                                        labels=labels)
        unindexed.add_metric(values, store.index.unindexed_keys if store.index is not None else 0)
        yield from (size, flush, dispatch, forced, unindexed)

    # -- POP, transactions, timer, long polling ---------------------------------------------------------------
    def _services(self) -> Iterator[Metric]:
        b = self.broker
        common = self._common
        perm = GaugeMetricFamily("rocketmq_broker_permission", "Broker permission", labels=list(COMMON_LABELS))
        perm.add_metric(common, b.config.broker_permission)
        yield perm

        pending, committed, rolled_back = b.transactions.counts()  # builds nothing (this is not the loop's thread)
        half = GaugeMetricFamily("rocketmq_half_messages", "Half messages of all topics (pending transactions)",
                                 labels=list(COMMON_LABELS))
        half.add_metric(common, pending)
        commit = CounterMetricFamily("rocketmq_commit_messages", "Total number of commit messages",
                                     labels=list(COMMON_LABELS))
        commit.add_metric(common, committed)
        rollback = CounterMetricFamily("rocketmq_rollback_messages", "Total number of rollback messages",
                                       labels=list(COMMON_LABELS))
        rollback.add_metric(common, rolled_back)
        yield from (half, commit, rollback)

        if b.timer.config.enable:
            timer = b.timer.service  # (not built yet: nothing scheduled, enqueued or delivered; it stays unbuilt)
            m = timer.metrics() if timer is not None else {"scheduled": 0, "enqueued": 0, "delivered": 0,
                                                            "enqueueLag": 0}
            timing = GaugeMetricFamily("rocketmq_timing_messages", "Current message number in timing",
                                       labels=list(COMMON_LABELS))
            timing.add_metric(common, int(m["scheduled"]))
            enqueue = CounterMetricFamily("rocketmq_timer_enqueue", "Total number of timer enqueue",
                                          labels=list(COMMON_LABELS))
            enqueue.add_metric(common, int(m["enqueued"]))
            dequeue = CounterMetricFamily("rocketmq_timer_dequeue", "Total number of timer dequeue",
                                          labels=list(COMMON_LABELS))
            dequeue.add_metric(common, int(m["delivered"]))
            lag = GaugeMetricFamily("rocketmq_timer_enqueue_lag", "Timer enqueue messages lag",
                                    labels=list(COMMON_LABELS))
            lag.add_metric(common, int(m["enqueueLag"]))
            yield from (timing, enqueue, dequeue, lag)

        pop = b.pop.metrics
        revive = CounterMetricFamily("rocketmq_pop_revive_retry_messages", "POP messages handed out again after "
                                     "their invisible time passed", labels=list(COMMON_LABELS))
        revive.add_metric(common, pop.redelivered)
        yield revive

        holds = GaugeMetricFamily("cometmq_long_polling_holds", "Requests held by long polling now",
                                  labels=[*COMMON_LABELS, "request_type"])
        holds.add_metric([*common, "pull"], b.hold.held_count)
        holds.add_metric([*common, "pop"], b.pop.waiting())
        yield holds


def _cumulative(bounds: list[str], counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(bounds, counts, strict=True):
        total += n
        out.append((bound, total))
    return out
