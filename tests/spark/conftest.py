"""One SparkSession (local[2]) and one real broker (``cometmq serve`` in a subprocess) for the Spark tests.

Spark's executors are other processes, so the broker must listen on a real socket for the whole session:
:class:`tests.interop.cometmq_server.CometServer` starts it on free 127.0.0.1 ports. Every test makes its own
topics (``topic()`` gives a fresh name), so tests do not see each other's messages.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install 'cometmq[spark]')")
pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install 'cometmq[spark]')")

from pyspark.sql import SparkSession

from cometmq.client import Message
from cometmq.client.sync import SyncProducer
from tests.interop.cometmq_server import CometServer

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after pytest closed the stream
# it captured: a "--- Logging error ---" traceback at the end of every run. Its INFO lines say nothing we need.
logging.getLogger("py4j").setLevel(logging.WARNING)

#: broker settings for the session broker: SQL92 filters on, small files
BROKER_CONF = {"enablePropertyFilter": "true"}

_names = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("cometmq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    from cometmq.spark import register

    register(session)
    yield session
    session.stop()


def running(tmp_path_factory: pytest.TempPathFactory, name: str, conf: dict[str, str]) -> Iterator[CometServer]:
    """``cometmq serve`` with ``conf`` on a new folder ``name``, started; closed when the generator ends (a
    fixture's ``yield from``)."""
    srv = CometServer(tmp_path_factory.mktemp(name), conf)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CometServer]:
    yield from running(tmp_path_factory, "spark-broker", BROKER_CONF)


@pytest.fixture(scope="module")
def producer(server: CometServer) -> Iterator[SyncProducer]:
    """Per module: an open facade holds the shared loop thread, which tests/client checks is gone when theirs close."""
    with SyncProducer("spark-test-producer", namesrv=server.namesrv) as p:
        yield p


@pytest.fixture
def topic(server: CometServer) -> Iterator[str]:
    """A fresh topic with 4 queues, routed by the nameserver."""
    name = f"SparkT{os.getpid()}_{next(_names)}"
    server.create_topic(name, 4)
    yield name


def send(producer: SyncProducer, topic: str, bodies: list[str], per_request: int = 5) -> None:
    """Send ``bodies`` in batches of ``per_request``; the producer picks the next queue for each batch."""
    for i in range(0, len(bodies), per_request):
        producer.send_batch([Message(topic, b.encode()) for b in bodies[i : i + per_request]])
