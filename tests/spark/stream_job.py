"""A streaming copy job for the kill test: cometmq topic -> Parquet, a few offsets per micro-batch.

    python -m tests.spark.stream_job NAMESRV TOPIC OUT_DIR CHECKPOINT_DIR

Prints ``started`` once the query runs; runs until killed.
"""

from __future__ import annotations

import os
import sys

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession


def main() -> None:
    namesrv, topic, out, checkpoint = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from cometmq.spark import register

    register(spark)
    query = (spark.readStream.format("cometmq").option("namesrv", namesrv).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "60").load()
             .select("queueId", "queueOffset", "body")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
