"""A task's read of a range its queue no longer has: the queue's end went back below the range after it was
planned (the topic deleted and made again, or a broker that lost its tail), against a real broker. With
failOnDataLoss=false the offsets are skipped with a warning, as any other loss; with it true the task fails
naming them. Otherwise a micro-batch planned before the queue went back would fail on every replay from the
checkpoint, failOnDataLoss=false or not."""

from __future__ import annotations

import logging

import pytest

from cometmq.client import Message, MessageQueue
from cometmq.client.sync import SyncAdmin, SyncProducer
from cometmq.spark.options import parse_read
from cometmq.spark.reader import QueueSlice, read_slice
from cometmq.spark.resolve import DataLossError
from cometmq.spark.schema import arrow_schema, read_schema
from tests.interop.cometmq_server import CometServer
from tests.kit import wait_until


def offsets_read(server: CometServer, queue: MessageQueue, start: int, end: int, **options: str) -> list[int]:
    opts = parse_read({"namesrv": server.namesrv, "subscribe": queue.topic, **options}, streaming=True)
    part = QueueSlice(queue, start, end, server.broker_addr, opts)
    return [o for b in read_slice(part, arrow_schema(read_schema())) for o in b.column("queueOffset").to_pylist()]


def test_a_range_past_the_queues_end_is_data_loss_that_can_be_skipped(server: CometServer, producer: SyncProducer,
                                                                     topic: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    queue = MessageQueue(topic, "broker-a", 0)
    producer.send_batch([Message(topic, f"a{i}".encode()) for i in range(20)], queue=queue)
    assert offsets_read(server, queue, 10, 20) == list(range(10, 20))
    with SyncAdmin(namesrv=server.namesrv) as admin:  # the topic deleted and made again: queue 0 ends at 3 now
        admin.delete_topic(topic)
        server.create_topic(topic, 4)
        wait_until(lambda: server.route(topic) is not None, 10, "the route of the topic made again")
        producer.send_batch([Message(topic, f"b{i}".encode()) for i in range(3)], queue=queue)
        assert admin.max_offset(queue) == 3
    # The range [10, 20) was planned before: it is gone. A read from 0 (the broker's "start again") is not it.
    with caplog.at_level(logging.WARNING, logger="cometmq.spark.reader"):
        assert offsets_read(server, queue, 10, 20, failOnDataLoss="false") == []
    assert "offsets 10..19" in caplog.text
    with pytest.raises(DataLossError, match=r"offsets 10\.\.19 .*queue's end \(3\)"):
        offsets_read(server, queue, 10, 20)
    # A range that starts inside the queue and runs past its end: what is there, then the rest reported.
    with pytest.raises(DataLossError, match=r"offsets 3\.\.19"):
        offsets_read(server, queue, 1, 20)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cometmq.spark.reader"):
        assert offsets_read(server, queue, 1, 20, failOnDataLoss="false") == [1, 2]
    # one warning, for what is lost: the rows read before it are not taken for a hole after it
    assert [r.getMessage() for r in caplog.records if "offsets" in r.getMessage()] == [
        f"skipping lost messages: {topic} broker-a:0: offsets 3..19 are not in the queue (it ends at 3). "
        "Set failOnDataLoss=false to skip them."]
