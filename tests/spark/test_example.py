"""examples/spark_pipeline.py end to end: readings in, windows out to a topic and to Parquet."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tests.interop.cometmq_server import CometServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_pipeline"] = module
    spec.loader.exec_module(module)
    return module


def test_example_pipeline(spark: SparkSession, server: CometServer, topic: str, tmp_path: Path) -> None:
    pipeline = load_example()
    sink = topic + "Win"
    server.create_topic(sink, 4)
    pipeline.send_demo_readings(server.namesrv, topic, 400, sensors=4, span_s=300)
    queries = pipeline.start(spark, namesrv=server.namesrv, source=topic, sink=sink,
                             parquet=str(tmp_path / "windows"), checkpoint=str(tmp_path / "ck"),
                             window="1 minute", watermark="10 seconds")
    for q in queries:
        assert q.awaitTermination(240) and q.exception() is None

    parquet = spark.read.parquet(str(tmp_path / "windows")).collect()
    readings = sum(r.readings for r in parquet if r.sensor != "tick")
    assert readings == 400, "every reading is in exactly one closed window"
    assert {r.sensor for r in parquet} == {"s0", "s1", "s2", "s3"}  # the tick's own window is still open
    messages = (spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", sink)
                .load().collect())
    windows = [json.loads(m.body) for m in messages]
    assert sorted((w["sensor"], w["start"], w["readings"]) for w in windows) == sorted(
        (r.sensor, r.windowStart.strftime("%Y-%m-%dT%H:%M:%S") + "Z", r.readings) for r in parquet)
    assert all(m.tags == "window" for m in messages)
    # One sensor's windows sit in one queue (sharding key), so they keep their order.
    assert all(len({m.queueId for m in messages if json.loads(m.body)["sensor"] == s}) == 1
               for s in ("s0", "s1", "s2", "s3"))
