"""A broker promoted again in the same process rebuilds its unresolved transactions from its log as it is now.

Demoted, a master's log may be cut back (the tail a new master never got, as in test_repromote_ack.py): a half
it held may be gone, and the half-queue offsets it had are given to other halves. Promoted again, the broker must
not keep the halves it tracked before: the promotion failed (its rebuild met a half it could no longer read), and
a new half at a reused offset would have been taken for the old one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.msgid import decode_offset_msg_id
from tests.broker.conftest import props, send_request
from tests.ha.cluster import Broker, Cluster

TOPIC = "HARepromoteTx"
GROUP = "txg"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path, {"slaveTimeout": "6000", "haMaxTimeSlaveNotCatchup": "2000"}) as c:
        yield c


async def send_half(cluster: Cluster, b: Broker, body: bytes) -> tuple[int, int, int]:
    """A half of GROUP: the answer's code, its commit-log offset and its half-queue offset."""
    cmd = send_request(TOPIC, body, 0, props(UNIQ_KEY=body.decode(), TRAN_MSG="true", PGROUP=GROUP),
                       producerGroup=GROUP, sysFlag=4)
    r = await cluster.request(b.addr, cmd.code, cmd.ext_fields, body, timeout=15)
    if r.code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT):
        return r.code, -1, -1
    return r.code, decode_offset_msg_id(r.ext_fields["msgId"]).offset, int(r.ext_fields["queueOffset"])


async def test_a_repromoted_broker_tracks_the_halves_of_its_log_as_it_is_now(cluster: Cluster) -> None:
    async with cluster.replica_behind_cutter(TOPIC) as (b0, b1, to_b0, shared_end):

        # b1 gets nothing more: the half b0 stores now (and tracks) is in b0's tail only.
        to_b0.cut_at = shared_end
        code, _, lost_offset = await send_half(cluster, b0, b"lost-half")
        assert code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT) and lost_offset == 0, code

        # The operator promotes b1; b0 follows it and its tail, the half with it, is cut.
        assert (await cluster.promote(b1, 2)).code == 0
        assert (await cluster.follow(b0, b1, 2, 2)).code == 0
        await cluster.wait_sync_set(b1, {0, 2})
        assert await cluster.wait_caught_up(b0, b1) == shared_end

        # b0 is master again: promoted with its transactions rebuilt from the log it holds now.
        r = await cluster.promote(b0, 3)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark, cluster.logs())
        assert (await cluster.follow(b1, b0, 3, 1)).code == 0
        await cluster.wait_sync_set(b0, {0, 1})
        # A new half at the half-queue offset the lost one had is tracked as itself, and its commit delivered.
        code, clo, offset = await send_half(cluster, b0, b"new-half")
        assert code == ResponseCode.SUCCESS and offset == lost_offset, (code, offset)
        r = await cluster.request(b0.addr, RequestCode.END_TRANSACTION, {
            "producerGroup": GROUP, "tranStateTableOffset": offset, "commitLogOffset": clo, "commitOrRollback": 8,
            "msgId": "new-half", "fromTransactionCheck": "false"}, timeout=15)
        assert r.code == ResponseCode.SUCCESS and not r.remark, (r.code, r.remark)
        pulled = await cluster.pull_queue(b0.addr, TOPIC, 0)
        assert [m.body for m in pulled.records] == [b"shared", b"new-half"]
