"""A streaming pipeline on Spark: sensor readings from a cometmq topic, per-minute windows, results to a topic
and to Parquet.

    pip install 'cometmq[spark]'
    cometmq serve &                                                 # nameserver :9876, broker :10911
    python examples/spark_pipeline.py --namesrv 127.0.0.1:9876 --demo 2000   # send demo readings first
    python examples/spark_pipeline.py --namesrv 127.0.0.1:9876 --continuous  # keep running

Readings are JSON bodies ``{"sensor": "s1", "value": 21.5, "ts": <epoch ms>}`` on the topic ``--source``.
The pipeline reads them with ``spark.readStream.format("cometmq")``, takes ``ts`` as event time with a
watermark of ``--watermark``, and counts and averages the readings per sensor in tumbling windows of
``--window``. Each window, once the watermark has passed it, is written

- to the topic ``--sink`` as a JSON message (tag ``window``, sharding key = sensor, so one sensor's windows
  stay in order), with ``writeStream.format("cometmq")``, and
- to Parquet files under ``--parquet``,

by two streaming queries with their own checkpoints under ``--checkpoint``. Run again, it goes on where the
checkpoints say: a reading is counted once (Spark's checkpoint covers the cometmq read and the Parquet files;
the topic write is at-least-once, so a crash can repeat a window message there).

By default it runs with ``Trigger.AvailableNow`` (process what is there, then stop); ``--continuous`` uses a
processing-time trigger until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

READING = StructType([StructField("sensor", StringType()), StructField("value", DoubleType()),
                      StructField("ts", LongType())])


def windows(spark: SparkSession, namesrv: str, source: str, window: str, watermark: str) -> DataFrame:
    """Per-sensor windows over the readings on ``source``: sensor, window start/end, count, avg, max."""
    events = (spark.readStream.format("cometmq")
              .option("namesrv", namesrv)
              .option("subscribe", source)
              .option("startingOffsets", "earliest")
              .option("includeProperties", "false")
              .load())
    readings = (events
                .select(F.from_json(F.col("body").cast("string"), READING).alias("r"))
                .select("r.*")
                .where(F.col("sensor").isNotNull() & F.col("ts").isNotNull())
                .withColumn("eventTime", F.timestamp_millis("ts")))
    return (readings
            .withWatermark("eventTime", watermark)
            .groupBy(F.window("eventTime", window).alias("w"), "sensor")
            .agg(F.count("*").alias("readings"), F.avg("value").alias("avg"), F.max("value").alias("max"))
            .select("sensor", F.col("w.start").alias("windowStart"), F.col("w.end").alias("windowEnd"),
                    "readings", "avg", "max"))


def start(spark: SparkSession, *, namesrv: str, source: str, sink: str, parquet: str, checkpoint: str,
          window: str = "1 minute", watermark: str = "30 seconds", available_now: bool = True,
          interval: str = "5 seconds") -> list[StreamingQuery]:
    """Start the two queries (to the topic, to Parquet) and return them."""
    agg = windows(spark, namesrv, source, window, watermark)
    as_messages = agg.select(
        F.to_json(F.struct("sensor", F.date_format("windowStart", "yyyy-MM-dd'T'HH:mm:ssX").alias("start"),
                           "readings", "avg", "max")).alias("body"),
        F.lit("window").alias("tags"),
        F.concat_ws("@", "sensor", F.unix_millis("windowStart").cast("string")).alias("keys"),
        F.col("sensor").alias("shardingKey"))

    def trigger(w: object) -> object:
        return w.trigger(availableNow=True) if available_now else w.trigger(processingTime=interval)  # type: ignore[attr-defined]

    to_topic = trigger(as_messages.writeStream.format("cometmq").outputMode("append")
                       .option("namesrv", namesrv).option("topic", sink)
                       .option("checkpointLocation", os.path.join(checkpoint, "to-topic")))
    to_parquet = trigger(agg.writeStream.format("parquet").outputMode("append")
                         .option("path", parquet)
                         .option("checkpointLocation", os.path.join(checkpoint, "to-parquet")))
    return [to_topic.start(), to_parquet.start()]  # type: ignore[attr-defined]


def send_demo_readings(namesrv: str, topic: str, count: int, sensors: int = 4, span_s: int = 600) -> None:
    """``count`` readings spread over the last ``span_s`` seconds, then one reading far ahead of them all,
    whose event time moves the watermark past every earlier window so that they are written."""
    from cometmq.client import Message
    from cometmq.client.sync import SyncProducer

    now = int(time.time() * 1000)
    rng = random.Random(7)
    msgs = [Message(topic, json.dumps({"sensor": f"s{i % sensors}", "value": round(rng.uniform(15, 30), 2),
                                       "ts": now - span_s * 1000 + i * span_s * 1000 // count}).encode())
            for i in range(count)]
    msgs.append(Message(topic, json.dumps({"sensor": "tick", "value": 0.0, "ts": now + 3_600_000}).encode()))
    with SyncProducer("spark-pipeline-demo", namesrv=namesrv) as p:
        for i in range(0, len(msgs), 100):
            p.send_batch(msgs[i : i + 100])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", default="127.0.0.1:9876")
    ap.add_argument("--source", default="SensorReadings")
    ap.add_argument("--sink", default="SensorWindows")
    ap.add_argument("--parquet", default="spark-pipeline/windows")
    ap.add_argument("--checkpoint", default="spark-pipeline/checkpoints")
    ap.add_argument("--window", default="1 minute")
    ap.add_argument("--watermark", default="30 seconds")
    ap.add_argument("--continuous", action="store_true", help="a processing-time trigger instead of AvailableNow")
    ap.add_argument("--demo", type=int, default=0, help="first send this many demo readings to --source")
    args = ap.parse_args(argv)

    if args.demo:
        send_demo_readings(args.namesrv, args.source, args.demo)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("cometmq-spark-pipeline").getOrCreate()
    from cometmq.spark import register

    register(spark)
    queries = start(spark, namesrv=args.namesrv, source=args.source, sink=args.sink,
                    parquet=str(Path(args.parquet).resolve()), checkpoint=str(Path(args.checkpoint).resolve()),
                    window=args.window, watermark=args.watermark, available_now=not args.continuous)
    try:
        for q in queries:
            q.awaitTermination()
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    print(f"windows in {args.parquet}: {spark.read.parquet(args.parquet).count()}")
    spark.stop()


if __name__ == "__main__":
    main()
