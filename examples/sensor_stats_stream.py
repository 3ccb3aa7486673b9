"""examples/pipelines (a Spark Declarative Pipeline) as a plain structured-streaming job, for a Spark without
``spark-pipelines`` or for comparison:

    pip install 'cometmq[spark]'
    cometmq serve &
    python examples/sensor_stats_stream.py --namesrv 127.0.0.1:9876 --topic SensorReadings --out sensor-stats

1. ``readings`` (the pipeline's streaming table): a streaming query from the cometmq topic into Parquet under
   ``OUT/readings``, with ``Trigger.AvailableNow`` and a checkpoint under ``OUT/_checkpoints``, so that each
   run adds the readings that came since the last one, each once;
2. ``sensor_stats`` (the pipeline's materialized view): a batch aggregation over all of ``readings``, written
   over ``OUT/sensor_stats`` on every run.

The pipeline keeps both as catalog tables and its checkpoints under its ``storage``; here they are paths.
The parsing and the aggregation are those of examples/pipelines/transformations/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

READING = "sensor string, value double, ts bigint"

#: examples/pipelines/transformations/sensor_stats.sql, over a view named ``readings``
SENSOR_STATS = """
SELECT sensor,
       count(*)              AS readings,
       round(avg(value), 3)  AS avg_value,
       max(value)            AS max_value,
       max(eventTime)        AS last_reading
FROM readings
GROUP BY sensor
"""


def readings(spark: SparkSession, namesrv: str, topic: str) -> DataFrame:
    """The readings on ``topic`` as a stream: queue, offset, sensor, value, event time."""
    messages = (spark.readStream.format("cometmq")
                .option("namesrv", namesrv)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .option("includeProperties", "false")
                .load())
    return (messages
            .select("queueId", "queueOffset", F.from_json(F.col("body").cast("string"), READING).alias("r"))
            .select("queueId", "queueOffset", "r.sensor", "r.value", F.timestamp_millis("r.ts").alias("eventTime"))
            .where(F.col("sensor").isNotNull()))


def run(spark: SparkSession, *, namesrv: str, topic: str, out: str) -> DataFrame:
    """One update: new readings appended (exactly once, by the checkpoint), then the stats recomputed.
    Returns the stats as written."""
    table, stats = os.path.join(out, "readings"), os.path.join(out, "sensor_stats")
    query = (readings(spark, namesrv, topic).writeStream.format("parquet")
             .option("path", table).option("checkpointLocation", os.path.join(out, "_checkpoints", "readings"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the readings query failed: {query.exception()}")
    spark.read.parquet(table).createOrReplaceTempView("readings")
    spark.sql(SENSOR_STATS).write.mode("overwrite").parquet(stats)
    return spark.read.parquet(stats)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", default="127.0.0.1:9876")
    ap.add_argument("--topic", default="SensorReadings")
    ap.add_argument("--out", default="sensor-stats")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("cometmq-sensor-stats").getOrCreate()
    run(spark, namesrv=args.namesrv, topic=args.topic, out=str(Path(args.out).resolve())).orderBy("sensor").show()
    spark.stop()


if __name__ == "__main__":
    main()
