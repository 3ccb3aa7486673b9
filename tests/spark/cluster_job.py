"""A classic PySpark application for the standalone-cluster test, run with ``spark-submit --master spark://...``:
reads a topic, writes its rows to another topic (tag ``copied``), and reports what ran where.

    spark-submit --master spark://127.0.0.1:PORT tests/spark/cluster_job.py NAMESRV SOURCE SINK

Prints one line ``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    namesrv, source, sink = sys.argv[1:4]
    spark = SparkSession.builder.appName("cometmq-cluster-job").getOrCreate()
    df = spark.read.format("cometmq").option("namesrv", namesrv).option("subscribe", source).load()
    read = df.count()
    (df.select("body", F.lit("copied").alias("tags"), "keys")
     .write.format("cometmq").option("namesrv", namesrv).option("topic", sink).mode("append").save())
    # The Python workers of the tasks: their parent is the executor JVM, not this driver.
    pids = spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getppid()).distinct().collect()
    print("RESULT " + json.dumps({"read": read, "master": spark.sparkContext.master,
                                  "worker_parents": pids, "driver_pid": os.getppid()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
