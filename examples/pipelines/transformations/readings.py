"""The streaming table ``readings``: every sensor reading on the cometmq topic, parsed, read once each.

spark-pipelines runs this file with ``spark`` (the pipeline's session, a Spark Connect one) set in it; the
topic and the nameserver come from the pipeline's configuration (spark-pipeline.yml).
"""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

spark: SparkSession = globals()["spark"]  # the pipeline's session: spark-pipelines sets it before running this file

READING = "sensor string, value double, ts bigint"


@dp.table(comment="sensor readings from a cometmq topic, one row per message")
def readings() -> DataFrame:
    messages = (spark.readStream.format("cometmq")
                .option("namesrv", spark.conf.get("cometmq.namesrv", "127.0.0.1:9876"))
                .option("subscribe", spark.conf.get("cometmq.topic", "SensorReadings"))
                .option("startingOffsets", "earliest")
                .option("includeProperties", "false")
                .load())
    return (messages
            .select("queueId", "queueOffset", F.from_json(F.col("body").cast("string"), READING).alias("r"))
            .select("queueId", "queueOffset", "r.sensor", "r.value", F.timestamp_millis("r.ts").alias("eventTime"))
            .where(F.col("sensor").isNotNull()))
