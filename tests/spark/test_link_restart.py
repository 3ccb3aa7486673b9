"""The driver side of a stream across a restart of the server (nameserver and broker): its Link runs its loop only
during calls, so connections the server closed in between are noticed by the next request. A trigger after the
restart must plan its micro-batch, not fail the query on a server that is up again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cometmq.client import Message, MessageQueue
from cometmq.client.sync import SyncProducer
from cometmq.spark.options import parse_read
from cometmq.spark.planning import from_json
from cometmq.spark.reader import CometStreamReader
from cometmq.spark.schema import read_schema
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[CometServer]:
    srv = CometServer(tmp_path / "broker")
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def test_a_trigger_after_the_server_restarted_plans_its_batch(own_server: CometServer) -> None:
    topic = "RestartT"
    own_server.create_topic(topic, 2)
    queue = MessageQueue(topic, "broker-a", 0)
    with SyncProducer("restart-producer", namesrv=own_server.namesrv) as p:
        p.send_batch([Message(topic, b"a%d" % i) for i in range(5)], queue=queue)
    reader = CometStreamReader(parse_read({"namesrv": own_server.namesrv, "subscribe": topic,
                                           "startingOffsets": "earliest"}, streaming=True), read_schema())
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert from_json(end)[queue] == 5
        own_server.restart()  # the reader's connections to the nameserver and the broker are dead now
        wait_until(lambda: own_server.route(topic) is not None, 20, "the route after the restart")
        with SyncProducer("restart-producer", namesrv=own_server.namesrv) as p:
            p.send_batch([Message(topic, b"b%d" % i) for i in range(3)], queue=queue)
        nxt = reader.latestOffset(end, ReadAllAvailable())
        assert from_json(nxt)[queue] == 8
        assert [(s.start, s.end) for s in reader.partitions(end, nxt)] == [(5, 8)]
        own_server.restart()
        wait_until(lambda: own_server.route(topic) is not None, 20, "the route after the restart")
        assert [(s.start, s.end) for s in reader.partitions(end, nxt)] == [(5, 8)]  # a replay: the broker first
    finally:
        reader.stop()


def test_calls_further_apart_than_the_servers_idle_timeout(tmp_path: Path) -> None:
    """The broker closes a connection idle for serverChannelMaxIdleTimeSeconds (120 s by default; a trigger every
    5 minutes is longer): the next call opens another."""
    srv = CometServer(tmp_path / "broker", {"serverChannelMaxIdleTimeSeconds": "1"})
    srv.start()
    reader = None
    try:
        topic = "IdleT"
        srv.create_topic(topic, 1)
        queue = MessageQueue(topic, "broker-a", 0)
        with SyncProducer("idle-producer", namesrv=srv.namesrv) as p:
            p.send_batch([Message(topic, b"a%d" % i) for i in range(4)], queue=queue)
        reader = CometStreamReader(parse_read({"namesrv": srv.namesrv, "subscribe": topic,
                                               "startingOffsets": "earliest"}, streaming=True), read_schema())
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        wait_until(lambda: "serverChannelMaxIdleTimeSeconds" in srv.log_text(), 20,
                   "the broker to close the reader's idle connection")
        assert [(s.start, s.end) for s in reader.partitions(start, end)] == [(0, 4)]
    finally:
        if reader is not None:
            reader.stop()
        srv.close()
