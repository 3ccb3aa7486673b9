"""Recalling timer messages from the SDK (RocketMQ 5's RecallMessage) against a real broker."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from cometmq.client import (
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    Message,
    MessageQueue,
    NoRouteError,
    Producer,
)
from cometmq.client.sync import SyncProducer, loop_thread_running
from cometmq.protocol.codes import ResponseCode
from cometmq.protocol.message import iter_records
from tests.kit import eventually, wait_until

from .conftest import Cluster
from .test_sync import ThreadCluster, tc  # noqa: F401 - the threaded cluster fixture


def delivered(cluster: Cluster, topic: str) -> list[str]:
    """UNIQ_KEYs of the messages stored under ``topic`` (delivered timers, plain sends)."""
    store = cluster.brokers[0].store
    out: list[str] = []
    for q in range(8):
        r = store.get_messages(topic, q, 0, 1000, max_bytes=1 << 24)
        out += [rec.properties["UNIQ_KEY"] for rec in iter_records(b"".join(bytes(v) for v in r.buffers))]
    return out


def handle(topic: str, broker: str, timestamp: str, msg_id: str) -> str:
    raw = f"v1 {topic} {broker} {timestamp} {msg_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_recall_before_due_is_never_delivered(cluster: Cluster) -> None:
    q = MessageQueue("RT", "broker-a", 0)
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        plain = await p.send(Message("RT", b"now"), queue=q)
        gone = await p.send(Message("RT", b"gone", delay=0.8), queue=q)
        stays = await p.send(Message("RT", b"stays", delay=1.2), queue=q)
        assert plain.recall_handle is None
        assert gone.recall_handle and stays.recall_handle and gone.recall_handle != stays.recall_handle
        assert await p.recall("RT", gone.recall_handle) == gone.msg_id
        assert await p.recall("RT", gone.recall_handle) == gone.msg_id  # again: still before due, harmless
        # ``stays`` is due after ``gone``: once it is there, ``gone``'s time has passed too
        await eventually(lambda: stays.msg_id in delivered(cluster, "RT"), 10,
                         what="the message not recalled delivered")
        await asyncio.sleep(0.2)
    assert delivered(cluster, "RT") == [plain.msg_id, stays.msg_id]
    stats = cluster.brokers[0].timer.service.stats  # type: ignore[union-attr]
    assert (stats.cancelled, stats.delivered) == (1, 1)


async def test_recall_after_delivery_is_refused(cluster: Cluster) -> None:
    async with Producer("pg", namesrv=cluster.namesrv_addr) as p:
        r = await p.send(Message("RL", b"x", delay=0.2))
        assert r.recall_handle is not None
        await eventually(lambda: r.msg_id in delivered(cluster, "RL"), 10, what="the message delivered")
        with pytest.raises(BrokerError) as err:
            await p.recall("RL", r.recall_handle)
    # as RocketMQ's broker answers: the message is already due, so there is nothing to cancel
    assert err.value.code == ResponseCode.ILLEGAL_OPERATION and "timestamp invalid" in str(err.value)
    assert not err.value.retriable
    assert delivered(cluster, "RL") == [r.msg_id]


async def test_bad_and_foreign_handles(cluster: Cluster) -> None:
    p = Producer("pg", namesrv=cluster.namesrv_addr)
    with pytest.raises(ClientStateError):
        await p.recall("RB", "anything")
    async with p:
        r = await p.send(Message("RB", b"x", delay=30))
        other = await p.send(Message("RB2", b"y"))
        assert r.recall_handle is not None and other.ok
        for bad in ("", "not-a-handle", base64.urlsafe_b64encode(b"v2 RB broker-a 1 X").decode(), "\u00e9"):
            with pytest.raises(InvalidArgumentError, match="recall handle is invalid"):
                await p.recall("RB", bad)
        with pytest.raises(InvalidArgumentError):
            await p.recall("%RETRY%pg", r.recall_handle)
        with pytest.raises(InvalidArgumentError):
            await p.recall("bad topic", r.recall_handle)
        with pytest.raises(NoRouteError, match="no-such-broker"):
            await p.recall("RB", handle("RB", "no-such-broker", "1", r.msg_id))
        with pytest.raises(BrokerError) as err:  # the handle is for another topic
            await p.recall("RB2", r.recall_handle)
        assert err.value.code == ResponseCode.ILLEGAL_OPERATION
        with pytest.raises(BrokerError) as err:  # a stale (long past) time
            await p.recall("RB", handle("RB", "broker-a", str(int(time.time() * 1000) - 60_000), r.msg_id))
        assert err.value.code == ResponseCode.ILLEGAL_OPERATION and "timestamp invalid" in str(err.value)
        # none of that cancelled the message: its own handle still does
        assert await p.recall("RB", r.recall_handle) == r.msg_id


def test_sync_recall(tc: ThreadCluster) -> None:  # noqa: F811 - the fixture
    with SyncProducer("spg", namesrv=tc.namesrv_addr) as p:
        r = p.send(Message("SR", b"x", delay=0.6))
        keep = p.send(Message("SR", b"y", delay=0.9))
        assert r.recall_handle is not None
        assert p.recall("SR", r.recall_handle) == r.msg_id
        with pytest.raises(InvalidArgumentError):
            p.recall("SR", "nope")
    wait_until(lambda: keep.msg_id in delivered(tc.cluster, "SR"), 10, "the kept message delivered", step=0.05)
    time.sleep(0.2)
    assert delivered(tc.cluster, "SR") == [keep.msg_id]
    assert not loop_thread_running()
