"""Streaming reads and writes: availableNow runs that resume, a killed query restarted, writeStream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from cometmq.client import Message, MessageQueue
from cometmq.client.sync import SyncAdmin, SyncProducer
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until
from tests.spark.conftest import send

ROOT = Path(__file__).resolve().parents[2]


def stream(spark: SparkSession, server: CometServer, topic: str, **options: str) -> DataFrame:
    r = (spark.readStream.format("cometmq").option("namesrv", server.namesrv).option("subscribe", topic)
         .option("startingOffsets", "earliest"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: DataFrame, out: Path, checkpoint: Path) -> None:
    q = (df.select("queueId", "queueOffset", "body").writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the availableNow query did not finish"
    assert q.exception() is None


def keys_of(spark: SparkSession, out: Path) -> list[tuple[int, int, bytes]]:
    return [(r.queueId, r.queueOffset, r.body) for r in spark.read.parquet(str(out)).collect()]


def test_available_now_resumes_without_duplicates_or_gaps(spark: SparkSession, server: CometServer,
                                                           producer: SyncProducer, topic: str,
                                                           tmp_path: Path) -> None:
    out, ck = tmp_path / "out", tmp_path / "ck"
    send(producer, topic, [f"a{i}" for i in range(60)])
    df = stream(spark, server, topic, maxOffsetsPerTrigger="25", commitToGroup="spark-report")
    run_available_now(df, out, ck)
    first = keys_of(spark, out)
    assert sorted(b for _, _, b in first) == sorted(f"a{i}".encode() for i in range(60))
    batches = len(list((ck / "commits").iterdir()))
    assert batches >= 3, f"maxOffsetsPerTrigger=25 should have split 60 messages into 3+ batches, got {batches}"

    send(producer, topic, [f"b{i}" for i in range(45)])
    run_available_now(df, out, ck)
    second = keys_of(spark, out)
    assert len(second) == len(set(second)) == 105, "a message was read twice or lost"
    assert {b for _, _, b in second} == {f"a{i}".encode() for i in range(60)} | {f"b{i}".encode() for i in range(45)}
    # commitToGroup reports to the broker what Spark committed. Spark commits a batch's source offsets when it
    # plans the next batch, so the report is the end of the last batch but one.
    logs = sorted((ck / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    before_last = json.loads(logs[-2].read_text().splitlines()[-1])[topic]
    assert server.consumer_offsets("spark-report", topic) == {
        int(k.split(":")[1]): v for k, v in before_last.items()}


def test_new_queues_and_a_run_with_nothing_new(spark: SparkSession, server: CometServer, producer: SyncProducer,
                                               topic: str, tmp_path: Path) -> None:
    out, ck = tmp_path / "out", tmp_path / "ck"
    send(producer, topic, ["x1", "x2"])
    df = stream(spark, server, topic)
    run_available_now(df, out, ck)
    run_available_now(df, out, ck)  # nothing new: no batch, no duplicate
    assert sorted(b for _, _, b in keys_of(spark, out)) == [b"x1", b"x2"]
    server.create_topic(topic, 8)  # four more queues, picked up from offset 0
    producer.send_batch([Message(topic, b"q7")],
                        queue=MessageQueue(topic, "broker-a", 7))
    def eight() -> bool:
        route = server.route(topic)
        return route is not None and route["queueDatas"][0]["readQueueNums"] == 8

    wait_until(eight, 10, "the 8-queue route")
    run_available_now(df, out, ck)
    got = keys_of(spark, out)
    assert sorted(b for _, _, b in got) == [b"q7", b"x1", b"x2"] and (7, 0, b"q7") in got


def test_killed_query_restarts_from_its_checkpoint(spark: SparkSession, server: CometServer,
                                                   producer: SyncProducer, topic: str, tmp_path: Path) -> None:
    out, ck = tmp_path / "out", tmp_path / "ck"
    bodies = [f"k{i}" for i in range(300)]
    send(producer, topic, bodies, per_request=20)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "tests.spark.stream_job", server.namesrv, topic, str(out),
                             str(ck)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # Kill it (the driver and its JVM, SIGKILL) once 2 of its 5 micro-batches are committed.
        wait_until(lambda: (ck / "commits").exists() and len(list((ck / "commits").glob("[0-9]*"))) >= 2,
                   150, "two committed micro-batches", step=0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    committed = len(list((ck / "commits").glob("[0-9]*")))
    assert committed < 5, "the job finished before it could be killed; the test proves nothing"
    run_available_now(stream(spark, server, topic), out, ck)
    got = keys_of(spark, out)
    assert len(got) == len(set(got)) == 300, f"{len(got)} rows, {len(set(got))} distinct"
    assert sorted(b.decode() for _, _, b in got) == sorted(bodies)


def test_stream_write_copies_a_topic(spark: SparkSession, server: CometServer, producer: SyncProducer,
                                     topic: str, tmp_path: Path) -> None:
    target = topic + "Copy"
    server.create_topic(target, 4)
    send(producer, topic, [f"c{i}" for i in range(50)])
    q = (stream(spark, server, topic).select("body", "tags", "keys", "properties")
         .writeStream.format("cometmq").option("namesrv", server.namesrv).option("topic", target)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(180) and q.exception() is None
    copied = (spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", target).load()
              .collect())
    assert sorted(r.body for r in copied) == sorted(f"c{i}".encode() for i in range(50))
    with SyncAdmin(namesrv=server.namesrv) as admin:
        assert sum(admin.max_offset(MessageQueue(target, "broker-a", i)) for i in range(4)) == 50
    progress = q.lastProgress
    assert progress is not None and json.loads(progress["sources"][0]["endOffset"])[topic]  # offsets per queue


def test_min_offsets_per_trigger_waits_for_enough_or_the_delay(spark: SparkSession, server: CometServer,
                                                               producer: SyncProducer, topic: str) -> None:
    """minOffsetsPerTrigger holds micro-batches back until that many offsets wait, or maxTriggerDelay has passed
    since the last one; the first trigger is never held back (as in Spark's Kafka source)."""
    name = f"minoffsets_{topic.lower()}"
    send(producer, topic, [f"a{i}" for i in range(5)])
    q = (stream(spark, server, topic, minOffsetsPerTrigger="20", maxTriggerDelay="6s").select("body")
         .writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start())
    try:
        def rows() -> int:
            return int(spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0])

        wait_until(lambda: rows() == 5, 60, "the first micro-batch")
        t0 = time.time()
        send(producer, topic, [f"b{i}" for i in range(5)])
        time.sleep(1.5)
        held, elapsed = rows(), time.time() - t0
        if elapsed < 3:  # (a machine too slow to look in time proves nothing here)
            assert held == 5, "5 offsets waiting, fewer than minOffsetsPerTrigger=20: no micro-batch yet"
        wait_until(lambda: rows() == 10, 60, "the micro-batch maxTriggerDelay lets through")
        t1 = time.time()
        send(producer, topic, [f"c{i}" for i in range(20)])
        wait_until(lambda: rows() == 30, 60, "the micro-batch of 20 offsets")
        assert time.time() - t1 < 4, "20 offsets waiting should trigger at once, not after maxTriggerDelay"
        assert q.exception() is None
    finally:
        q.stop()


def test_a_topic_made_again_is_data_loss_not_a_silent_skip(spark: SparkSession, server: CometServer,
                                                            producer: SyncProducer, topic: str,
                                                            tmp_path: Path) -> None:
    """A topic deleted and created again starts its queues at offset 0 again. A stream that had read up to 10
    must not wait, skipping every message, until the queues come back to 10: the queues' ends went back, which
    is data loss, reported (failOnDataLoss), or with failOnDataLoss=false skipped, the stream going on from the
    queues' new ends."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    send(producer, topic, [f"a{i}" for i in range(40)])
    run_available_now(stream(spark, server, topic), out, ck)
    assert len(keys_of(spark, out)) == 40
    with SyncAdmin(namesrv=server.namesrv) as admin:
        admin.delete_topic(topic)
        server.create_topic(topic, 4)
        wait_until(lambda: server.route(topic) is not None, 10, "the route of the topic made again")
        send(producer, topic, [f"b{i}" for i in range(8)])  # queue ends 5 and 3, below 10
        q = (stream(spark, server, topic).select("queueId", "queueOffset", "body").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        with pytest.raises(Exception, match=r"went back.*from 10 to"):
            q.awaitTermination(180)
        run_available_now(stream(spark, server, topic, failOnDataLoss="false"), out, ck)
        send(producer, topic, [f"c{i}" for i in range(40)])
        ends = {i: admin.max_offset(MessageQueue(topic, "broker-a", i)) for i in range(4)}
    assert sorted(ends.values()) == [10, 10, 13, 15]  # c's at offsets below 10, which the stream had read before
    run_available_now(stream(spark, server, topic, failOnDataLoss="false"), out, ck)
    got = [b for _, _, b in keys_of(spark, out)]
    assert len(got) == len(set(got)) and {b for b in got if b.startswith(b"c")} == {f"c{i}".encode() for i in range(40)}
    # A starting offset past a queue's end is refused at the start, naming the option (as a batch read does).
    past = json.dumps({topic: {"broker-a:0": 99}})
    q = (stream(spark, server, topic, startingOffsets=past).writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    with pytest.raises(Exception, match=r"option startingOffsets: offset 99 .* past the queue's end"):
        q.awaitTermination(120)
