"""Batch reads through Spark against a real broker: offset ranges, timestamps, filters, errors, data loss."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from cometmq.client import Message, MessageQueue
from cometmq.client.sync import SyncAdmin, SyncProducer
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until
from tests.spark.conftest import send

SparkError = (PySparkException, Py4JJavaError)


def reader(spark: SparkSession, server: CometServer, topic: str, **options: str):  # type: ignore[no-untyped-def]
    r = spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_whole_topic_with_every_column(spark: SparkSession, server: CometServer, producer: SyncProducer,
                                       topic: str) -> None:
    producer.send(Message(topic, b"first", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}))
    send(producer, topic, [f"m{i}" for i in range(40)])
    rows = reader(spark, server, topic).collect()
    assert len(rows) == 41
    assert sorted(r.body for r in rows) == sorted([b"first"] + [f"m{i}".encode() for i in range(40)])
    first = next(r for r in rows if r.body == b"first")
    assert (first.topic, first.brokerName, first.tags, first.keys) == (topic, "broker-a", "TagA", "k1 k2")
    assert first.properties == {"color": "red"} and first.reconsumeTimes == 0 and len(first.msgId) == 32
    assert first.bornTimestamp <= first.storeTimestamp
    # Every (queue, offset) once, and each queue's offsets 0..n-1.
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        per_queue.setdefault(r.queueId, []).append(r.queueOffset)
    assert len(per_queue) > 1, "the producer should have spread the batches over the queues"
    for offsets in per_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_many_pulls_per_task_capped_by_the_broker(spark: SparkSession, server: CometServer,
                                                  producer: SyncProducer, topic: str) -> None:
    """A range far larger than one pull answer (the broker cuts answers at 256 KiB): several pulls on the wire
    at once, answers cut short and their rest fetched, and still every offset once, in order, with its body."""
    queue = MessageQueue(topic, "broker-a", 1)
    for first in range(0, 3000, 500):
        producer.send_batch([Message(topic, f"{i:06d}".encode() * 60) for i in range(first, first + 500)],
                            queue=queue)
    end = json.dumps({topic: {"broker-a:1": 2950}})
    rows = reader(spark, server, topic, startingOffsets=json.dumps({topic: {"broker-a:1": 3}}),
                  endingOffsets=end).select("queueId", "queueOffset", "body").collect()
    assert [(r.queueId, r.queueOffset) for r in rows] == [(1, i) for i in range(3, 2950)]
    assert all(r.body == f"{r.queueOffset:06d}".encode() * 60 for r in rows)


def test_exact_offset_ranges(spark: SparkSession, server: CometServer, producer: SyncProducer, topic: str) -> None:
    queue = MessageQueue(topic, "broker-a", 2)
    producer.send_batch([Message(topic, f"q2-{i}".encode()) for i in range(30)], queue=queue)
    producer.send_batch([Message(topic, b"other")], queue=MessageQueue(topic, "broker-a", 1))
    start = json.dumps({topic: {"broker-a:2": 5, "broker-a:1": -2}})
    end = json.dumps({topic: {"broker-a:2": 12, "broker-a:1": 0, "broker-a:0": -1}})
    df = reader(spark, server, topic, startingOffsets=start, endingOffsets=end, minPartitions="3")
    rows = df.collect()
    assert sorted((r.queueId, r.queueOffset) for r in rows) == [(2, i) for i in range(5, 12)]
    assert sorted(r.body for r in rows) == sorted(f"q2-{i}".encode() for i in range(5, 12))
    assert df.rdd.getNumPartitions() >= 3  # the one range was split
    # assign: one queue only
    assigned = (spark.read.format("cometmq").option("namesrv", server.namesrv)
                .option("assign", json.dumps({topic: [1]})).load().collect())
    assert [r.body for r in assigned] == [b"other"]


def test_timestamps_bound_the_read(spark: SparkSession, server: CometServer, producer: SyncProducer,
                                   topic: str) -> None:
    """startingTimestamp / endingTimestamp, their per-queue JSON forms, the no-match strategy; and
    maxRecordsPerPartition and includeHeaders, on the same data. Queue 1 has nothing after the cut, queue 3
    nothing at all."""
    def to(queue: int, bodies: list[str]) -> None:
        producer.send_batch([Message(topic, b.encode()) for b in bodies], queue=MessageQueue(topic, "broker-a", queue))

    to(0, [f"early0-{i}" for i in range(6)])
    to(1, [f"early1-{i}" for i in range(6)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    to(0, [f"late0-{i}" for i in range(6)])
    to(2, [f"late2-{i}" for i in range(6)])
    late = {f"late{q}-{i}".encode() for q in (0, 2) for i in range(6)}
    early = {f"early{q}-{i}".encode() for q in (0, 1) for i in range(6)}

    def bodies(**options: str) -> set[bytes]:
        return {r.body for r in reader(spark, server, topic, **options).collect()}

    # As Spark's Kafka source: by default a queue with no message at or after the starting timestamp fails the read.
    with pytest.raises(SparkError, match=r"startingTimestamp: no message stored at or after the timestamp in "
                                         rf"{topic} broker-a:1 \(timestamp {cut}\); {topic} broker-a:3"):
        bodies(startingTimestamp=str(cut))
    assert bodies(startingTimestamp=str(cut), startingOffsetsByTimestampStrategy="latest") == late
    assert bodies(endingTimestamp=str(cut)) == early
    by_queue = bodies(startingOffsetsByTimestamp=json.dumps({topic: {"broker-a:0": cut, "broker-a:2": -2}}),
                      endingOffsetsByTimestamp=json.dumps({topic: {"broker-a:0": -1, "broker-a:1": cut}}))
    assert by_queue == late | {f"early1-{i}".encode() for i in range(6)}  # queues left out: earliest / latest

    split = reader(spark, server, topic, maxRecordsPerPartition="4", includeHeaders="false")
    assert "properties" not in split.columns
    assert split.rdd.getNumPartitions() == 3 + 2 + 2  # 12, 6 and 6 messages in pieces of at most 4
    assert split.count() == 24


def test_tag_and_sql92_filters(spark: SparkSession, server: CometServer, producer: SyncProducer,
                               topic: str) -> None:
    for i in range(30):
        producer.send(Message(topic, f"m{i}".encode(), tags="even" if i % 2 == 0 else "odd",
                              properties={"n": str(i)}))
    tagged = reader(spark, server, topic, subExpression="odd").collect()
    assert sorted(r.body for r in tagged) == sorted(f"m{i}".encode() for i in range(1, 30, 2))
    sql = reader(spark, server, topic, expressionType="SQL92", subExpression="n >= 25").collect()
    assert sorted(r.body for r in sql) == sorted(f"m{i}".encode() for i in range(25, 30))
    lean = reader(spark, server, topic, includeProperties="false")
    assert "properties" not in lean.columns and lean.count() == 30


def test_pattern_skips_other_topics(spark: SparkSession, server: CometServer, producer: SyncProducer,
                                    topic: str) -> None:
    other = topic + "x"
    server.create_topic(other, 2)
    send(producer, topic, ["a", "b"])
    send(producer, other, ["c"])
    df = (spark.read.format("cometmq").option("namesrv", server.namesrv)
          .option("subscribePattern", f"{topic}x?").load())
    assert sorted((r.topic, r.body) for r in df.collect()) == sorted(
        [(topic, b"a"), (topic, b"b"), (other, b"c")])


def test_bad_options_fail_with_a_clear_error(spark: SparkSession, server: CometServer, topic: str) -> None:
    with pytest.raises(SparkError, match="unknown cometmq read option 'startoffsets'"):
        reader(spark, server, topic, startOffsets="earliest").collect()
    with pytest.raises(SparkError, match="contradict"):
        reader(spark, server, topic, startingOffsets="earliest", startingTimestamp="1").collect()
    with pytest.raises(SparkError, match="unknown to the nameserver"):
        reader(spark, server, "NoSuchTopicHere").collect()
    with pytest.raises(SparkError, match="has no queue 9"):
        (spark.read.format("cometmq").option("namesrv", server.namesrv)
         .option("assign", json.dumps({topic: [9]})).load().collect())


# -- retention ---------------------------------------------------------------------------------------------------
RETENTION_CONF = {
    "mappedFileSizeCommitLog": str(64 * 1024),
    "maxMessageSize": "8192",
    "mappedFileSizeConsumeQueue": str(20 * 100),
    "fileReservedTime": "0",
    "deleteWhen": ";".join(f"{h:02d}" for h in range(24)),
    "cleanResourceInterval": "200",
}


def test_data_loss_after_retention(spark: SparkSession, tmp_path: Path) -> None:
    server = CometServer(tmp_path / "retention", RETENTION_CONF)
    server.start()
    try:
        topic = "RetainedT"
        server.create_topic(topic, 1)
        queue = MessageQueue(topic, "broker-a", 0)
        with SyncProducer("retention-producer", namesrv=server.namesrv) as p:
            for i in range(0, 1500, 25):  # a batch, encoded, must fit maxMessageSize (8 KiB here)
                p.send_batch([Message(topic, f"r{j}".encode() * 20) for j in range(i, i + 25)], queue=queue)
        with SyncAdmin(namesrv=server.namesrv) as admin:
            wait_until(lambda: admin.min_offset(queue) > 0, 30, "retention to delete the oldest segments")
            low, high = admin.min_offset(queue), admin.max_offset(queue)
        assert 0 < low < high == 1500
        from_zero = json.dumps({topic: {"broker-a:0": 0}})
        with pytest.raises(SparkError, match=r"deleted before they were read.*offsets 0\.\."):
            reader(spark, server, topic, startingOffsets=from_zero).collect()
        rows = reader(spark, server, topic, startingOffsets=from_zero, failOnDataLoss="false").collect()
        assert sorted(r.queueOffset for r in rows) == list(range(low, 1500)) or \
            sorted(r.queueOffset for r in rows)[-1] == 1499  # retention may go on deleting meanwhile
        # A stream that was at offset 0 when the data went away notices it too.
        stream = (spark.readStream.format("cometmq").option("namesrv", server.namesrv)
                  .option("subscribe", topic).option("startingOffsets", from_zero).load()
                  .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
                  .trigger(availableNow=True).start())
        with pytest.raises(Exception, match="deleted before they were read"):
            stream.awaitTermination(120)
    finally:
        server.close()
