"""The driver side of a stream across a restart of the server (nameserver and broker): its Link runs its loop only
during calls, so connections the server closed in between are noticed by the next request. A trigger after the
restart must plan its micro-batch, not fail the query on a server that is up again. And across a broker that leaves
the topic's route (two in-process brokers): the stream goes on with the others, keeps the gone broker's offsets, and
reads it again from them when it returns."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cometmq.client import Message, MessageQueue, NoRouteError
from cometmq.client.sync import SyncAdmin, SyncProducer
from cometmq.spark.options import parse_read
from cometmq.spark.planning import from_json
from cometmq.spark.reader import CometStreamReader
from cometmq.spark.resolve import DataLossError
from cometmq.spark.schema import read_schema
from tests.client.test_sync import ThreadCluster
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


# -- a broker that leaves the topic's route, and comes back ----------------------------------------------------------
@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[ThreadCluster]:
    """broker-a and broker-b on one in-process nameserver (real sockets; read tasks connect as Spark's would)."""
    tc = ThreadCluster(tmp_path)
    try:
        tc.run(tc.cluster.add_broker("broker-b"))
        yield tc
    finally:
        tc.close()


def _brokers_routed(tc: ThreadCluster, topic: str) -> set[str]:
    with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
        try:
            return {qd.broker_name for qd in admin.topic_route(topic).queue_datas}
        except NoRouteError:
            return set()


def _send(tc: ThreadCluster, queue: MessageQueue, bodies: list[bytes]) -> None:
    with SyncProducer("gone-producer", namesrv=tc.namesrv_addr) as p:  # a new one: routes fresh from the nameserver
        p.send_batch([Message(queue.topic, b) for b in bodies], queue=queue)


def _read(reader: CometStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[str, int, bytes]]:
    return sorted((r["brokerName"], r["queueOffset"], r["body"]) for s in reader.partitions(start, end)
                  for b in reader.read(s) for r in b.to_pylist())


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_broker_gone_from_the_route_is_carried_and_read_again_when_it_returns(
        two_brokers: ThreadCluster, fail_on_data_loss: str, caplog: pytest.LogCaptureFixture) -> None:
    """Before, every trigger asked the gone broker for its queues' ends and failed: the stream stood still."""
    tc, topic, only_b = two_brokers, "GoneT", "GoneOnlyB"  # (only_b: no route at all once broker-b is gone)
    with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
        admin.create_topic(topic, read_queues=2)
        admin.create_topic(only_b, read_queues=1, broker="broker-b")
    wait_until(lambda: _brokers_routed(tc, topic) == {"broker-a", "broker-b"}, 10, "both brokers routed")
    qa, qb = MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-b", 0)
    _send(tc, qa, [b"a0", b"a1", b"a2"])
    _send(tc, qb, [b"b0", b"b1", b"b2", b"b3"])
    _send(tc, MessageQueue(only_b, "broker-b", 0), [b"o0"])
    options = {"namesrv": tc.namesrv_addr, "subscribe": f"{topic},{only_b}", "startingOffsets": "earliest",
               "failOnDataLoss": fail_on_data_loss, "commitToGroup": "gone-report"}
    reader = CometStreamReader(parse_read(options, streaming=True), read_schema())
    restarted = CometStreamReader(parse_read(options, streaming=True), read_schema())
    try:
        start = reader.initialOffset()
        end1 = reader.latestOffset(start, ReadAllAvailable())
        assert len(_read(reader, start, end1)) == 8
        b = tc.cluster.brokers.pop()
        tc.run(b.stop())  # it unregisters: the route names broker-a alone
        wait_until(lambda: _brokers_routed(tc, topic) == {"broker-a"}, 10, "broker-b gone from the route")
        _send(tc, qa, [b"a3", b"a4"])
        with caplog.at_level(logging.WARNING, logger="cometmq.spark"):
            end2 = reader.latestOffset(end1, ReadAllAvailable())
            # broker-b's queues are carried forward unchanged (what Spark writes to its checkpoint); broker-a's move
            assert end2 == {topic: {**end1[topic], "broker-a:0": 5}, only_b: {"broker-b:0": 1}}
            assert _read(reader, end1, end2) == [("broker-a", 3, b"a3"), ("broker-a", 4, b"a4")]
            assert reader.latestOffset(end2, ReadAllAvailable()) == end2  # nothing new: no micro-batch
            reader.commit(end2)  # reported for the queues routed, without a failure for the others
            # a driver restarted meanwhile (its client knows no address of broker-b) plans the same
            assert restarted.latestOffset(end2, ReadAllAvailable()) == end2
        with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
            assert admin.committed_offset("gone-report", qa) == 5
        warned = [r.getMessage() for r in caplog.records if r.name == "cometmq.spark.reader"]
        assert len(warned) == 2 * 3, warned  # once per queue (and reader), not once per trigger
        assert not [r for r in caplog.records if "could not report" in r.getMessage()]
        assert (f"{topic} broker-b:0 is no longer in the topic's route (broker broker-b left the cluster, or the topic "
                "was deleted on it): keeping its offset 4 and reading nothing from it; reading resumes from there if "
                "the route lists it again") in warned
        tc.run(tc.cluster.add_broker("broker-b"))  # the same store folder: its 4 messages are still there
        wait_until(lambda: _brokers_routed(tc, topic) == {"broker-a", "broker-b"}, 10, "broker-b routed again")
        _send(tc, qb, [b"b4", b"b5", b"b6"])
        _send(tc, MessageQueue(only_b, "broker-b", 0), [b"o1"])
        for r in (reader, restarted):
            end3 = r.latestOffset(end2, ReadAllAvailable())
            assert end3 == {topic: {**end2[topic], "broker-b:0": 7}, only_b: {"broker-b:0": 2}}
            assert _read(r, end2, end3) == [("broker-b", 1, b"o1"), ("broker-b", 4, b"b4"), ("broker-b", 5, b"b5"),
                                            ("broker-b", 6, b"b6")]
    finally:
        reader.stop()
        restarted.stop()


def test_a_broker_back_without_its_messages_is_data_loss(two_brokers: ThreadCluster, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Away is not loss, but the usual rules hold when it returns: here broker-b comes back with an empty store (the
    queue ends at 2, below the 4 kept), which fails the query, or with failOnDataLoss=false goes on from the end."""
    tc, topic = two_brokers, "LostT"
    with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
        admin.create_topic(topic, read_queues=1)
    wait_until(lambda: _brokers_routed(tc, topic) == {"broker-a", "broker-b"}, 10, "both brokers routed")
    qb = MessageQueue(topic, "broker-b", 0)
    _send(tc, qb, [b"b0", b"b1", b"b2", b"b3"])
    readers = {fail: CometStreamReader(parse_read({"namesrv": tc.namesrv_addr, "subscribe": topic,
                                                   "startingOffsets": "earliest", "failOnDataLoss": fail},
                                                  streaming=True), read_schema()) for fail in ("true", "false")}
    try:
        ends = {fail: r.latestOffset(r.initialOffset(), ReadAllAvailable()) for fail, r in readers.items()}
        tc.run(tc.cluster.brokers.pop().stop())
        wait_until(lambda: _brokers_routed(tc, topic) == {"broker-a"}, 10, "broker-b gone from the route")
        assert all(r.latestOffset(ends[f], ReadAllAvailable()) == ends[f] for f, r in readers.items())
        tc.cluster.tmp = tmp_path / "elsewhere"  # a new store folder: broker-b lost its messages
        tc.run(tc.cluster.add_broker("broker-b"))
        with SyncAdmin(namesrv=tc.namesrv_addr) as admin:
            admin.create_topic(topic, read_queues=1, broker="broker-b")
        _send(tc, qb, [b"n0", b"n1"])
        with pytest.raises(DataLossError, match=rf"{topic} broker-b:0 from 4 to 2"):
            readers["true"].latestOffset(ends["true"], ReadAllAvailable())
        with caplog.at_level(logging.WARNING, logger="cometmq.spark.reader"):
            after = readers["false"].latestOffset(ends["false"], ReadAllAvailable())
        assert from_json(after)[qb] == 2 and "going on from the queues' new ends" in caplog.text
        _send(tc, qb, [b"n2"])
        nxt = readers["false"].latestOffset(after, ReadAllAvailable())
        assert _read(readers["false"], after, nxt) == [("broker-b", 2, b"n2")]
    finally:
        for r in readers.values():
            r.stop()
