"""df.write.format("cometmq"): columns, sharding keys, timer messages, bad rows; then read back."""

from __future__ import annotations

import datetime as dt
import time
import zlib

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cometmq.client import MessageQueue
from cometmq.client.sync import SyncAdmin
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until

SparkError = (PySparkException, Py4JJavaError)


def read_all(spark: SparkSession, server: CometServer, topic: str):  # type: ignore[no-untyped-def]
    return spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", topic).load()


def test_write_then_read_back(spark: SparkSession, server: CometServer, topic: str) -> None:
    rows = [(f"body{i}", f"tag{i % 3}", f"key{i}", {"n": str(i)}, f"order{i % 4}") for i in range(200)]
    df = spark.createDataFrame(rows, "body string, tags string, keys string, properties map<string,string>, "
                                     "shardingKey string").repartition(2)
    (df.write.format("cometmq").option("namesrv", server.namesrv).option("topic", topic)
     .option("batchSize", "16").mode("append").save())
    back = read_all(spark, server, topic).collect()
    assert len(back) == 200
    by_body = {r.body.decode(): r for r in back}
    for body, tags, keys, props, _ in rows:
        r = by_body[body]
        assert (r.tags, r.keys, r.properties) == (tags, keys, props)
    # One sharding key -> one queue, and within a task the rows of a key keep their order.
    queues: dict[str, set[int]] = {}
    for r in back:
        queues.setdefault(f"order{int(r.body[4:]) % 4}", set()).add(r.queueId)
    assert all(len(q) == 1 for q in queues.values()), queues
    for key in queues:
        mine = sorted((r for r in back if f"order{int(r.body[4:]) % 4}" == key), key=lambda r: r.queueOffset)
        assert [int(r.body[4:]) for r in mine] != [] and len(mine) == 50


def test_topic_column_and_binary_body(spark: SparkSession, server: CometServer, topic: str) -> None:
    other = topic + "B"
    server.create_topic(other, 2)
    df = spark.createDataFrame([(bytearray(b"\x00\x01raw"), topic), (bytearray(b"two"), other)],
                               "body binary, topic string")
    df.write.format("cometmq").option("namesrv", server.namesrv).mode("append").save()
    assert [bytes(r.body) for r in read_all(spark, server, topic).collect()] == [b"\x00\x01raw"]
    assert [bytes(r.body) for r in read_all(spark, server, other).collect()] == [b"two"]


def test_timer_messages_arrive_when_due(spark: SparkSession, server: CometServer, topic: str) -> None:
    due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    df = spark.createDataFrame([("later", due), ("now", None)], "body string, deliverAt timestamp")
    t0 = time.time()
    df.write.format("cometmq").option("namesrv", server.namesrv).option("topic", topic).mode("append").save()
    with SyncAdmin(namesrv=server.namesrv) as admin:
        def stored() -> int:
            return sum(admin.max_offset(MessageQueue(topic, "broker-a", i)) for i in range(4))

        wait_until(lambda: stored() >= 1, 20, "the immediate message")
        wait_until(lambda: stored() >= 2, 30, "the timer message")
    rows = {r.body: r for r in read_all(spark, server, topic).collect()}
    assert set(rows) == {b"later", b"now"}
    assert rows[b"later"].storeTimestamp.timestamp() >= due.timestamp() - 0.5  # not before it was due
    assert time.time() - t0 >= 1.5


def test_bad_writes_fail_clearly(spark: SparkSession, server: CometServer, topic: str) -> None:
    def write(df, **opts: str) -> None:  # type: ignore[no-untyped-def]
        w = df.write.format("cometmq").option("namesrv", server.namesrv)
        for k, v in opts.items():
            w = w.option(k, v)
        w.mode("append").save()

    body = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(SparkError, match="a 'topic' column or the option topic"):
        write(body)
    with pytest.raises(SparkError, match="column 'colour' cannot be written"):
        write(body.withColumn("colour", F.lit("red")), topic=topic)
    with pytest.raises(SparkError, match="'body' column"):
        write(spark.createDataFrame([("x",)], "tags string"), topic=topic)
    with pytest.raises(SparkError, match="null or empty"):
        write(spark.createDataFrame([(None,)], "body string"), topic=topic)
    with pytest.raises(SparkError, match="reserved"):
        write(spark.createDataFrame([("x", {"TAGS": "t"})], "body string, properties map<string,string>"),
              topic=topic)
    with pytest.raises(SparkError, match="appended"):
        body.write.format("cometmq").option("namesrv", server.namesrv).option("topic", topic) \
            .mode("overwrite").save()
    assert read_all(spark, server, topic).count() == 0  # nothing half-written by the refused writes


def test_queue_column_picks_the_queue(spark: SparkSession, server: CometServer, topic: str) -> None:
    rows = [(f"q{i}", i % 4, "broker-a" if i % 2 else None) for i in range(12)]
    df = spark.createDataFrame(rows, "body string, queueId int, brokerName string").coalesce(1)
    df.write.format("cometmq").option("namesrv", server.namesrv).option("topic", topic).mode("append").save()
    back = read_all(spark, server, topic).collect()
    assert sorted((r.body.decode(), r.queueId) for r in back) == sorted((b, q) for b, q, _ in rows)
    for q in range(4):  # one task, one queue: the rows keep their order
        mine = sorted((r for r in back if r.queueId == q), key=lambda r: r.queueOffset)
        assert [r.body.decode() for r in mine] == [b for b, qid, _ in rows if qid == q]
    with pytest.raises(SparkError, match="has no writable queue 9"):
        (spark.createDataFrame([("x", 9)], "body string, queue int").write.format("cometmq")
         .option("namesrv", server.namesrv).option("topic", topic).mode("append").save())


def test_every_column_kind_round_trips(spark: SparkSession, server: CometServer, topic: str) -> None:
    """Body, tags, keys (text and array), properties, queueId with brokerName, shardingKey and a topic column in
    one job each, written from small Arrow batches (requests then span batches): read back, every field is what
    the row said, every row once with its own message id, in the queue it named, in order there."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        rows = [(f"b{i}".encode(), f"tag{i % 3}" if i % 5 else None, f" k{i}  x{i % 2} " if i % 4 else None,
                 {"n": str(i), "é": "日本"} if i % 3 else None, i % 4 if i % 6 else None,
                 "broker-a" if i % 2 else None) for i in range(120)]
        df = spark.createDataFrame(rows, "body binary, tags string, keys string, properties map<string,string>, "
                                         "queueId int, brokerName string").coalesce(1)
        (df.write.format("cometmq").option("namesrv", server.namesrv).option("topic", topic)
         .option("batchSize", "10").mode("append").save())
        other = topic + "K"
        server.create_topic(other, 4)
        keyed = [(f"s{i}", other, [f"a{i}", "", None, "z"] if i % 2 else [], f"user{i % 5}") for i in range(60)]
        (spark.createDataFrame(keyed, "body string, topic string, keys array<string>, shardingKey string")
         .coalesce(1).write.format("cometmq").option("namesrv", server.namesrv).option("batchSize", "4")
         .mode("append").save())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    back = read_all(spark, server, topic).collect()
    assert len(back) == len(rows) and len({r.msgId for r in back}) == len(rows)
    got = {bytes(r.body): r for r in back}
    for body, tags, keys, props, qid, _ in rows:
        r = got[body]
        want_keys = " ".join(k for k in keys.split(" ") if k) if keys else None
        assert (r.tags, r.keys, r.properties) == (tags, want_keys, props or {}), body
        if qid is not None:
            assert r.queueId == qid
    for q in range(4):  # one task: the rows that named a queue are there in row order
        mine = [int(r.body[1:]) for r in sorted(back, key=lambda r: r.queueOffset) if r.queueId == q
                and rows[int(r.body[1:])][4] is not None]
        assert len(mine) >= 10 and mine == sorted(mine), (q, mine)

    back = read_all(spark, server, other).collect()
    assert len(back) == len(keyed) and len({r.msgId for r in back}) == len(keyed)
    by_user: dict[str, list[tuple[int, int, int]]] = {}
    for r in back:
        i = int(r.body[1:])
        assert r.keys == (f"a{i} z" if i % 2 else None)
        by_user.setdefault(f"user{i % 5}", []).append((r.queueId, r.queueOffset, i))
    for user, got_rows in by_user.items():  # one key, one queue (the SDK's hash), in row order (one task)
        assert {q for q, _, _ in got_rows} == {zlib.crc32(user.encode()) % 4}, user
        assert [i for _, _, i in sorted(got_rows)] == sorted(i for _, _, i in got_rows)
