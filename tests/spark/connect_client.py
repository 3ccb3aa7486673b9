"""A thin Spark Connect client for tests/spark/test_connect.py: PySpark's Connect client only, cometmq NOT
importable (unless ``--with-cometmq``), to show that ``format("cometmq")`` needs nothing on the client.

    python tests/spark/connect_client.py sc://127.0.0.1:PORT SCENARIO '{"json": "args"}' [--with-cometmq]

Prints one line ``RESULT <json>``. Run as a script (not ``-m``), so that nothing of this repository is
imported but this file.
"""

from __future__ import annotations

import json
import sys
from typing import Any

if "--with-cometmq" not in sys.argv:
    # A thin client: importing cometmq (or PySpark's auto-discovery module for it) fails in this process.
    sys.modules["cometmq"] = None  # type: ignore[assignment]
    sys.modules["pyspark_cometmq"] = None  # type: ignore[assignment]

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def read(spark: SparkSession, a: dict[str, Any]) -> dict[str, Any]:
    df = spark.read.format("cometmq").option("namesrv", a["namesrv"]).option("subscribe", a["topic"]).load()
    rows = [[r.queueId, r.queueOffset, r.body.decode(), r.tags] for r in df.collect()]
    per_queue = {str(r.queueId): r["count"] for r in df.groupBy("queueId").count().collect()}  # planned server side
    return {"rows": rows, "per_queue": per_queue}


def write(spark: SparkSession, a: dict[str, Any]) -> dict[str, Any]:
    rows = [(f"w{i}", f"t{i % 2}", f"k{i}", f"s{i % 3}") for i in range(a["n"])]
    df = spark.createDataFrame(rows, "body string, tags string, keys string, shardingKey string")
    (df.write.format("cometmq").option("namesrv", a["namesrv"]).option("topic", a["topic"])
     .option("transactional", str(a.get("transactional", False)).lower()).mode("append").save())
    return {"written": len(rows)}


def stream(spark: SparkSession, a: dict[str, Any]) -> dict[str, Any]:
    """A long-running query source -> sink (both cometmq topics); more rows written into the source while it
    runs; then the query restarted from its checkpoint with AvailableNow (nothing new: no batch)."""
    def start(trigger: dict[str, Any]) -> Any:
        src = (spark.readStream.format("cometmq").option("namesrv", a["namesrv"]).option("subscribe", a["source"])
               .option("startingOffsets", "earliest").load())
        return (src.select("body", F.lit("streamed").alias("tags"))
                .writeStream.format("cometmq").option("namesrv", a["namesrv"]).option("topic", a["sink"])
                .option("transactional", str(a.get("transactional", False)).lower())
                .option("checkpointLocation", a["checkpoint"]).trigger(**trigger).start())

    def rows(query: Any) -> int:
        return sum(p.numInputRows or 0 for p in query.recentProgress)

    q = start({"processingTime": "300 milliseconds"})
    q.processAllAvailable()
    first = rows(q)
    more = spark.createDataFrame([(f"late{i}",) for i in range(a["more"])], "body string")
    more.write.format("cometmq").option("namesrv", a["namesrv"]).option("topic", a["source"]).mode("append").save()
    q.processAllAvailable()
    total = rows(q)
    q.stop()
    exc = q.exception()
    again = start({"availableNow": True})
    again.awaitTermination(120)
    return {"first": first, "total": total, "error": str(exc) if exc else None,
            "rerun_rows": rows(again),
            "rerun_error": str(again.exception()) if again.exception() else None}


def tables(spark: SparkSession, a: dict[str, Any]) -> dict[str, Any]:
    """The rows of tables (e.g. those a pipeline made), as JSON-able dicts."""
    return {name: [{k: (v if isinstance(v, int | float | str) or v is None else str(v))
                    for k, v in r.asDict().items()} for r in spark.read.table(name).collect()]
            for name in a["tables"]}


def register(spark: SparkSession, a: dict[str, Any]) -> dict[str, Any]:
    """Registration from the client: the class is pickled by reference, so the client imports cometmq."""
    from cometmq.spark import register as reg

    reg(spark)
    return read(spark, a)


def main() -> None:
    url, scenario, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        result = {"read": read, "write": write, "stream": stream, "tables": tables,
                  "register": register}[scenario](spark, args)
        result["cometmq_imported"] = any(m.startswith("cometmq") and sys.modules[m] is not None for m in sys.modules)
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
