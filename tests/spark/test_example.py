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


def test_sensor_stats_stream(spark: SparkSession, server: CometServer, producer: Any, topic: str,
                             tmp_path: Path) -> None:
    """examples/sensor_stats_stream.py (examples/pipelines as a plain job): two runs, each reading once."""
    spec = importlib.util.spec_from_file_location("sensor_stats_stream", EXAMPLE.parent / "sensor_stats_stream.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    from cometmq.client import Message

    def send(start: int, n: int) -> None:
        producer.send_batch([Message(topic, json.dumps({"sensor": f"s{i % 3}", "value": float(i), "ts": i}).encode())
                             for i in range(start, start + n)])

    def expected(n: int) -> dict[str, tuple[int, float, float]]:
        vals = {s: [float(i) for i in range(n) if i % 3 == int(s[1])] for s in ("s0", "s1", "s2")}
        return {s: (len(v), round(sum(v) / len(v), 3), max(v)) for s, v in vals.items()}

    send(0, 30)
    producer.send_batch([Message(topic, b"not json")])
    out = str(tmp_path / "out")
    stats = job.run(spark, namesrv=server.namesrv, topic=topic, out=out).collect()
    assert {r.sensor: (r.readings, r.avg_value, r.max_value) for r in stats} == expected(30)
    send(30, 15)
    stats = job.run(spark, namesrv=server.namesrv, topic=topic, out=out).collect()
    assert {r.sensor: (r.readings, r.avg_value, r.max_value) for r in stats} == expected(45)
    table = spark.read.parquet(str(tmp_path / "out" / "readings")).collect()
    assert len(table) == len({(r.queueId, r.queueOffset) for r in table}) == 45
