"""The cometmq Spark data source against its ceiling: batch reads into count() and Parquet, and a stream write.

    .venv/bin/python bench/bench_spark.py                      # 1M messages of 100 B, 3 rounds
    .venv/bin/python bench/bench_spark.py --messages 200000 --rounds 1      # quick

Starts ``cometmq serve`` on free 127.0.0.1 ports with a temporary data folder, produces ``--messages``
100-byte messages (tags, keys, one property) into ``--queues`` queues, and starts one SparkSession
(local[2], UI off). Then, in each round, and alternating so both see the same machine:

- ``cometmq``: ``spark.read.format("cometmq")`` of the whole topic into ``count()`` and into Parquet;
- ``ceiling``: an in-memory synthetic Python data source (Arrow batches, same schema, same number of rows and
  partitions, bodies of the same size; ``bench/spark_ceiling.py``: each worker process builds every partition's
  batches once, in an untimed first count, and reuses them, so it costs Spark nothing but taking them) into the
  same ``count()`` and Parquet.

Rows/s are rows over wall time; the ratio is cometmq / ceiling of the best round each. Then the writes: the
ceiling's rows (body, tags, keys) into a topic with ``df.write.format("cometmq")`` (the batch write rate, best of
four, the first of which warms the workers up), and ``--stream-runs`` streaming queries (availableNow), each reading
``--stream-messages`` of a topic and writing them to a second topic with ``writeStream.format("cometmq")`` (the
stream write rate: the best query, whole query included), and as many availableNow queries writing the batch write's
rows from Parquet files into a topic (the sink alone in a stream: ``stream_parquet_write_*``). With ``--eos`` (or
``--eos-only``, which skips the reads), the same batch write and stream write again with ``transactional=true``
(exactly-once: the rows as packed halves, committed by the driver with batched END_TRANSACTIONs: cometmq extensions,
docs/transactions.md), interleaved with the at-least-once ones, and the ratio of their times
(``eos_batch_write_ratio``, ``eos_stream_write_ratio``: exactly-once time / at-least-once time, best run each). One
JSON object on stdout (and in bench/results/).

The write rates against the SDK: after each at-least-once write, ``cometmq bench produce`` (the batched producer as
the CLI runs it: 64 per request, 4 in flight; bodies of ``--body-size``, ``--produce-messages`` of them) against the
same broker, in a subprocess on the same tree. ``batch_write_ratio`` and ``stream_write_ratio`` are each write rate
over the best produce rate measured beside it (``produce_cli_msgs_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The Python workers import the ceiling's data source by name (bench/spark_ceiling.py): see that module.
# ROOT/src too, so that the workers (and the `cometmq bench produce` subprocess) run this tree's cometmq.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "bench"), str(ROOT / "src"),
                                                       os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(ROOT / "bench"))

from pyspark.sql import SparkSession  # noqa: E402
from spark_ceiling import SyntheticSource  # noqa: E402
from tests.interop.cometmq_server import CometServer  # noqa: E402

from cometmq.client import Message, Producer  # noqa: E402
from cometmq.net.loop import run  # noqa: E402
from cometmq.spark import register  # noqa: E402


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


# -- setup ---------------------------------------------------------------------------------------------------------
async def produce(namesrv: str, topic: str, total: int, body_size: int) -> float:
    body = b"x" * body_size
    t0 = time.perf_counter()
    async with Producer("bench-spark-producer", namesrv=namesrv, max_batch_bytes=512 * 1024) as p:
        qs = await p.queues(topic)
        sem = asyncio.Semaphore(4)

        async def one(i: int, first: int, n: int) -> None:
            async with sem:
                await p.send_batch([Message(topic, body, tags="TagA", keys=[f"k{first + j}"],
                                            properties={"source": "bench"}) for j in range(n)],
                                   queue=qs[i % len(qs)])

        jobs, i, first = [], 0, 0
        while first < total:
            n = min(2000, total - first)
            jobs.append(one(i, first, n))
            first += n
            i += 1
        await asyncio.gather(*jobs)
    return time.perf_counter() - t0


def cli_produce(server: CometServer, topic: str, count: int, body_size: int) -> float:
    """``cometmq bench produce`` against ``server`` (its defaults: 64 per request, 4 in flight): msgs/s."""
    out = subprocess.run([sys.executable, "-m", "cometmq.cli", "bench", "produce", "--namesrv", server.namesrv,
                          "--topic", topic, "--count", str(count), "--size", str(body_size)],
                         check=True, capture_output=True, text=True, timeout=600)
    rate = float(json.loads(out.stdout.strip().splitlines()[-1])["msgs_per_s"])
    log(f"cometmq bench produce: {rate:.0f} msgs/s")
    return rate


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_eos(spark: SparkSession, server: CometServer, ceiling: Any, args: argparse.Namespace,
              res: dict[str, Any], tmp: Path) -> None:
    """At-least-once vs exactly-once (transactional=true): the batch write of the ceiling's rows and an
    availableNow stream copy of --stream-messages, alternating, best of --rounds (at least 2) each."""
    rounds = max(2, args.rounds)
    n = min(args.stream_messages, args.messages)
    stream_in = "BenchEosIn"
    server.create_topic(stream_in, args.queues)
    run(produce(server.namesrv, stream_in, n, args.body_size))
    rows = ceiling.select("body", "tags", "keys")
    times: dict[str, list[float]] = {k: [] for k in ("alo_batch", "eos_batch", "alo_stream", "eos_stream")}
    for r in range(rounds):
        for mode in ("alo", "eos"):
            tx = "true" if mode == "eos" else "false"
            target = f"BenchEos{mode.capitalize()}{r}"
            server.create_topic(target, args.queues)
            dt, _ = timed(lambda target=target, tx=tx: rows.write.format("cometmq")
                          .option("namesrv", server.namesrv).option("topic", target).option("transactional", tx)
                          .mode("append").save())
            times[f"{mode}_batch"].append(dt)
            src = (spark.readStream.format("cometmq").option("namesrv", server.namesrv)
                   .option("subscribe", stream_in).option("startingOffsets", "earliest").load())
            query = (src.select("body", "tags", "keys").writeStream.format("cometmq")
                     .option("namesrv", server.namesrv).option("topic", target).option("transactional", tx)
                     .option("checkpointLocation", str(tmp / f"eos-ckpt-{mode}{r}")).trigger(availableNow=True))
            t0 = time.perf_counter()
            q = query.start()
            q.awaitTermination(900)
            times[f"{mode}_stream"].append(time.perf_counter() - t0)
            assert q.exception() is None, q.exception()
            got = spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", target) \
                .load().count()
            assert got == args.messages + n, f"{mode} round {r}: {got} rows, not {args.messages} + {n}"
            log(f"round {r + 1} {mode}: batch write {times[f'{mode}_batch'][-1]:.2f} s ({args.messages} rows), "
                f"stream write {times[f'{mode}_stream'][-1]:.2f} s ({n} rows)")
    res["eos_seconds"] = {k: [round(x, 3) for x in v] for k, v in times.items()}
    res["eos_stream_messages"] = n
    for what in ("batch", "stream"):
        res[f"eos_{what}_write_ratio"] = round(min(times[f"eos_{what}"]) / min(times[f"alo_{what}"]), 3)
    res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    log(f"exactly-once / at-least-once time: batch {res['eos_batch_write_ratio']}, "
        f"stream {res['eos_stream_write_ratio']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream-messages", type=int, default=200_000)
    ap.add_argument("--stream-runs", type=int, default=2, help="availableNow queries copying the stream input")
    ap.add_argument("--produce-messages", type=int, default=200_000,
                    help="messages per `cometmq bench produce` run (one after each write)")
    ap.add_argument("--eos", action="store_true", help="also time the exactly-once (transactional=true) writes")
    ap.add_argument("--eos-only", action="store_true", help="only the at-least-once vs exactly-once writes")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here (default: bench/results/)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cometmq-bench-spark-"))
    server = CometServer(tmp / "server", {"mappedFileSizeCommitLog": str(256 << 20),
                                          "mappedFileSizeConsumeQueue": str(20 * 300_000),
                                          "maxHashSlotNum": "500000", "maxIndexNum": "2000000"})
    spark = None
    res: dict[str, Any] = {"bench": "spark_source", "python": platform.python_version(), "cpus": os.cpu_count(),
                           "machine": platform.machine(), "messages": args.messages, "queues": args.queues,
                           "body_size": args.body_size, "rounds": args.rounds}
    try:
        server.start()
        topic, out_topic = "BenchSpark", "BenchSparkOut"
        server.create_topic(topic, args.queues)
        server.create_topic(out_topic, args.queues)
        log(f"server pid {server.pid}; producing {args.messages} messages")
        dt = run(produce(server.namesrv, topic, args.messages, args.body_size))
        res["produce_msg_s"] = round(args.messages / dt)
        log(f"produced at {res['produce_msg_s']} msg/s")

        import pyspark

        res["pyspark"] = pyspark.__version__
        spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        spark.dataSource.register(SyntheticSource)
        comet = (spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", topic).load())
        ceiling = (spark.read.format("cometmq_synthetic").option("rows", str(args.messages))
                   .option("parts", str(args.queues)).option("body", str(args.body_size)).load())
        if args.eos_only:
            bench_eos(spark, server, ceiling, args, res, tmp)
        else:
            # Same rows? A quick look at both, and every message must be there.
            assert comet.count() == args.messages, "the cometmq read lost or added messages"
            assert ceiling.count() == args.messages
            pq = tmp / "parquet"
            runs: dict[str, list[float]] = {k: [] for k in ("cometmq_count", "ceiling_count", "cometmq_parquet",
                                                            "ceiling_parquet")}
            for r in range(args.rounds):
                for name, df in (("ceiling", ceiling), ("cometmq", comet)):
                    dt, n = timed(df.count)
                    assert n == args.messages
                    runs[f"{name}_count"].append(dt)
                    shutil.rmtree(pq, ignore_errors=True)
                    dt, _ = timed(lambda df=df: df.write.parquet(str(pq)))
                    runs[f"{name}_parquet"].append(dt)
                    log(f"round {r + 1} {name}: count {runs[f'{name}_count'][-1]:.2f} s, "
                        f"parquet {runs[f'{name}_parquet'][-1]:.2f} s")
            res["seconds"] = {k: [round(x, 3) for x in v] for k, v in runs.items()}
            for what in ("count", "parquet"):
                c = args.messages / min(runs[f"cometmq_{what}"])
                ceil = args.messages / min(runs[f"ceiling_{what}"])
                res[f"cometmq_{what}_rows_s"] = round(c)
                res[f"ceiling_{what}_rows_s"] = round(ceil)
                res[f"{what}_ratio"] = round(c / ceil, 3)

            # Batch write: the ceiling's rows (body, tags, keys) into a topic with df.write.format("cometmq"), best of
            # four (the first also starts the workers' write path: three that count), `cometmq bench produce` beside
            # each.
            write_topic = "BenchSparkWrite"
            server.create_topic(write_topic, args.queues)
            rows = ceiling.select("body", "tags", "keys")
            produce_topic = "BenchSparkProduce"
            server.create_topic(produce_topic, args.queues)
            batch_s, produce_batch = [], []
            for _ in range(4):
                dt, _ = timed(lambda: rows.write.format("cometmq").option("namesrv", server.namesrv)
                              .option("topic", write_topic).mode("append").save())
                batch_s.append(dt)
                produce_batch.append(cli_produce(server, produce_topic, args.produce_messages, args.body_size))
            res["batch_write_s"] = [round(x, 3) for x in batch_s]
            res["batch_write_rows_s"] = round(args.messages / min(batch_s))

            # Stream write: an availableNow query copies a topic of --stream-messages into another topic. Each run is
            # a new query (its own checkpoint) over the same input, so each copies all of it; the rate is the best
            # run's, whole query included (start, planning, checkpoint writes, the one micro-batch).
            n = min(args.stream_messages, args.messages)
            stream_in = "BenchSparkStreamIn"
            server.create_topic(stream_in, args.queues)
            run(produce(server.namesrv, stream_in, n, args.body_size))

            def queries(source: Any, topic: str, name: str) -> tuple[list[float], list[float]]:
                """--stream-runs availableNow queries of ``source()`` into ``topic`` (each with its own checkpoint,
                so each writes everything), whole query timed, `cometmq bench produce` beside each."""
                seconds, produced = [], []
                for k in range(args.stream_runs):
                    query = (source().writeStream.format("cometmq").option("namesrv", server.namesrv)
                             .option("topic", topic).option("checkpointLocation", str(tmp / f"ckpt-{name}{k}"))
                             .trigger(availableNow=True))
                    t0 = time.perf_counter()
                    query.start().awaitTermination(600)
                    seconds.append(time.perf_counter() - t0)
                    produced.append(cli_produce(server, produce_topic, args.produce_messages, args.body_size))
                return seconds, produced

            stream_s, produce_stream = queries(
                lambda: spark.readStream.format("cometmq").option("namesrv", server.namesrv)
                .option("subscribe", stream_in).option("startingOffsets", "earliest").load()
                .select("body", "tags", "keys"), out_topic, "copy")
            # The sink alone in a streaming query: the same rows as the batch write, from Parquet files (a source that
            # costs Spark little), written by availableNow queries; the topic copy above also pays the stream read.
            src_pq = tmp / "stream-parquet"
            rows.write.parquet(str(src_pq))
            pq_topic = "BenchSparkStreamPq"
            server.create_topic(pq_topic, args.queues)
            pq_s, produce_pq = queries(lambda: spark.readStream.schema(rows.schema).parquet(str(src_pq)), pq_topic,
                                       "pq")
            res["stream_parquet_write_s"] = [round(x, 3) for x in pq_s]
            res["stream_parquet_write_rows_s"] = round(args.messages / min(pq_s))
            res["stream_parquet_write_ratio"] = round(res["stream_parquet_write_rows_s"] / max(produce_pq), 3)
            written = spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", out_topic) \
                .load().count()
            assert written == args.stream_runs * n, \
                f"the stream writes wrote {written} rows, not {args.stream_runs} x {n}"
            res["stream_written"] = written
            res["stream_write_s"] = [round(x, 3) for x in stream_s]
            res["stream_write_rows_s"] = round(n / min(stream_s))
            # The write rates over `cometmq bench produce`'s (same broker, same body size, run beside each).
            res["produce_cli_msgs_s"] = {"batch": [round(x) for x in produce_batch],
                                         "stream": [round(x) for x in produce_stream]}
            res["batch_write_ratio"] = round(res["batch_write_rows_s"] / max(produce_batch), 3)
            res["stream_write_ratio"] = round(res["stream_write_rows_s"] / max(produce_stream), 3)
            log(f"batch write {res['batch_write_rows_s']} rows/s ({res['batch_write_ratio']} of cometmq bench "
                f"produce), stream write {res['stream_write_rows_s']} rows/s ({res['stream_write_ratio']}), from "
                f"Parquet {res['stream_parquet_write_rows_s']} rows/s ({res['stream_parquet_write_ratio']})")
            if args.eos:
                bench_eos(spark, server, ceiling, args, res, tmp)
    finally:
        if spark is not None:
            spark.stop()
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    line = json.dumps(res)
    print(line)
    out = args.out or ROOT / "bench" / "results" / f"spark-{time.strftime('%Y%m%d-%H%M')}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
