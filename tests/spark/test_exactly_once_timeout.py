"""transactionTimeoutMs: how long a transactional write's halves wait before the broker asks about them (and,
after transactionCheckMax checks nobody answers, discards them).

The broker here checks every 500 ms and discards a half after 2 undecided checks, so a half whose immunity has
passed is gone about a second later. The fast tests call the sink's task and driver functions in this process
(no Spark job) with a timeout of 1 s, below the option's minimum, so that the broker discards halves within a
test. The soak tests run a Spark batch write whose second task ends 66 s after the first: past the immunity the
halves had before this option (60 s) and the broker's checks.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cometmq.spark.exactly_once import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    HalfBatch,
    TransactionTimeoutError,
    _Driver,
    commit_halves,
    send_halves,
)
from cometmq.spark.options import WriteOptions, parse_write
from tests.interop.cometmq_server import CometServer
from tests.spark.conftest import running

SparkError = (PySparkException, Py4JJavaError)
CHECK_CONF = {"transactionTimeOut": "500", "transactionCheckInterval": "500", "transactionCheckMax": "2"}
#: how long after its immunity a half of this broker is surely discarded (2 checks 500 ms apart, then the discard)
DISCARDED_AFTER_S = 3.0
#: the immunity before transactionTimeoutMs existed; the slow task of the soak tests outlasts it and the checks
OLD_IMMUNITY_S = 60
SLOW_TASK_S = OLD_IMMUNITY_S + 6


@pytest.fixture(scope="module")
def ckserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    yield from running(tmp_path_factory, "eos-timeout-broker", CHECK_CONF)


_n = iter(range(1, 1_000_000))


def new_topic(server: CometServer) -> str:
    name = f"EosTo{os.getpid()}_{next(_n)}"
    server.create_topic(name, 4)
    return name


def visible(spark: SparkSession, server: CometServer, topic: str) -> list[str]:
    df = spark.read.format("cometmq").option("namesrv", server.namesrv).option("subscribe", topic).load()
    return sorted(r.body.decode() for r in df.select("body").collect())


def write_opts(server: CometServer, topic: str, **extra: str) -> WriteOptions:
    return parse_write({"namesrv": server.namesrv, "topic": topic, "transactional": "true", "batchSize": "10",
                        **extra})


def task(opts: WriteOptions, query: str, first: int, n: int = 30) -> HalfBatch:
    """One task's rows ``r<first>``.. sent as halves, as a Spark task of the write sends them."""
    rows = pa.RecordBatch.from_pydict({"body": [f"r{i}" for i in range(first, first + n)]})
    return send_halves(iter([rows]), opts, query, 0)


def test_halves_carry_transaction_timeout(spark: SparkSession, ckserver: CometServer) -> None:
    """The option becomes each half's CHECK_IMMUNITY_TIME_IN_SECONDS, in seconds rounded up (the committed rows
    keep the half's properties)."""
    for option, seconds in ((None, "3600"), ("90500", "91")):
        target = new_topic(ckserver)
        w = (spark.createDataFrame([(f"r{i}",) for i in range(20)], "body string").repartition(2).write
             .format("cometmq").option("namesrv", ckserver.namesrv).option("topic", target)
             .option("transactional", "true"))
        if option is not None:
            w = w.option("transactionTimeoutMs", option)
        w.mode("append").save()
        df = spark.read.format("cometmq").option("namesrv", ckserver.namesrv).option("subscribe", target).load()
        assert {r.properties[CHECK_IMMUNITY_TIME_IN_SECONDS] for r in df.collect()} == {seconds}


def test_options_refused(spark: SparkSession, ckserver: CometServer) -> None:
    df = spark.createDataFrame([("x",)], "body string")
    for value, error in (("59999", "must be at least 60000"), ("86400001", "must be at most 86400000"),
                         ("1h", "is not an integer")):
        with pytest.raises(SparkError, match=f"transactionTimeoutMs={value!r} {error}"):
            (df.write.format("cometmq").option("namesrv", ckserver.namesrv).option("topic", "T")
             .option("transactional", "true").option("transactionTimeoutMs", value).mode("append").save())
    with pytest.raises(SparkError, match="transactionTimeoutMs only means something with transactional=true"):
        (df.write.format("cometmq").option("namesrv", ckserver.namesrv).option("topic", "T")
         .option("transactionTimeoutMs", "60000").mode("append").save())


def test_halves_outlive_the_check_window_within_their_timeout(spark: SparkSession, ckserver: CometServer) -> None:
    """A task's halves stored early survive the broker's short check window (its transactionTimeOut + 2 checks)
    while their immunity lasts: a commit after it makes every row visible."""
    target = new_topic(ckserver)
    opts, query = write_opts(ckserver, target), f"job-{uuid.uuid4().hex}"
    early = task(opts, query, 0)
    time.sleep(DISCARDED_AFTER_S)
    late = task(opts, query, 30)
    assert commit_halves(opts, [early, late], 0) == len(early.halves) + len(late.halves)
    assert visible(spark, ckserver, target) == sorted(f"r{i}" for i in range(60))


def test_commit_past_the_timeout_commits_nothing(spark: SparkSession, ckserver: CometServer) -> None:
    """A commit later than transactionTimeoutMs after the first task started (the broker has discarded that
    task's halves by then) fails naming the option and commits no row: all or nothing."""
    target = new_topic(ckserver)
    opts = dataclasses.replace(write_opts(ckserver, target), transaction_timeout_ms=1000)  # below the minimum
    query = f"job-{uuid.uuid4().hex}"
    early = task(opts, query, 0)
    time.sleep(1 + DISCARDED_AFTER_S)
    late = task(opts, query, 30)
    with pytest.raises(TransactionTimeoutError, match=r"past transactionTimeoutMs=1000.*none is committed"):
        commit_halves(opts, [early, late], 0)
    time.sleep(1 + DISCARDED_AFTER_S)  # (the late task's halves: rolled back, not left to be checked)
    assert visible(spark, ckserver, target) == []


def test_replay_of_a_marker_whose_halves_were_discarded_names_the_option(spark: SparkSession,
                                                                         ckserver: CometServer) -> None:
    """A driver that wrote the marker and died; its halves outlived transactionTimeoutMs and were discarded. The
    replay's commit cannot complete the marker: it fails naming the option (not "the check-back completes them")
    and rolls back its own halves."""
    target = new_topic(ckserver)
    opts = dataclasses.replace(write_opts(ckserver, target), transaction_timeout_ms=1000)
    query = f"q-{uuid.uuid4().hex}"
    crashed = task(opts, query, 0)
    with _Driver(opts, query) as d:  # what the crashed run's commit did before it died
        d.link.run(d.markers.ensure_topic())
        d.link.run(d.markers.write(d.producer, query, 0, [crashed.write_id], crashed.halves))
    time.sleep(1 + DISCARDED_AFTER_S)
    replay = task(opts, query, 0)
    with pytest.raises(TransactionTimeoutError, match=r"discarded 3 of the 3 halves.*transactionTimeoutMs=1000"):
        commit_halves(opts, [replay], 0)
    time.sleep(1 + DISCARDED_AFTER_S)
    assert visible(spark, ckserver, target) == []


# -- a Spark job longer than the old immunity (soak) -------------------------------------------------------------
def slow_job_write(spark: SparkSession, server: CometServer, target: str, timeout_ms: str | None) -> None:
    """200 rows in 2 tasks; the second starts its rows after SLOW_TASK_S, so the first's halves are that much
    older than the commit."""

    def body(i: int) -> str:
        if i == 100:
            time.sleep(SLOW_TASK_S)
        return f"r{i}"

    df = spark.range(0, 200, numPartitions=2).select(F.udf(body, "string", useArrow=False)("id").alias("body"))
    w = (df.write.format("cometmq").option("namesrv", server.namesrv).option("topic", target)
         .option("transactional", "true"))
    if timeout_ms is not None:
        w = w.option("transactionTimeoutMs", timeout_ms)
    w.mode("append").save()


@pytest.mark.soak  # a job of ~70 s
@pytest.mark.timeout(300)
def test_job_longer_than_the_old_immunity_commits_every_row(spark: SparkSession, ckserver: CometServer) -> None:
    """Before transactionTimeoutMs the halves' immunity was 60 s: the first task's halves were discarded before
    the commit, which then failed with half of the rows visible."""
    target = new_topic(ckserver)
    slow_job_write(spark, ckserver, target, None)
    assert visible(spark, ckserver, target) == sorted(f"r{i}" for i in range(200))


@pytest.mark.soak  # a job of ~70 s
@pytest.mark.timeout(300)
def test_job_longer_than_its_transaction_timeout_writes_nothing(spark: SparkSession, ckserver: CometServer) -> None:
    target = new_topic(ckserver)
    with pytest.raises(SparkError, match="past transactionTimeoutMs=60000"):
        slow_job_write(spark, ckserver, target, "60000")
    time.sleep(DISCARDED_AFTER_S)
    assert visible(spark, ckserver, target) == []
