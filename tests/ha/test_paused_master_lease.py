"""A master SIGSTOPped past the controller's heartbeat timeout takes no writes when it is let go (as processes).

With allAckInSyncStateSet=false the master acknowledges a send alone, so only its lease stands between it and a
second master: after the controller elects the replica, the old one must have stopped acking (#7017). Acks its
replica sent before the pause reach its socket while it is stopped (here a proxy holds them back 1.5 s, as a
slow link would); read after SIGCONT, they used to count as heard *now* and renewed the lease for a full term, so
the old master took and acknowledged writes beside the new one (each lost when it rejoins as a replica). With
allAck=false a replica's ack acknowledges nothing and renews nothing; only the controller's answers do, counted
from when the request was sent.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cometmq.protocol.codes import ResponseCode
from tests.broker.conftest import send_request
from tests.chaos.cluster import ChaosBroker, ChaosCluster

TOPIC = "LeaseAfterPause"


async def send(c: ChaosCluster, b: ChaosBroker, body: bytes) -> tuple[int, str]:
    cmd = send_request(TOPIC, body)
    try:
        reply = await c.request(b.addr, cmd.code, cmd.ext_fields, body, timeout=3)
    except Exception as exc:  # (a timeout is not an acknowledgement either)
        return -1, repr(exc)
    return reply.code, reply.remark or ""


async def test_a_paused_master_acks_no_write_after_sigcont(tmp_path: Path) -> None:
    async with ChaosCluster(tmp_path, brokers=2, controllers=1,
                            conf={"allAckInSyncStateSet": "false", "minInSyncReplicas": "1"}) as c:
        await c.start()
        await c.create_topic(TOPIC, 1)
        old = await c.wait_master()
        new = next(b for b in c.brokers if b is not old)
        assert (await send(c, old, b"before"))[0] == ResponseCode.SUCCESS
        # the replica's acks (its HA link's upstream) reach the master 1.5 s late: some are always on the way
        await c.hub.command(f"{old.name}-ha delay 1.5 up src={new.ip}")
        await asyncio.sleep(2.5)
        # the old master will not hear the controller's news at SIGCONT (nor renew its lease there)
        await c.drop(old.name, "c0")
        c.pause(old.name)
        paused_at = time.monotonic()
        elected = await c.wait_master(20, not_=old)
        assert elected is new
        assert (await send(c, new, b"to-the-new-master"))[0] == ResponseCode.SUCCESS
        await asyncio.sleep(max(0.0, paused_at + 2.0 - time.monotonic()))  # (the held acks have arrived)
        c.resume(old.name)
        answers = [await send(c, old, f"to-the-old-master-{i}".encode()) for i in range(10)]
        acked = [a for a in answers if a[0] == ResponseCode.SUCCESS]
        assert not acked, f"the old master acknowledged {len(acked)} of 10 writes beside the new one: {answers}\n" \
                          f"{c.logs()}"
        assert any("not heard from the controller" in remark for _, remark in answers), answers
