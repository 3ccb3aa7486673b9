"""A streaming copy job for the exactly-once kill test: a cometmq topic -> another, ``transactional=true``.

    python -m tests.spark.eos_job NAMESRV SOURCE TARGET CHECKPOINT_DIR

A few offsets per micro-batch; runs until killed (the test arms a failpoint in the sink's commit that SIGKILLs
this process's group: the driver and its JVM; the Python workers die with their JVM).
"""

from __future__ import annotations

import os
import sys

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession


def main() -> None:
    namesrv, source, target, checkpoint = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    from cometmq.spark import register

    register(spark)
    query = (spark.readStream.format("cometmq").option("namesrv", namesrv).option("subscribe", source)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "60").load()
             .select("body", "keys")
             .writeStream.format("cometmq").option("namesrv", namesrv).option("topic", target)
             .option("transactional", "true").option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
