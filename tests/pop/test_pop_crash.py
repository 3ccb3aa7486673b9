"""POP state across a real broker process's kill -9 and clean restart (the blocking SDK facade drives it)."""

from __future__ import annotations

import time
from pathlib import Path

from cometmq.client import Message
from cometmq.client.sync import SyncProducer, SyncSimpleConsumer
from tests.interop.cometmq_server import CometServer

TOPIC = "PopCrash"
GROUP = "pop-crash"


def receive_all(sc: SyncSimpleConsumer, *, quiet: float) -> list:  # type: ignore[type-arg]
    """Everything that arrives until nothing has come for ``quiet`` seconds (acking it)."""
    got = []
    last = time.monotonic()
    while time.monotonic() - last < quiet:
        msgs = sc.receive(64, wait=0.5)
        if msgs:
            got.extend(msgs)
            sc.ack_many(msgs)
            last = time.monotonic()
    return got


def test_acked_never_redelivered_across_kill9_and_restart(tmp_path: Path) -> None:
    # No snapshot during the test: after kill -9 the state comes from replaying the pop log alone.
    server = CometServer(tmp_path / "srv", {"popSnapshotIntervalMs": "600000"})
    server.start()
    try:
        server.create_topic(TOPIC, 2)
        with SyncProducer("pg", namesrv=server.namesrv) as p:
            ids = [r.msg_id for r in p.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(200)])]
        with SyncSimpleConsumer(GROUP, namesrv=server.namesrv, consume_from="first", invisible_duration=3) as sc:
            sc.subscribe(TOPIC)
            got = []
            while len(got) < 200:
                msgs = sc.receive(64, wait=1)
                assert msgs, f"only {len(got)} of 200 received"
                got.extend(msgs)
            assert sorted(m.msg_id for m in got) == sorted(ids)
            unacked = {m.msg_id for m in got[:20]}
            sc.ack_many(got[20:150])
            for m in got[150:]:
                sc.ack(m)
        server.kill()  # SIGKILL: no snapshot, no shutdown code
        server.start()
        with SyncSimpleConsumer(GROUP, namesrv=server.namesrv, invisible_duration=30) as sc:
            sc.subscribe(TOPIC)
            again = receive_all(sc, quiet=5.0)  # the 3 s invisible time passes meanwhile
        assert sorted(m.msg_id for m in again) == sorted(unacked)
        assert all(m.reconsume_times == 1 for m in again)
        server.restart()  # clean: everything is acked now
        with SyncSimpleConsumer(GROUP, namesrv=server.namesrv, invisible_duration=30) as sc:
            sc.subscribe(TOPIC)
            assert receive_all(sc, quiet=4.0) == []
        offsets = server.consumer_offsets(GROUP, TOPIC)
        assert sum(offsets.values()) == 200, offsets
    finally:
        server.close()
