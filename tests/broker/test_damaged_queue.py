"""A consume-queue unit damaged on disk where recovery does not look (a queue's older file), behind a restarted broker:
a pull or a POP at it goes on with the next messages, as RocketMQ's read moves past a unit it cannot read. It
answered "nothing here" with the same offset to begin from next: a consumer pulled that offset again at once, for
ever (the queue being longer, a held pull was woken at once), and a POP consumer never got past it."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from cometmq.broker.controller import BrokerController
from cometmq.net.client import RemotingClient
from cometmq.protocol.codes import RequestCode, ResponseCode
from cometmq.protocol.message import iter_records
from cometmq.protocol.remoting import make_request
from cometmq.store.config import CQ_UNIT_SIZE

from .conftest import StartBroker, pull_request, send_request

N = 40
BAD = 5


async def damaged_broker(start_broker: StartBroker, client: RemotingClient, path: Path) -> BrokerController:
    """A broker whose queue D/0 holds N messages, unit BAD (in the first of three consume-queue files) pointing 4
    bytes into its record, restarted on those files."""
    b = await start_broker(path, store_consume_queue_units_per_file=16)
    for i in range(N):
        r = await client.invoke(b.addr, send_request("D", f"m{i}".encode(), 0))
        assert r.code == ResponseCode.SUCCESS, r.remark
    await b.stop()
    with open(sorted((path / "consumequeue" / "D" / "0").iterdir())[0], "r+b") as f:
        f.seek(BAD * CQ_UNIT_SIZE)
        phy, size, tags = struct.unpack(">qiq", f.read(CQ_UNIT_SIZE))
        f.seek(BAD * CQ_UNIT_SIZE)
        f.write(struct.pack(">qiq", phy + 4, size, tags))
    return await start_broker(path, store_consume_queue_units_per_file=16)


async def test_pull_at_a_damaged_unit_goes_on_after_it(start_broker: StartBroker, client: RemotingClient,
                                                      tmp_path: Path) -> None:
    b = await damaged_broker(start_broker, client, tmp_path / "b")
    loop = asyncio.get_running_loop()
    got: list[tuple[int, bytes]] = []
    offset = BAD
    t0 = loop.time()
    while offset < N:  # a long-polling pull (suspend flag), as the push consumer's
        r = await client.invoke(b.addr, pull_request("D", offset, suspend_ms=5000), timeout=3)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark, r.ext_fields)
        got += [(rec.queue_offset, rec.body) for rec in iter_records(r.body, check_crc=True)]
        offset = int(r.ext_fields["nextBeginOffset"])
    assert loop.time() - t0 < 1.5
    assert got == [(i, f"m{i}".encode()) for i in range(BAD + 1, N)]
    assert b.store.bad_units.unreadable == 1
    r = await client.invoke(b.addr, pull_request("D", 0))  # the messages before it are all there
    assert [rec.queue_offset for rec in iter_records(r.body)] == [*range(BAD), *range(BAD + 1, N)][:32]


async def test_pop_at_a_damaged_unit_goes_on_after_it(start_broker: StartBroker, client: RemotingClient,
                                                     tmp_path: Path) -> None:
    b = await damaged_broker(start_broker, client, tmp_path / "b")
    pop = {"consumerGroup": "popg", "topic": "D", "queueId": "0", "maxMsgNums": "8", "bornTime": "0",
           "initMode": "0", "pollTime": "400", "invisibleTime": "60000"}
    got: list[int] = []
    while len(got) < N - 1:  # (a POP held at the bad unit answered POLLING_TIMEOUT, and the next one the same)
        r = await client.invoke(b.addr, make_request(RequestCode.POP_MESSAGE, pop), timeout=3)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark, got)
        recs = list(iter_records(r.body, check_crc=True))
        assert all(rec.body == f"m{rec.queue_offset}".encode() for rec in recs)
        got += [rec.queue_offset for rec in recs]
    assert got == [*range(BAD), *range(BAD + 1, N)]
    note = {"consumerGroup": "popg", "topic": "D", "queueId": "0", "bornTime": "0", "pollTime": "0"}
    r = await client.invoke(b.addr, make_request(RequestCode.NOTIFICATION, note))
    assert r.code == ResponseCode.SUCCESS and r.ext_fields["hasMsg"] == "false"
